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

// Per-row stream: one hash of (seed, key); column c then draws splitmix64's c-th output, one
// mix per column instead of a chain of hashes.
EMBSTORE_HD uint64_t init_row_seed(const InitParams& p, int64_t key) {
  return hash_combine(p.seed, static_cast<uint64_t>(key));
}

EMBSTORE_HD uint64_t init_column_hash(uint64_t row_seed, uint32_t col) {
  return mix64(row_seed + (uint64_t{col} + 1) * 0x9e3779b97f4a7c15ull);
}

// 32 random bits for column `col` of a row: distinct columns give distinct values. 32-bit
// arithmetic only, so the host compiler vectorizes a row's loop (a uniform row is the hot
// path of inserting new keys).
EMBSTORE_HD uint32_t init_column_bits(uint64_t row_seed, uint32_t col) {
  const uint32_t lo = static_cast<uint32_t>(row_seed);
  const uint32_t hi = static_cast<uint32_t>(row_seed >> 32);
  return mix32((lo + col * 0x9e3779b9u) ^ hi);
}

// [0, 1) from the top 24 bits; exact in float. Through int32 so it vectorizes.
EMBSTORE_HD float unit_float24(uint32_t bits) {
  return static_cast<float>(static_cast<int32_t>(bits >> 8)) * (1.0f / 16777216.0f);
}

EMBSTORE_HD float init_value_at(const InitParams& p, uint64_t row_seed, uint32_t col) {
  switch (p.kind) {
    case InitKind::kZeros:
      return 0.0f;
    case InitKind::kConstant:
      return p.a;
    case InitKind::kUniform:
      return p.a + (p.b - p.a) * unit_float24(init_column_bits(row_seed, col));
    case InitKind::kNormal:
      return p.a + p.b * standard_normal(init_column_hash(row_seed, col));
  }
  return 0.0f;
}

// The initial value of column `col` of `key`'s row.
EMBSTORE_HD float init_value(const InitParams& p, int64_t key, uint32_t col) {
  return init_value_at(p, init_row_seed(p, key), col);
}

// A whole row; the kind is resolved once, outside the column loop (host backend).
EMBSTORE_HD void init_row(const InitParams& p, int64_t key, uint32_t dim, float* out) {
  const uint64_t seed = init_row_seed(p, key);
  switch (p.kind) {
    case InitKind::kZeros:
    case InitKind::kConstant: {
      const float v = p.kind == InitKind::kZeros ? 0.0f : p.a;
      for (uint32_t c = 0; c < dim; ++c) out[c] = v;
      return;
    }
    case InitKind::kUniform: {
      const float width = p.b - p.a;
      for (uint32_t c = 0; c < dim; ++c) {
        out[c] = p.a + width * unit_float24(init_column_bits(seed, c));
      }
      return;
    }
    case InitKind::kNormal:
      for (uint32_t c = 0; c < dim; ++c) out[c] = init_value_at(p, seed, c);
      return;
  }
}

}  // namespace embstore::row
