#include "io/codec/block_codec.hpp"

// ZSTD_getFrameHeader: zstd's own reading of the frame header its encoder wrote (exported by
// the shared library too).
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <new>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "cuda/row/codec.h"
#include "io/format/xxh3.hpp"

namespace embstore::io {
namespace {

void set_detail(std::string* detail, std::string text) {
  if (detail != nullptr) *detail = std::move(text);
}

// The most floats one block holds: 16 GiB of them, so that every byte count below fits size_t
// (a shape read from a hostile header cannot wrap it around).
constexpr size_t kMaxBlockFloats = size_t{1} << 32;

bool shape_ok(uint32_t rows, uint32_t width, std::string* detail) {
  if (size_t{rows} * width <= kMaxBlockFloats) return true;
  set_detail(detail, "a block of " + std::to_string(rows) + " rows x " + std::to_string(width) +
                         " floats is over the limit of 2^32 floats");
  return false;
}

size_t float_bytes(uint32_t rows, uint32_t width) { return size_t{rows} * width * sizeof(float); }

// The byte shuffle is a transpose of n x 4 bytes (float i's byte k at 4i + k) into 4 x n (at
// k * n + i). With SSE2 (every x86-64 CPU) it goes 16 floats at a time: a 64-byte group's
// address bits are (i3 i2 | i1 i0 k1 k0) as (register | byte), and one round of byte unpacks
// of registers (0, 2) and (1, 3) rotates them left by one; four rounds give (k1 k0 | i3 i2 i1
// i0), the planes' bytes, and two more (six in all) undo a shuffle. A plain loop does the rest (n
// mod 16), and all of it elsewhere: the bytes are the same either way (tests/io/codec_test.cpp).
#if defined(__SSE2__)
// Four registers held by value and rounds unrolled at compile time, so -O2 keeps the group in
// registers (a loop over an array of them spilled it to the stack at every round).
struct Group {
  __m128i r0, r1, r2, r3;
};

template <int kRounds>
inline Group rotate_left(Group g) {
  for (int i = 0; i < kRounds; ++i) {
    g = Group{_mm_unpacklo_epi8(g.r0, g.r2), _mm_unpackhi_epi8(g.r0, g.r2),
              _mm_unpacklo_epi8(g.r1, g.r3), _mm_unpackhi_epi8(g.r1, g.r3)};
  }
  return g;
}

inline __m128i load16(const char* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}
inline void store16(char* p, __m128i v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v); }

constexpr size_t kGroupFloats = 16;  // 4 registers of 16 bytes
#endif

// in (n floats' bytes) -> out: byte k of every float, for k = 0..3 (little-endian machines: the
// exponents' bytes end up together, which is what zstd finds).
void shuffle(const char* in, size_t n, char* out) {
  size_t i = 0;
#if defined(__SSE2__)
  for (; i + kGroupFloats <= n; i += kGroupFloats) {
    const char* at = in + i * sizeof(float);
    const Group g =
        rotate_left<4>(Group{load16(at), load16(at + 16), load16(at + 32), load16(at + 48)});
    store16(out + i, g.r0);
    store16(out + n + i, g.r1);
    store16(out + 2 * n + i, g.r2);
    store16(out + 3 * n + i, g.r3);
  }
#endif
  for (; i < n; ++i) {
    for (size_t k = 0; k < sizeof(float); ++k) out[k * n + i] = in[i * sizeof(float) + k];
  }
}

void unshuffle(const char* in, size_t n, char* out) {
  size_t i = 0;
#if defined(__SSE2__)
  for (; i + kGroupFloats <= n; i += kGroupFloats) {
    const Group g = rotate_left<2>(
        Group{load16(in + i), load16(in + n + i), load16(in + 2 * n + i), load16(in + 3 * n + i)});
    char* at = out + i * sizeof(float);
    store16(at, g.r0);
    store16(at + 16, g.r1);
    store16(at + 32, g.r2);
    store16(at + 48, g.r3);
  }
#endif
  for (; i < n; ++i) {
    for (size_t k = 0; k < sizeof(float); ++k) out[i * sizeof(float) + k] = in[k * n + i];
  }
}

// zstd's fast strategy (level 1 and the negative levels) finds matches through a hash table
// sized for text: on blocks over 256 KB, 2^14 entries at level 1 and 2^13 at negative levels. In
// shuffled floats the matches are short and near (runs of zeros, repeated exponent bytes) and the
// low mantissa bytes match nothing, so a table of 2^8 entries, which stays in L1, finds as many: on
// a trained table's rows it stored 0.824 of the floats' bytes against 0.830 in two thirds of the
// time
// (`embstore-perf codecs`; performance.md, "zstd's hash table"). Other strategies (level 2 and
// up, and level 0, which is zstd's default, 3) keep zstd's own tables. Only the encoder
// changes: any zstd frame decodes.
constexpr int kFastHashLog = 8;

bool fast_strategy(int level) { return level == 1 || level < 0; }

size_t configure_compression(ZSTD_CCtx* c, int level) {
  size_t e = ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, level);
  if (!ZSTD_isError(e) && fast_strategy(level)) {
    e = ZSTD_CCtx_setParameter(c, ZSTD_c_hashLog, kFastHashLog);
  }
  return e;
}

