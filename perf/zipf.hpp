// Zipf-distributed key streams: the skew of real feature ids (a few hot rows, a long cold
// tail) without a table of key_space probabilities.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "cuda/row/hash.h"

namespace embstore::perf {

// A bijection on 64 bits (the index's own hash), so distinct ranks stay distinct keys and hot
// ranks are scattered over the int64 range instead of being adjacent integers.
inline uint64_t scramble64(uint64_t x) { return row::mix64(x); }

// The key of rank k (1-based).
inline int64_t key_of_rank(uint64_t rank) { return static_cast<int64_t>(scramble64(rank)); }

// splitmix64 generator: small, fast, and reproducible on every platform (unlike the
// distributions of <random>, whose outputs are implementation-defined).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ull;
    return scramble64(state_);
  }
  // Uniform in [0, 1) with 53 random bits.
  double next_unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

// Exact sampler of P(k) ~ k^-s over k in [1, n], s > 0, by rejection-inversion
// (W. Hormann, G. Derflinger, "Rejection-inversion to generate variates from monotone
// discrete distributions", ACM TOMACS 6(3), 1996), as in Apache Commons RNG. O(1) memory and
// about 1.1 uniform draws per sample for any n.
class ZipfSampler {
 public:
  ZipfSampler(uint64_t n, double s) : n_(n), s_(s) {
    if (n == 0) throw std::invalid_argument("zipf: key space must be >= 1");
    if (!(s > 0.0) || !std::isfinite(s)) throw std::invalid_argument("zipf: exponent must be > 0");
    h_integral_x1_ = h_integral(1.5) - 1.0;
    h_integral_n_ = h_integral(static_cast<double>(n) + 0.5);
    squeeze_ = 2.0 - h_integral_inverse(h_integral(2.5) - h(2.0));
  }

  uint64_t operator()(SplitMix64& rng) const {
    for (;;) {
      // u is uniform in (h_integral_x1_, h_integral_n_]; inverting H gives a continuous x
      // whose density dominates the pmf; k is x rounded.
      const double u = h_integral_n_ + rng.next_unit() * (h_integral_x1_ - h_integral_n_);
      const double x = h_integral_inverse(u);
      double kd = std::floor(x + 0.5);
      if (kd < 1.0) kd = 1.0;
      if (kd > static_cast<double>(n_)) kd = static_cast<double>(n_);
      // Squeeze first (cheap, accepts most draws), then the exact acceptance test.
      if (kd - x <= squeeze_ || u >= h_integral(kd + 0.5) - h(kd)) {
        return static_cast<uint64_t>(kd);
      }
    }
  }

 private:
  // h(x) = x^-s; H(x) = integral of h, written as (x^(1-s) - 1) / (1 - s) in a form that is
  // stable at s = 1 (log x).
  double h(double x) const { return std::exp(-s_ * std::log(x)); }
  double h_integral(double x) const {
    const double log_x = std::log(x);
    return expm1_over_x((1.0 - s_) * log_x) * log_x;
  }
  double h_integral_inverse(double x) const {
    double t = x * (1.0 - s_);
    if (t < -1.0) t = -1.0;  // rounding can leave the domain of log1p
    return std::exp(log1p_over_x(t) * x);
  }
  static double log1p_over_x(double x) {
    if (std::abs(x) > 1e-8) return std::log1p(x) / x;
    return 1.0 - x * (0.5 - x * (1.0 / 3.0 - x * 0.25));
  }
  static double expm1_over_x(double x) {
    if (std::abs(x) > 1e-8) return std::expm1(x) / x;
    return 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + x * 0.25));
  }

  uint64_t n_;
  double s_;
  double h_integral_x1_, h_integral_n_, squeeze_;
};

// An endless stream of keys: Zipf(s) ranks over [1, key_space] (s > 0), or uniform ranks (s = 0),
// mapped through key_of_rank. Deterministic in seed; drawn as needed, so a long stream costs no
// memory (the vectors below hold the same keys).
class KeyStream {
 public:
  KeyStream(uint64_t key_space, double s, uint64_t seed)
      : key_space_(checked_key_space(key_space)),
        zipf_(s > 0 ? key_space : 1, s > 0 && std::isfinite(s) ? s : 1.0),
        uniform_(s == 0),
        rng_(seed) {
    if (!(s >= 0) || !std::isfinite(s)) {
      throw std::invalid_argument("key stream: the exponent must be > 0, or 0 for uniform keys");
    }
  }
  void fill(int64_t* out, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = key_of_rank(uniform_ ? uniform_rank() : zipf_(rng_));
  }

 private:
  static uint64_t checked_key_space(uint64_t key_space) {
    if (key_space == 0) throw std::invalid_argument("key stream: key space must be >= 1");
    return key_space;
  }
  uint64_t uniform_rank() {
    const uint64_t rank =
        1 + static_cast<uint64_t>(rng_.next_unit() * static_cast<double>(key_space_));
    return std::min(rank, key_space_);
  }
  uint64_t key_space_;
  ZipfSampler zipf_;
  bool uniform_;
  SplitMix64 rng_;
};

// n keys: Zipf(s) ranks over [1, key_space] mapped through key_of_rank. Deterministic in seed.
inline std::vector<int64_t> zipf_key_stream(size_t n, uint64_t key_space, double s, uint64_t seed) {
  if (!(s > 0.0)) throw std::invalid_argument("zipf: exponent must be > 0");
  std::vector<int64_t> keys(n);
  KeyStream(key_space, s, seed).fill(keys.data(), n);
  return keys;
}

// n keys: ranks uniform over [1, key_space], mapped through key_of_rank. Deterministic in seed.
inline std::vector<int64_t> uniform_key_stream(size_t n, uint64_t key_space, uint64_t seed) {
  std::vector<int64_t> keys(n);
  KeyStream(key_space, 0, seed).fill(keys.data(), n);
  return keys;
}

}  // namespace embstore::perf
