// Codecs of a block of rows' floats in checkpoint files (issue 35): a block's values, or its
// optimizer state, are rows x width floats, row-major, stored in one of four encodings.
//
//   codec     stored bytes                                          error
//   none      the floats, little-endian (4 x rows x width)          none
//   lossless  zstd frame of the floats byte-shuffled (all first      none
//             bytes, then all second bytes, ...: exponents together)
//   bf16      rows x width bf16, little-endian (2 bytes a value)     relative 2^-8 (codec.h)
//   int8      rows scales, rows offsets (floats), then rows x width  half a step of the row's
//             bytes (row-wise, FBGEMM's fused 8-bit rows)            range (cuda/row/codec.h)
//
// A lossless frame may keep its first planes in raw zstd blocks (those that look random, at the
// fast levels; block_codec.cpp): still one frame of the same bytes, which any zstd decoder reads.
//
// Blocks are independent, so a file of them still streams, checksums and decodes in parallel.
// Row files (io/format/row_file.hpp) encode each block's values and state with it.
//
// Decoding treats the bytes as hostile: the caller says how many rows and floats a row the
// block holds (from its checksummed header, itself bounded), and decode() checks that the
// stored bytes are exactly what that takes: a size that lies, a zstd frame that is corrupt,
// holds more or fewer bytes, or is followed by anything is -EBADMSG with *detail saying which.
// It never writes past out[rows x width) and allocates at most 4 x rows x width bytes of
// scratch, so a decompression bomb cannot take more memory than the block's honest size.
//
// liburing style: 0 or -errno; nothing throws (std::bad_alloc is -ENOMEM). One object per
// thread: it keeps zstd contexts and scratch between blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace embstore::io {

enum class Codec : uint8_t { kNone = 0, kLossless = 1, kBf16 = 2, kInt8 = 3 };

// "none", "lossless", "bf16", "int8"; "?" for a value outside the enum.
const char* codec_name(Codec codec);
// By name; false for an unknown one.
bool codec_from_name(std::string_view name, Codec* out);
// Whether a byte read from disk names a codec.
bool codec_is_known(uint32_t value);
// Whether decoding gives back the floats encoded, bit for bit.
inline bool codec_is_lossless(Codec codec) {
  return codec == Codec::kNone || codec == Codec::kLossless;
}
// Rounds each of values[0..n) to the nearest bf16 (ties to even), kept as a float: what the
// BF16 codec's decoding gives back, so rounding twice changes nothing.
void round_to_bf16(float* values, size_t n);

// Whether got (rows x width floats, row-major) is what decoding codec's encoding of want may
// give: bit for bit for the lossless codecs, else each value (bf16) or row (int8) within the
// bound that cuda/row/codec.h states. For tests and embstore-ckpt verify.
bool within_bound(Codec codec, const float* want, const float* got, size_t rows, uint32_t width);

class BlockCodec {
 public:
  // zstd_level: lossless's zstd level (zstd's scale; the default favours speed).
  explicit BlockCodec(int zstd_level = 1);
  ~BlockCodec();
  BlockCodec(const BlockCodec&) = delete;
  BlockCodec& operator=(const BlockCodec&) = delete;

  // A block holds at most 2^32 floats (rows x width): encode() and decode() refuse larger
  // shapes with -EINVAL, so no byte count can wrap around.
  // The most bytes encode() writes for rows x width floats; 0 for a shape over the limit.
  static size_t bound(Codec codec, uint32_t rows, uint32_t width);
  // Appends the encoding of in[0..rows x width) to *out. -EINVAL for an unknown codec, a shape
  // over the limit or a null pointer with floats to encode; -ENOMEM; -EIO when zstd fails. A
  // failure leaves *out as it was.
  int encode(Codec codec, const float* in, uint32_t rows, uint32_t width, std::vector<char>* out,
             std::string* detail);
  // Decodes data[0..size) as rows x width floats into out. -EBADMSG for bytes that are not such
  // an encoding (see the top of this file); -EINVAL for an unknown codec, a shape over the
  // limit or a null pointer; -ENOMEM.
  int decode(Codec codec, const char* data, size_t size, uint32_t rows, uint32_t width, float* out,
             std::string* detail);

 private:
  struct Contexts;
  int level_;
  std::unique_ptr<Contexts> zstd_;
  std::vector<char> scratch_;
};

}  // namespace embstore::io