// Raw planes. A trained float's low mantissa bytes are close to random: zstd's fast strategy
// stores them at 0.94-1.00 of their size and spends half of a block's time on them
// (performance.md, "the byte planes"). So a lossless block whose first planes (bytes 0, 1, 2 of
// every float, in that order) look random keeps those planes in raw zstd blocks and compresses
// only the planes after them, in the same frame: the frame header and raw blocks written here
// (RFC 8878: the frame and block formats), then the blocks of a zstd frame of the rest with its
// header dropped. Any zstd decoder reads the frame, whose content is the shuffled block as
// before: the format does not change. Only the first compressed block may follow raw ones: zstd
// starts each frame with repeat offsets (1, 4, 8) and no entropy tables, which raw blocks leave
// as they are, so the rest's blocks decode after them as after their own header. The frame asks
// for the window the rest's frame asked for (at least 128 KiB, for the raw blocks), not for the
// whole block, so streaming decoders with their default memory limits read it too.
constexpr size_t kZstdBlockMax = size_t{128} << 10;  // Block_Maximum_Size, at most 128 KiB
// A plane looks random when the order-0 entropy of sampled bytes is at least this many bits a
// byte: stored raw it takes at most 1/8 more than an entropy coder of single bytes would (zstd's
// Huffman literals come close to it on these planes). Matches are what the entropy does not see:
// a block whose rows repeat (sampled_rows_repeat) keeps zstd for every plane.
constexpr double kRandomPlaneBits = 7.0;
// Samples: runs of 256 consecutive bytes (a few rows' worth of one byte of each float) spread
// over the plane, 4,096 bytes in all; smaller planes are compressed whole.
constexpr size_t kSampleRun = 256;
constexpr size_t kSampleBytes = 4096;

bool looks_random(const unsigned char* plane, size_t n) {
  if (n < kSampleBytes) return false;
  uint32_t counts[256] = {};
  const size_t runs = kSampleBytes / kSampleRun;
  const size_t gap = (n - kSampleRun) / (runs - 1);
  for (size_t r = 0; r < runs; ++r) {
    const unsigned char* run = plane + r * gap;
    for (size_t i = 0; i < kSampleRun; ++i) ++counts[run[i]];
  }
  double sum = 0;  // sum of c log2 c
  for (const uint32_t c : counts) {
    if (c > 1) sum += c * std::log2(static_cast<double>(c));
  }
  const double bits = std::log2(static_cast<double>(kSampleBytes)) - sum / kSampleBytes;
  return bits >= kRandomPlaneBits;
}

