#include "io/format/row_file.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <system_error>

#include "io/format/xxh3.hpp"

namespace embstore::io {

// Keys and floats go to disk as they lie in memory.
static_assert(std::endian::native == std::endian::little, "row files are little-endian");

namespace {

constexpr size_t kHeaderHashedBytes = 56;

void put_u32(char* p, uint32_t v) { std::memcpy(p, &v, sizeof v); }
void put_u64(char* p, uint64_t v) { std::memcpy(p, &v, sizeof v); }
uint32_t get_u32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
uint64_t get_u64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

uint64_t upsert_row_bytes(uint64_t dim, uint64_t state_dim) {
  return sizeof(int64_t) + sizeof(float) * (dim + state_dim);
}

// The most rows of row_bytes that fit one block of buffer_bytes (0 when not even one does).
uint32_t block_capacity(size_t buffer_bytes, uint64_t row_bytes) {
  if (buffer_bytes < kRowBlockHeaderBytes) return 0;
  const uint64_t rows = (buffer_bytes - kRowBlockHeaderBytes) / row_bytes;
  return static_cast<uint32_t>(std::min<uint64_t>(rows, std::numeric_limits<uint32_t>::max()));
}

}  // namespace

// ------------------------------------------------------------------------------ writer --

void detail::HashDeleter::operator()(XXH3_state_s* s) const { XXH3_freeState(s); }

RowFileWriter::~RowFileWriter() {
  // Blocks still being laid out write into the file writer's buffers: the threads end first.
  encoders_.reset();
}

int RowFileWriter::open(const std::string& path, uint32_t dim, uint32_t state_dim,
                        const WriterOptions& options, std::unique_ptr<RowFileWriter>* out,
                        RowCodecs codecs) {
  if (out == nullptr || dim == 0) return -EINVAL;
  if (!codec_is_known(static_cast<uint32_t>(codecs.values)) ||
      !codec_is_known(static_cast<uint32_t>(codecs.state))) {
    return -EINVAL;
  }
  std::unique_ptr<RowFileWriter> w(new RowFileWriter());
  w->dim_ = dim;
  w->state_dim_ = state_dim;
  w->codecs_ = codecs;
  w->hash_.reset(XXH3_createState());
  if (!w->hash_ || XXH3_64bits_reset(w->hash_.get()) != XXH_OK) return -ENOMEM;
  if (const int r = FileWriter::open(path, options, &w->writer_); r < 0) return r;
  const size_t buffer = w->writer_->buffer_bytes();
  w->upsert_capacity_ = block_capacity(buffer, upsert_row_bytes(dim, state_dim));
  w->tombstone_capacity_ = block_capacity(buffer, sizeof(int64_t));
  if (w->upsert_capacity_ == 0) {
    w->writer_->finish();
    return -EINVAL;
  }
  // Blocks being encoded hold a staging buffer each; one more is the block being filled. The
  // encoder threads start with the first full block (a writer of a few rows never starts them).
  const unsigned buffers = options.buffers != 0 ? options.buffers : options.queue_depth;
  if (codecs.any() && buffers > 1) {
    w->encoder_threads_ = codecs.threads != 0
                              ? codecs.threads
                              : std::min(4u, std::max(1u, std::thread::hardware_concurrency()));
    w->max_pending_ = buffers - 1;
  }
  try {
    w->coder_ = std::make_unique<Coder>();
  } catch (const std::bad_alloc&) {
    w->writer_->finish();
    return -ENOMEM;
  }
  *out = std::move(w);
  return 0;
}

bool RowFileWriter::start_encoders() {
  if (encoders_) return true;
  if (encoder_threads_ == 0) return false;
  try {
    encoders_ = std::make_unique<Encoders>(
        encoder_threads_, [this](Block& b, Coder& coder) { lay_out_block(b, &coder); });
  } catch (const std::exception&) {
    // No thread (a pids limit, no memory): the caller lays every block out itself, as without
    // codecs; slower, never a failure.
    encoder_threads_ = 0;
    max_pending_ = 0;
    return false;
  }
  return true;
}

uint64_t RowFileWriter::checksum() const { return XXH3_64bits_digest(hash_.get()); }

int RowFileWriter::start_block(RowBlockKind kind) {
  void* buf = nullptr;
  if (const int r = writer_->acquire(&buf); r < 0) {
    fail(r);
    return r;
  }
  buf_ = static_cast<char*>(buf);
  kind_ = kind;
  capacity_ = rows_per_block(kind);
  count_ = 0;
  return 0;
}

int RowFileWriter::encode_block(Block& b, Coder* coder, char* h, uint64_t* payload_bytes) const {
  char* const payload = b.buf + kRowBlockHeaderBytes;
  const uint64_t key_bytes = uint64_t{b.count} * sizeof(int64_t);
  if (codecs_.round_values_to_bf16) {
    round_to_bf16(reinterpret_cast<float*>(payload + key_bytes), size_t{b.count} * dim_);
  }
  const struct Column {
    Codec codec;
    uint32_t width;
    const char* floats;
  } columns[2] = {
      {codecs_.values, dim_, payload + key_bytes},
      {codecs_.state, state_dim_, payload + key_bytes + uint64_t{b.count} * dim_ * sizeof(float)},
  };
  Codec stored[2] = {Codec::kNone, Codec::kNone};
  uint64_t sizes[2] = {0, 0};
  for (int c = 0; c < 2; ++c) {
    const Column& col = columns[c];
    const uint64_t raw = uint64_t{b.count} * col.width * sizeof(float);
    sizes[c] = raw;
    if (col.codec == Codec::kNone || col.width == 0) continue;
    std::vector<char>& out = coder->encoded[c];
    out.clear();
    if (const int r = coder->codec.encode(col.codec, reinterpret_cast<const float*>(col.floats),
                                          b.count, col.width, &out, &b.detail);
        r < 0) {
      return r;
    }
    // Floats are the fallback: a stored column is never larger than they are.
    if (out.size() < raw) {
      stored[c] = col.codec;
      sizes[c] = out.size();
    }
  }
  if (stored[0] == Codec::kNone && stored[1] == Codec::kNone) return 0;
  // Encoded columns come from scratch; a column kept as floats moves down (values stay), and
  // nothing lands on floats still to be read: encoded values are smaller than the raw ones.
  char* dst = payload + key_bytes;
  for (int c = 0; c < 2; ++c) {
    if (stored[c] != Codec::kNone) {
      std::memcpy(dst, coder->encoded[c].data(), sizes[c]);
    } else if (dst != columns[c].floats) {
      std::memmove(dst, columns[c].floats, sizes[c]);
    }
    dst += sizes[c];
  }
  h[28] = static_cast<char>(stored[0]);
  h[29] = static_cast<char>(stored[1]);
  put_u32(h + 32, static_cast<uint32_t>(sizes[0]));
  put_u32(h + 36, static_cast<uint32_t>(sizes[1]));
  *payload_bytes = key_bytes + sizes[0] + sizes[1];
  return 0;
}

void RowFileWriter::lay_out_block(Block& b, Coder* coder) const {
  char* const h = b.buf;
  char* const payload = b.buf + kRowBlockHeaderBytes;
  std::memset(h, 0, kRowBlockHeaderBytes);
  uint64_t payload_bytes = uint64_t{b.count} * sizeof(int64_t);
  if (b.kind == RowBlockKind::kUpserts) {
    // Values and state were placed for a full block; a short block moves them down to follow
    // its keys. Only the last block of a run pays this.
    const size_t value_bytes = size_t{dim_} * sizeof(float);
    const size_t state_bytes = size_t{state_dim_} * sizeof(float);
    const char* values_at = payload + size_t{b.capacity} * sizeof(int64_t);
    const char* state_at = values_at + size_t{b.capacity} * value_bytes;
    char* dst = payload + payload_bytes;
    if (b.count < b.capacity) std::memmove(dst, values_at, b.count * value_bytes);
    dst += b.count * value_bytes;
    if (b.count < b.capacity && state_bytes > 0) {
      std::memmove(dst, state_at, b.count * state_bytes);
    }
    payload_bytes += b.count * (value_bytes + state_bytes);
    if (codecs_.any()) {
      int r = 0;
      try {
        r = encode_block(b, coder, h, &payload_bytes);
      } catch (const std::bad_alloc&) {  // an error's words; nothing else here allocates
        r = -ENOMEM;
      }
      if (r < 0) {
        b.error = r;
        return;
      }
    }
  }
  b.bytes = detail::align_up(kRowBlockHeaderBytes + payload_bytes);
  std::memset(payload + payload_bytes, 0, b.bytes - kRowBlockHeaderBytes - payload_bytes);

  const bool encoded = h[28] != 0 || h[29] != 0;
  std::memcpy(h, kRowFileMagic, sizeof kRowFileMagic);
  put_u32(h + 8, encoded ? kRowFileEncodedVersion : kRowFileVersion);
  put_u32(h + 12, static_cast<uint32_t>(b.kind));
  put_u32(h + 16, b.count);
  put_u32(h + 20, dim_);
  put_u32(h + 24, state_dim_);
  put_u64(h + 40, payload_bytes);
  put_u64(h + 48, xxh3_64(payload, payload_bytes));
  put_u64(h + 56, xxh3_64(h, kHeaderHashedBytes));
}

int RowFileWriter::flush_block() {
  Block* b = nullptr;
  try {
    pending_.push_back(std::make_unique<Block>());
    b = pending_.back().get();
  } catch (const std::bad_alloc&) {
    fail(-ENOMEM);  // the buffer stays with us; finish() closes the file without it
    return -ENOMEM;
  }
  b->buf = buf_;
  b->kind = kind_;
  b->count = count_;
  b->capacity = capacity_;
  buf_ = nullptr;
  count_ = 0;
  bool queued = false;
  if (b->kind == RowBlockKind::kUpserts && b->count == b->capacity) start_encoders();
  if (encoders_) {
    try {
      encoders_->add(b);
      queued = true;
    } catch (const std::bad_alloc&) {  // laid out here instead
    }
  }
  if (!queued) {
    lay_out_block(*b, coder_.get());
    b->done = true;  // no thread knows of it: no lock needed
  }
  return submit_pending(max_pending_);
}

int RowFileWriter::submit_pending(size_t keep) {
  while (!pending_.empty()) {
    Block& b = *pending_.front();
    if (encoders_) {
      if (pending_.size() > keep) {
        encoders_->wait(&b, *coder_);
      } else if (!encoders_->done(&b)) {
        return error_;
      }
    }
    // After an error nothing more is submitted, but every block is still waited for: none may
    // be written into once the file writer finishes.
    if (error_ == 0 && b.error != 0) {
      error_detail_ = b.detail;
      fail(b.error);
    }
    if (error_ == 0) {
      // Hash before submit: the buffer goes back to the writer with it.
      xxh3_update(hash_.get(), b.buf, b.bytes);
      if (const int r = writer_->submit(b.buf, b.bytes); r < 0) fail(r);
    }
    pending_.pop_front();
  }
  return error_;
}

int RowFileWriter::add(int64_t key, const float* value, const float* state) {
  if (finished_ || value == nullptr || (state == nullptr && state_dim_ > 0)) return -EINVAL;
  if (error_ != 0) return error_;
  if (buf_ != nullptr && kind_ != RowBlockKind::kUpserts) {
    if (const int r = flush_block(); r < 0) return r;
  }
  if (buf_ == nullptr) {
    if (const int r = start_block(RowBlockKind::kUpserts); r < 0) return r;
  }
  char* const payload = buf_ + kRowBlockHeaderBytes;
  const size_t value_bytes = size_t{dim_} * sizeof(float);
  const size_t state_bytes = size_t{state_dim_} * sizeof(float);
  char* const values_at = payload + size_t{capacity_} * sizeof(int64_t);
  char* const state_at = values_at + size_t{capacity_} * value_bytes;
  std::memcpy(payload + size_t{count_} * sizeof(int64_t), &key, sizeof key);
  std::memcpy(values_at + count_ * value_bytes, value, value_bytes);
  if (state_bytes > 0) std::memcpy(state_at + count_ * state_bytes, state, state_bytes);
  ++count_;
  ++rows_;
  if (count_ == capacity_) return flush_block();
  return 0;
}

int RowFileWriter::add_tombstone(int64_t key) {
  if (finished_) return -EINVAL;
  if (error_ != 0) return error_;
  if (buf_ != nullptr && kind_ != RowBlockKind::kTombstones) {
    if (const int r = flush_block(); r < 0) return r;
  }
  if (buf_ == nullptr) {
    if (const int r = start_block(RowBlockKind::kTombstones); r < 0) return r;
  }
  std::memcpy(buf_ + kRowBlockHeaderBytes + size_t{count_} * sizeof(int64_t), &key, sizeof key);
  ++count_;
  ++rows_;
  if (count_ == capacity_) return flush_block();
  return 0;
}

int RowFileWriter::finish() {
  if (finished_) return -EINVAL;
  finished_ = true;
  if (buf_ != nullptr && error_ == 0) flush_block();
  submit_pending(0);
  const int r = writer_->finish();
  return error_ != 0 ? error_ : r;
}

// ------------------------------------------------------------------------------ reader --

// The thread of a reader with check_behind: checks one block's payload at a time, handed over
// by next_block() and waited for by the next call.
class RowFileReader::BehindChecker {
 public:
  explicit BehindChecker(RowFileReader& reader) : reader_(reader), thread_([this] { run(); }) {}
  ~BehindChecker() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  void start(const Payload& p) {
    {
      std::lock_guard lock(mutex_);
      job_ = p;
      busy_ = true;
      problem_ = nullptr;
    }
    changed_.notify_all();
  }
  // nullptr, or what was wrong with the last block handed over (at *offset).
  const char* wait(uint64_t* offset) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return !busy_; });
    *offset = job_.offset;
    return problem_;
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      changed_.wait(lock, [&] { return stop_ || busy_; });
      if (stop_) return;
      const Payload p = job_;
      lock.unlock();
      const char* problem = reader_.check_payload(p, /*hash=*/true);
      lock.lock();
      problem_ = problem;
      busy_ = false;
      changed_.notify_all();
    }
  }

  RowFileReader& reader_;
  std::mutex mutex_;
  std::condition_variable changed_;
  Payload job_;
  const char* problem_ = nullptr;
  bool busy_ = false, stop_ = false;
  std::thread thread_;  // last: starts once the rest is set up
};

