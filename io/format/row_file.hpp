// Row files of a checkpoint (docs/DESIGN.md, "On-disk layout and commit"):
// `tables/<table>/shard-00000-of-00001.rows`, a sequence of checksummed blocks. liburing style:
// every call returns 0 (or a count) or -errno; nothing throws.
//
// Block layout, all integers little-endian:
//
//   offset  size  field
//        0     8  magic "EMBROWS1"
//        8     4  format version, u32: 1, or 2 for a block whose values or state are encoded
//       12     4  kind, u32: 0 = upserts (keys, values, state), 1 = tombstones (keys only)
//       16     4  rows, u32
//       20     4  dim, u32 (the file's; tombstone blocks carry it too)
//       24     4  state_dim, u32 (the file's)
//       28    12  version 1: reserved, written as zeros. Version 2 (upserts only):
//                   28  1  values' codec, u8 (io/codec/block_codec.hpp: 0 none, 1 lossless,
//                          2 bf16, 3 int8)
//                   29  1  state's codec, u8
//                   30  2  zeros
//                   32  4  values' stored bytes, u32
//                   36  4  state's stored bytes, u32
//       40     8  payload bytes, u64
//       48     8  payload checksum, u64: XXH3_64bits of the payload (the stored bytes)
//       56     8  header checksum, u64: XXH3_64bits of bytes [0, 56) of the header
//       64        payload: keys (int64 x rows), then for upserts values (float x rows x dim),
//                 then state (float x rows x state_dim); in version 2 values and state are
//                 each stored in their codec's encoding (BlockCodec), keys as in version 1
//                 zero padding up to the next multiple of 4096
//
// Codecs (issue 35): a writer opened with RowCodecs encodes each upsert block's values and
// state; a column whose encoding would not be smaller than its floats (lossless on noise, int8
// at dim < 3) is stored as floats (codec 0) in that block. Blocks where both columns end up as
// floats, and tombstone blocks, are version 1, so a file written without codecs is byte for
// byte what earlier versions wrote, and readers of version 1 only refuse just the encoded
// blocks. A reader checks an encoded block's payload checksum before decoding it (with
// check_behind too), so corrupt stored bytes are reported as corrupt, never decoded; a block
// that checks but does not decode (a size that lies, a bomb) is corrupt too. The decoded block
// is bounded like a version 1 block: rows x row_bytes within kMaxRowBlockBytes.
//
// Threads: a writer with codecs encodes full blocks on encoder threads while the caller fills
// the next (RowCodecs::threads; started with the first full block, and without threads when
// none can start), and writes them in order; a reader that meets encoded blocks reads up to 8
// of them (at most 32 MiB stored and decoded, past the first) ahead of the caller and checks
// and decodes them on decoder threads (one per core, at most 4), handing them out in order. A
// problem in a block read ahead is reported when the caller reaches that block, after the blocks
// before it.
//
// Every block, the last included, is padded to 4096 bytes, so each block is one FileWriter
// submit that keeps FileWriter's alignment rule, and the file size is a multiple of 4096. An
// empty file (0 bytes) holds no rows.
//
// Rows per block: a block must fit one FileWriter staging buffer (buffer_bytes, 1 MiB by
// default), so a block holds at most (buffer_bytes - 64) / row_bytes rows, where row_bytes is
// 8 + 4 * dim + 4 * state_dim for upserts and 8 for tombstones. A block ends early when the
// kind changes (upserts and tombstones never share a block) and at finish().
//
//   std::unique_ptr<RowFileWriter> w;
//   if (int r = RowFileWriter::open(path, dim, state_dim, {}, &w); r < 0) return r;
//   for (...) if (int r = w->add(key, value, state); r < 0) { w->finish(); return r; }
//   return w->finish();  // then bytes() and checksum() go into the manifest
//
//   std::unique_ptr<RowFileReader> r;
//   if (int e = RowFileReader::open(path, {}, &r); e < 0) return e;
//   RowBlock b;
//   while ((e = r->next_block(&b)) == 1) apply(b);
//   return e;  // 0 at a clean end; -EBADMSG with r->error_detail() for a corrupt file
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "io/codec/block_codec.hpp"
#include "io/engine/file_reader.hpp"
#include "io/engine/file_writer.hpp"
#include "io/format/block_workers.hpp"

struct XXH3_state_s;

