// The spill file a restore parks replaced tables in (host/table/spill_file.hpp): what is
// appended reads back, misaligned input is refused, and a missing directory is an error.
#include "host/table/spill_file.hpp"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "tests/io/io_fixtures.hpp"

namespace {

struct AlignedBytes {
  explicit AlignedBytes(size_t n)
      : data(static_cast<unsigned char*>(std::aligned_alloc(embstore::SpillFile::kAlignment, n))),
        size(n) {}
  ~AlignedBytes() { std::free(data); }
  unsigned char* data;
  size_t size;
};

}  // namespace

TEST_CASE("a spill file reads back what was appended", "[table][spill]") {
  embstore_test::TempDir dir;
  std::unique_ptr<embstore::SpillFile> file;
  REQUIRE(embstore::SpillFile::open(dir.path(), &file) == 0);
  constexpr size_t kA = embstore::SpillFile::kAlignment;
  AlignedBytes a(3 * kA), b(5 * kA);
  for (size_t i = 0; i < a.size; ++i) a.data[i] = static_cast<unsigned char>(i * 7 + 1);
  for (size_t i = 0; i < b.size; ++i) b.data[i] = static_cast<unsigned char>(i * 13 + 5);
  uint64_t at_a = 1, at_b = 1;
  REQUIRE(file->append(a.data, a.size, &at_a) == 0);
  REQUIRE(file->append(b.data, b.size, &at_b) == 0);
  REQUIRE(at_a == 0);
  REQUIRE(at_b == a.size);
  REQUIRE(file->settle() == 0);
  AlignedBytes back(5 * kA);
  REQUIRE(file->read(back.data, b.size, at_b) == 0);
  REQUIRE(std::equal(back.data, back.data + b.size, b.data));
  REQUIRE(file->read(back.data, a.size, at_a) == 0);
  REQUIRE(std::equal(back.data, back.data + a.size, a.data));

  SECTION("misaligned data, lengths or offsets are refused") {
    uint64_t at = 0;
    REQUIRE(file->append(a.data + 1, kA, &at) == -EINVAL);
    REQUIRE(file->append(a.data, kA - 1, &at) == -EINVAL);
    REQUIRE(file->read(back.data, kA, 1) == -EINVAL);
    REQUIRE(file->bytes() == a.size + b.size);  // nothing appended
  }
  SECTION("reading past the end is an error, not a short read") {
    REQUIRE(file->read(back.data, 2 * kA, a.size + b.size - kA) == -EIO);
  }
}

TEST_CASE("a spill file in a missing directory is an error", "[table][spill]") {
  std::unique_ptr<embstore::SpillFile> file;
  embstore_test::TempDir dir;
  REQUIRE(embstore::SpillFile::open(dir.path() + "/no-such-dir", &file) == -ENOENT);
  REQUIRE(file == nullptr);
}