int RowFileReader::open(const std::string& path, const ReaderOptions& options,
                        std::unique_ptr<RowFileReader>* out, bool check_behind) {
  if (out == nullptr) return -EINVAL;
  std::unique_ptr<RowFileReader> r(new RowFileReader());
  try {
    r->spare_.reserve(kSpareBlocks);
  } catch (const std::bad_alloc&) {
    return -ENOMEM;
  }
  r->hash_.reset(XXH3_createState());
  if (!r->hash_ || XXH3_64bits_reset(r->hash_.get()) != XXH_OK) return -ENOMEM;
  if (const int e = FileReader::open(path, options, &r->reader_); e < 0) return e;
  if (check_behind) {
    try {
      r->behind_ = std::make_unique<BehindChecker>(*r);
    } catch (const std::exception&) {  // bad_alloc, or system_error from the thread
      return -ENOMEM;
    }
  }
  *out = std::move(r);
  return 0;
}

RowFileReader::~RowFileReader() {
  decoders_.reset();  // before the blocks its threads decode
}

const char* RowFileReader::check_payload(const Payload& p, bool hash) {
  if (hash) xxh3_update(hash_.get(), p.data, p.span);
  if (p.xxh3 != xxh3_64(p.data, p.bytes)) return "payload checksum mismatch";
  // Padding lies outside both checksums; zeros keep the file's bytes fully determined.
  for (uint64_t i = p.bytes; i < p.span; ++i) {
    if (p.data[i] != 0) return "nonzero padding";
  }
  return nullptr;
}

