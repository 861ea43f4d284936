// The lossy codecs' per-row arithmetic (cuda/row/codec.h): bf16's rounding and int8's row-wise
// quantization hold the error bounds that the header states, and non-finite values come back
// as the header says.
#include "cuda/row/codec.h"

#include <catch2/catch.hpp>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace embstore::row {
namespace {

float from_bits(uint32_t b) { return bit_cast<float>(b); }

TEST_CASE("bf16 rounds to nearest, ties to even", "[codec]") {
  // Exactly representable values come back unchanged.
  for (const float x : {0.0f, -0.0f, 1.0f, -2.5f, 65536.0f, 0.15625f}) {
    REQUIRE(bit_cast<uint32_t>(float_from_bf16(bf16_from_float(x))) == bit_cast<uint32_t>(x));
  }
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even one, 1.
  REQUIRE(float_from_bf16(bf16_from_float(1.0f + 0x1p-8f)) == 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  REQUIRE(float_from_bf16(bf16_from_float(1.0f + 3 * 0x1p-8f)) == 1.0f + 0x1p-6f);
  // Just above halfway rounds up.
  REQUIRE(float_from_bf16(bf16_from_float(from_bits(0x3f808001u))) == 1.0f + 0x1p-7f);
}

TEST_CASE("bf16 keeps infinities and NaNs and overflows to infinity", "[codec]") {
  const float inf = std::numeric_limits<float>::infinity();
  REQUIRE(float_from_bf16(bf16_from_float(inf)) == inf);
  REQUIRE(float_from_bf16(bf16_from_float(-inf)) == -inf);
  REQUIRE(std::isnan(float_from_bf16(bf16_from_float(std::numeric_limits<float>::quiet_NaN()))));
  // A signalling NaN whose payload sits only in the dropped bits stays a NaN.
  REQUIRE(std::isnan(float_from_bf16(bf16_from_float(from_bits(0x7f800001u)))));
  REQUIRE(float_from_bf16(bf16_from_float(FLT_MAX)) == inf);
  REQUIRE(float_from_bf16(bf16_from_float(-FLT_MAX)) == -inf);
}

TEST_CASE("bf16 is within a relative 2^-8 of every normal value", "[codec]") {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  int checked = 0;
  for (int i = 0; i < 200000; ++i) {
    const float x = from_bits(bits(rng));
    if (!std::isnormal(x) || std::fabs(x) > 3.38e38f) continue;
    const float y = float_from_bf16(bf16_from_float(x));
    const double bound = std::ldexp(std::fabs(static_cast<double>(x)), -8);  // in double: exact
    REQUIRE(std::fabs(static_cast<double>(y) - x) <= bound);
    REQUIRE(bf16_error_bound(x) == bound);
    ++checked;
  }
  REQUIRE(checked > 100000);
  // Subnormals: within 2^-134 absolute.
  for (uint32_t b = 1; b < 0x00800000u; b += 4099) {
    const float x = from_bits(b);
    REQUIRE(std::fabs(static_cast<double>(float_from_bf16(bf16_from_float(x))) - x) <=
            std::ldexp(1.0, -134));
    REQUIRE(bf16_error_bound(x) == std::ldexp(1.0, -134));
  }
}

// The header's bound: (max - min) / 510 + 2^-22 * (|min| + |max|) + 2^-149.
void require_int8_bound(const std::vector<float>& x) {
  const uint32_t n = static_cast<uint32_t>(x.size());
  std::vector<uint8_t> q(n);
  std::vector<float> y(n);
  float scale = 0, offset = 0;
  int8_encode_row(x.data(), n, q.data(), &scale, &offset);
  int8_decode_row(q.data(), n, scale, offset, y.data());
  float lo = x[0], hi = x[0];
  for (const float v : x) lo = std::min(lo, v), hi = std::max(hi, v);
  const double bound = int8_error_bound(lo, hi);
  for (uint32_t i = 0; i < n; ++i) {
    INFO("value " << x[i] << " came back as " << y[i] << ", scale " << scale);
    REQUIRE(std::isfinite(y[i]));
    REQUIRE(std::fabs(static_cast<double>(y[i]) - x[i]) <= bound);
  }
}

TEST_CASE("int8 rows come back within half a step of their range", "[codec]") {
  std::mt19937 rng(11);
  SECTION("trained-like rows") {
    std::normal_distribution<float> d(0.0f, 0.05f);
    for (int r = 0; r < 2000; ++r) {
      std::vector<float> x(64);
      for (float& v : x) v = d(rng);
      require_int8_bound(x);
    }
  }
  SECTION("ranges from subnormal to the largest floats") {
    for (const double spread : {1e-44, 1e-30, 1e-3, 1.0, 1e20, 3e38}) {
      std::uniform_real_distribution<double> d(-spread, spread);
      for (int r = 0; r < 200; ++r) {
        std::vector<float> x(17);
        for (float& v : x) v = static_cast<float>(d(rng));
        require_int8_bound(x);
      }
    }
    require_int8_bound({-FLT_MAX, FLT_MAX, 0.0f, 1.0f});
    require_int8_bound({from_bits(1u), from_bits(2u), 0.0f});
    // A subnormal scale rounded to nearest would leave the maximum a 256th step (codec_fuzz).
    std::vector<float> tiny(48, 0.0f);
    tiny[0] = from_bits(0x2700u);
    require_int8_bound(tiny);
  }
  SECTION("a row of equal values comes back exactly") {
    const std::vector<float> x(9, -3.75f);
    std::vector<uint8_t> q(9);
    std::vector<float> y(9);
    float scale = 1, offset = 0;
    int8_encode_row(x.data(), 9, q.data(), &scale, &offset);
    REQUIRE(scale == 0.0f);
    int8_decode_row(q.data(), 9, scale, offset, y.data());
    REQUIRE(y == x);
  }
}

TEST_CASE("an int8 row holding a NaN or an infinity comes back as all NaN", "[codec]") {
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity()}) {
    const std::vector<float> x = {1.0f, bad, 2.0f};
    std::vector<uint8_t> q(3, 7);
    std::vector<float> y(3);
    float scale = 0, offset = 0;
    int8_encode_row(x.data(), 3, q.data(), &scale, &offset);
    int8_decode_row(q.data(), 3, scale, offset, y.data());
    for (const float v : y) REQUIRE(std::isnan(v));
  }
}