// Whether some of 64 rows sampled evenly over the block are equal (by XXH3; a collision only
// costs the raw planes' speed): rows copied from one another, which zstd stores as matches and
// the entropy of bytes takes for noise (8 distinct random rows over a 1 MiB block, in a
// reviewer's program: 0.0017 of the bytes compressed, 0.50 with raw planes).
bool sampled_rows_repeat(const float* in, uint32_t rows, uint32_t width) {
  constexpr uint32_t kSampledRows = 64;
  if (rows < 2 || width == 0) return false;
  const uint32_t k = std::min(rows, kSampledRows);
  uint64_t hashes[kSampledRows];
  for (uint32_t i = 0; i < k; ++i) {
    const uint64_t r = uint64_t{i} * rows / k;
    hashes[i] = xxh3_64(in + r * width, size_t{width} * sizeof(float));
  }
  std::sort(hashes, hashes + k);
  return std::adjacent_find(hashes, hashes + k) != hashes + k;
}

void put_le(char* at, uint64_t v, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) at[i] = static_cast<char>(v >> (8 * i));
}

// The header of a frame of `content` bytes with a window of 2^window_log bytes (no dictionary,
// no checksum): magic, descriptor (content size flag; not single-segment), window descriptor
// (exponent window_log - 10, mantissa 0), content size (4 bytes, or 8 past 2^32 - 1). Its
// length when out is null.
size_t frame_header(size_t content, unsigned window_log, char* out) {
  const bool wide = content > UINT32_MAX;
  const size_t bytes = 4 + 1 + 1 + (wide ? 8 : 4);
  if (out != nullptr) {
    put_le(out, ZSTD_MAGICNUMBER, 4);
    out[4] = static_cast<char>((wide ? 3u : 2u) << 6);
    out[5] = static_cast<char>((window_log - 10) << 3);
    put_le(out + 6, content, wide ? 8 : 4);
  }
  return bytes;
}

// Bytes of raw blocks holding n bytes: a 3-byte header (last-block bit, type 0: raw, size) per
// 128 KiB.
size_t raw_blocks_bytes(size_t n) { return n + 3 * ((n + kZstdBlockMax - 1) / kZstdBlockMax); }

// Writes src[0..n) as raw blocks to out; the last one is the frame's last when `last`.
void put_raw_blocks(const char* src, size_t n, bool last, char* out) {
  for (size_t at = 0; at < n;) {
    const size_t size = std::min(kZstdBlockMax, n - at);
    const bool final = last && at + size == n;
    put_le(out, (uint64_t{size} << 3) | (final ? 1u : 0u), 3);
    std::memcpy(out + 3, src + at, size);
    out += 3 + size;
    at += size;
  }
}

// The smallest window log (zstd's: 10 to 41) whose window holds `window` bytes and 128 KiB
// blocks.
unsigned window_log_for(uint64_t window) {
  unsigned log = 17;  // kZstdBlockMax
  while (log < 41 && (uint64_t{1} << log) < window) ++log;
  return log;
}

// The lossless frame of a shuffled block (planes[0..4n): n floats' bytes 0, then their bytes 1,
// ...) into dst[0..cap), cap at least ZSTD_compressBound(4n): its size, or a zstd error code.
// Where raw_allowed (zstd's fast strategy, on rows that do not repeat) the first planes that
// look random go in raw blocks (above); other levels ask for bytes over speed and get one
// compressed frame, as does a block that has no such plane.
size_t compress_planes(ZSTD_CCtx* c, bool raw_allowed, const char* planes, size_t n, char* dst,
                       size_t cap) {
  const size_t total = 4 * n;
  size_t raw_planes = 0;
  while (raw_allowed && raw_planes < 4 &&
         looks_random(reinterpret_cast<const unsigned char*>(planes + raw_planes * n), n)) {
    ++raw_planes;
  }
  const size_t raw = raw_planes * n;
  const size_t rest = total - raw;
  const size_t header = frame_header(total, 17, nullptr);
  const size_t blocks_at = header + raw_blocks_bytes(raw);
  if (raw == 0 || blocks_at + (rest == 0 ? 0 : ZSTD_compressBound(rest)) > cap) {
    return ZSTD_compress2(c, dst, cap, planes, total);
  }
  size_t tail = 0;  // the rest's blocks, at dst + blocks_at
  uint64_t window = 0;
  if (rest != 0) {
    const size_t frame = ZSTD_compress2(c, dst + blocks_at, cap - blocks_at, planes + raw, rest);
    if (ZSTD_isError(frame)) return frame;
    // zstd's header is dropped; its window (a single-segment frame's is its content size) is
    // the one the frame asks for. configure_compression asks for no checksum and no dictionary.
    ZSTD_frameHeader h{};
    if (ZSTD_getFrameHeader(&h, dst + blocks_at, frame) != 0 || h.checksumFlag != 0 ||
        h.dictID != 0 || h.headerSize >= frame) {
      return ZSTD_compress2(c, dst, cap, planes, total);  // not expected: one frame as before
    }
    tail = frame - h.headerSize;
    window = h.windowSize;
    std::memmove(dst + blocks_at, dst + blocks_at + h.headerSize, tail);
  }
  frame_header(total, window_log_for(window), dst);
  put_raw_blocks(planes, raw, rest == 0, dst + header);
  return blocks_at + tail;
}

