// Block codecs (io/codec/block_codec.hpp): every codec round-trips blocks of every shape, the
// lossless ones bit for bit (NaN payloads and -0 included), the lossy ones within their bounds;
// decoding refuses bytes that are not an encoding of the block it is told about.
#include "cuda/row/codec.h"

#include <zstd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "io/codec/block_codec.hpp"

namespace embstore::io {
namespace {

constexpr Codec kAll[] = {Codec::kNone, Codec::kLossless, Codec::kBf16, Codec::kInt8};

// Rows like trained embeddings: small values around zero, a few exact zeros and -0.
std::vector<float> trained_rows(uint32_t rows, uint32_t width, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.03f);
  std::vector<float> v(size_t{rows} * width);
  for (size_t i = 0; i < v.size(); ++i) v[i] = i % 29 == 0 ? (i % 2 ? -0.0f : 0.0f) : d(rng);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// What the lossless codec's frame holds, by the format's definition: float i's byte k at
// k x n + i, written a byte at a time (the codec's own shuffle is what is under test).
std::vector<char> byte_planes(const std::vector<float>& in) {
  const size_t n = in.size();
  std::vector<char> planes(n * sizeof(float));
  const auto* bytes = reinterpret_cast<const char*>(in.data());
  for (size_t i = 0; i < n; ++i) {
    for (size_t k = 0; k < sizeof(float); ++k) planes[k * n + i] = bytes[i * sizeof(float) + k];
  }
  return planes;
}

std::vector<char> encode_ok(BlockCodec& c, Codec codec, const std::vector<float>& in, uint32_t rows,
                            uint32_t width) {
  std::vector<char> out = {'x'};  // encode appends
  std::string detail;
  REQUIRE(c.encode(codec, in.data(), rows, width, &out, &detail) == 0);
  REQUIRE(out[0] == 'x');
  REQUIRE(out.size() - 1 <= BlockCodec::bound(codec, rows, width));
  return std::vector<char>(out.begin() + 1, out.end());
}

TEST_CASE("every codec round-trips blocks of every shape", "[codec]") {
  BlockCodec c;
  for (const auto& [rows, width] :
       {std::pair<uint32_t, uint32_t>{0, 8}, {1, 1}, {3, 7}, {257, 64}, {1000, 129}}) {
    const std::vector<float> in = trained_rows(rows, width, rows + width);
    for (const Codec codec : kAll) {
      INFO(codec_name(codec) << ", " << rows << " x " << width);
      const std::vector<char> bytes = encode_ok(c, codec, in, rows, width);
      std::vector<float> out(in.size() + 1, 12345.0f);  // a canary after the block
      std::string detail;
      REQUIRE(c.decode(codec, bytes.data(), bytes.size(), rows, width, out.data(), &detail) == 0);
      REQUIRE(out.back() == 12345.0f);
      out.pop_back();
      if (codec_is_lossless(codec)) {
        REQUIRE(same_bits(in, out));
      } else {
        for (size_t i = 0; i < in.size(); ++i) {
          // bf16: relative 2^-8; int8: half a step of the row's range, plus float rounding.
          double tol = row::bf16_error_bound(in[i]);
          if (codec == Codec::kInt8) {
            const float* row = in.data() + i / width * width;
            const auto [lo, hi] = std::minmax_element(row, row + width);
            tol = row::int8_error_bound(*lo, *hi);
          }
          REQUIRE(std::fabs(static_cast<double>(out[i]) - in[i]) <= tol);
        }
      }
    }
  }
}

TEST_CASE("int8 blocks hold the bytes of the row arithmetic, whatever the CPU's vector width",
          "[codec]") {
  // BlockCodec runs int8 in AVX2 clones where the CPU has them (block_codec.cpp); this file's
  // copy of cuda/row/codec.h is plain. Both, and the formula of the first int8 encoder
  // (floor((x - offset) / scale + 0.5), clamped), must give the same bytes and the same floats.
  constexpr uint32_t kWidth = 67;  // vector loops and their tails
  std::vector<float> in = trained_rows(64, kWidth, 5);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> wide(-3e38f, 3e38f);
  for (uint32_t k = 0; k < kWidth; ++k) {
    in[1 * kWidth + k] = 0.25f;                                                // constant
    in[2 * kWidth + k] = wide(rng);                                            // near FLT_MAX
    in[3 * kWidth + k] = std::numeric_limits<float>::denorm_min() * float(k);  // subnormal
    in[4 * kWidth + k] = k % 2 ? -0.0f : 0.0f;
  }
  in[5 * kWidth + 9] = std::numeric_limits<float>::quiet_NaN();
  in[6 * kWidth + 3] = std::numeric_limits<float>::infinity();
  in[7 * kWidth] = std::numeric_limits<float>::max();
  in[7 * kWidth + 1] = -std::numeric_limits<float>::max();
  // Zeros of both signs as a row's minimum (8, 9) or maximum (10, 11), in lanes and an order
  // where four lanes of extremes would pick the other one than a scan in order.
  for (uint32_t r = 8; r < 12; ++r) {
    for (uint32_t k = 0; k < kWidth; ++k) in[r * kWidth + k] = r < 10 ? 0.5f + k : -0.5f - k;
    in[r * kWidth + 2] = r % 2 ? -0.0f : 0.0f;
    in[r * kWidth + 5] = r % 2 ? 0.0f : -0.0f;
  }
  BlockCodec c;
  const std::vector<char> bytes = encode_ok(c, Codec::kInt8, in, 64, kWidth);
  std::vector<float> out(in.size());
  REQUIRE(c.decode(Codec::kInt8, bytes.data(), bytes.size(), 64, kWidth, out.data(), nullptr) == 0);
  const auto* q = reinterpret_cast<const uint8_t*>(bytes.data() + 64 * 2 * sizeof(float));
  for (uint32_t r = 0; r < 64; ++r) {
    INFO("row " << r);
    const float* x = in.data() + size_t{r} * kWidth;
    std::vector<uint8_t> want(kWidth);
    float scale = 0, offset = 0;
    row::int8_encode_row(x, kWidth, want.data(), &scale, &offset);
    float stored_scale = 0, stored_offset = 0;
    std::memcpy(&stored_scale, bytes.data() + r * sizeof(float), sizeof(float));
    std::memcpy(&stored_offset, bytes.data() + (64 + r) * sizeof(float), sizeof(float));
    CHECK(std::memcmp(&stored_scale, &scale, sizeof(float)) == 0);
    CHECK(std::memcmp(&stored_offset, &offset, sizeof(float)) == 0);
    // The first encoder's extent: one scan in order, the first of equal extremes kept.
    float first_lo = x[0];
    bool finite = true;
    for (uint32_t k = 0; k < kWidth; ++k) {
      finite = finite && std::isfinite(x[k]);
      first_lo = x[k] < first_lo ? x[k] : first_lo;
    }
    if (finite) CHECK(std::memcmp(&stored_offset, &first_lo, sizeof(float)) == 0);
    CHECK(std::memcmp(q + size_t{r} * kWidth, want.data(), kWidth) == 0);
    if (scale > 0) {
      for (uint32_t k = 0; k < kWidth; ++k) {
        const double v = std::floor((static_cast<double>(x[k]) - offset) / scale + 0.5);
        CHECK(want[k] == static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v)));
      }
    }
    std::vector<float> decoded(kWidth);
    row::int8_decode_row(want.data(), kWidth, scale, offset, decoded.data());
    CHECK(std::memcmp(decoded.data(), out.data() + size_t{r} * kWidth, kWidth * sizeof(float)) ==
          0);
  }
}

