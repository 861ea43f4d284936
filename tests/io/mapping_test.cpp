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
#include <string>
#include <vector>

#include "io/engine/file_reader.hpp"
#include "tests/io/io_fixtures.hpp"

using embstore::io::Mapping;

namespace {

constexpr size_t kHuge = Mapping::kHugePage;

// Whether this kernel has transparent huge pages at all (MADV_HUGEPAGE is refused without).
bool kernel_has_thp() {
  return std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good();
}

// The "VmFlags:" line of the mapping that starts at addr in /proc/self/smaps; "" when no
// mapping starts there.
std::string vm_flags_at(const void* addr) {
  std::ifstream smaps("/proc/self/smaps");
  char start[32];
  std::snprintf(start, sizeof start, "%lx-",
                static_cast<unsigned long>(reinterpret_cast<uintptr_t>(addr)));
  std::string line;
  bool in = false;
  while (std::getline(smaps, line)) {
    // A mapping's line starts "from-to " in hex; its fields ("Size:", "VmFlags:") follow.
    const std::string first = line.substr(0, line.find(' '));
    const size_t dash = first.find('-');
    const bool header = dash != std::string::npos && dash > 0 &&
                        first.find_first_not_of("0123456789abcdef-") == std::string::npos;
    if (header) {
      in = line.rfind(start, 0) == 0;
    } else if (in && line.rfind("VmFlags:", 0) == 0) {
      return line + " ";
    }
  }
  return "";
}

bool mapped_at(const void* addr) { return !vm_flags_at(addr).empty(); }

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
    // The trimmed mapping is its own VMA starting at data(), advised onto huge pages ("hg",
    // set by MADV_HUGEPAGE whatever the system-wide THP mode).
    const std::string flags = vm_flags_at(m.data());
    INFO(flags);
    REQUIRE_FALSE(flags.empty());
    if (kernel_has_thp()) {
      CHECK(flags.find(" hg ") != std::string::npos);
    } else {
      WARN("this kernel has no transparent huge pages: the advice is not checked");
    }
  }
}

TEST_CASE("the trim keeps whole huge pages from the first 2 MiB boundary, whatever mmap returned",
          "[io][mapping]") {
  const size_t rounded = 3 * kHuge, mapped = rounded + kHuge;
  for (const uintptr_t off : {uintptr_t{0}, uintptr_t{4096}, uintptr_t{kHuge - 4096}}) {
    INFO("base at 2 MiB x 100 + " << off);
    const uintptr_t base = 100 * kHuge + off;
    const Mapping::Trim t = Mapping::trim(base, mapped, rounded);
    CHECK(t.start % kHuge == 0);
    CHECK(t.start >= base);
    CHECK(t.start - base == t.head);
    CHECK(t.head < kHuge);
    CHECK(t.head + rounded + t.tail == mapped);  // nothing unmapped twice, nothing left over
    CHECK(t.start == (off == 0 ? base : 101 * kHuge));
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
  // The largest size the guard lets through reaches mmap, which has no such address space.
  CHECK(Mapping::map(SIZE_MAX - 2 * kHuge, &kept) == -ENOMEM);
  CHECK(Mapping::map(SIZE_MAX - 2 * kHuge + 1, &kept) == -ENOMEM);
  CHECK(Mapping::map(size_t{1} << 62, &kept) == -ENOMEM);
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
  // Into a target holding a mapping: that one is unmapped, the source left empty.
  Mapping c;
  REQUIRE(Mapping::map(kHuge, &c) == 0);
  void* const old = c.data();
  REQUIRE(mapped_at(old));
  c = std::move(b);
  CHECK_FALSE(mapped_at(old));
  CHECK(b.data() == nullptr);
  CHECK(b.bytes() == 0);
  CHECK(c.data() == data);
  CHECK(c.bytes() == bytes);
  Mapping& same = c;
  c = std::move(same);  // self-move keeps the mapping
  CHECK(c.data() == data);
  CHECK(mapped_at(data));
  static_cast<char*>(c.data())[bytes - 1] = 7;
  c.reset();
  CHECK(c.data() == nullptr);
  CHECK(c.bytes() == 0);
  CHECK_FALSE(mapped_at(data));
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