int RowFileReader::wait_behind() {
  if (!behind_) return 0;
  uint64_t offset = 0;
  if (const char* problem = behind_->wait(&offset)) return corrupt(offset, problem);
  return 0;
}

int RowFileReader::corrupt(uint64_t offset, const std::string& what) {
  error_ = -EBADMSG;
  error_detail_ = "block at offset " + std::to_string(offset) + ": " + what;
  return error_;
}

int RowFileReader::take(size_t n, const char** data, bool hash) {
  if (chunk_at_ == chunk_bytes_) {
    const void* p = nullptr;
    if (const int e = reader_->next(&p, &chunk_bytes_); e < 0) return e;
    chunk_ = static_cast<const char*>(p);
    chunk_at_ = 0;
  }
  if (chunk_bytes_ - chunk_at_ >= n) {
    *data = chunk_ + chunk_at_;
    if (hash) xxh3_update(hash_.get(), *data, n);
    chunk_at_ += n;
    offset_ += n;
    return 0;
  }
  // Spans chunks: gather. The caller checked the file holds n more bytes.
  scratch_.resize((n + sizeof(uint64_t) - 1) / sizeof(uint64_t));
  char* dst = reinterpret_cast<char*>(scratch_.data());
  size_t got = 0;
  while (got < n) {
    if (chunk_at_ == chunk_bytes_) {
      const void* p = nullptr;
      if (const int e = reader_->next(&p, &chunk_bytes_); e < 0) return e;
      if (chunk_bytes_ == 0) return -EIO;  // the file shrank under us
      chunk_ = static_cast<const char*>(p);
      chunk_at_ = 0;
    }
    const size_t k = std::min(n - got, chunk_bytes_ - chunk_at_);
    std::memcpy(dst + got, chunk_ + chunk_at_, k);
    got += k;
    chunk_at_ += k;
  }
  offset_ += n;
  *data = dst;
  if (hash) xxh3_update(hash_.get(), dst, n);
  return 0;
}

