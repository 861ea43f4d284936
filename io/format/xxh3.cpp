#include "io/format/xxh3.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(EMBSTORE_XXH3_DISPATCH)
#include <xxh_x86dispatch.h>  // redefines XXH3_64bits and XXH3_64bits_update as *_dispatch
#endif

namespace embstore::io {

#if defined(__x86_64__)
namespace {
// vzeroupper is an AVX instruction: built for AVX in this function only, run only where the CPU
// has it (a CPU without AVX never ran a path that dirties the state).
__attribute__((target("avx"))) void zero_upper_avx() { _mm256_zeroupper(); }
}  // namespace

void clear_vector_upper() {
  static const bool has_avx = __builtin_cpu_supports("avx");
  if (has_avx) zero_upper_avx();
}
#else
void clear_vector_upper() {}
#endif

uint64_t xxh3_64(const void* data, size_t bytes) {
  const uint64_t sum = XXH3_64bits(data, bytes);
  clear_vector_upper();
  return sum;
}

XXH_errorcode xxh3_update(XXH3_state_t* state, const void* data, size_t bytes) {
  const XXH_errorcode r = XXH3_64bits_update(state, data, bytes);
  clear_vector_upper();
  return r;
}

}  // namespace embstore::io
