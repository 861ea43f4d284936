// The host backend's memory (host/backend/host_buffer.hpp): a Prefaulter faulting pages in
// while another thread writes the same pages never changes a byte that thread wrote.
#include "host/backend/host_buffer.hpp"

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr size_t kPage = 4096;

uint8_t pattern(size_t page, size_t round) { return static_cast<uint8_t>(page * 131 + round) | 1; }

}  // namespace

TEST_CASE("a prefault beside a writer of the same pages keeps every byte written",
          "[table][host_buffer]") {
  if (!embstore::HostBuffer::can_populate()) {
    WARN("this kernel has no MADV_POPULATE_WRITE: the Prefaulter does not run");
    embstore::Prefaulter p;
    REQUIRE_FALSE(p.start({}));
    return;
  }
  for (size_t round = 0; round < 4; ++round) {
    INFO("round " << round);
    embstore::HostBuffer buffer(size_t{64} << 20);
    char* data = buffer.as<char>();
    const size_t pages = buffer.bytes() / kPage;
    embstore::Prefaulter prefaulter;
    // The prefault runs forward from the first page, the writer backward from the last: they
    // cross, so each finds pages the other touched first.
    REQUIRE(prefaulter.start({{data, buffer.bytes()}}));
    for (size_t p = pages; p-- > 0;) {
      std::memset(data + p * kPage, pattern(p, round), kPage);
    }
    prefaulter.stop();
    size_t wrong = 0;
    for (size_t p = 0; p < pages; ++p) {
      for (size_t b = 0; b < kPage; b += 512)
        wrong += data[p * kPage + b] != char(pattern(p, round));
    }
    REQUIRE(wrong == 0);
  }
}

TEST_CASE("a Prefaulter stopped early, or restarted, leaves its memory usable",
          "[table][host_buffer]") {
  embstore::HostBuffer buffer(size_t{32} << 20);
  char* data = buffer.as<char>();
  {
    embstore::Prefaulter prefaulter;
    prefaulter.start({{data, buffer.bytes()}});
    prefaulter.start({{data, buffer.bytes() / 2}});  // stops the first run, then starts again
  }                                                  // the destructor stops and joins
  std::memset(data, 7, buffer.bytes());
  REQUIRE(data[0] == 7);
  REQUIRE(data[buffer.bytes() - 1] == 7);
}