std::string size_mismatch(Codec codec, size_t size, size_t want, uint32_t rows, uint32_t width) {
  return std::string(codec_name(codec)) + " block of " + std::to_string(rows) + " rows x " +
         std::to_string(width) + " floats holds " + std::to_string(size) + " bytes, not " +
         std::to_string(want);
}

// int8's rows, with AVX2 where the CPU has it (chosen once, at load): the per-value loops of
// cuda/row/codec.h vectorize 4 doubles wide instead of SSE2's 2. The same IEEE operations in
// either version (no FMA: CMakeLists.txt compiles this file with -ffp-contract=off), so the
// same bytes.
// Not under ThreadSanitizer: the clones' ifunc resolver runs before its runtime is up, and
// every program then crashes at load.
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define EMBSTORE_NO_TARGET_CLONES
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define EMBSTORE_NO_TARGET_CLONES
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && defined(__GLIBC__) && \
    !defined(EMBSTORE_NO_TARGET_CLONES)
#define EMBSTORE_AVX2_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define EMBSTORE_AVX2_CLONES
#endif

// Scales, offsets, then the bytes, a row at a time (width > 0).
EMBSTORE_AVX2_CLONES void encode_int8_rows(const float* in, uint32_t rows, uint32_t width,
                                           char* dst) {
  char* scales = dst;
  char* offsets = dst + size_t{rows} * sizeof(float);
  auto* q = reinterpret_cast<uint8_t*>(dst + size_t{rows} * 2 * sizeof(float));
  for (uint32_t r = 0; r < rows; ++r) {
    float scale = 0, offset = 0;
    row::int8_encode_row(in + size_t{r} * width, width, q + size_t{r} * width, &scale, &offset);
    std::memcpy(scales + size_t{r} * sizeof(float), &scale, sizeof(float));
    std::memcpy(offsets + size_t{r} * sizeof(float), &offset, sizeof(float));
  }
}

EMBSTORE_AVX2_CLONES void decode_int8_rows(const char* data, uint32_t rows, uint32_t width,
                                           float* out) {
  const auto* q = reinterpret_cast<const uint8_t*>(data + size_t{rows} * 2 * sizeof(float));
  for (uint32_t r = 0; r < rows; ++r) {
    float scale = 0, offset = 0;
    std::memcpy(&scale, data + size_t{r} * sizeof(float), sizeof(float));
    std::memcpy(&offset, data + (size_t{rows} + r) * sizeof(float), sizeof(float));
    row::int8_decode_row(q + size_t{r} * width, width, scale, offset, out + size_t{r} * width);
  }
}

}  // namespace

struct BlockCodec::Contexts {
  ZSTD_CCtx* c = nullptr;
  ZSTD_DCtx* d = nullptr;
  ~Contexts() {
    ZSTD_freeCCtx(c);
    ZSTD_freeDCtx(d);
  }
};

const char* codec_name(Codec codec) {
  switch (codec) {
    case Codec::kNone:
      return "none";
    case Codec::kLossless:
      return "lossless";
    case Codec::kBf16:
      return "bf16";
    case Codec::kInt8:
      return "int8";
  }
  return "?";
}

