// Whether a thread's vector registers have their upper halves in use (x86-64): a library that
// leaves them so (AVX code returning without vzeroupper) makes every SSE instruction the thread
// runs afterwards pay a false dependency on them, so the caller's own code, built for the
// baseline, runs many times slower. Tests check that embstore's calls leave them clear, having
// cleared them first with embstore::io::clear_vector_upper (io/format/xxh3.hpp).
#pragma once

#include <cstdint>
#include <optional>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace embstore_test {

#if defined(__x86_64__)
namespace detail {
// XGETBV with ECX = 1 reads XINUSE, the state components in use: the OS enabled XSAVE
// (CPUID.1:ECX.OSXSAVE) and the CPU has that form (CPUID.(EAX=0DH,ECX=1):EAX[2]).
inline bool has_xinuse() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0 || (c & (1u << 27)) == 0) return false;
  if (__get_cpuid_count(0xD, 1, &a, &b, &c, &d) == 0) return false;
  return (a & (1u << 2)) != 0;
}
}  // namespace detail

// Whether the upper halves of YMM0-15 (XINUSE bit 2) or of ZMM0-15 (bit 6) are in use on this
// thread; nullopt where the CPU cannot tell.
inline std::optional<bool> vector_upper_in_use() {
  static const bool can_tell = detail::has_xinuse();
  if (!can_tell) return std::nullopt;
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(1));
  return (eax & ((1u << 2) | (1u << 6))) != 0;
}
#else
inline std::optional<bool> vector_upper_in_use() { return std::nullopt; }
#endif

}  // namespace embstore_test