TEST_CASE("lossless keeps every bit and shrinks trained rows", "[codec]") {
  BlockCodec c;
  std::vector<float> in = trained_rows(512, 64, 3);
  in[5] = std::numeric_limits<float>::quiet_NaN();
  uint32_t payload_nan = 0x7fa00001u;  // a signalling NaN with a payload
  std::memcpy(&in[6], &payload_nan, sizeof(float));
  in[7] = -std::numeric_limits<float>::infinity();
  in[8] = std::numeric_limits<float>::denorm_min();
  const std::vector<char> bytes = encode_ok(c, Codec::kLossless, in, 512, 64);
  std::vector<float> out(in.size());
  REQUIRE(c.decode(Codec::kLossless, bytes.data(), bytes.size(), 512, 64, out.data(), nullptr) ==
          0);
  REQUIRE(same_bits(in, out));
  // The shuffle puts the exponents' bytes together: values of one scale compress.
  REQUIRE(bytes.size() < in.size() * sizeof(float) * 95 / 100);
}

TEST_CASE("lossless stores a zstd frame of the floats' byte planes, whatever the vector path",
          "[codec]") {
  // The shuffle runs 16 floats at a time where the CPU allows and a byte at a time for the rest
  // (block_codec.cpp): the file format is the planes' bytes (float i's byte k at k x n + i),
  // so the frame must hold exactly those, for counts below, at and past a group, and a frame
  // made from planes by any other writer must decode to the floats.
  BlockCodec c;
  for (const auto& [rows, width] : {std::pair<uint32_t, uint32_t>{1, 1},
                                    {1, 15},
                                    {1, 16},
                                    {1, 17},
                                    {3, 33},
                                    {2016, 64},
                                    {7, 129}}) {
    INFO(rows << " x " << width);
    std::vector<float> in = trained_rows(rows, width, rows * 31 + width);
    if (in.size() > 2) {
      const uint32_t marked = 0xa1b2c3d4u;  // four distinct bytes: a swapped plane shows
      std::memcpy(&in[in.size() - 2], &marked, sizeof(float));
    }
    const size_t n = in.size();
    const std::vector<char> planes = byte_planes(in);
    const std::vector<char> frame = encode_ok(c, Codec::kLossless, in, rows, width);
    std::vector<char> stored(planes.size());
    REQUIRE(ZSTD_decompress(stored.data(), stored.size(), frame.data(), frame.size()) ==
            stored.size());
    REQUIRE(stored == planes);

    std::vector<char> other(ZSTD_compressBound(planes.size()));
    other.resize(ZSTD_compress(other.data(), other.size(), planes.data(), planes.size(), 3));
    std::vector<float> out(n);
    REQUIRE(c.decode(Codec::kLossless, other.data(), other.size(), rows, width, out.data(),
                     nullptr) == 0);
    REQUIRE(same_bits(in, out));
  }
}

