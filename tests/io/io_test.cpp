// White-box tests of the checkpoint I/O layer (io/): FileWriter and FileReader through every
// engine combination the machine offers, injected write faults, and misuse.
//
// allow_uring = false forces pwrite/pread and direct = false forces buffered I/O, so every
// fallback runs here even where io_uring and O_DIRECT work; where they don't, the "preferred"
// combinations fall back and must still pass.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "io/engine/fault.hpp"
#include "io/engine/file_reader.hpp"
#include "io/engine/file_writer.hpp"
#include "tests/io/io_fixtures.hpp"

using namespace embstore::io;

using embstore_test::FaultGuard;
using embstore_test::TempDir;

namespace {

std::vector<unsigned char> pattern(size_t n, uint64_t seed) {
  std::vector<unsigned char> v(n);
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    v[i] = static_cast<unsigned char>((x * 0x2545f4914f6cdd1dull) >> 56);
  }
  return v;
}

// Writes data through a FileWriter in buffer-sized chunks; returns finish()'s result or the
// first failing call's.
int write_all(const std::string& path, const std::vector<unsigned char>& data,
              const WriterOptions& options, std::string* engine = nullptr) {
  std::unique_ptr<FileWriter> w;
  if (const int r = FileWriter::open(path, options, &w); r < 0) return r;
  if (engine != nullptr) *engine = w->engine();
  size_t at = 0;
  while (at < data.size()) {
    void* buf = nullptr;
    if (const int r = w->acquire(&buf); r < 0) {
      w->finish();
      return r;
    }
    REQUIRE(reinterpret_cast<uintptr_t>(buf) % kAlignment == 0);
    const size_t n = std::min(w->buffer_bytes(), data.size() - at);
    std::memcpy(buf, data.data() + at, n);
    if (const int r = w->submit(buf, n); r < 0) {
      w->finish();
      return r;
    }
    at += n;
  }
  const int r = w->finish();
  if (r == 0) REQUIRE(w->bytes_written() == data.size());
  return r;
}

int read_all(const std::string& path, const ReaderOptions& options, std::vector<unsigned char>* out,
             std::string* engine = nullptr) {
  out->clear();
  std::unique_ptr<FileReader> r;
  if (const int e = FileReader::open(path, options, &r); e < 0) return e;
  if (engine != nullptr) *engine = r->engine();
  for (;;) {
    const void* data = nullptr;
    size_t n = 0;
    if (const int e = r->next(&data, &n); e < 0) return e;
    if (n == 0) break;
    // Every chunk but the last is a full buffer.
    if (out->size() + n < r->size()) REQUIRE(n == r->buffer_bytes());
    const auto* p = static_cast<const unsigned char*>(data);
    out->insert(out->end(), p, p + n);
  }
  REQUIRE(out->size() == r->size());
  const void* data = nullptr;
  size_t n = 1;
  REQUIRE(r->next(&data, &n) == 0);  // the end stays the end
  REQUIRE(n == 0);
  return 0;
}

std::vector<unsigned char> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), {});
}

struct Combo {
  bool uring, direct;
};
const Combo kCombos[] = {{true, true}, {true, false}, {false, true}, {false, false}};

WriterOptions options_for(Combo c) {
  WriterOptions o;
  o.allow_uring = c.uring;
  o.direct = c.direct;
  return o;
}

}  // namespace