bool codec_from_name(std::string_view name, Codec* out) {
  for (const Codec c : {Codec::kNone, Codec::kLossless, Codec::kBf16, Codec::kInt8}) {
    if (name == codec_name(c)) {
      *out = c;
      return true;
    }
  }
  return false;
}

bool codec_is_known(uint32_t value) { return value <= static_cast<uint32_t>(Codec::kInt8); }

void round_to_bf16(float* values, size_t n) {
  for (size_t i = 0; i < n; ++i) values[i] = row::float_from_bf16(row::bf16_from_float(values[i]));
}

bool within_bound(Codec codec, const float* want, const float* got, size_t rows, uint32_t width) {
  const size_t n = rows * width;
  switch (codec) {
    case Codec::kNone:
    case Codec::kLossless:
      return n == 0 || std::memcmp(want, got, n * sizeof(float)) == 0;
    case Codec::kBf16:
      for (size_t i = 0; i < n; ++i) {
        if (!row::bf16_within_bound(want[i], got[i])) return false;
      }
      return true;
    case Codec::kInt8:
      for (size_t i = 0; i < n; i += width) {
        if (!row::int8_row_within_bound(want + i, got + i, width)) return false;
      }
      return true;
  }
  return false;
}

BlockCodec::BlockCodec(int zstd_level) : level_(zstd_level), zstd_(new Contexts) {}
BlockCodec::~BlockCodec() = default;

size_t BlockCodec::bound(Codec codec, uint32_t rows, uint32_t width) {
  const size_t values = size_t{rows} * width;
  if (values > kMaxBlockFloats) return 0;
  switch (codec) {
    case Codec::kNone:
      return values * sizeof(float);
    case Codec::kLossless:
      return ZSTD_compressBound(values * sizeof(float));
    case Codec::kBf16:
      return values * sizeof(uint16_t);
    case Codec::kInt8:
      return size_t{rows} * 2 * sizeof(float) + values;
  }
  return 0;
}

int BlockCodec::encode(Codec codec, const float* in, uint32_t rows, uint32_t width,
                       std::vector<char>* out, std::string* detail) {
  if (!codec_is_known(static_cast<uint32_t>(codec))) {
    set_detail(detail, "unknown codec " + std::to_string(static_cast<unsigned>(codec)));
    return -EINVAL;
  }
  if (!shape_ok(rows, width, detail)) return -EINVAL;
  const size_t values = size_t{rows} * width;
  if (out == nullptr || (values != 0 && in == nullptr)) {
    set_detail(detail, "null block");
    return -EINVAL;
  }
  // Every failure leaves *out as it was.
  const size_t at = out->size();
  try {
    out->resize(at + bound(codec, rows, width));
    char* dst = out->data() + at;
    switch (codec) {
      case Codec::kNone:
        if (values != 0) std::memcpy(dst, in, values * sizeof(float));
        return 0;
      case Codec::kBf16:
        for (size_t i = 0; i < values; ++i) {
          const uint16_t b = row::bf16_from_float(in[i]);
          std::memcpy(dst + i * sizeof(b), &b, sizeof(b));
        }
        return 0;
      case Codec::kInt8: {
        if (width != 0) encode_int8_rows(in, rows, width, dst);
        if (width == 0) std::memset(dst, 0, size_t{rows} * 2 * sizeof(float));
        return 0;
      }
      case Codec::kLossless: {
        if (zstd_->c == nullptr) {
          if ((zstd_->c = ZSTD_createCCtx()) == nullptr) {
            out->resize(at);
            set_detail(detail, "out of memory for a zstd context");
            return -ENOMEM;
          }
          const size_t e = configure_compression(zstd_->c, level_);
          if (ZSTD_isError(e)) {
            ZSTD_freeCCtx(zstd_->c);
            zstd_->c = nullptr;
            out->resize(at);
            set_detail(detail, std::string("zstd parameters: ") + ZSTD_getErrorName(e));
            return -EIO;
          }
        }
        scratch_.resize(values * sizeof(float));
        shuffle(reinterpret_cast<const char*>(in), values, scratch_.data());
        const bool raw_allowed = fast_strategy(level_) && !sampled_rows_repeat(in, rows, width);
        const size_t n = compress_planes(zstd_->c, raw_allowed, scratch_.data(), values, dst,
                                         bound(codec, rows, width));
        if (ZSTD_isError(n)) {
          out->resize(at);
          set_detail(detail, std::string("zstd: ") + ZSTD_getErrorName(n));
          return -EIO;
        }
        out->resize(at + n);
        return 0;
      }
    }
  } catch (const std::bad_alloc&) {
    out->resize(at);  // shrinking does not allocate
    set_detail(detail, "out of memory encoding a block");
    return -ENOMEM;
  }
  return -EINVAL;
}