uint64_t RowFileReader::checksum() const { return XXH3_64bits_digest(hash_.get()); }

int RowFileReader::read_block(Ahead* a) {
  const uint64_t size = reader_->size();
  const uint64_t at = offset_;
  if (at == size) return 0;
  if (size - at < kRowBlockHeaderBytes) return corrupt(at, "truncated header");

  const char* p = nullptr;
  if (const int e = take(kRowBlockHeaderBytes, &p); e < 0) return error_ = e;
  char h[kRowBlockHeaderBytes];
  std::memcpy(h, p, sizeof h);
  if (std::memcmp(h, kRowFileMagic, sizeof kRowFileMagic) != 0) return corrupt(at, "bad magic");
  if (get_u64(h + 56) != xxh3_64(h, kHeaderHashedBytes)) {
    return corrupt(at, "header checksum mismatch");
  }
  const uint32_t version = get_u32(h + 8);
  if (version != kRowFileVersion && version != kRowFileEncodedVersion) {
    return corrupt(at, "unsupported format version " + std::to_string(version));
  }
  const uint32_t kind = get_u32(h + 12);
  const uint32_t rows = get_u32(h + 16);
  const uint32_t dim = get_u32(h + 20);
  const uint32_t state_dim = get_u32(h + 24);
  const uint64_t payload_bytes = get_u64(h + 40);
  if (kind > static_cast<uint32_t>(RowBlockKind::kTombstones)) {
    return corrupt(at, "unknown block kind " + std::to_string(kind));
  }
  if (have_shape_ && (dim != dim_ || state_dim != state_dim_)) {
    return corrupt(at, "dim " + std::to_string(dim) + "/state_dim " + std::to_string(state_dim) +
                           " differ from the first block's " + std::to_string(dim_) + "/" +
                           std::to_string(state_dim_));
  }
  // Cannot overflow: rows < 2^32 and row_bytes < 2^36.
  const unsigned __int128 raw_payload =
      static_cast<unsigned __int128>(rows) *
      (kind == 0 ? upsert_row_bytes(dim, state_dim) : sizeof(int64_t));
  const bool encoded = version == kRowFileEncodedVersion;
  RowCodecs stored;
  uint32_t value_bytes = 0, state_bytes = 0;
  if (!encoded) {
    if (raw_payload != payload_bytes) {
      return corrupt(at, "payload size does not match the row count");
    }
  } else {
    if (kind != static_cast<uint32_t>(RowBlockKind::kUpserts)) {
      return corrupt(at, "a tombstone block of format version 2");
    }
    if (!codec_is_known(static_cast<uint8_t>(h[28])) ||
        !codec_is_known(static_cast<uint8_t>(h[29])) || h[30] != 0 || h[31] != 0) {
      return corrupt(at, "unknown codec " + std::to_string(static_cast<uint8_t>(h[28])) + "/" +
                             std::to_string(static_cast<uint8_t>(h[29])));
    }
    stored.values = static_cast<Codec>(h[28]);
    stored.state = static_cast<Codec>(h[29]);
    value_bytes = get_u32(h + 32);
    state_bytes = get_u32(h + 36);
    if (uint64_t{rows} * sizeof(int64_t) + value_bytes + state_bytes != payload_bytes) {
      return corrupt(at, "payload size does not match its keys' and columns' sizes");
    }
    // What the block decodes into is bounded like a block of floats, so a block that claims
    // many rows in few stored bytes cannot make the reader allocate more than a writer's block.
    if (raw_payload + kRowBlockHeaderBytes > kMaxRowBlockBytes) {
      return corrupt(at, "an encoded block of " + std::to_string(rows) +
                             " rows, more than a writer's block holds");
    }
  }
  const uint64_t rest = size - at - kRowBlockHeaderBytes;
  const uint64_t padded = detail::align_up(kRowBlockHeaderBytes + payload_bytes);
  if (payload_bytes > rest || padded - kRowBlockHeaderBytes > rest) {
    return corrupt(at, "truncated block");
  }
  // Before the block is read into memory: a forged header over a large (even sparse) file
  // must not make the reader allocate what no writer writes.
  if (padded > kMaxRowBlockBytes) {
    return corrupt(at, "a block of " + std::to_string(padded) + " bytes, more than a writer's " +
                           std::to_string(kMaxRowBlockBytes));
  }

  // Encoded blocks are checked before they are decoded (on a decoder thread), never behind.
  const bool behind = behind_ != nullptr && !encoded;
  if (const int e = take(padded - kRowBlockHeaderBytes, &p, /*hash=*/!behind); e < 0) {
    return error_ = e;
  }
  Payload payload{p, payload_bytes, padded - kRowBlockHeaderBytes, get_u64(h + 48), at};
  if (encoded) {
    // Out of the chunk, which the next blocks' reads may replace before this one is decoded.
    try {
      a->stored.resize((payload.span + sizeof(uint64_t) - 1) / sizeof(uint64_t));
    } catch (const std::bad_alloc&) {
      return error_ = -ENOMEM;
    }
    std::memcpy(a->stored.data(), p, payload.span);
    p = reinterpret_cast<const char*>(a->stored.data());
    payload.data = p;
    a->payload = payload;
    a->value_bytes = value_bytes;
    a->state_bytes = state_bytes;
  } else if (behind) {
    behind_->start(payload);
  } else if (const char* problem = check_payload(payload, /*hash=*/false)) {
    return corrupt(at, problem);
  }

  have_shape_ = true;
  dim_ = dim;
  state_dim_ = state_dim;
  a->encoded = encoded;
  RowBlock* const out = &a->block;
  out->kind = static_cast<RowBlockKind>(kind);
  out->rows = rows;
  out->dim = dim;
  out->state_dim = state_dim;
  out->offset = at;
  out->stored = stored;
  out->stored_bytes = padded;
  out->keys = reinterpret_cast<const int64_t*>(p);
  out->values = nullptr;
  out->state = nullptr;
  if (encoded) return 1;  // values and state once decoded
  if (out->kind == RowBlockKind::kUpserts) {
    const char* values = p + uint64_t{rows} * sizeof(int64_t);
    out->values = reinterpret_cast<const float*>(values);
    if (state_dim > 0) {
      out->state = reinterpret_cast<const float*>(values + uint64_t{rows} * dim * sizeof(float));
    }
  }
  return 1;
}

