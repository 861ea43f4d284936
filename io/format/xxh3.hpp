#pragma once

// XXH3, the checksum of every file, block and manifest of the checkpoint format. Where
// libxxhash has its x86 dispatcher (EMBSTORE_XXH3_DISPATCH, from CMake's check; Debian's library
// has it), the calls below go to the same hash built for the widest SIMD the CPU has, chosen at
// run time: the library's plain entry points are built for the x86-64 baseline (SSE2). Identical
// hashes; a restore hashes every block twice (the block's payload, then the whole file), which
// this makes cheaper (docs/DESIGN.md, "Restore", has the figures).
#include <xxhash.h>

#if defined(EMBSTORE_XXH3_DISPATCH)
#include <xxh_x86dispatch.h>  // redefines XXH3_64bits, XXH3_64bits_update, ... as *_dispatch
#endif
