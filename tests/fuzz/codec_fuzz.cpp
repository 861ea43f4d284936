// Fuzzes the block codecs (io/codec/block_codec.hpp). Input: byte 0 picks the codec (its low two
// bits), bytes 1-2 the rows (little-endian, at most 511), byte 3 the floats a row (1 to 64); the
// rest is the stored block. Checks:
// - decode() of the rest as that block returns 0 or -EBADMSG (with a reason), never writes past
//   the block's floats (a canary after them) and hands out only what it was given room for;
// - the rest, read as floats (as many as the block holds, zero-filled), encodes within bound()
//   and decodes back: bit for bit for none and lossless, within the header's bounds for bf16
//   and int8 (a non-finite value: NaN for int8's whole row; bf16 keeps NaN and infinities).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/row/codec.h"
#include "io/codec/block_codec.hpp"

namespace {

using embstore::io::BlockCodec;
using embstore::io::Codec;

[[noreturn]] void fail(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "codec_fuzz: %s %s\n", what, detail.c_str());
  std::abort();
}

void check_lossy(Codec codec, const float* in, const float* out, uint32_t rows, uint32_t width) {
  for (uint32_t r = 0; r < rows; ++r) {
    const float* x = in + size_t{r} * width;
    const float* y = out + size_t{r} * width;
    if (codec == Codec::kInt8) {
      if (!embstore::row::int8_row_within_bound(x, y, width)) fail("int8: out of bound");
      continue;
    }
    for (uint32_t i = 0; i < width; ++i) {
      if (!embstore::row::bf16_within_bound(x[i], y[i])) fail("bf16: out of bound");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const auto codec = static_cast<Codec>(data[0] & 3);
  const uint32_t rows = (data[1] | uint32_t{data[2]} << 8) & 511;
  const uint32_t width = (data[3] & 63) + 1;
  const char* block = reinterpret_cast<const char*>(data + 4);
  const size_t block_size = size - 4;
  const size_t values = size_t{rows} * width;
  static BlockCodec codec_state;  // reused, as a reader reuses it between blocks

  std::vector<float> out(values + 1);
  const float canary = 1234.5f;
  out[values] = canary;
  std::string detail;
  const int r = codec_state.decode(codec, block, block_size, rows, width, out.data(), &detail);
  if (r != 0 && r != -EBADMSG) fail("decode returned", std::to_string(r));
  if (r == -EBADMSG && detail.empty()) fail("-EBADMSG without a reason");
  if (std::memcmp(&out[values], &canary, sizeof(float)) != 0) fail("decode wrote past the block");

  std::vector<float> in(values, 0.0f);
  if (values != 0) std::memcpy(in.data(), block, std::min(block_size, values * sizeof(float)));
  std::vector<char> encoded;
  if (int e = codec_state.encode(codec, in.data(), rows, width, &encoded, &detail); e != 0) {
    fail("encode returned", std::to_string(e) + " " + detail);
  }
  if (encoded.size() > BlockCodec::bound(codec, rows, width)) fail("encode beyond bound()");
  std::vector<float> back(values + 1);
  back[values] = canary;
  if (int e = codec_state.decode(codec, encoded.data(), encoded.size(), rows, width, back.data(),
                                 &detail);
      e != 0) {
    fail("decode of an encoding returned", std::to_string(e) + " " + detail);
  }
  if (std::memcmp(&back[values], &canary, sizeof(float)) != 0) fail("decode wrote past");
  if (codec == Codec::kNone || codec == Codec::kLossless) {
    if (values != 0 && std::memcmp(in.data(), back.data(), values * sizeof(float)) != 0) {
      fail("a lossless codec changed bits");
    }
  } else {
    check_lossy(codec, in.data(), back.data(), rows, width);
  }
  return 0;
}