TEST_CASE("round trip of every size through every engine", "[io]") {
  TempDir dir;
  const size_t sizes[] = {0, 1, 4095, 4096, 4097, (size_t{10} << 20) + 123};
  for (const Combo c : kCombos) {
    for (const bool small_buffers : {false, true}) {
      WriterOptions o = options_for(c);
      if (small_buffers) {  // many chunks: the buffers and the ring wrap around many times
        o.buffer_bytes = 8192;
        o.queue_depth = 3;
        o.buffers = 5;
      }
      for (const size_t size : sizes) {
        CAPTURE(c.uring, c.direct, small_buffers, size);
        const std::vector<unsigned char> data = pattern(size, size + 7);
        const std::string path = dir.file("rt.dat");
        std::string wengine, rengine;
        REQUIRE(write_all(path, data, o, &wengine) == 0);
        CAPTURE(wengine);
        struct stat st;
        REQUIRE(::stat(path.c_str(), &st) == 0);
        REQUIRE(static_cast<size_t>(st.st_size) == size);  // O_DIRECT padding truncated
        REQUIRE(slurp(path) == data);
        std::vector<unsigned char> back;
        REQUIRE(read_all(path, o, &back, &rengine) == 0);
        CAPTURE(rengine);
        REQUIRE(back == data);
      }
    }
  }
}

TEST_CASE("a size hint preallocates, and the file ends where the data ends", "[io]") {
  TempDir dir;
  for (const Combo c : kCombos) {
    // Hints above, below and at the size; sizes aligned and not.
    for (const size_t size : {size_t{0}, size_t{5000}, size_t{3} << 20}) {
      for (const uint64_t hint : {uint64_t{1}, uint64_t{size}, uint64_t{size} + (8u << 20)}) {
        CAPTURE(c.uring, c.direct, size, hint);
        WriterOptions o = options_for(c);
        o.size_hint = hint;
        const std::vector<unsigned char> data = pattern(size, hint);
        const std::string path = dir.file("hint.dat");
        REQUIRE(write_all(path, data, o) == 0);
        struct stat st;
        REQUIRE(::stat(path.c_str(), &st) == 0);
        REQUIRE(static_cast<size_t>(st.st_size) == size);
        // Nothing stays allocated past the data (blocks are 512 bytes).
        REQUIRE(static_cast<uint64_t>(st.st_blocks) * 512 <= size + (size_t{1} << 20));
        REQUIRE(slurp(path) == data);
      }
    }
  }
}

TEST_CASE("engine names follow the options and the machine", "[io]") {
  TempDir dir;
  for (const Combo c : kCombos) {
    std::unique_ptr<FileWriter> w;
    REQUIRE(FileWriter::open(dir.file("e.dat"), options_for(c), &w) == 0);
    const std::string we = w->engine();
    REQUIRE(w->finish() == 0);
    std::unique_ptr<FileReader> r;
    REQUIRE(FileReader::open(dir.file("e.dat"), options_for(c), &r) == 0);
    const std::string re = r->engine();
    CAPTURE(c.uring, c.direct, we, re);
    const bool w_uring = we.rfind("io_uring", 0) == 0;
    const bool w_direct = we.find("+O_DIRECT") != std::string::npos;
    REQUIRE((w_uring || we.rfind("pwrite", 0) == 0));
    REQUIRE((re.rfind("io_uring", 0) == 0 || re.rfind("pread", 0) == 0));
    if (!c.uring) REQUIRE(!w_uring);
    if (!c.direct) REQUIRE(!w_direct);
    // Reader and writer probe the same way, so they agree.
    REQUIRE(w_uring == (re.rfind("io_uring", 0) == 0));
    REQUIRE(w_direct == (re.find("+O_DIRECT") != std::string::npos));
  }
  // Where this test machine has io_uring and O_DIRECT, the default must use both; set
  // EMBSTORE_IO_TEST_EXPECT=io_uring+O_DIRECT to enforce it.
  if (const char* expect = std::getenv("EMBSTORE_IO_TEST_EXPECT")) {
    std::unique_ptr<FileWriter> w;
    REQUIRE(FileWriter::open(dir.file("d.dat"), {}, &w) == 0);
    REQUIRE(std::string(w->engine()) == expect);
    REQUIRE(w->finish() == 0);
  }
}