void RowFileReader::decode(Ahead& a, BlockCodec* codec) {
  try {
    decode_checked(a, codec);
  } catch (const std::bad_alloc&) {  // the words of an error
    a.error = -ENOMEM;
  }
}

void RowFileReader::decode_checked(Ahead& a, BlockCodec* codec) {
  RowBlock& b = a.block;
  const auto bad = [&](const std::string& what) {
    a.error = -EBADMSG;
    a.detail = "block at offset " + std::to_string(b.offset) + ": " + what;
  };
  if (const char* problem = check_payload(a.payload, /*hash=*/false)) return bad(problem);
  try {
    a.decoded.resize(size_t{b.rows} * (b.dim + b.state_dim));
  } catch (const std::bad_alloc&) {
    a.error = -ENOMEM;
    return;
  }
  const char* stored = a.payload.data + size_t{b.rows} * sizeof(int64_t);
  float* values = a.decoded.data();
  float* state = values + size_t{b.rows} * b.dim;
  std::string why;
  if (const int e =
          codec->decode(b.stored.values, stored, a.value_bytes, b.rows, b.dim, values, &why);
      e < 0) {
    if (e == -EBADMSG) return bad("values: " + why);
    a.error = e;
    return;
  }
  if (b.state_dim > 0 || a.state_bytes > 0) {
    if (const int e = codec->decode(b.stored.state, stored + a.value_bytes, a.state_bytes, b.rows,
                                    b.state_dim, state, &why);
        e < 0) {
      if (e == -EBADMSG) return bad("state: " + why);
      a.error = e;
      return;
    }
  }
  b.keys = reinterpret_cast<const int64_t*>(a.payload.data);
  b.values = values;
  b.state = b.state_dim > 0 ? state : nullptr;
}