namespace embstore::io {

namespace detail {
struct HashDeleter {
  void operator()(XXH3_state_s* s) const;
};
}  // namespace detail

inline constexpr char kRowFileMagic[8] = {'E', 'M', 'B', 'R', 'O', 'W', 'S', '1'};
inline constexpr uint32_t kRowFileVersion = 1;
// The block version of encoded upserts (the header's codec fields are read).
inline constexpr uint32_t kRowFileEncodedVersion = 2;
inline constexpr size_t kRowBlockHeaderBytes = 64;
// The largest block a reader takes: writers' blocks fit their staging buffer (1 MiB, or the
// widest row's record, 48 KiB, and a header), so this leaves a wide margin and still bounds
// what a forged header can make a reader allocate.
inline constexpr size_t kMaxRowBlockBytes = size_t{64} << 20;

enum class RowBlockKind : uint32_t { kUpserts = 0, kTombstones = 1 };

// The codecs a writer encodes each upsert block's columns with.
struct RowCodecs {
  Codec values = Codec::kNone;
  Codec state = Codec::kNone;
  // Threads that encode blocks while the caller fills the next ones (blocks are still written
  // in order); 0: one per core, at most 4. Unused without a codec or rounding.
  unsigned threads = 0;
  // Values rounded to bf16 (round_to_bf16) before their codec encodes them, on the encoder
  // threads: how values-only files store the serving codec BF16 (serving_row_codecs). Not
  // recorded in the file: its blocks say only how the rounded values are stored.
  bool round_values_to_bf16 = false;
  bool any() const {
    return values != Codec::kNone || state != Codec::kNone || round_values_to_bf16;
  }
};

// How a values-only file (no state) stores a table's serving codec: BF16 as values rounded to
// bf16 and then stored LOSSLESS, whose byte shuffle and zstd take the zero low halves away, the
// fewest bytes within bf16's bound; the others as they are. Rows read back from such a file are
// bf16 values already, so writing them again this way stores the same values.
inline RowCodecs serving_row_codecs(Codec serving) {
  RowCodecs codecs;
  codecs.values = serving == Codec::kBf16 ? Codec::kLossless : serving;
  codecs.round_values_to_bf16 = serving == Codec::kBf16;
  return codecs;
}

// One block as the reader hands it out; the pointers stay valid until the next call to
// next_block(). values and state are null for tombstones (and state when state_dim is 0).
struct RowBlock {
  RowBlockKind kind = RowBlockKind::kUpserts;
  uint32_t rows = 0;
  uint32_t dim = 0;
  uint32_t state_dim = 0;
  uint64_t offset = 0;        // the block's byte offset in the file
  RowCodecs stored;           // how the block stored its columns (decoded for the caller)
  uint64_t stored_bytes = 0;  // the block's bytes in the file: header, payload and padding
  const int64_t* keys = nullptr;
  const float* values = nullptr;  // rows x dim, row-major
  const float* state = nullptr;   // rows x state_dim, row-major
};

class RowFileWriter {
 public:
  // Creates (or truncates) path. -EINVAL when dim is 0, one row does not fit a staging buffer
  // or a codec is unknown; FileWriter::open's errors otherwise. codecs: how upsert blocks store
  // values and state (none: version 1 blocks, as before codecs).
  static int open(const std::string& path, uint32_t dim, uint32_t state_dim,
                  const WriterOptions& options, std::unique_ptr<RowFileWriter>* out,
                  RowCodecs codecs = {});
  // Without finish(): the file is left incomplete (FileWriter's destructor, no fsync).
  ~RowFileWriter();
  RowFileWriter(const RowFileWriter&) = delete;
  RowFileWriter& operator=(const RowFileWriter&) = delete;

  // Appends an upsert: dim floats of value and state_dim floats of state (state may be null
  // when state_dim is 0). Writes a block when it is full. -EINVAL for a null pointer that is
  // needed or a call after finish(); the first write error once one has been seen.
  int add(int64_t key, const float* value, const float* state);
  // Appends a tombstone (a deleted key).
  int add_tombstone(int64_t key);
  // Writes the last block, waits, fsyncs and closes. Returns the first error of the whole
  // file; the file is then incomplete and must not be committed. Call once.
  int finish();

  // Rows added (upserts and tombstones).
  uint64_t rows() const { return rows_; }
  // Bytes handed to the file so far: its size once finish() returned 0.
  uint64_t bytes() const { return writer_->bytes_written(); }
  // XXH3_64bits of every byte handed to the file, padding included: the whole file's checksum
  // once finish() returned 0.
  uint64_t checksum() const;
  // The most rows one block of each kind holds.
  uint32_t rows_per_block(RowBlockKind kind) const {
    return kind == RowBlockKind::kUpserts ? upsert_capacity_ : tombstone_capacity_;
  }
  const RowCodecs& codecs() const { return codecs_; }
  // The first encoding error's words (a codec that failed), for the caller's message.
  const std::string& error_detail() const { return error_detail_; }

