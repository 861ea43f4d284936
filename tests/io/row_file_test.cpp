// White-box tests of the checkpoint row file format (io/row_file.*): bit-exact round trips,
// block boundaries, tombstones, the whole-file checksum, corruption and truncation reported
// with the bad block's offset, and injected write faults.
//
// Small staging buffers make files of many blocks cheap; a reader buffer that is not a
// multiple of the block size makes blocks span reader chunks.
#include "io/format/row_file.hpp"

#include <xxhash.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/engine/fault.hpp"
#include "io/format/chain.hpp"
#include "io/format/manifest.hpp"
#include "tests/io/io_fixtures.hpp"

using namespace embstore::io;

using embstore_test::FaultGuard;
using embstore_test::TempDir;

namespace {

uint64_t next_random(uint64_t* x) {
  *x ^= *x >> 12;
  *x ^= *x << 25;
  *x ^= *x >> 27;
  return *x * 0x2545f4914f6cdd1dull;
}

// Rows with arbitrary float bit patterns (NaNs and denormals included): the format must move
// bits, not values.
struct Rows {
  std::vector<int64_t> keys;
  std::vector<float> values;
  std::vector<float> state;
};

Rows make_rows(size_t n, uint32_t dim, uint32_t state_dim, uint64_t seed) {
  Rows r;
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  const int64_t edge[] = {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                          0, -1};
  for (size_t i = 0; i < n; ++i) {
    r.keys.push_back(i < std::size(edge) ? edge[i] : static_cast<int64_t>(next_random(&x)));
  }
  auto fill = [&](std::vector<float>* v, size_t count) {
    v->resize(count);
    for (float& f : *v) {
      const uint32_t bits = static_cast<uint32_t>(next_random(&x) >> 32);
      std::memcpy(&f, &bits, sizeof f);
    }
  };
  fill(&r.values, n * dim);
  fill(&r.state, n * state_dim);
  return r;
}

WriterOptions small_writer() {
  WriterOptions o;
  o.buffer_bytes = 16384;
  o.queue_depth = 4;
  return o;
}

ReaderOptions odd_reader() {
  ReaderOptions o;
  o.buffer_bytes = 12288;  // blocks of 16 KiB straddle its chunks
  o.queue_depth = 4;
  return o;
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const std::vector<char>& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
}

struct Written {
  uint64_t rows = 0;
  uint64_t bytes = 0;
  uint64_t checksum = 0;
  uint32_t rows_per_block = 0;
};

Written write_rows(const std::string& path, const Rows& rows, uint32_t dim, uint32_t state_dim,
                   const WriterOptions& options) {
  std::unique_ptr<RowFileWriter> w;
  REQUIRE(RowFileWriter::open(path, dim, state_dim, options, &w) == 0);
  for (size_t i = 0; i < rows.keys.size(); ++i) {
    REQUIRE(w->add(rows.keys[i], rows.values.data() + i * dim,
                   state_dim > 0 ? rows.state.data() + i * state_dim : nullptr) == 0);
  }
  REQUIRE(w->finish() == 0);
  return {w->rows(), w->bytes(), w->checksum(), w->rows_per_block(RowBlockKind::kUpserts)};
}

// Reads every upsert back into a Rows; returns next_block's final result.
int read_rows(const std::string& path, const ReaderOptions& options, Rows* out,
              std::vector<uint64_t>* offsets = nullptr, std::string* detail = nullptr,
              bool check_behind = false, uint64_t* checksum = nullptr) {
  std::unique_ptr<RowFileReader> r;
  REQUIRE(RowFileReader::open(path, options, &r, check_behind) == 0);
  RowBlock b;
  int e;
  while ((e = r->next_block(&b)) == 1) {
    if (offsets != nullptr) offsets->push_back(b.offset);
    REQUIRE(b.kind == RowBlockKind::kUpserts);
    out->keys.insert(out->keys.end(), b.keys, b.keys + b.rows);
    out->values.insert(out->values.end(), b.values, b.values + size_t{b.rows} * b.dim);
    if (b.state_dim > 0) {
      out->state.insert(out->state.end(), b.state, b.state + size_t{b.rows} * b.state_dim);
    } else {
      CHECK(b.state == nullptr);
    }
  }
  if (detail != nullptr) *detail = r->error_detail();
  if (checksum != nullptr) *checksum = r->checksum();
  return e;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  // memcmp must not see the null data() of an empty vector.
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// A file of blocks blocks of dim 4, state_dim 2, through small buffers; returns the block
// offsets the reader reports.
std::vector<uint64_t> write_blocks(const std::string& path, size_t blocks) {
  const uint32_t dim = 4, state_dim = 2;
  std::unique_ptr<RowFileWriter> probe;
  REQUIRE(RowFileWriter::open(path, dim, state_dim, small_writer(), &probe) == 0);
  const size_t per_block = probe->rows_per_block(RowBlockKind::kUpserts);
  REQUIRE(probe->finish() == 0);
  const Rows rows = make_rows(per_block * blocks - per_block / 2, dim, state_dim, 7);
  write_rows(path, rows, dim, state_dim, small_writer());
  Rows back;
  std::vector<uint64_t> offsets;
  REQUIRE(read_rows(path, {}, &back, &offsets) == 0);
  REQUIRE(offsets.size() == blocks);
  return offsets;
}

std::string at_offset(uint64_t offset) { return "block at offset " + std::to_string(offset) + ":"; }

}  // namespace

TEST_CASE("row file: round trip of 0, 1 and many rows, bit-exact", "[rowfile]") {
  TempDir dir;
  for (const uint32_t dim : {1u, 64u}) {
    for (const uint32_t state_dim : {0u, 2 * dim + 2}) {
      for (const bool small : {true, false}) {
        const WriterOptions wo = small ? small_writer() : WriterOptions{};
        std::unique_ptr<RowFileWriter> probe;
        const std::string path = dir.file("t.rows");
        REQUIRE(RowFileWriter::open(path, dim, state_dim, wo, &probe) == 0);
        const size_t per_block = probe->rows_per_block(RowBlockKind::kUpserts);
        REQUIRE(probe->finish() == 0);
        // Default buffers hold many rows per block: a few blocks are enough there.
        const size_t many = per_block * (small ? 5 : 2) + 3;
        for (const size_t n : {size_t{0}, size_t{1}, per_block, many}) {
          INFO("dim " << dim << " state_dim " << state_dim << " rows " << n << " small " << small);
          const Rows rows = make_rows(n, dim, state_dim, n + dim);
          const Written w = write_rows(path, rows, dim, state_dim, wo);
          CHECK(w.rows == n);
          CHECK(w.bytes == std::filesystem::file_size(path));
          CHECK(w.bytes % 4096 == 0);
          for (const ReaderOptions& ro : {ReaderOptions{}, odd_reader()}) {
            Rows back;
            std::vector<uint64_t> offsets;
            REQUIRE(read_rows(path, ro, &back, &offsets) == 0);
            CHECK(offsets.size() == (n + per_block - 1) / per_block);
            CHECK(back.keys == rows.keys);
            CHECK(same_bits(back.values, rows.values));
            CHECK(same_bits(back.state, rows.state));
          }
        }
      }
    }
  }
}

TEST_CASE("row file: rows per block fill one staging buffer", "[rowfile]") {
  TempDir dir;
  std::unique_ptr<RowFileWriter> w;
  REQUIRE(RowFileWriter::open(dir.file("a.rows"), 64, 130, {}, &w) == 0);
  // (1 MiB - 64) / (8 + 4 * 64 + 4 * 130) and (1 MiB - 64) / 8.
  CHECK(w->rows_per_block(RowBlockKind::kUpserts) == (1048576 - 64) / 784);
  CHECK(w->rows_per_block(RowBlockKind::kTombstones) == (1048576 - 64) / 8);
  REQUIRE(w->finish() == 0);
}

TEST_CASE("row file: tombstone blocks mixed with upserts keep their order", "[rowfile]") {
  TempDir dir;
  const std::string path = dir.file("delta.rows");
  const uint32_t dim = 3, state_dim = 8;
  std::unique_ptr<RowFileWriter> w;
  REQUIRE(RowFileWriter::open(path, dim, state_dim, small_writer(), &w) == 0);
  const size_t tomb_block = w->rows_per_block(RowBlockKind::kTombstones);
  // Runs: upserts, a run of tombstones longer than a block, upserts, one tombstone.
  struct Op {
    bool tombstone;
    int64_t key;
  };
  std::vector<Op> ops;
  int64_t key = std::numeric_limits<int64_t>::min();
  for (int i = 0; i < 10; ++i) ops.push_back({false, key++});
  for (size_t i = 0; i < tomb_block + 5; ++i) ops.push_back({true, key++});
  for (int i = 0; i < 400; ++i) ops.push_back({false, key++});
  ops.push_back({true, std::numeric_limits<int64_t>::max()});
  const Rows rows = make_rows(ops.size(), dim, state_dim, 3);
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].tombstone) {
      REQUIRE(w->add_tombstone(ops[i].key) == 0);
    } else {
      REQUIRE(w->add(ops[i].key, &rows.values[i * dim], &rows.state[i * state_dim]) == 0);
    }
  }
  REQUIRE(w->finish() == 0);
  CHECK(w->rows() == ops.size());

  for (const ReaderOptions& ro : {ReaderOptions{}, odd_reader()}) {
    std::unique_ptr<RowFileReader> r;
    REQUIRE(RowFileReader::open(path, ro, &r) == 0);
    RowBlock b;
    size_t i = 0;
    std::vector<RowBlockKind> kinds;
    int e;
    while ((e = r->next_block(&b)) == 1) {
      kinds.push_back(b.kind);
      CHECK(b.dim == dim);
      CHECK(b.state_dim == state_dim);
      for (uint32_t j = 0; j < b.rows; ++j, ++i) {
        REQUIRE(i < ops.size());
        CHECK(ops[i].tombstone == (b.kind == RowBlockKind::kTombstones));
        CHECK(b.keys[j] == ops[i].key);
        if (b.kind == RowBlockKind::kUpserts) {
          CHECK(std::memcmp(&b.values[j * dim], &rows.values[i * dim], dim * 4) == 0);
          CHECK(std::memcmp(&b.state[j * state_dim], &rows.state[i * state_dim], state_dim * 4) ==
                0);
        } else {
          CHECK(b.values == nullptr);
          CHECK(b.state == nullptr);
        }
      }
    }
    CHECK(e == 0);
    CHECK(i == ops.size());
    using K = RowBlockKind;
    // 313 upserts of 52 bytes fill a 16 KiB block: 400 need two.
    CHECK(kinds == std::vector<K>{K::kUpserts, K::kTombstones, K::kTombstones, K::kUpserts,
                                  K::kUpserts, K::kTombstones});
  }
}