int RowFileReader::fill_ahead() {
  uint64_t ahead_bytes = 0;
  for (;;) {
    std::unique_ptr<Ahead> a;
    if (!spare_.empty()) {
      a = std::move(spare_.back());
      spare_.pop_back();
      a->reuse();
    } else {
      try {
        a = std::make_unique<Ahead>();
      } catch (const std::bad_alloc&) {
        return error_ = -ENOMEM;
      }
    }
    const int r = read_block(a.get());
    if (r < 0) {
      // Reported once the blocks before it have been handed out.
      a->error = error_;
      a->detail = error_detail_;
      error_ = 0;
      error_detail_.clear();
    } else if (r == 0) {
      return 0;  // the end: next_block says so once the queue is empty
    }
    Ahead* const raw = a.get();
    const bool last = r < 0 || !raw->encoded;
    try {
      ahead_.push_back(std::move(a));
      if (raw->encoded) {
        if (!decoders_) {
          decoder_ = std::make_unique<BlockCodec>();
          const auto work = [this](Ahead& ahead, BlockCodec& codec) { decode(ahead, &codec); };
          try {
            decoders_ = std::make_unique<Decoders>(
                std::min(4u, std::max(1u, std::thread::hardware_concurrency())), work);
          } catch (const std::system_error&) {
            // No thread: the caller decodes each block as it reaches it.
            decoders_ = std::make_unique<Decoders>(0, work);
          }
        }
        decoders_->add(raw);
      } else {
        raw->done = true;
      }
    } catch (const std::exception&) {  // bad_alloc, or system_error from a thread
      if (ahead_.empty() || ahead_.back().get() != raw) return error_ = -ENOMEM;
      raw->error = -ENOMEM;
      raw->encoded = false;
      raw->done = true;
      return 0;
    }
    // A version 1 block points into the current chunk, which the next read may replace: it
    // ends the batch, as does an error. Encoded blocks own their bytes, stored and decoded:
    // at most kReadAheadBytes of them (always one block), whatever a forged file's blocks hold.
    ahead_bytes += raw->payload.span + uint64_t{raw->block.rows} *
                                           (raw->block.dim + raw->block.state_dim) * sizeof(float);
    if (last || ahead_.size() >= kReadAhead || ahead_bytes >= kReadAheadBytes) return 0;
  }
}