 private:
  RowFileWriter() = default;
  void fail(int err) {
    if (error_ == 0) error_ = err;
  }
  // A filled block on its way to the file: laid out in its buffer (compacted, encoded, padded,
  // its header written) by lay_out_block, on an encoder thread or the caller's, then hashed into
  // the file's checksum and submitted, in order, by submit_pending.
  struct Block {
    char* buf = nullptr;
    RowBlockKind kind = RowBlockKind::kUpserts;
    uint32_t count = 0, capacity = 0;
    size_t bytes = 0;  // laid out: header, payload and padding
    int error = 0;     // an encoding error, with detail
    std::string detail;
    bool done = false;  // laid out (under the encoders' mutex when there are encoders)
  };
  // One thread's codec and scratch.
  struct Coder {
    BlockCodec codec;
    std::vector<char> encoded[2];  // values', state's encoding of a block
  };
  using Encoders = detail::BlockWorkers<Block, Coder>;

  // Acquires a staging buffer and lays out a new block of kind there.
  int start_block(RowBlockKind kind);
  // Hands the block being filled over to be laid out and written.
  int flush_block();
  // Lays b out in its buffer: everything but the file's checksum. Reads only what open() set.
  void lay_out_block(Block& b, Coder* coder) const;
  // With codecs: encodes the compacted upsert block's values and state (after its keys) in
  // place, writing the codec fields of header h; *payload_bytes becomes the stored size. Falls
  // back to floats for a column whose encoding is not smaller.
  int encode_block(Block& b, Coder* coder, char* h, uint64_t* payload_bytes) const;
  // Submits the oldest blocks in order: waits for them until at most keep are pending, then
  // takes those already laid out. The first error, or 0.
  int submit_pending(size_t keep);
  // Starts the encoder threads unless they run or cannot: false when blocks are laid out by the
  // caller (no codec, one staging buffer, or no thread could start).
  bool start_encoders();

  std::unique_ptr<FileWriter> writer_;
  std::unique_ptr<XXH3_state_s, detail::HashDeleter> hash_;
  RowCodecs codecs_;
  std::unique_ptr<Coder> coder_;  // the caller's
  std::deque<std::unique_ptr<Block>> pending_;
  size_t max_pending_ = 0;        // blocks laid out by encoders at once (staging buffers - 1)
  unsigned encoder_threads_ = 0;  // to start with the first full block; 0: none
  std::string error_detail_;
  uint32_t dim_ = 0;
  uint32_t state_dim_ = 0;
  uint32_t upsert_capacity_ = 0;
  uint32_t tombstone_capacity_ = 0;
  // The block being filled, in place in the staging buffer: keys, values and state each at
  // its offset for a full block, compacted by flush_block() when the block ends short.
  char* buf_ = nullptr;
  RowBlockKind kind_ = RowBlockKind::kUpserts;
  uint32_t capacity_ = 0;
  uint32_t count_ = 0;
  uint64_t rows_ = 0;
  bool finished_ = false;
  int error_ = 0;
  std::unique_ptr<Encoders> encoders_;  // with codecs; last, so its threads end first
};

class RowFileReader {
 public:
  // FileReader::open's errors. The first block is not read until next_block().
  //
  // check_behind: a block's payload checksum, padding and share of the file's XXH3 are checked
  // on a thread of the reader's own while the caller uses the block, and a mismatch is returned
  // by the next call of next_block() (the one that would hand out the following block, or
  // report the end) instead of this one. For a caller that can drop what it did with a block
  // when a later call fails (a restore loading a table aside): reading, checking and using the
  // file then overlap. The header is always checked before the block is handed out.
  static int open(const std::string& path, const ReaderOptions& options,
                  std::unique_ptr<RowFileReader>* out, bool check_behind = false);
  ~RowFileReader();
  RowFileReader(const RowFileReader&) = delete;
  RowFileReader& operator=(const RowFileReader&) = delete;

  // 1 and the next block in *out; 0 at a clean end of the file; -EBADMSG for a corrupt or
  // truncated block (error_detail() says where and what); other -errno from reading. An error
  // is returned again by every later call.
  int next_block(RowBlock* out);
  // With check_behind: waits for the check of the last version 1 block read: the block handed
  // out last, or, after encoded blocks, one read ahead of the caller (then its corruption is
  // reported early, as the file's). 0, or -EBADMSG (and error_detail()) when it is corrupt.
  // Without check_behind, 0.
  int wait_checked() { return error_ != 0 ? error_ : wait_behind(); }
  // "block at offset N: what was wrong" after -EBADMSG; empty otherwise.
  const std::string& error_detail() const { return error_detail_; }
  // XXH3_64bits of every byte read so far (headers, payloads, padding): the whole file's
  // checksum once next_block() returned 0, checked against the manifest without a second read.
  // With check_behind, only once next_block() has returned 0 or an error.
  uint64_t checksum() const;