TEST_CASE("the bound checks the tests, the fuzzer and the benchmark share can fail", "[codec]") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  REQUIRE(bf16_within_bound(1.0f, 1.0f + 0x1p-9f));
  REQUIRE_FALSE(bf16_within_bound(1.0f, 1.0f + 0x1p-7f));
  REQUIRE(bf16_within_bound(inf, inf));
  REQUIRE_FALSE(bf16_within_bound(inf, -inf));
  REQUIRE(bf16_within_bound(FLT_MAX, inf));
  REQUIRE_FALSE(bf16_within_bound(3e38f, inf));
  REQUIRE_FALSE(bf16_within_bound(-FLT_MAX, inf));
  REQUIRE(bf16_within_bound(nan, nan));
  REQUIRE_FALSE(bf16_within_bound(nan, 1.0f));
  REQUIRE_FALSE(bf16_within_bound(1.0f, nan));
  const float x[3] = {0.0f, 0.5f, 1.0f};
  const float near[3] = {0.001f, 0.499f, 1.0f}, far[3] = {0.0f, 0.51f, 1.0f};
  REQUIRE(int8_row_within_bound(x, near, 3));
  REQUIRE_FALSE(int8_row_within_bound(x, far, 3));
  const float bad_row[3] = {0.0f, nan, 1.0f}, nans[3] = {nan, nan, nan};
  REQUIRE(int8_row_within_bound(bad_row, nans, 3));
  REQUIRE_FALSE(int8_row_within_bound(bad_row, x, 3));
}

}  // namespace
}  // namespace embstore::row
