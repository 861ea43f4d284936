// Lossy row codecs of checkpointed rows (issue 35): the per-value and per-row arithmetic of bf16
// and int8, which the host's writers and readers run and the CUDA backend's staging can run as
// they are. The lossless codec (a byte shuffle, then zstd) has no per-row part: io/codec.
//
// bf16: a float's top 16 bits, rounded to nearest, ties to even. A finite normal value comes
// back within a relative 2^-8 of itself (half a unit in the last of bf16's 8 significant
// bits); a subnormal within 2^-134 absolute; a value that rounds past bf16's largest finite
// (about 3.39e38) becomes an infinity of its sign; infinities stay; a NaN stays a NaN (quiet).
//
// int8 (FBGEMM's fused 8-bit rows): a row of n values becomes n bytes and two floats, offset =
// the row's minimum and scale = (maximum - minimum) / 255, q = the nearest integer to
// (x - offset) / scale, scale rounded up to a float; decoded, offset + scale * q. Each value
// comes back within half a step of itself: |decoded - x| <= (maximum - minimum) / 510 +
// 2^-22 * (|minimum| + |maximum|) + 2^-149 (the last two terms: the float rounding of the scale
// and of the result, and a subnormal scale's coarser one). A row whose values are all equal
// comes back exactly. A row holding a NaN or an infinity comes back as all NaN: 8 bits a value
// cannot hold it, and NaNs say so where a finite value would be silently wrong.
//
// Arithmetic is in double, IEEE-exact operations only, so host and device give the same bytes.
#pragma once

#include <cstdint>

#include "cuda/row/hd.h"

namespace embstore::row {

constexpr uint32_t kFloatExponentMask = 0x7f800000u;

EMBSTORE_HD bool is_finite_bits(uint32_t bits) {
  return (bits & kFloatExponentMask) != kFloatExponentMask;
}

// The minimum and maximum of x[0..n) (n >= 1); whether every value is finite.
// Four lanes of minimum and maximum, merged at the end, so that the scan does not wait on one
// comparison after another (it is a third of int8's encoding). A NaN leaves a lane's extremes
// wherever it falls; the row is then not finite and its extremes unused.
EMBSTORE_HD bool row_extent(const float* x, uint32_t n, float* lo, float* hi) {
  float l[4] = {x[0], x[0], x[0], x[0]}, h[4] = {x[0], x[0], x[0], x[0]};
  uint32_t non_finite = 0;
  uint32_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (uint32_t k = 0; k < 4; ++k) {
      const float v = x[i + k];
      non_finite |= static_cast<uint32_t>(!is_finite_bits(bit_cast<uint32_t>(v)));
      l[k] = v < l[k] ? v : l[k];
      h[k] = v > h[k] ? v : h[k];
    }
  }
  for (; i < n; ++i) {
    non_finite |= static_cast<uint32_t>(!is_finite_bits(bit_cast<uint32_t>(x[i])));
    l[0] = x[i] < l[0] ? x[i] : l[0];
    h[0] = x[i] > h[0] ? x[i] : h[0];
  }
  for (uint32_t k = 1; k < 4; ++k) {
    l[0] = l[k] < l[0] ? l[k] : l[0];
    h[0] = h[k] > h[0] ? h[k] : h[0];
  }
  // One scan in order keeps the first of equal extremes; equal floats have the same bits but
  // for the zeros, so an extreme of zero takes the sign of the row's first zero, as that scan
  // gave it (the stored offset's bytes stay those of every earlier encoder).
  if (l[0] == 0 || h[0] == 0) {
    for (uint32_t j = 0; j < n; ++j) {
      if (x[j] == 0) {
        if (l[0] == 0) l[0] = x[j];
        if (h[0] == 0) h[0] = x[j];
        break;
      }
    }
  }
  *lo = l[0];
  *hi = h[0];
  return non_finite == 0;
}

EMBSTORE_HD uint16_t bf16_from_float(float x) {
  const uint32_t bits = bit_cast<uint32_t>(x);
  if ((bits & 0x7fffffffu) > kFloatExponentMask) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // NaN: sign and payload kept, quiet
  }
  // Round to nearest even on the 16 bits dropped; a carry into the exponent is the right
  // rounding too (up to the next binade, or to infinity past the largest finite).
  const uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

EMBSTORE_HD float float_from_bf16(uint16_t b) { return bit_cast<float>(uint32_t{b} << 16); }

// The bounds above, as numbers, for the tests and the benchmark that check them.
// bf16: the largest |decoded - x| for a finite x that does not round past bf16's largest.
EMBSTORE_HD double bf16_error_bound(float x) {
  const uint32_t exponent = bit_cast<uint32_t>(x) & kFloatExponentMask;
  const double magnitude = x < 0 ? -static_cast<double>(x) : static_cast<double>(x);
  return exponent != 0 ? magnitude * 0x1p-8 : 0x1p-134;
}
// int8: the largest |decoded - x| for the values of a finite row with minimum lo, maximum hi.
EMBSTORE_HD double int8_error_bound(float lo, float hi) {
  const double a = lo < 0 ? -static_cast<double>(lo) : lo,
               b = hi < 0 ? -static_cast<double>(hi) : hi;
  return (static_cast<double>(hi) - lo) / 510 + (a + b) * 0x1p-22 + 0x1p-149;
}

