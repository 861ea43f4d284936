// Fuzzes the row file reader (RowFileReader, io/format/row_file.hpp). The input is written to a
// regular file of the process's own (created once, under $TMPDIR or /tmp, removed at exit) and
// read from there: the reader opens with O_NOFOLLOW, so a memfd's /proc/self/fd/N (a symlink),
// which this harness used until 2026-11-28, was refused with ELOOP and no block was ever read.
// Checks:
// - opening the file succeeds (it is a regular file: nothing is read before next_block);
// - next_block never crashes and never hands out memory outside the file: every key, value and
//   state float of every block is read (ASan catches a read out of bounds);
// - a block is consistent: a known kind, the first block's dim/state_dim throughout, tombstones
//   without values, offsets on 4096-byte boundaries and inside the file, in order;
// - an error is -EBADMSG (with a reason) or another -errno, and is returned again by the next
//   call;
// - the reader's chunking does not change the result: the file is read with the default
//   chunk size (1 MiB) and engine (io_uring and O_DIRECT where the kernel allows them), and
//   again with 4096-byte chunks (blocks then span chunks and are gathered) over pread; both
//   see the same blocks and the same end (abort() otherwise).
// Mutations almost always break a block's XXH3 checksums, so every input is read a second time
// with the checksums of its blocks recomputed, to reach the checks that follow them.
#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "io/format/row_file.hpp"

namespace {

using embstore::io::ReaderOptions;
using embstore::io::RowBlock;
using embstore::io::RowBlockKind;
using embstore::io::RowFileReader;

[[noreturn]] void fail(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "row_file_fuzz: %s %s\n", what, detail.c_str());
  std::abort();
}

// What one read of the file saw: per block its shape and a digest of its contents, then the
// final result.
struct Trace {
  std::vector<uint64_t> blocks;
  int end = 0;
  bool operator==(const Trace&) const = default;
};

uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001b3ull + (h >> 29); }

// Reads every byte the block points at.
uint64_t digest(const RowBlock& b) {
  uint64_t h = mix(mix(mix(mix(0, static_cast<uint64_t>(b.kind)), b.rows), b.dim), b.state_dim);
  h = mix(h, b.offset);
  for (uint32_t i = 0; i < b.rows; ++i) h = mix(h, static_cast<uint64_t>(b.keys[i]));
  auto floats = [&h](const float* p, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &p[i], sizeof bits);
      h = mix(h, bits);
    }
  };
  if (b.kind == RowBlockKind::kUpserts) {
    if (b.values == nullptr && b.rows > 0 && b.dim > 0) fail("upserts without values");
    floats(b.values, uint64_t{b.rows} * b.dim);
    if (b.state_dim > 0) {
      if (b.state == nullptr && b.rows > 0) fail("upserts with state_dim but no state");
      floats(b.state, uint64_t{b.rows} * b.state_dim);
    } else if (b.state != nullptr) {
      fail("state without state_dim");
    }
  } else {
    if (b.kind != RowBlockKind::kTombstones) fail("unknown block kind handed out");
    if (b.values != nullptr || b.state != nullptr) fail("tombstones with values or state");
  }
  return h;
}

Trace read_all(const std::string& path, const ReaderOptions& options, uint64_t size) {
  Trace t;
  std::unique_ptr<RowFileReader> reader;
  if (const int e = RowFileReader::open(path, options, &reader); e < 0) {
    fail("open of a regular file failed", std::to_string(e));
  }
  RowBlock b;
  uint32_t dim = 0, state_dim = 0;
  uint64_t next_offset = 0;
  int r;
  while ((r = reader->next_block(&b)) == 1) {
    if (b.offset % 4096 != 0 || b.offset >= size || b.offset < next_offset) {
      fail("block offset out of place", std::to_string(b.offset));
    }
    if (t.blocks.empty()) {
      dim = b.dim;
      state_dim = b.state_dim;
    } else if (b.dim != dim || b.state_dim != state_dim) {
      fail("blocks of different shapes");
    }
    next_offset = b.offset + 4096;
    if (b.rows > 0 && b.keys == nullptr) fail("rows without keys");
    t.blocks.push_back(digest(b));
  }
  if (r != 0 && !(r < 0 && r >= -4095)) fail("next_block: not 0, 1 or -errno", std::to_string(r));
  if (r == -EBADMSG && reader->error_detail().empty()) fail("-EBADMSG without a reason");
  if (r < 0 && reader->next_block(&b) != r) fail("the error is not returned again");
  if (r == 0 && reader->next_block(&b) != 0) fail("the end is not returned again");
  t.end = r;
  return t;
}