TEST_CASE("more writes than buffers: acquire waits for a completion", "[io]") {
  TempDir dir;
  for (const Combo c : kCombos) {
    for (const unsigned buffers : {1u, 2u, 8u}) {
      WriterOptions o = options_for(c);
      o.buffer_bytes = kAlignment;
      o.queue_depth = 2;
      o.buffers = buffers;  // 8 > queue depth: submit waits instead of acquire
      CAPTURE(c.uring, c.direct, buffers);
      const std::vector<unsigned char> data = pattern(1000 * kAlignment + 17, buffers);
      REQUIRE(write_all(dir.file("w.dat"), data, o) == 0);
      REQUIRE(slurp(dir.file("w.dat")) == data);
      std::vector<unsigned char> back;
      REQUIRE(read_all(dir.file("w.dat"), o, &back) == 0);
      REQUIRE(back == data);
    }
  }
}

TEST_CASE("acquire refuses when the caller holds every buffer", "[io]") {
  TempDir dir;
  WriterOptions o;
  o.buffers = 2;
  o.queue_depth = 2;
  std::unique_ptr<FileWriter> w;
  REQUIRE(FileWriter::open(dir.file("h.dat"), o, &w) == 0);
  void *a = nullptr, *b = nullptr, *c = nullptr;
  REQUIRE(w->acquire(&a) == 0);
  REQUIRE(w->acquire(&b) == 0);
  REQUIRE(a != b);
  REQUIRE(w->acquire(&c) == -ENOBUFS);
  REQUIRE(w->submit(a, 0) == 0);  // an empty write gives the buffer back
  REQUIRE(w->acquire(&c) == 0);
  REQUIRE(c == a);
  REQUIRE(w->finish() == 0);
  REQUIRE(w->bytes_written() == 0);
}

TEST_CASE("misuse is refused with -EINVAL", "[io]") {
  TempDir dir;
  for (const Combo c : kCombos) {
    CAPTURE(c.uring, c.direct);
    std::unique_ptr<FileWriter> w;
    REQUIRE(FileWriter::open(dir.file("m.dat"), options_for(c), &w) == 0);
    char foreign[16];
    REQUIRE(w->submit(foreign, 1) == -EINVAL);
    void* buf = nullptr;
    REQUIRE(w->acquire(&buf) == 0);
    REQUIRE(w->submit(static_cast<char*>(buf) + 1, 1) == -EINVAL);
    REQUIRE(w->submit(buf, w->buffer_bytes() + 1) == -EINVAL);  // gives the buffer back
    REQUIRE(w->submit(buf, 1) == -EINVAL);                      // no longer held
    REQUIRE(w->acquire(&buf) == 0);
    std::memset(buf, 'x', 100);
    REQUIRE(w->submit(buf, 100) == 0);
    REQUIRE(w->acquire(&buf) == 0);
    REQUIRE(w->submit(buf, kAlignment) == -EINVAL);  // nothing may follow a partial write
    REQUIRE(w->finish() == 0);
    REQUIRE(w->finish() == -EINVAL);
    REQUIRE(w->acquire(&buf) == -EINVAL);
    REQUIRE(slurp(dir.file("m.dat")) == std::vector<unsigned char>(100, 'x'));
  }
  WriterOptions bad;
  std::unique_ptr<FileWriter> w;
  bad.queue_depth = 0;
  REQUIRE(FileWriter::open(dir.file("b.dat"), bad, &w) == -EINVAL);
  bad = {};
  bad.buffer_bytes = 0;
  REQUIRE(FileWriter::open(dir.file("b.dat"), bad, &w) == -EINVAL);
  REQUIRE(FileWriter::open(dir.file("b.dat"), {}, nullptr) == -EINVAL);
}