TEST_CASE("row file: checksum() is the XXH3 of the file read back", "[rowfile]") {
  TempDir dir;
  const std::string path = dir.file("c.rows");
  for (const size_t n : {size_t{0}, size_t{1}, size_t{5000}}) {
    const Rows rows = make_rows(n, 16, 34, n);
    const Written w = write_rows(path, rows, 16, 34, small_writer());
    const std::vector<char> file = read_file(path);
    CHECK(file.size() == w.bytes);
    CHECK(w.checksum == XXH3_64bits(file.data(), file.size()));
  }
}

TEST_CASE("row file: a flipped byte fails its block with -EBADMSG and the block's offset",
          "[rowfile]") {
  TempDir dir;
  const std::string path = dir.file("f.rows");
  const std::vector<uint64_t> offsets = write_blocks(path, 4);
  const std::vector<char> good = read_file(path);
  // 3.5 blocks of 510 rows: the last holds 255 rows, 64 + 255 * 32 bytes, padded to 12 KiB.
  REQUIRE(good.size() == offsets[3] + 12288);

  struct Case {
    const char* name;
    size_t block;
    uint64_t at;  // within the block
    const char* what;
  };
  const Case cases[] = {
      {"magic", 1, 0, "bad magic"},
      {"header rows", 2, 16, "header checksum mismatch"},
      {"header checksum", 0, 60, "header checksum mismatch"},
      {"payload key", 1, 64, "payload checksum mismatch"},
      {"payload value", 2, 5000, "payload checksum mismatch"},
      {"last block header", 3, 24, "header checksum mismatch"},
      {"last block payload", 3, 200, "payload checksum mismatch"},
      {"last block padding", 3, 12287, "nonzero padding"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    std::vector<char> bad = good;
    bad[offsets[c.block] + c.at] ^= 0x10;
    write_file(path, bad);
    for (const ReaderOptions& ro : {ReaderOptions{}, odd_reader()}) {
      for (const bool behind : {false, true}) {
        INFO("check_behind " << behind);
        Rows back;
        std::vector<uint64_t> seen;
        std::string detail;
        CHECK(read_rows(path, ro, &back, &seen, &detail, behind) == -EBADMSG);
        // The blocks before it were good. Checked behind, a block whose header is good is
        // handed out before its payload's check fails the next call.
        const bool payload =
            std::string(c.what) != "bad magic" && std::string(c.what) != "header checksum mismatch";
        CHECK(seen.size() == c.block + (behind && payload ? 1 : 0));
        CHECK(detail == at_offset(offsets[c.block]) + " " + c.what);
      }
    }
  }
}

TEST_CASE("row file: checked behind, the rows and the file's checksum are the same", "[rowfile]") {
  TempDir dir;
  const std::string path = dir.file("b.rows");
  for (const size_t n : {size_t{0}, size_t{1}, size_t{5000}}) {
    const Rows rows = make_rows(n, 16, 34, n);
    const Written w = write_rows(path, rows, 16, 34, small_writer());
    for (const ReaderOptions& ro : {ReaderOptions{}, odd_reader()}) {
      Rows back;
      uint64_t checksum = 0;
      REQUIRE(read_rows(path, ro, &back, nullptr, nullptr, /*check_behind=*/true, &checksum) == 0);
      CHECK(back.keys == rows.keys);
      CHECK(same_bits(back.values, rows.values));
      CHECK(same_bits(back.state, rows.state));
      CHECK(checksum == w.checksum);
    }
  }
}

// A restore's sink loads a block before its check ends (check_behind): when the sink fails on a
// block that is corrupt (its garbage made the load fail), the corruption is the error reported.
TEST_CASE("row file: a sink failing on a corrupt block checked behind reports the corruption",
          "[rowfile]") {
  TempDir dir;
  const std::string path = dir.file("s.rows");
  const std::vector<uint64_t> offsets = write_blocks(path, 3);
  const std::vector<char> good = read_file(path);
  FileEntry f;
  f.path = "s.rows";
  f.bytes = good.size();
  f.xxh3 = XXH3_64bits(good.data(), good.size());
  Rows all;
  REQUIRE(read_rows(path, {}, &all) == 0);
  f.rows = all.keys.size();
  TableEntry t;
  t.name = "t";
  t.config.dim = 4;
  t.state_dim = 2;
  std::vector<char> bad = good;
  bad[offsets[1] + 100] ^= 0x10;  // block 1's payload
  write_file(path, bad);
  for (const bool throws : {false, true}) {
    INFO("the sink " << (throws ? "throws" : "returns an error"));
    size_t blocks = 0;
    const RowSink sink = [&](const RowBlock& b, std::string* why) -> int {
      if (b.offset != offsets[1]) return 0;
      ++blocks;
      if (throws) throw std::runtime_error("the sink's own failure");
      *why = "the sink's own failure";
      return -EINVAL;
    };
    std::string detail;
    CHECK(read_row_file(path, f, t, /*full=*/true, sink, &detail, /*check_behind=*/true) ==
          -EBADMSG);
    CHECK(blocks == 1);  // handed out before its check ended
    CHECK(detail == path + ": " + at_offset(offsets[1]) + " payload checksum mismatch");
  }
  // A sink failing on a good block reports its own reason.
  write_file(path, good);
  std::string detail;
  const RowSink refuse = [&](const RowBlock& b, std::string* why) -> int {
    if (b.offset != offsets[1]) return 0;
    *why = "refused";
    return -EINVAL;
  };
  CHECK(read_row_file(path, f, t, true, refuse, &detail, true) == -EINVAL);
  CHECK(detail == path + ": " + at_offset(offsets[1]) + " refused");
}

TEST_CASE("row file: a truncated file is -EBADMSG", "[rowfile]") {
  TempDir dir;
  const std::string path = dir.file("t.rows");
  const std::vector<uint64_t> offsets = write_blocks(path, 3);
  const std::vector<char> good = read_file(path);
  const uint64_t last = offsets.back();
  struct Case {
    uint64_t size;
    const char* what;
  };
  const Case cases[] = {
      {good.size() - 1, "truncated block"},   {last + 100, "truncated block"},
      {last + 64, "truncated block"},         {last + 10, "truncated header"},
      {offsets[1] + 4096, "truncated block"},
  };
  for (const Case& c : cases) {
    INFO("size " << c.size);
    write_file(path, std::vector<char>(good.begin(), good.begin() + c.size));
    Rows back;
    std::string detail;
    CHECK(read_rows(path, odd_reader(), &back, nullptr, &detail) == -EBADMSG);
    const uint64_t block = c.size > last ? last : offsets[1];
    CHECK(detail == at_offset(block) + " " + c.what);
  }
}

TEST_CASE("row file: the error sticks", "[rowfile]") {
  TempDir dir;
  const std::string path = dir.file("s.rows");
  write_blocks(path, 2);
  std::vector<char> bad = read_file(path);
  bad[100] ^= 1;
  write_file(path, bad);
  std::unique_ptr<RowFileReader> r;
  REQUIRE(RowFileReader::open(path, {}, &r) == 0);
  RowBlock b;
  CHECK(r->next_block(&b) == -EBADMSG);
  CHECK(r->next_block(&b) == -EBADMSG);
  CHECK(r->error_detail() == "block at offset 0: payload checksum mismatch");
}

TEST_CASE("row file: an empty file ends at once", "[rowfile]") {
  TempDir dir;
  const std::string path = dir.file("e.rows");
  write_file(path, {});
  std::unique_ptr<RowFileReader> r;
  REQUIRE(RowFileReader::open(path, {}, &r) == 0);
  RowBlock b;
  CHECK(r->next_block(&b) == 0);
  CHECK(r->next_block(&b) == 0);
  CHECK(r->error_detail().empty());
}

TEST_CASE("row file: a block whose dim differs from the first block's is -EBADMSG", "[rowfile]") {
  TempDir dir;
  const Rows a = make_rows(10, 4, 0, 1);
  const Rows b = make_rows(10, 5, 0, 2);
  write_rows(dir.file("a.rows"), a, 4, 0, {});
  write_rows(dir.file("b.rows"), b, 5, 0, {});
  std::vector<char> both = read_file(dir.file("a.rows"));
  const uint64_t second = both.size();
  const std::vector<char> tail = read_file(dir.file("b.rows"));
  both.insert(both.end(), tail.begin(), tail.end());
  write_file(dir.file("ab.rows"), both);
  Rows back;
  std::string detail;
  CHECK(read_rows(dir.file("ab.rows"), {}, &back, nullptr, &detail) == -EBADMSG);
  CHECK(back.keys == a.keys);
  CHECK(detail == at_offset(second) + " dim 5/state_dim 0 differ from the first block's 4/0");
}

TEST_CASE("row file: an injected write fault is returned by finish()", "[rowfile]") {
  TempDir dir;
  for (const int fault : {-ENOSPC, -EIO}) {
    for (const bool uring : {true, false}) {
      INFO("fault " << fault << " uring " << uring);
      // Fails the third block's write.
      FaultGuard guard([fault](uint64_t offset, size_t) { return offset >= 32768 ? fault : 0; });
      WriterOptions wo = small_writer();
      wo.allow_uring = uring;
      std::unique_ptr<RowFileWriter> w;
      REQUIRE(RowFileWriter::open(dir.file("x.rows"), 8, 0, wo, &w) == 0);
      const Rows rows = make_rows(w->rows_per_block(RowBlockKind::kUpserts) * 5, 8, 0, 9);
      int first_error = 0;
      for (size_t i = 0; i < rows.keys.size() && first_error == 0; ++i) {
        first_error = w->add(rows.keys[i], &rows.values[i * 8], nullptr);
      }
      CHECK((first_error == 0 || first_error == fault));
      CHECK(w->finish() == fault);
    }
  }
  // Only the last (partial) block fails: the fault still surfaces at finish().
  {
    FaultGuard guard([](uint64_t offset, size_t) { return offset >= 16384 ? -EIO : 0; });
    std::unique_ptr<RowFileWriter> w;
    REQUIRE(RowFileWriter::open(dir.file("y.rows"), 8, 0, small_writer(), &w) == 0);
    const float v[8] = {};
    const size_t n = w->rows_per_block(RowBlockKind::kUpserts) + 1;
    for (size_t i = 0; i < n; ++i) REQUIRE(w->add(static_cast<int64_t>(i), v, nullptr) == 0);
    CHECK(w->finish() == -EIO);
  }
}

TEST_CASE("row file: misuse is refused with -EINVAL", "[rowfile]") {
  TempDir dir;
  std::unique_ptr<RowFileWriter> w;
  CHECK(RowFileWriter::open(dir.file("z.rows"), 0, 0, {}, &w) == -EINVAL);
  WriterOptions tiny;
  tiny.buffer_bytes = 4096;
  CHECK(RowFileWriter::open(dir.file("z.rows"), 1024, 0, tiny, &w) == -EINVAL);  // 4104 B row
  REQUIRE(RowFileWriter::open(dir.file("z.rows"), 2, 1, {}, &w) == 0);
  const float v[2] = {1, 2};
  CHECK(w->add(1, nullptr, v) == -EINVAL);
  CHECK(w->add(1, v, nullptr) == -EINVAL);
  CHECK(w->add(1, v, v) == 0);
  CHECK(w->finish() == 0);
  CHECK(w->add(2, v, v) == -EINVAL);
  CHECK(w->add_tombstone(2) == -EINVAL);
  CHECK(w->finish() == -EINVAL);
  std::unique_ptr<RowFileReader> r;
  CHECK(RowFileReader::open(dir.file("missing.rows"), {}, &r) == -ENOENT);
}