std::string scratch;  // the file inputs are written to

void remove_scratch() { ::unlink(scratch.c_str()); }

const std::string& scratch_path() {
  if (scratch.empty()) {
    const char* dir = std::getenv("TMPDIR");
    std::string name = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") +
                       "/row_file_fuzz.XXXXXX";
    const int fd = ::mkstemp(name.data());
    if (fd < 0) {
      std::perror("mkstemp");
      std::abort();
    }
    ::close(fd);
    scratch = name;
    std::atexit(remove_scratch);
  }
  return scratch;
}

// Reads the bytes as a row file, twice, and compares.
void check(const uint8_t* data, size_t size) {
  const std::string& path = scratch_path();
  const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) std::abort();
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    if (n <= 0) std::abort();
    done += static_cast<size_t>(n);
  }
  ::close(fd);

  // The default chunk size and engine, but one buffer instead of queue_depth (16): inputs are
  // far below one 1 MiB chunk, so read-ahead never starts, and sixteen 1 MiB buffers,
  // allocated under ASan and registered with the ring, cost 12 ms per input instead of 1.
  ReaderOptions wide_options;
  wide_options.queue_depth = 1;
  const Trace wide = read_all(path, wide_options, size);

  ReaderOptions narrow_options;
  narrow_options.queue_depth = 2;
  narrow_options.buffer_bytes = 4096;
  narrow_options.allow_uring = false;
  const Trace narrow = read_all(path, narrow_options, size);

  if (!(wide == narrow)) {
    fail("the chunk size or engine changed what was read",
         std::to_string(wide.end) + "/" + std::to_string(narrow.end) + " after " +
             std::to_string(wide.blocks.size()) + "/" + std::to_string(narrow.blocks.size()) +
             " blocks");
  }
}

uint64_t load_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The input with every block's payload and header checksums made right, following the blocks
// the way the reader does (each starts where the previous one's padding ends). Empty when
// nothing changes.
std::vector<uint8_t> with_checksums(const uint8_t* data, size_t size) {
  std::vector<uint8_t> copy(data, data + size);
  size_t at = 0;
  while (at <= size && size - at >= embstore::io::kRowBlockHeaderBytes) {
    uint8_t* h = copy.data() + at;
    const uint64_t payload = load_u64(h + 40);
    const size_t rest = size - at - embstore::io::kRowBlockHeaderBytes;
    if (payload <= rest) {
      const uint64_t sum = XXH3_64bits(h + embstore::io::kRowBlockHeaderBytes, payload);
      std::memcpy(h + 48, &sum, sizeof sum);
    }
    const uint64_t head = XXH3_64bits(h, 56);
    std::memcpy(h + 56, &head, sizeof head);
    if (payload > rest) break;
    at += embstore::io::detail::align_up(embstore::io::kRowBlockHeaderBytes + payload);
  }
  if (size == 0 || std::memcmp(copy.data(), data, size) == 0) copy.clear();
  return copy;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  check(data, size);
  // Mutated blocks almost never keep their checksums: the same bytes with them recomputed
  // reach the checks behind them (kind, shape, sizes, padding).
  if (const std::vector<uint8_t> fixed = with_checksums(data, size); !fixed.empty()) {
    check(fixed.data(), fixed.size());
  }
  return 0;
}
