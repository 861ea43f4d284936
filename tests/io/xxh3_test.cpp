// The project's XXH3 (io/format/xxh3.hpp): the library's hashes, and the calling thread's vector
// registers left as it found them.
#include "io/format/xxh3.hpp"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "tests/support/vector_state.hpp"

namespace {

std::vector<unsigned char> pattern(size_t n) {
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>(i * 131 + 7);
  return v;
}

// Short inputs, the boundaries of XXH3's paths (16, 128, 240 bytes; a 1 KiB stripe block) and
// long ones, which take the dispatcher's SIMD path.
const size_t kLengths[] = {0, 1, 16, 17, 128, 129, 240, 241, 1024, 1025, 4096, 100000, 1 << 20};

}  // namespace

TEST_CASE("xxh3: one call and a streamed hash give the library's plain XXH3", "[io][xxh3]") {
  for (const size_t n : kLengths) {
    const std::vector<unsigned char> data = pattern(n);
    const uint64_t want = XXH3_64bits(data.data(), n);  // the baseline build, no dispatcher
    CAPTURE(n);
    CHECK(embstore::io::xxh3_64(data.data(), n) == want);
    XXH3_state_t* state = XXH3_createState();
    REQUIRE(state != nullptr);
    REQUIRE(XXH3_64bits_reset(state) == XXH_OK);
    // In uneven pieces, so that the stream's internal buffer is crossed.
    size_t at = 0;
    for (size_t piece = 1; at < n; piece = piece * 3 + 1) {
      const size_t take = std::min(piece, n - at);
      REQUIRE(embstore::io::xxh3_update(state, data.data() + at, take) == XXH_OK);
      at += take;
    }
    CHECK(XXH3_64bits_digest(state) == want);
    XXH3_freeState(state);
  }
}

TEST_CASE("xxh3: a hash leaves the thread's vector registers' upper halves unused", "[io][xxh3]") {
  if (!embstore_test::vector_upper_in_use().has_value()) {
    WARN("this CPU cannot tell (no XGETBV with ECX = 1): nothing checked");
    return;
  }
  XXH3_state_t* state = XXH3_createState();
  REQUIRE(state != nullptr);
  REQUIRE(XXH3_64bits_reset(state) == XXH_OK);
  for (const size_t n : kLengths) {
    const std::vector<unsigned char> data = pattern(n);
    CAPTURE(n);
    embstore::io::clear_vector_upper();
    REQUIRE_FALSE(*embstore_test::vector_upper_in_use());
    (void)embstore::io::xxh3_64(data.data(), n);
    CHECK_FALSE(*embstore_test::vector_upper_in_use());
    embstore::io::clear_vector_upper();
    REQUIRE(embstore::io::xxh3_update(state, data.data(), n) == XXH_OK);
    CHECK_FALSE(*embstore_test::vector_upper_in_use());
  }
  XXH3_freeState(state);
}