int BlockCodec::decode(Codec codec, const char* data, size_t size, uint32_t rows, uint32_t width,
                       float* out, std::string* detail) {
  if (!codec_is_known(static_cast<uint32_t>(codec))) {
    set_detail(detail, "unknown codec " + std::to_string(static_cast<unsigned>(codec)));
    return -EINVAL;
  }
  if (!shape_ok(rows, width, detail)) return -EINVAL;
  const size_t values = size_t{rows} * width;
  if ((size != 0 && data == nullptr) || (values != 0 && out == nullptr)) {
    set_detail(detail, "null block");
    return -EINVAL;
  }
  if (codec != Codec::kLossless) {
    const size_t want = bound(codec, rows, width);
    if (size != want) {
      set_detail(detail, size_mismatch(codec, size, want, rows, width));
      return -EBADMSG;
    }
  }
  switch (codec) {
    case Codec::kNone:
      if (values != 0) std::memcpy(out, data, values * sizeof(float));
      return 0;
    case Codec::kBf16:
      for (size_t i = 0; i < values; ++i) {
        uint16_t b = 0;
        std::memcpy(&b, data + i * sizeof(b), sizeof(b));
        out[i] = row::float_from_bf16(b);
      }
      return 0;
    case Codec::kInt8: {
      if (width != 0) decode_int8_rows(data, rows, width, out);
      return 0;
    }
    case Codec::kLossless: {
      const size_t want = float_bytes(rows, width);
      // The frame must say its size, and say this one: zstd then never writes more than that.
      const unsigned long long declared = ZSTD_getFrameContentSize(data, size);
      if (declared == ZSTD_CONTENTSIZE_ERROR || declared == ZSTD_CONTENTSIZE_UNKNOWN ||
          declared != want) {
        set_detail(detail, "lossless block of " + std::to_string(rows) + " rows x " +
                               std::to_string(width) + " floats: " +
                               (declared == ZSTD_CONTENTSIZE_ERROR ? "not a zstd frame"
                                : declared == ZSTD_CONTENTSIZE_UNKNOWN
                                    ? "a zstd frame of no size"
                                    : "a zstd frame of " + std::to_string(declared) +
                                          " bytes, not " + std::to_string(want)));
        return -EBADMSG;
      }
      // One frame, all of the block: anything after it is not this block's.
      const size_t frame = ZSTD_findFrameCompressedSize(data, size);
      if (ZSTD_isError(frame) || frame != size) {
        set_detail(detail, "lossless block: " + std::string(ZSTD_isError(frame)
                                                                ? ZSTD_getErrorName(frame)
                                                                : "bytes after its zstd frame"));
        return -EBADMSG;
      }
      try {
        scratch_.resize(want);
      } catch (const std::bad_alloc&) {
        set_detail(detail, "out of memory decoding a block");
        return -ENOMEM;
      }
      if (zstd_->d == nullptr && (zstd_->d = ZSTD_createDCtx()) == nullptr) return -ENOMEM;
      const size_t n = ZSTD_decompressDCtx(zstd_->d, scratch_.data(), want, data, size);
      if (ZSTD_isError(n) || n != want) {
        set_detail(detail, "lossless block: zstd: " +
                               std::string(ZSTD_isError(n) ? ZSTD_getErrorName(n)
                                                           : "a frame shorter than it says"));
        return -EBADMSG;
      }
      unshuffle(scratch_.data(), values, reinterpret_cast<char*>(out));
      return 0;
    }
  }
  return -EINVAL;
}

}  // namespace embstore::io