// The bytes of the raw blocks at the start of a zstd frame as the lossless writer makes it
// (magic, descriptor 0x80: a 4-byte content size, not single-segment; a window descriptor; the
// content size; then blocks; RFC 8878), read by the format's definition: 0 when its first block
// is not raw or the header is another. *frame_ok: the frame walked to a last block that ends it.
size_t leading_raw_bytes(const std::vector<char>& frame, bool* frame_ok) {
  *frame_ok = false;
  if (frame.size() < 10 || static_cast<uint8_t>(frame[4]) != 0x80) return 0;
  size_t at = 10, raw = 0;
  bool leading = true;
  while (at + 3 <= frame.size()) {
    const uint32_t h = static_cast<uint8_t>(frame[at]) | static_cast<uint8_t>(frame[at + 1]) << 8 |
                       static_cast<uint32_t>(static_cast<uint8_t>(frame[at + 2])) << 16;
    const uint32_t type = (h >> 1) & 3, size = h >> 3;
    leading = leading && type == 0;
    if (leading) raw += size;
    at += 3 + (type == 1 ? 1 : size);  // an RLE block stores one byte
    if (h & 1) {
      *frame_ok = at == frame.size();
      break;
    }
  }
  return raw;
}

TEST_CASE("lossless stores byte planes that look random in raw blocks of the same frame",
          "[codec]") {
  // With zstd's fast strategy (the default level) the first planes whose sampled bytes look
  // random go in raw zstd blocks, the rest compressed after them in the same frame: a trained
  // float's three low bytes (planes 0-2) raw, exactly 3 x n bytes of them (zstd's own raw blocks
  // hold 128 KiB each), and its exponents compressed; planes of bf16 rounded floats (low halves
  // zero), of few distinct values, and of a few random rows copied over the block compressed
  // whole; random bits all raw. Any zstd decoder reads the planes back, a streaming one within a
  // window smaller than the block (1.5 MB), and so does the codec.
  const uint32_t rows = 6000, width = 64;
  const size_t n = size_t{rows} * width;
  std::vector<float> trained = trained_rows(rows, width, 21);
  std::vector<float> rounded = trained;
  round_to_bf16(rounded.data(), rounded.size());
  std::vector<float> steps(n);  // 16 distinct values: every plane compresses
  for (size_t i = 0; i < n; ++i) steps[i] = 0.25f * static_cast<float>((i * 7) % 16);
  std::vector<float> noise(n);  // any bits at all, NaNs included
  std::mt19937 rng(4);
  for (float& f : noise) {
    const uint32_t bits = static_cast<uint32_t>(rng());
    std::memcpy(&f, &bits, sizeof(f));
  }
  // 8 random rows, copied over the block: bytes that look random, but zstd's matches store
  // them in a few hundredths; raw planes would keep half of them.
  std::vector<float> copies(n);
  for (uint32_t r = 0; r < rows; ++r) {
    std::memcpy(&copies[size_t{r} * width], &noise[size_t{r % 8} * width], width * sizeof(float));
  }
  struct Case {
    const char* what;
    const std::vector<float>* in;
    size_t raw_planes;
  };
  for (const Case& k : {Case{"trained", &trained, 3}, Case{"bf16-rounded", &rounded, 0},
                        Case{"16 values", &steps, 0}, Case{"random bits", &noise, 4},
                        Case{"8 rows copied", &copies, 0}}) {
    INFO(k.what);
    BlockCodec c;
    const std::vector<char> frame = encode_ok(c, Codec::kLossless, *k.in, rows, width);
    bool frame_ok = false;
    const size_t raw = leading_raw_bytes(frame, &frame_ok);
    REQUIRE(raw == k.raw_planes * n);
    if (k.raw_planes != 0) REQUIRE(frame_ok);
    if (k.raw_planes == 3) REQUIRE(frame.size() < 3 * n + n * 6 / 10);  // the exponents shrink
    if (k.in == &copies) REQUIRE(frame.size() < n / 10);
    const std::vector<char> planes = byte_planes(*k.in);
    std::vector<char> stored(planes.size());
    REQUIRE(ZSTD_decompress(stored.data(), stored.size(), frame.data(), frame.size()) ==
            stored.size());
    REQUIRE(stored == planes);
    // A streaming decoder that allows a window of 1 MiB (zstd's tool allows 128 MiB) reads it:
    // the frame asks for the window of the compressed planes' frame, not for the whole block.
    ZSTD_DCtx* d = ZSTD_createDCtx();
    REQUIRE(!ZSTD_isError(ZSTD_DCtx_setParameter(d, ZSTD_d_windowLogMax, 20)));
    // (4 KiB in, 64 KiB out at a time: given the whole frame and room for all of it, zstd
    // would decode it in one pass, where no window applies.)
    std::vector<char> streamed;
    std::vector<char> piece(64 << 10);
    size_t fed = 0, left = 1;
    while (left != 0) {
      const size_t in_bytes = std::min<size_t>(4096, frame.size() - fed);
      ZSTD_inBuffer src{frame.data() + fed, in_bytes, 0};
      do {
        ZSTD_outBuffer dst{piece.data(), piece.size(), 0};
        left = ZSTD_decompressStream(d, &dst, &src);
        REQUIRE(!ZSTD_isError(left));
        streamed.insert(streamed.end(), piece.begin(), piece.begin() + dst.pos);
        if (dst.pos < dst.size) break;
      } while (left != 0);
      fed += src.pos;
      REQUIRE((left == 0 || fed < frame.size()));
    }
    ZSTD_freeDCtx(d);
    REQUIRE(streamed == planes);
    std::vector<float> out(n);
    REQUIRE(c.decode(Codec::kLossless, frame.data(), frame.size(), rows, width, out.data(),
                     nullptr) == 0);
    REQUIRE(same_bits(*k.in, out));
    // Cut anywhere, the frame is refused, never decoded short.
    for (const size_t cut : {size_t{1}, size_t{3}, frame.size() / 2, frame.size() - 9}) {
      std::string detail;
      REQUIRE(c.decode(Codec::kLossless, frame.data(), frame.size() - cut, rows, width, out.data(),
                       &detail) == -EBADMSG);
    }
  }
}