TEST_CASE("an injected ENOSPC or EIO fails the file, never silently", "[io]") {
  TempDir dir;
  const std::vector<unsigned char> data = pattern((size_t{8} << 20) + 5, 99);
  for (const int err : {-ENOSPC, -EIO}) {
    for (const uint64_t fault_at : {uint64_t{0}, uint64_t{3} << 20, uint64_t{8} << 20}) {
      for (const Combo c : kCombos) {
        CAPTURE(err, fault_at, c.uring, c.direct);
        int calls = 0;
        FaultGuard guard([&](uint64_t offset, size_t bytes) {
          ++calls;
          return offset <= fault_at && fault_at < offset + bytes ? err : 0;
        });
        const std::string path = dir.file("f.dat");
        REQUIRE(write_all(path, data, options_for(c)) == err);
        REQUIRE(calls > 0);
        // The faulted range never reached the file: it is shorter or differs there.
        const std::vector<unsigned char> on_disk = slurp(path);
        const bool complete = on_disk.size() == data.size() &&
                              std::memcmp(on_disk.data() + fault_at, data.data() + fault_at,
                                          std::min<size_t>(4096, data.size() - fault_at)) == 0;
        REQUIRE_FALSE(complete);
      }
    }
  }
  // Off again: the next file is fine.
  REQUIRE(write_all(dir.file("ok.dat"), data, {}) == 0);
  REQUIRE(slurp(dir.file("ok.dat")) == data);
}

TEST_CASE("finish reports a fault seen by an earlier call too", "[io]") {
  TempDir dir;
  for (const Combo c : kCombos) {
    CAPTURE(c.uring, c.direct);
    FaultGuard guard([](uint64_t offset, size_t) { return offset == 0 ? -EIO : 0; });
    WriterOptions o = options_for(c);
    std::unique_ptr<FileWriter> w;
    REQUIRE(FileWriter::open(dir.file("g.dat"), o, &w) == 0);
    void* buf = nullptr;
    REQUIRE(w->acquire(&buf) == 0);
    REQUIRE(w->submit(buf, w->buffer_bytes()) == -EIO);  // known at once
    REQUIRE(w->acquire(&buf) == -EIO);                   // sticky
    REQUIRE(w->finish() == -EIO);
  }
}

TEST_CASE("a missing directory gives -ENOENT", "[io]") {
  TempDir dir;
  for (const Combo c : kCombos) {
    std::unique_ptr<FileWriter> w;
    REQUIRE(FileWriter::open(dir.file("no/such/dir/x.dat"), options_for(c), &w) == -ENOENT);
    REQUIRE(w == nullptr);
    std::unique_ptr<FileReader> r;
    REQUIRE(FileReader::open(dir.file("missing.dat"), options_for(c), &r) == -ENOENT);
    REQUIRE(r == nullptr);
  }
}

TEST_CASE("the reader reads files it did not write, with read-ahead", "[io]") {
  TempDir dir;
  const std::vector<unsigned char> data = pattern((size_t{3} << 20) + 4321, 5);
  {
    std::ofstream out(dir.file("plain.dat"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(data.data()),
              static_cast<std::streamsize>(data.size()));
  }
  for (const Combo c : kCombos) {
    for (const unsigned depth : {1u, 4u, 32u}) {
      ReaderOptions o = options_for(c);
      o.buffer_bytes = 64 * 1024;
      o.queue_depth = depth;
      o.buffers = depth == 4 ? 6 : 0;
      CAPTURE(c.uring, c.direct, depth);
      std::vector<unsigned char> back;
      REQUIRE(read_all(dir.file("plain.dat"), o, &back) == 0);
      REQUIRE(back == data);
    }
  }
}

TEST_CASE("a writer dropped without finish waits and closes", "[io]") {
  TempDir dir;
  for (const Combo c : kCombos) {
    std::unique_ptr<FileWriter> w;
    REQUIRE(FileWriter::open(dir.file("d.dat"), options_for(c), &w) == 0);
    for (int i = 0; i < 20; ++i) {
      void* buf = nullptr;
      REQUIRE(w->acquire(&buf) == 0);
      std::memset(buf, i + 1, w->buffer_bytes());
      REQUIRE(w->submit(buf, w->buffer_bytes()) == 0);
    }
    w.reset();  // must not crash nor leave the kernel writing into freed buffers
  }
}
