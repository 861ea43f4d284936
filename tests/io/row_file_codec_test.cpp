// Row files with codecs (io/format/row_file.hpp, format version 2 blocks): every codec pair
// round-trips through the file, the lossless ones bit for bit and the lossy ones within their
// bounds; a column that does not shrink is stored as floats, so a file of noise is byte for byte
// the file without codecs; an encoded block is checked before it is decoded (check_behind too);
// forged headers whose checksums hold are refused without decoding past their bounds.
#include <xxhash.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/row/codec.h"
#include "io/format/row_file.hpp"
#include "tests/io/io_fixtures.hpp"

using namespace embstore::io;
using embstore_test::TempDir;

namespace {

struct Rows {
  std::vector<int64_t> keys;
  std::vector<float> values;
  std::vector<float> state;
};

// Rows like a trained Adagrad table's: values small around zero, accumulators positive.
Rows trained_rows(size_t n, uint32_t dim, uint32_t state_dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> value(0.0f, 0.05f);
  std::exponential_distribution<float> acc(20.0f);
  Rows r;
  for (size_t i = 0; i < n; ++i) r.keys.push_back(static_cast<int64_t>(i * 7919 + seed));
  for (size_t i = 0; i < n * dim; ++i) r.values.push_back(value(rng));
  for (size_t i = 0; i < n * state_dim; ++i) r.state.push_back(acc(rng));
  return r;
}

// Arbitrary bit patterns (NaNs included): nothing compresses them.
Rows noise_rows(size_t n, uint32_t dim, uint32_t state_dim, uint32_t seed) {
  std::mt19937 rng(seed);
  Rows r;
  auto bits = [&] {
    const uint32_t b = static_cast<uint32_t>(rng());
    float f;
    std::memcpy(&f, &b, sizeof f);
    return f;
  };
  for (size_t i = 0; i < n; ++i) r.keys.push_back(static_cast<int64_t>(rng()));
  for (size_t i = 0; i < n * dim; ++i) r.values.push_back(bits());
  for (size_t i = 0; i < n * state_dim; ++i) r.state.push_back(bits());
  return r;
}

WriterOptions small_writer() {
  WriterOptions o;
  o.buffer_bytes = 65536;
  o.queue_depth = 4;
  return o;
}

ReaderOptions odd_reader() {
  ReaderOptions o;
  o.buffer_bytes = 12288;  // encoded blocks of varying size straddle its chunks
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

uint64_t write_rows(const std::string& path, const Rows& rows, uint32_t dim, uint32_t state_dim,
                    RowCodecs codecs, const WriterOptions& options = small_writer()) {
  std::unique_ptr<RowFileWriter> w;
  REQUIRE(RowFileWriter::open(path, dim, state_dim, options, &w, codecs) == 0);
  for (size_t i = 0; i < rows.keys.size(); ++i) {
    REQUIRE(w->add(rows.keys[i], rows.values.data() + i * dim,
                   state_dim > 0 ? rows.state.data() + i * state_dim : nullptr) == 0);
  }
  REQUIRE(w->finish() == 0);
  return w->bytes();
}

struct ReadBack {
  Rows rows;
  std::vector<RowCodecs> stored;  // per block
  std::vector<uint64_t> offsets;
  std::string detail;
  uint64_t checksum = 0;
  int result = 0;
};

ReadBack read_rows(const std::string& path, const ReaderOptions& options, bool behind) {
  ReadBack out;
  std::unique_ptr<RowFileReader> r;
  REQUIRE(RowFileReader::open(path, options, &r, behind) == 0);
  RowBlock b;
  while ((out.result = r->next_block(&b)) == 1) {
    out.stored.push_back(b.stored);
    out.offsets.push_back(b.offset);
    out.rows.keys.insert(out.rows.keys.end(), b.keys, b.keys + b.rows);
    out.rows.values.insert(out.rows.values.end(), b.values, b.values + size_t{b.rows} * b.dim);
    if (b.state_dim > 0) {
      out.rows.state.insert(out.rows.state.end(), b.state, b.state + size_t{b.rows} * b.state_dim);
    }
  }
  out.detail = r->error_detail();
  out.checksum = r->checksum();
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Whether got is what codec may make of want (rows of width floats).
bool within(Codec codec, const std::vector<float>& want, const std::vector<float>& got,
            uint32_t width) {
  return want.size() == got.size() &&
         embstore::io::within_bound(codec, want.data(), got.data(),
                                    width == 0 ? 0 : want.size() / width, width);
}

void put_u32(std::vector<char>* f, size_t at, uint32_t v) { std::memcpy(f->data() + at, &v, 4); }
void put_u64(std::vector<char>* f, size_t at, uint64_t v) { std::memcpy(f->data() + at, &v, 8); }
uint32_t get_u32(const std::vector<char>& f, size_t at) {
  uint32_t v;
  std::memcpy(&v, f.data() + at, 4);
  return v;
}
uint64_t get_u64(const std::vector<char>& f, size_t at) {
  uint64_t v;
  std::memcpy(&v, f.data() + at, 8);
  return v;
}

// Makes the block at `at` check again after its header or payload was edited: the payload and
// header checksums a forger would recompute.
void reseal(std::vector<char>* f, size_t at) {
  const uint64_t payload = get_u64(*f, at + 40);
  put_u64(f, at + 48, XXH3_64bits(f->data() + at + 64, payload));
  put_u64(f, at + 56, XXH3_64bits(f->data() + at, 56));
}

}  // namespace

TEST_CASE("row file codecs: every pair round-trips within its bound, and lossy ones shrink",
          "[rowfile][codec]") {
  TempDir dir;
  const uint32_t dim = 16, state_dim = 16;
  const Rows rows = trained_rows(3000, dim, state_dim, 5);
  const uint64_t plain = write_rows(dir.file("none.rows"), rows, dim, state_dim, {});
  for (const Codec values : {Codec::kNone, Codec::kLossless, Codec::kBf16, Codec::kInt8}) {
    for (const Codec state : {Codec::kNone, Codec::kLossless, Codec::kBf16}) {
      INFO("values " << codec_name(values) << ", state " << codec_name(state));
      const std::string path = dir.file("c.rows");
      const uint64_t bytes = write_rows(path, rows, dim, state_dim, {values, state});
      const std::vector<char> file = read_file(path);
      REQUIRE(file.size() == bytes);
      if (values == Codec::kNone && state == Codec::kNone) CHECK(bytes == plain);
      // Blocks are padded to 4 KiB: lossless on one column of these small blocks may not save a
      // whole page, but a file never grows, and a lossy column always saves pages.
      CHECK(bytes <= plain);
      if (!codec_is_lossless(values) || !codec_is_lossless(state)) CHECK(bytes < plain);
      for (const ReaderOptions& ro : {ReaderOptions{}, odd_reader()}) {
        for (const bool behind : {false, true}) {
          INFO("check_behind " << behind);
          const ReadBack back = read_rows(path, ro, behind);
          REQUIRE(back.result == 0);
          CHECK(back.checksum == XXH3_64bits(file.data(), file.size()));
          CHECK(back.rows.keys == rows.keys);
          CHECK(within(values, rows.values, back.rows.values, dim));
          CHECK(within(state, rows.state, back.rows.state, state_dim));
          REQUIRE(back.stored.size() > 2);
          for (const RowCodecs& s : back.stored) {
            CHECK(s.values == values);
            CHECK(s.state == state);
          }
        }
      }
    }
  }
}

TEST_CASE("row file codecs: columns that do not shrink are stored as floats", "[rowfile][codec]") {
  TempDir dir;
  SECTION("lossless on noise: the file is byte for byte the file without codecs") {
    const Rows rows = noise_rows(2000, 8, 8, 3);
    write_rows(dir.file("none.rows"), rows, 8, 8, {});
    write_rows(dir.file("lossless.rows"), rows, 8, 8, {Codec::kLossless, Codec::kLossless});
    CHECK(read_file(dir.file("none.rows")) == read_file(dir.file("lossless.rows")));
  }
  SECTION("int8 at dim 1 and 2 (scale and offset outweigh the bytes) keeps floats") {
    for (const uint32_t dim : {1u, 2u}) {
      const Rows rows = trained_rows(500, dim, 0, dim);
      write_rows(dir.file("none.rows"), rows, dim, 0, {});
      write_rows(dir.file("int8.rows"), rows, dim, 0, {Codec::kInt8, Codec::kNone});
      CHECK(read_file(dir.file("none.rows")) == read_file(dir.file("int8.rows")));
    }
    const Rows rows = trained_rows(500, 3, 0, 3);
    write_rows(dir.file("int8.rows"), rows, 3, 0, {Codec::kInt8, Codec::kNone});
    const ReadBack back = read_rows(dir.file("int8.rows"), {}, false);
    REQUIRE(back.result == 0);
    REQUIRE(!back.stored.empty());
    CHECK(back.stored[0].values == Codec::kInt8);  // 11 bytes a row instead of 12
    CHECK(within(Codec::kInt8, rows.values, back.rows.values, 3));
  }
  SECTION("one column encoded, the other kept, in the same block") {
    Rows rows = trained_rows(1000, 8, 8, 9);
    const Rows noise = noise_rows(1000, 8, 8, 9);
    rows.state = noise.state;
    write_rows(dir.file("mixed.rows"), rows, 8, 8, {Codec::kLossless, Codec::kLossless});
    const ReadBack back = read_rows(dir.file("mixed.rows"), odd_reader(), true);
    REQUIRE(back.result == 0);
    REQUIRE(!back.stored.empty());
    CHECK(back.stored[0].values == Codec::kLossless);
    CHECK(back.stored[0].state == Codec::kNone);
    CHECK(same_bits(back.rows.values, rows.values));
    CHECK(same_bits(back.rows.state, rows.state));
  }
}

TEST_CASE("row file codecs: tombstones between encoded blocks keep their order",
          "[rowfile][codec]") {
  TempDir dir;
  const std::string path = dir.file("t.rows");
  const Rows rows = trained_rows(100, 8, 8, 1);
  std::unique_ptr<RowFileWriter> w;
  REQUIRE(RowFileWriter::open(path, 8, 8, small_writer(), &w, {Codec::kInt8, Codec::kBf16}) == 0);
  REQUIRE(w->add(rows.keys[0], &rows.values[0], &rows.state[0]) == 0);
  REQUIRE(w->add_tombstone(-5) == 0);
  REQUIRE(w->add(rows.keys[1], &rows.values[8], &rows.state[8]) == 0);
  REQUIRE(w->finish() == 0);
  std::unique_ptr<RowFileReader> r;
  REQUIRE(RowFileReader::open(path, {}, &r) == 0);
  RowBlock b;
  std::vector<std::pair<RowBlockKind, int64_t>> seen;
  int e;
  while ((e = r->next_block(&b)) == 1) {
    for (uint32_t i = 0; i < b.rows; ++i) seen.emplace_back(b.kind, b.keys[i]);
    if (b.kind == RowBlockKind::kUpserts) {
      CHECK(b.stored.values == Codec::kInt8);
      CHECK(embstore::row::int8_row_within_bound(&rows.values[seen.size() == 1 ? 0 : 8], b.values,
                                                 8));
    }
  }
  CHECK(e == 0);
  const std::vector<std::pair<RowBlockKind, int64_t>> want = {
      {RowBlockKind::kUpserts, rows.keys[0]},
      {RowBlockKind::kTombstones, -5},
      {RowBlockKind::kUpserts, rows.keys[1]}};
  CHECK(seen == want);
}

TEST_CASE("row file codecs: corrupt stored bytes are reported, never decoded", "[rowfile][codec]") {
  TempDir dir;
  const std::string path = dir.file("bad.rows");
  const Rows rows = trained_rows(3000, 16, 16, 2);
  write_rows(path, rows, 16, 16, {Codec::kLossless, Codec::kLossless});
  const ReadBack good = read_rows(path, {}, false);
  REQUIRE(good.result == 0);
  REQUIRE(good.offsets.size() >= 3);
  const std::vector<char> file = read_file(path);
  const size_t block = 1;
  const size_t at = good.offsets[block];
  for (const size_t within_payload : {size_t{0}, size_t{300 * 8 + 10}, size_t{3000}}) {
    std::vector<char> bad = file;
    bad[at + 64 + within_payload] ^= 0x40;
    write_file(path, bad);
    for (const bool behind : {false, true}) {
      INFO("byte " << within_payload << " check_behind " << behind);
      const ReadBack back = read_rows(path, odd_reader(), behind);
      CHECK(back.result == -EBADMSG);
      // Not handed out, even checked behind: the check comes before the decoding.
      CHECK(back.offsets.size() == block);
      CHECK(back.detail == "block at offset " + std::to_string(at) + ": payload checksum mismatch");
    }
  }
}

TEST_CASE("row file codecs: forged headers that check are refused within their bounds",
          "[rowfile][codec]") {
  TempDir dir;
  const std::string path = dir.file("forged.rows");
  const Rows rows = trained_rows(200, 16, 16, 4);
  write_rows(path, rows, 16, 16, {Codec::kLossless, Codec::kBf16});
  const std::vector<char> file = read_file(path);
  REQUIRE(get_u32(file, 8) == kRowFileEncodedVersion);
  REQUIRE(get_u32(file, 36) == 200 * 16 * 2);  // bf16 state

  struct Case {
    const char* name;
    void (*edit)(std::vector<char>*);
    const char* what;  // the start of the detail after the offset
  };
  const Case cases[] = {
      {"unknown values codec", [](std::vector<char>* f) { (*f)[28] = 9; }, "unknown codec 9/2"},
      {"nonzero reserved byte", [](std::vector<char>* f) { (*f)[31] = 1; }, "unknown codec 1/2"},
      {"sizes that do not add up",
       [](std::vector<char>* f) { put_u32(f, 32, get_u32(*f, 32) + 4); },
       "payload size does not match its keys' and columns' sizes"},
      {"a tombstone block of version 2", [](std::vector<char>* f) { put_u32(f, 12, 1); },
       "a tombstone block of format version 2"},
      {"values said to be floats", [](std::vector<char>* f) { (*f)[28] = 0; },
       "values: none block of 200 rows x 16 floats holds"},
      {"state said to be int8", [](std::vector<char>* f) { (*f)[29] = 3; },
       "state: int8 block of 200 rows x 16 floats holds"},
      {"the bytes moved from values to state",
       [](std::vector<char>* f) {
         put_u32(f, 32, get_u32(*f, 32) - 2);
         put_u32(f, 36, get_u32(*f, 36) + 2);
       },
       "values: "},
      {"a header with fewer rows than the block holds",
       [](std::vector<char>* f) { put_u32(f, 16, 100); },
       "payload size does not match its keys' and columns' sizes"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    std::vector<char> bad = file;
    c.edit(&bad);
    // A payload whose size changed would no longer fit: only reseal what stays inside the file.
    if (get_u64(bad, 40) + 64 <= bad.size()) reseal(&bad, 0);
    write_file(path, bad);
    for (const bool behind : {false, true}) {
      const ReadBack back = read_rows(path, {}, behind);
      CHECK(back.result == -EBADMSG);
      CHECK(back.offsets.empty());
      const std::string prefix = "block at offset 0: ";
      CHECK(back.detail.substr(0, prefix.size() + std::strlen(c.what)) == prefix + c.what);
    }
  }
}

TEST_CASE("row file codecs: a block that would decode past the reader's bound is refused",
          "[rowfile][codec]") {
  TempDir dir;
  const std::string path = dir.file("big.rows");
  // One honest row, then a header claiming 2^20 rows of dim 16 and state 16 (136 MiB decoded)
  // whose stored sizes add up: 2^20 keys and a tiny lossless frame per column.
  const Rows rows = trained_rows(1, 16, 16, 8);
  write_rows(path, rows, 16, 16, {Codec::kLossless, Codec::kLossless});
  std::vector<char> f = read_file(path);
  const uint32_t n = 1u << 20;
  const uint64_t payload = uint64_t{n} * 8 + 16;
  f.resize(((64 + payload + 4095) / 4096) * 4096, 0);
  put_u32(&f, 8, kRowFileEncodedVersion);
  put_u32(&f, 16, n);
  f[28] = 1;
  f[29] = 1;
  put_u32(&f, 32, 8);
  put_u32(&f, 36, 8);
  put_u64(&f, 40, payload);
  reseal(&f, 0);
  write_file(path, f);
  const ReadBack back = read_rows(path, {}, false);
  CHECK(back.result == -EBADMSG);
  CHECK(back.detail ==
        "block at offset 0: an encoded block of 1048576 rows, more than a writer's block holds");
}

TEST_CASE("row file codecs: serving BF16 is values rounded by the writer, stored losslessly",
          "[rowfile][codec]") {
  TempDir dir;
  const uint32_t dim = 16;
  const auto round = [](const std::vector<float>& v) {
    std::vector<float> r(v);
    round_to_bf16(r.data(), r.size());
    return r;
  };
  SECTION("trained values: encoded blocks of rounded values, written again unchanged") {
    const Rows rows = trained_rows(3000, dim, 0, 11);
    const RowCodecs codecs = serving_row_codecs(Codec::kBf16);
    CHECK(codecs.values == Codec::kLossless);
    CHECK(codecs.state == Codec::kNone);
    write_rows(dir.file("serving.rows"), rows, dim, 0, codecs);
    const ReadBack back = read_rows(dir.file("serving.rows"), odd_reader(), true);
    REQUIRE(back.result == 0);
    CHECK(back.rows.keys == rows.keys);
    // Exactly the rounded values, not just within bf16's bound: every low half is zero.
    CHECK(same_bits(back.rows.values, round(rows.values)));
    CHECK_FALSE(same_bits(back.rows.values, rows.values));
    REQUIRE(!back.stored.empty());
    for (const RowCodecs& s : back.stored) CHECK(s.values == Codec::kLossless);
    // Smaller than the same values stored losslessly unrounded.
    const uint64_t unrounded =
        write_rows(dir.file("lossless.rows"), rows, dim, 0, {Codec::kLossless, Codec::kNone});
    CHECK(read_file(dir.file("serving.rows")).size() < unrounded);
    // Compaction writes rows read from such a file the same way: the same bytes again.
    write_rows(dir.file("again.rows"), back.rows, dim, 0, codecs);
    CHECK(read_file(dir.file("again.rows")) == read_file(dir.file("serving.rows")));
  }
  SECTION("any bit pattern (NaNs, infinities) comes back as the BF16 codec would give it") {
    const Rows rows = noise_rows(500, dim, 0, 12);
    write_rows(dir.file("noise.rows"), rows, dim, 0, serving_row_codecs(Codec::kBf16));
    const ReadBack back = read_rows(dir.file("noise.rows"), {}, false);
    REQUIRE(back.result == 0);
    CHECK(same_bits(back.rows.values, round(rows.values)));
    write_rows(dir.file("bf16.rows"), rows, dim, 0, {Codec::kBf16, Codec::kNone});
    const ReadBack codec = read_rows(dir.file("bf16.rows"), {}, false);
    REQUIRE(codec.result == 0);
    CHECK(same_bits(back.rows.values, codec.rows.values));
  }
  SECTION("the other serving codecs store as they say, without rounding") {
    for (const Codec c : {Codec::kNone, Codec::kLossless, Codec::kInt8}) {
      const RowCodecs codecs = serving_row_codecs(c);
      CHECK(codecs.values == c);
      CHECK_FALSE(codecs.round_values_to_bf16);
    }
    const Rows rows = trained_rows(500, dim, 0, 13);
    write_rows(dir.file("lossless.rows"), rows, dim, 0, serving_row_codecs(Codec::kLossless));
    const ReadBack back = read_rows(dir.file("lossless.rows"), {}, false);
    REQUIRE(back.result == 0);
    CHECK(same_bits(back.rows.values, rows.values));
  }
}

TEST_CASE("row file codecs: encoder threads write the same bytes as one thread",
          "[rowfile][codec]") {
  TempDir dir;
  const Rows rows = trained_rows(20000, 16, 16, 6);  // about 40 blocks of 64 KiB
  write_rows(dir.file("one.rows"), rows, 16, 16, {Codec::kLossless, Codec::kBf16, 1});
  const std::vector<char> one = read_file(dir.file("one.rows"));
  for (const unsigned threads : {0u, 2u, 3u, 8u}) {
    for (const unsigned buffers : {2u, 4u, 16u}) {
      INFO(threads << " threads, " << buffers << " buffers");
      WriterOptions wo = small_writer();
      wo.buffers = buffers;
      wo.queue_depth = std::min(buffers, 4u);
      write_rows(dir.file("many.rows"), rows, 16, 16, {Codec::kLossless, Codec::kBf16, threads},
                 wo);
      CHECK(read_file(dir.file("many.rows")) == one);
    }
  }
  const ReadBack back = read_rows(dir.file("one.rows"), {}, true);
  REQUIRE(back.result == 0);
  CHECK(same_bits(back.rows.values, rows.values));
}

TEST_CASE("row file codecs: a write fault with blocks still encoding is returned by finish()",
          "[rowfile][codec]") {
  TempDir dir;
  const Rows rows = trained_rows(20000, 16, 16, 7);
  for (const int fault : {-ENOSPC, -EIO}) {
    for (const uint64_t at : {uint64_t{0}, uint64_t{65536}, uint64_t{400000}}) {
      INFO("fault " << fault << " at " << at);
      embstore_test::FaultGuard guard(
          [fault, at](uint64_t offset, size_t) { return offset >= at ? fault : 0; });
      std::unique_ptr<RowFileWriter> w;
      REQUIRE(RowFileWriter::open(dir.file("x.rows"), 16, 16, small_writer(), &w,
                                  {Codec::kLossless, Codec::kLossless, 3}) == 0);
      int first_error = 0;
      for (size_t i = 0; i < rows.keys.size() && first_error == 0; ++i) {
        first_error = w->add(rows.keys[i], &rows.values[i * 16], &rows.state[i * 16]);
      }
      CHECK((first_error == 0 || first_error == fault));
      CHECK(w->finish() == fault);
    }
  }
  // Dropped without finish() while blocks are being encoded: the threads end first.
  std::unique_ptr<RowFileWriter> w;
  REQUIRE(RowFileWriter::open(dir.file("y.rows"), 16, 16, small_writer(), &w,
                              {Codec::kLossless, Codec::kLossless, 3}) == 0);
  for (size_t i = 0; i < 5000; ++i) {
    REQUIRE(w->add(rows.keys[i], &rows.values[i * 16], &rows.state[i * 16]) == 0);
  }
  w.reset();
}

TEST_CASE("row file codecs: blocks read ahead come out in order, raw and encoded mixed",
          "[rowfile][codec]") {
  TempDir dir;
  const std::string path = dir.file("mixed.rows");
  // Runs of trained rows (lossless shrinks them: version 2 blocks) and of noise (kept as
  // floats: version 1 blocks), a run a block or more, so both kinds alternate in the file.
  Rows rows;
  for (uint32_t run = 0; run < 12; ++run) {
    const Rows part = run % 3 == 2 ? noise_rows(700, 16, 16, run) : trained_rows(700, 16, 16, run);
    for (size_t i = 0; i < part.keys.size(); ++i) rows.keys.push_back(run * 1000 + i);
    rows.values.insert(rows.values.end(), part.values.begin(), part.values.end());
    rows.state.insert(rows.state.end(), part.state.begin(), part.state.end());
  }
  write_rows(path, rows, 16, 16, {Codec::kLossless, Codec::kLossless});
  const std::vector<char> file = read_file(path);
  ReadBack good;
  for (const bool behind : {false, true}) {
    for (const ReaderOptions& ro : {ReaderOptions{}, odd_reader()}) {
      good = read_rows(path, ro, behind);
      REQUIRE(good.result == 0);
      CHECK(good.rows.keys == rows.keys);
      CHECK(same_bits(good.rows.values, rows.values));
      CHECK(same_bits(good.rows.state, rows.state));
      CHECK(good.checksum == XXH3_64bits(file.data(), file.size()));
    }
  }
  size_t raw = 0, encoded = 0;
  for (const RowCodecs& c : good.stored) (c.any() ? encoded : raw) += 1;
  REQUIRE(raw >= 3);
  REQUIRE(encoded >= 10);
  // A corrupt block deep in a read-ahead batch: every block before it is handed out first.
  for (const size_t block : {size_t{3}, size_t{9}, good.offsets.size() - 1}) {
    std::vector<char> bad = file;
    bad[good.offsets[block] + 64 + 100] ^= 0x01;
    write_file(path, bad);
    for (const bool behind : {false, true}) {
      INFO("block " << block << " check_behind " << behind);
      const ReadBack back = read_rows(path, odd_reader(), behind);
      CHECK(back.result == -EBADMSG);
      const bool is_raw = !good.stored[block].any();
      // A raw block checked behind is handed out before its check fails the next call.
      CHECK(back.offsets.size() == block + (behind && is_raw ? 1 : 0));
      CHECK(back.detail == "block at offset " + std::to_string(good.offsets[block]) +
                               ": payload checksum mismatch");
    }
  }
}

TEST_CASE("row file codecs: a writer refuses an unknown codec", "[rowfile][codec]") {
  TempDir dir;
  std::unique_ptr<RowFileWriter> w;
  CHECK(RowFileWriter::open(dir.file("x.rows"), 4, 0, {}, &w,
                            {static_cast<Codec>(7), Codec::kNone}) == -EINVAL);
  CHECK(RowFileWriter::open(dir.file("x.rows"), 4, 0, {}, &w,
                            {Codec::kNone, static_cast<Codec>(4)}) == -EINVAL);
  CHECK(w == nullptr);
}
