// Portable per-row logic: every header in cuda/row/ compiles under nvcc (functions become
// __host__ __device__) and under the host compiler (plain inline), so the host backend and
// the tests run exactly the code the GPU kernels run.
//
// Floating point: both builds disable multiply-add contraction (nvcc --fmad=false, host
// -ffp-contract=off) and use only IEEE-exact operations (+ - * / sqrt), so a row computed on
// either backend is bit-identical.
#pragma once

#include <cstdint>
#include <cstring>

#if !defined(__CUDACC__)
#include <cmath>
#endif

#if defined(__CUDACC__)
#define EMBSTORE_HD __host__ __device__ __forceinline__
#else
#define EMBSTORE_HD inline
#endif

namespace embstore::row {

template <typename To, typename From>
EMBSTORE_HD To bit_cast(From from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  memcpy(&to, &from, sizeof(To));
  return to;
}

// Relaxed atomic OR on a 64-bit word: device atomicOr, host __atomic builtin.
EMBSTORE_HD void atomic_or(uint64_t* word, uint64_t bits) {
#if defined(__CUDA_ARCH__)
  atomicOr(reinterpret_cast<unsigned long long*>(word), static_cast<unsigned long long>(bits));
#else
  __atomic_fetch_or(word, bits, __ATOMIC_RELAXED);
#endif
}

// Relaxed atomic read of a word that other threads change.
EMBSTORE_HD uint64_t atomic_load(const uint64_t* word) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const volatile unsigned long long*>(word);
#else
  return __atomic_load_n(word, __ATOMIC_RELAXED);
#endif
}

// Atomic AND; returns the word before the AND. Relaxed on the device; sequentially consistent
// on the host, whose drain takes captured rows while training calls run
// (host_table_snapshot.cpp).
EMBSTORE_HD uint64_t atomic_and(uint64_t* word, uint64_t bits) {
#if defined(__CUDA_ARCH__)
  return atomicAnd(reinterpret_cast<unsigned long long*>(word),
                   static_cast<unsigned long long>(bits));
#else
  return __atomic_fetch_and(word, bits, __ATOMIC_SEQ_CST);
#endif
}

EMBSTORE_HD int popcount64(uint64_t x) {
#if defined(__CUDA_ARCH__)
  return __popcll(x);
#else
  return __builtin_popcountll(x);
#endif
}

// Correctly rounded square root on both sides (nvcc keeps -prec-sqrt=true by default).
EMBSTORE_HD float sqrt_rn(float x) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}

// Index of the most significant set bit; x must be non-zero.
EMBSTORE_HD int msb64(uint64_t x) {
#if defined(__CUDA_ARCH__)
  return 63 - __clzll(static_cast<long long>(x));
#else
  return 63 - __builtin_clzll(x);
#endif
}

}  // namespace embstore::row