 private:
  // A block's payload and padding (`span` bytes from data) waiting to be checked against the
  // header's payload checksum.
  struct Payload {
    const char* data = nullptr;
    uint64_t bytes = 0;
    uint64_t span = 0;
    uint64_t xxh3 = 0;
    uint64_t offset = 0;  // the block's
  };
  class BehindChecker;

  RowFileReader() = default;
  int corrupt(uint64_t offset, const std::string& what);
  // The next n bytes of the file: in place when they lie in the current chunk, else gathered
  // into scratch_. Valid until the next call. Hashed into the file's XXH3 unless told not to.
  int take(size_t n, const char** data, bool hash = true);
  // Hashes the payload into the file's XXH3 (when hash) and checks it: nullptr, or what is wrong.
  const char* check_payload(const Payload& p, bool hash);
  // With check_behind, waits for the check of the block handed out last: 0 or its error.
  int wait_behind();
  // A block read ahead of the caller. A version 1 block points into the reader's chunk (and is
  // always the last one read ahead); an encoded block owns its stored bytes and is checked and
  // decoded on a decoder thread (or the caller's) before it is handed out.
  struct Ahead {
    RowBlock block;
    bool encoded = false;
    Payload payload;               // encoded: in stored
    std::vector<uint64_t> stored;  // uint64_t keeps the keys aligned
    uint32_t value_bytes = 0, state_bytes = 0;
    std::vector<float> decoded;  // values, then state
    int error = 0;               // this block's, or (read ahead) the reading's
    std::string detail;
    bool done = false;  // under the decoders' mutex
    // Ready for the next block, as a new one, but for the buffers' memory.
    void reuse() {
      std::vector<uint64_t> kept_stored = std::move(stored);
      std::vector<float> kept_decoded = std::move(decoded);
      *this = Ahead{};
      stored = std::move(kept_stored);
      decoded = std::move(kept_decoded);
    }
  };
  using Decoders = detail::BlockWorkers<Ahead, BlockCodec>;
  // Blocks read ahead at most (decoded by one thread per core, at most 4), and their bytes
  // (stored and decoded) at most, past the first block.
  static constexpr size_t kReadAhead = 8;
  static constexpr uint64_t kReadAheadBytes = uint64_t{32} << 20;
  static constexpr size_t kSpareBlocks = kReadAhead + 1;

  // Reads the next block's header and payload into *a: 1, 0 at the end, or an error (in
  // error_ and error_detail_).
  int read_block(Ahead* a);
  // Reads blocks ahead into ahead_ (up to kReadAhead, up to and including a version 1 block or
  // an error), handing encoded ones to the decoders.
  int fill_ahead();
  // Checks a's payload and decodes it into a.decoded; a.error on failure (never throws).
  // Reads only a.
  void decode(Ahead& a, BlockCodec* codec);
  void decode_checked(Ahead& a, BlockCodec* codec);
  std::unique_ptr<FileReader> reader_;
  std::unique_ptr<XXH3_state_s, detail::HashDeleter> hash_;
  const char* chunk_ = nullptr;  // the current chunk of FileReader
  size_t chunk_bytes_ = 0;
  size_t chunk_at_ = 0;            // bytes of the chunk already consumed
  uint64_t offset_ = 0;            // file offset of the next unconsumed byte
  std::vector<uint64_t> scratch_;  // uint64_t keeps gathered keys 8-byte aligned
  bool have_shape_ = false;
  uint32_t dim_ = 0;
  uint32_t state_dim_ = 0;
  int error_ = 0;
  std::string error_detail_;
  std::unique_ptr<BehindChecker> behind_;
  std::deque<std::unique_ptr<Ahead>> ahead_;  // read, not yet handed out
  std::unique_ptr<Ahead> current_;            // handed out by the last next_block
  // Blocks handed out, for the next reads (at most kSpareBlocks, each of at most
  // kReadAheadBytes / kSpareBlocks of buffers): a file's blocks are alike, so an encoded
  // block's buffers are not allocated, zeroed and faulted in again each block.
  std::vector<std::unique_ptr<Ahead>> spare_;
  std::unique_ptr<BlockCodec> decoder_;  // the caller's, with decoders_
  std::unique_ptr<Decoders> decoders_;   // made by the first encoded block; last
};

}  // namespace embstore::io