// Whether y is what bf16 may give back for x: a NaN for a NaN, the same infinity for an
// infinity, an infinity only from beyond bf16's largest finite's halfway point, else within
// bf16_error_bound(x).
EMBSTORE_HD bool bf16_within_bound(float x, float y) {
  const uint32_t xb = bit_cast<uint32_t>(x), yb = bit_cast<uint32_t>(y);
  if ((xb & 0x7fffffffu) > kFloatExponentMask) return (yb & 0x7fffffffu) > kFloatExponentMask;
  if (!is_finite_bits(xb)) return yb == xb;
  if (!is_finite_bits(yb))
    return (yb & 0x7fffffffu) == kFloatExponentMask && (xb & 0x7fffffffu) >= 0x7f7f8000u &&
           (xb >> 31) == (yb >> 31);
  const double d = static_cast<double>(y) - static_cast<double>(x);
  return (d < 0 ? -d : d) <= bf16_error_bound(x);
}

// Whether y[0..n) is what int8 may give back for the row x[0..n) (n >= 1): all NaN for a row
// holding a non-finite value, else each within int8_error_bound of the row's range.
EMBSTORE_HD bool int8_row_within_bound(const float* x, const float* y, uint32_t n) {
  float lo = 0, hi = 0;
  const bool finite = row_extent(x, n, &lo, &hi);
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t yb = bit_cast<uint32_t>(y[i]);
    if (!finite) {
      if ((yb & 0x7fffffffu) <= kFloatExponentMask) return false;
      continue;
    }
    const double d = static_cast<double>(y[i]) - static_cast<double>(x[i]);
    if (!((d < 0 ? -d : d) <= int8_error_bound(lo, hi))) return false;
  }
  return true;
}

// Nearest integer of v in [0, 2^31 - 1), ties away from zero: floor(v + 0.5), exactly, as a
// truncating conversion (truncation is floor for a non-negative value). int8 meets values below
// 256. Not std::floor: without SSE4.1 that is a libm call a value, and the encoder loop then does
// not vectorize (300 MB/s against 1.4 GB/s).
EMBSTORE_HD int32_t round_half_up(double v) { return static_cast<int32_t>(v + 0.5); }

// The scale and offset of a row of n values (n >= 1) under int8. Non-finite values: both NaN.
EMBSTORE_HD void int8_row_range(const float* x, uint32_t n, float* scale, float* offset) {
  float lo = 0, hi = 0;
  const bool finite = row_extent(x, n, &lo, &hi);
  if (!finite) {
    *scale = bit_cast<float>(0x7fc00000u);
    *offset = *scale;
    return;
  }
  const double range = static_cast<double>(hi) - static_cast<double>(lo);  // exact enough
  float s = static_cast<float>(range / 255.0);
  // Rounded up, so that 255 steps cover the range and no value needs a 256th: a float's
  // rounding (coarse for a subnormal scale) must not cost more than half a step.
  if (static_cast<double>(s) * 255.0 < range) s = bit_cast<float>(bit_cast<uint32_t>(s) + 1u);
  *scale = s;
  *offset = lo;
}

// Encodes row x[0..n) into q[0..n), *scale and *offset.
EMBSTORE_HD void int8_encode_row(const float* x, uint32_t n, uint8_t* q, float* scale,
                                 float* offset) {
  int8_row_range(x, n, scale, offset);
  const double s = *scale, o = *offset;
  if (!(s > 0)) {  // all values equal (scale 0), or not finite (NaN)
    for (uint32_t i = 0; i < n; ++i) q[i] = 0;
    return;
  }
  for (uint32_t i = 0; i < n; ++i) {
    // x >= lo = o and s * 255 >= hi - lo: the quotient is in [0, 255] up to rounding; the
    // clamp before the conversion keeps it defined whatever the rounding.
    double v = (static_cast<double>(x[i]) - o) / s;
    v = v > 255 ? 255 : v;  // one select each: both vectorize (maxpd, minpd)
    v = v < 0 ? 0 : v;
    q[i] = static_cast<uint8_t>(round_half_up(v));
  }
}

EMBSTORE_HD void int8_decode_row(const uint8_t* q, uint32_t n, float scale, float offset,
                                 float* x) {
  // The largest float: a row reaching it may get a scale rounded up, whose last step lands a
  // hair beyond; that is the row's maximum, not an infinity. (A NaN passes both tests.)
  constexpr double kMax = 3.4028234663852886e38;
  const double s = scale, o = offset;
  for (uint32_t i = 0; i < n; ++i) {
    double v = o + s * static_cast<double>(q[i]);
    v = v > kMax ? kMax : v;  // one select each, so that the loop vectorizes
    v = v < -kMax ? -kMax : v;
    x[i] = static_cast<float>(v);
  }
}

}  // namespace embstore::row