TEST_CASE("lossless levels other than zstd's fast strategy keep zstd's own parameters", "[codec]") {
  // The writer's level 1 gets a small hash table (block_codec.cpp); level 0 is zstd's default
  // (level 3, another strategy), which must get zstd's own table like level 3 itself: the same
  // bytes as zstd's one-shot call at level 3.
  const std::vector<float> in = trained_rows(2016, 64, 11);
  const std::vector<char> planes = byte_planes(in);
  std::vector<char> want(ZSTD_compressBound(planes.size()));
  want.resize(ZSTD_compress(want.data(), want.size(), planes.data(), planes.size(), 3));
  for (const int level : {0, 3}) {
    INFO("level " << level);
    BlockCodec c(level);
    REQUIRE(encode_ok(c, Codec::kLossless, in, 2016, 64) == want);
  }
}

TEST_CASE("names and codes of codecs", "[codec]") {
  for (const Codec codec : kAll) {
    Codec back = Codec::kNone;
    REQUIRE(codec_from_name(codec_name(codec), &back));
    REQUIRE(back == codec);
    REQUIRE(codec_is_known(static_cast<uint32_t>(codec)));
  }
  Codec out = Codec::kInt8;
  REQUIRE_FALSE(codec_from_name("zstd", &out));
  REQUIRE(out == Codec::kInt8);
  REQUIRE_FALSE(codec_is_known(4));
  REQUIRE(std::string(codec_name(static_cast<Codec>(9))) == "?");
  BlockCodec c;
  std::vector<char> bytes;
  float f = 1;
  REQUIRE(c.encode(static_cast<Codec>(9), &f, 1, 1, &bytes, nullptr) == -EINVAL);
  REQUIRE(c.decode(static_cast<Codec>(9), "", 0, 0, 0, nullptr, nullptr) == -EINVAL);
  REQUIRE(c.encode(Codec::kNone, nullptr, 1, 1, &bytes, nullptr) == -EINVAL);
  // A shape whose byte count would wrap size_t (as a forged header could give) is refused
  // before anything is read or written.
  const uint32_t huge = UINT32_MAX;
  std::string detail;
  for (const Codec codec : kAll) {
    REQUIRE(BlockCodec::bound(codec, huge, huge) == 0);
    REQUIRE(c.decode(codec, "x", 1, huge, huge, &f, &detail) == -EINVAL);
    REQUIRE(detail.find("over the limit") != std::string::npos);
    REQUIRE(c.encode(codec, &f, huge, huge, &bytes, nullptr) == -EINVAL);
  }
}

