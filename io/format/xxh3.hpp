#pragma once

// XXH3, the checksum of every file, block and manifest of the checkpoint format, through two
// calls that every hash of the project goes by. Where libxxhash has its x86 dispatcher
// (EMBSTORE_XXH3_DISPATCH, from CMake's check; Debian's library has it), they hash with the
// widest SIMD the CPU has, chosen at run time: the library's plain entry points are built for the
// x86-64 baseline (SSE2). Identical hashes; a restore hashes every block twice (the block's
// payload, then the whole file), which this makes cheaper (docs/DESIGN.md, "Restore").
//
// libxxhash 0.8.1's AVX-512 path (inputs over 240 bytes) returns with the upper halves of the
// vector registers still in use (no vzeroupper): every SSE instruction the thread runs after
// that pays for a false dependency on them, and code built for the baseline ran slower on the
// development VM's Xeon (a Zipf sampler's maths 10 times, Python float code 3 times), the
// thread's children included, which inherit the state. These calls clear the upper halves before
// they return, so that no thread of a trainer is left in that state.
#include <xxhash.h>

#include <cstddef>
#include <cstdint>

namespace embstore::io {

// XXH3_64bits of [data, data + bytes).
uint64_t xxh3_64(const void* data, size_t bytes);

// XXH3_64bits_update: hashes [data, data + bytes) into a streamed hash (XXH3_64bits_reset,
// XXH3_64bits_digest). XXH_OK, or XXH_ERROR.
XXH_errorcode xxh3_update(XXH3_state_t* state, const void* data, size_t bytes);

// Marks the upper halves of the thread's vector registers unused (vzeroupper), where the CPU has
// AVX; nothing elsewhere. What the calls above end with (the tests set a clean state with it).
void clear_vector_upper();

}  // namespace embstore::io
