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

TEST_CASE("a Prefaulter restarted or destroyed mid-run leaves the bytes written before",
          "[table][host_buffer]") {
  embstore::HostBuffer buffer(size_t{32} << 20);
  char* data = buffer.as<char>();
  const size_t pages = buffer.bytes() / kPage;
  for (size_t p = 0; p < pages; p += 3) data[p * kPage] = static_cast<char>(pattern(p, 9));
  {
    embstore::Prefaulter prefaulter;
    REQUIRE(prefaulter.start({{data, buffer.bytes()}}) == embstore::HostBuffer::can_populate());
    // Stops the first run, then starts again over half.
    REQUIRE(prefaulter.start({{data, buffer.bytes() / 2}}) == embstore::HostBuffer::can_populate());
  }  // the destructor stops and joins
  size_t wrong = 0;
  for (size_t p = 0; p < pages; ++p) {
    wrong += data[p * kPage] != (p % 3 == 0 ? static_cast<char>(pattern(p, 9)) : 0);
  }
  REQUIRE(wrong == 0);
}