TEST_CASE("decoding refuses bytes that are not the block's encoding", "[codec]") {
  BlockCodec c;
  const uint32_t rows = 40, width = 16;
  const std::vector<float> in = trained_rows(rows, width, 5);
  std::vector<float> out(in.size() + 1, 7.0f);
  std::string detail;
  auto refused = [&](Codec codec, const std::vector<char>& bytes, const char* why) {
    INFO(codec_name(codec) << ": " << why);
    detail.clear();
    REQUIRE(c.decode(codec, bytes.data(), bytes.size(), rows, width, out.data(), &detail) ==
            -EBADMSG);
    REQUIRE(!detail.empty());
    REQUIRE(out.back() == 7.0f);  // nothing written past the block
  };
  for (const Codec codec : kAll) {
    std::vector<char> bytes = encode_ok(c, codec, in, rows, width);
    std::vector<char> shorter(bytes.begin(), bytes.end() - 1), longer = bytes;
    longer.push_back(0);
    refused(codec, shorter, "one byte short");
    refused(codec, longer, "one byte more");
    refused(codec, {}, "empty");
    // The same bytes taken for a block of another shape.
    detail.clear();
    REQUIRE(c.decode(codec, bytes.data(), bytes.size(), rows + 1, width, out.data(), &detail) ==
            -EBADMSG);
  }
  const std::vector<char> frame = encode_ok(c, Codec::kLossless, in, rows, width);
  SECTION("a corrupt frame") {
    std::vector<char> bad = frame;
    for (size_t i = 12; i < bad.size(); i += 7) bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    refused(Codec::kLossless, bad, "flipped bytes");
    refused(Codec::kLossless, std::vector<char>(frame.size(), 'z'), "not zstd");
  }
  SECTION("a frame of another size: a bomb asks for more than the block holds") {
    const std::vector<float> big(size_t{rows} * width * 1000, 0.0f);  // compresses to little
    std::vector<char> bomb(ZSTD_compressBound(big.size() * sizeof(float)));
    bomb.resize(ZSTD_compress(bomb.data(), bomb.size(), big.data(), big.size() * sizeof(float), 1));
    refused(Codec::kLossless, bomb, "declares 1000 times the block");
  }
  SECTION("a frame that does not say its size") {
    ZSTD_CCtx* cctx = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0);
    std::vector<char> unsized(ZSTD_compressBound(in.size() * sizeof(float)));
    ZSTD_outBuffer o{unsized.data(), unsized.size(), 0};
    ZSTD_inBuffer i{in.data(), in.size() * sizeof(float), 0};
    REQUIRE(ZSTD_compressStream2(cctx, &o, &i, ZSTD_e_end) == 0);
    ZSTD_freeCCtx(cctx);
    unsized.resize(o.pos);
    refused(Codec::kLossless, unsized, "no content size");
  }
  SECTION("two frames") {
    std::vector<char> two = frame;
    two.insert(two.end(), frame.begin(), frame.end());
    refused(Codec::kLossless, two, "a second frame after the first");
  }
}

}  // namespace
}  // namespace embstore::io
