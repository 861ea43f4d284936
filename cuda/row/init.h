// Deterministic initializers: a value depends only on (seed, key, column), never on insert
// order, thread count or backend.
#pragma once

#include "cuda/row/hash.h"

namespace embstore::row {

enum class InitKind : uint32_t { kZeros = 0, kConstant = 1, kUniform = 2, kNormal = 3 };

struct InitParams {
  InitKind kind;
  float a, b;
  uint64_t seed;
};

// [0, 1) with 24 random bits: every value is exact in float.
EMBSTORE_HD float unit_float(uint64_t h) {
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

// Natural log for x > 0 from + - * / only, so host and device agree bit for bit (libm and
// CUDA's logf differ in the last place). Error below 2 ulp for normal x.
EMBSTORE_HD float portable_log(float x) {
  uint32_t bits = bit_cast<uint32_t>(x);
  int e = static_cast<int>((bits >> 23) & 0xffu) - 127;
  float m = bit_cast<float>((bits & 0x007fffffu) | 0x3f800000u);  // [1, 2)
  if (m > 1.41421356f) {
    m = m * 0.5f;
    e += 1;
  }
  const float s = (m - 1.0f) / (m + 1.0f);  // |s| <= 0.172
  const float s2 = s * s;
  const float series =
      1.0f + s2 * (0.333333333f + s2 * (0.2f + s2 * (0.142857143f + s2 * 0.111111111f)));
  const float ln_m = 2.0f * s * series;
  const float ef = static_cast<float>(e);
  return ef * 0.693359375f + (ef * -2.12194440e-4f + ln_m);
}

// Standard normal by Marsaglia's polar method: needs only log and sqrt. Each attempt draws
// from its own hash, so the result is a pure function of (seed, key, column).
EMBSTORE_HD float standard_normal(uint64_t h) {
  for (uint64_t attempt = 0; attempt < 64; ++attempt) {
    const uint64_t h1 = hash_combine(h, 2 * attempt);
    const uint64_t h2 = hash_combine(h, 2 * attempt + 1);
    const float u = 2.0f * unit_float(h1) - 1.0f;
    const float v = 2.0f * unit_float(h2) - 1.0f;
    const float s = u * u + v * v;
    if (s > 0.0f && s < 1.0f) return u * sqrt_rn(-2.0f * portable_log(s) / s);
  }
  return 0.0f;  // (1 - pi/4)^64 ~ 1e-43: never in practice
}

EMBSTORE_HD float init_value(const InitParams& p, int64_t key, uint32_t col) {
  switch (p.kind) {
    case InitKind::kZeros:
      return 0.0f;
    case InitKind::kConstant:
      return p.a;
    case InitKind::kUniform: {
      const uint64_t h = hash_combine(hash_combine(p.seed, static_cast<uint64_t>(key)), col);
      return p.a + (p.b - p.a) * unit_float(h);
    }
    case InitKind::kNormal: {
      const uint64_t h = hash_combine(hash_combine(p.seed, static_cast<uint64_t>(key)), col);
      return p.a + p.b * standard_normal(h);
    }
  }
  return 0.0f;
}

}  // namespace embstore::row
