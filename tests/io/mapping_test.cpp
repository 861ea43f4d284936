// io::Mapping (io/engine/mapping.hpp), the memory of the engine's staging buffers and of the host
// backend's tables: sizes, alignment, the huge-page advice, failures; and the staging buffers a
// reader hands out lying on huge-page boundaries.
#include "io/engine/mapping.hpp"

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "io/engine/file_reader.hpp"
#include "tests/io/io_fixtures.hpp"

using embstore::io::Mapping;

namespace {

constexpr size_t kHuge = Mapping::kHugePage;

// Whether the kernel would put an madvise(MADV_HUGEPAGE) mapping on huge pages at all.
bool thp_possible() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  return std::getline(f, line) && line.find("[never]") == std::string::npos;
}

// The "THPeligible:" field of the mapping that starts at addr in /proc/self/smaps, or -1.
int thp_eligible(const void* addr) {
  std::ifstream smaps("/proc/self/smaps");
  char start[32];
  std::snprintf(start, sizeof start, "%lx-",
                static_cast<unsigned long>(reinterpret_cast<uintptr_t>(addr)));
  std::string line;
  bool in = false;
  while (std::getline(smaps, line)) {
    // A mapping's line starts "from-to " in hex; its fields ("Size:", "THPeligible:") follow.
    const std::string first = line.substr(0, line.find(' '));
    const size_t dash = first.find('-');
    const bool header = dash != std::string::npos && dash > 0 &&
                        first.find_first_not_of("0123456789abcdef-") == std::string::npos;
    if (header) {
      in = line.rfind(start, 0) == 0;
    } else if (in && line.rfind("THPeligible:", 0) == 0) {
      return std::stoi(line.substr(std::strlen("THPeligible:")));
    }
  }
  return -1;
}

}  // namespace

TEST_CASE("a mapping below a huge page is the size asked, zeroed and writable", "[io][mapping]") {
  for (const size_t bytes : {size_t{1}, size_t{4096}, size_t{100000}, kHuge - 1}) {
    INFO(bytes << " bytes");
    Mapping m;
    REQUIRE(Mapping::map(bytes, &m) == 0);
    REQUIRE(m.data() != nullptr);
    CHECK(m.bytes() == bytes);
    CHECK(reinterpret_cast<uintptr_t>(m.data()) % 4096 == 0);
    auto* p = static_cast<unsigned char*>(m.data());
    CHECK(p[0] == 0);
    CHECK(p[bytes - 1] == 0);
    std::memset(p, 0xA5, bytes);
    CHECK(p[bytes - 1] == 0xA5);
  }
}

TEST_CASE("a mapping of a huge page or more is 2 MiB-aligned, whole huge pages, advised onto them",
          "[io][mapping]") {
  for (const size_t bytes : {kHuge, kHuge + 1, 3 * kHuge + 4096, size_t{64} << 20}) {
    INFO(bytes << " bytes");
    Mapping m;
    REQUIRE(Mapping::map(bytes, &m) == 0);
    CHECK(reinterpret_cast<uintptr_t>(m.data()) % kHuge == 0);
    CHECK(m.bytes() % kHuge == 0);
    CHECK(m.bytes() >= bytes);
    CHECK(m.bytes() < bytes + kHuge);
    auto* p = static_cast<unsigned char*>(m.data());
    p[0] = 1;
    p[m.bytes() - 1] = 2;  // the whole rounded size is usable
    CHECK((p[0] == 1 && p[m.bytes() - 1] == 2));
    if (thp_possible()) {
      // The trimmed mapping is its own VMA starting at data(), eligible for huge pages (with
      // THP in "madvise" mode only through the advice).
      CHECK(thp_eligible(m.data()) == 1);
    } else {
      WARN("transparent huge pages are off on this machine: the advice is not checked");
    }
  }
}

TEST_CASE("a mapping that cannot be made fails with -ENOMEM and leaves the target as it was",
          "[io][mapping]") {
  Mapping kept;
  REQUIRE(Mapping::map(4096, &kept) == 0);
  void* const before = kept.data();
  CHECK(Mapping::map(0, &kept) == -ENOMEM);
  CHECK(Mapping::map(SIZE_MAX, &kept) == -ENOMEM);
  CHECK(Mapping::map(SIZE_MAX - kHuge, &kept) == -ENOMEM);
  CHECK(Mapping::map(size_t{1} << 62, &kept) == -ENOMEM);  // more address space than there is
  CHECK(kept.data() == before);
  CHECK(kept.bytes() == 4096);
}

TEST_CASE("a mapping moves, and reset() unmaps it", "[io][mapping]") {
  Mapping a;
  REQUIRE(Mapping::map(3 * kHuge, &a) == 0);
  void* const data = a.data();
  const size_t bytes = a.bytes();
  Mapping b(std::move(a));
  CHECK(a.data() == nullptr);
  CHECK(a.bytes() == 0);
  CHECK(b.data() == data);
  CHECK(b.bytes() == bytes);
  Mapping c;
  c = std::move(b);
  CHECK(c.data() == data);
  static_cast<char*>(c.data())[bytes - 1] = 7;
  c.reset();
  CHECK(c.data() == nullptr);
  CHECK(c.bytes() == 0);
  CHECK(thp_eligible(data) == -1);  // no mapping starts there any more
}

TEST_CASE("a reader's staging buffers of whole huge pages start on huge-page boundaries",
          "[io][mapping]") {
  embstore_test::TempDir dir;
  const std::string path = dir.path() + "/data";
  std::vector<char> data(3 * kHuge + 12345);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + 1);
  {
    std::ofstream out(path, std::ios::binary);
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
  }
  embstore::io::ReaderOptions options;
  options.queue_depth = 2;
  options.buffer_bytes = kHuge;
  std::unique_ptr<embstore::io::FileReader> reader;
  REQUIRE(embstore::io::FileReader::open(path, options, &reader) == 0);
  size_t at = 0;
  const void* chunk = nullptr;
  size_t n = 0;
  while (reader->next(&chunk, &n) == 0 && n > 0) {
    CHECK(reinterpret_cast<uintptr_t>(chunk) % kHuge == 0);
    REQUIRE(at + n <= data.size());
    CHECK(std::memcmp(chunk, data.data() + at, n) == 0);
    at += n;
  }
  CHECK(at == data.size());
}