int RowFileReader::next_block(RowBlock* out) {
  if (error_ != 0) return error_;
  if (out == nullptr) return -EINVAL;
  // Spares keep their buffers' memory, which read-ahead does not count: only a block of
  // ordinary size is kept (a forged file's outsized blocks are freed as before), so the spares
  // hold at most kReadAheadBytes in all.
  if (current_ && spare_.size() < kSpareBlocks &&
      current_->stored.capacity() * sizeof(uint64_t) +
              current_->decoded.capacity() * sizeof(float) <=
          kReadAheadBytes / kSpareBlocks) {
    spare_.push_back(std::move(current_));  // reserved by open(): no allocation
  }
  current_.reset();
  if (ahead_.empty()) {
    // The previous block's check ends before its buffer can be reused below.
    if (const int e = wait_behind(); e < 0) return e;
    if (const int e = fill_ahead(); e < 0) return e;
    if (ahead_.empty()) return 0;
  }
  current_ = std::move(ahead_.front());
  ahead_.pop_front();
  Ahead& a = *current_;
  if (a.encoded) decoders_->wait(&a, *decoder_);
  if (a.error != 0) {
    // A version 1 block behind it in the batch may still be checked behind: that ends first,
    // so that nothing touches the file's checksum once an error is returned.
    if (behind_) {
      uint64_t offset = 0;
      behind_->wait(&offset);
    }
    error_ = a.error;
    error_detail_ = a.detail;
    return error_;
  }
  *out = a.block;
  return 1;
}

}  // namespace embstore::io
