// Scenario `codecs`: what the row codecs of io/codec (issue 35's first part; no checkpoint uses
// them yet) do to a trained table's rows. A table of --rows rows (dim, --optimizer) is filled
// (keys 1..rows at their initial values), trained --steps Zipf batches (lookup with insert,
// apply_gradients of fixed pseudo-random gradients in [-0.01, 0.01), step), and checkpointed in
// full into a fresh directory under --dir. Its row file is read back block by block, and each
// block's values and optimizer state are encoded and decoded with every codec (state: all but
// int8, which state may not use).
//
// Reported per part (values, state) and codec: stored bytes and their share of none's, encode
// and decode speed (MB/s of floats, one thread, the sum over the blocks), and the largest
// error (0 for the lossless codecs, whose decoded floats must equal the stored ones bit for
// bit; for bf16 and int8 every value is checked against its bound from cuda/row/codec.h).
// Exits 2 when a check fails. Also reported: how many rows the training touched (the rest
// hold their initializer's values, which is what most rows of a large table hold early on).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cuda/row/codec.h"
#include "io/codec/block_codec.hpp"
#include "io/format/commit.hpp"
#include "io/format/layout.hpp"
#include "io/format/manifest.hpp"
#include "io/format/row_file.hpp"
#include "perf/harness.hpp"
#include "perf/report.hpp"
#include "perf/zipf.hpp"

namespace embstore::perf {
namespace {

// The floats of one part of the row file, block by block.
struct Part {
  const char* name = "";
  uint32_t width = 0;
  std::vector<std::vector<float>> blocks;
  uint64_t floats() const {
    uint64_t n = 0;
    for (const auto& b : blocks) n += b.size();
    return n;
  }
};

struct Result {
  std::string part, codec;
  uint64_t bytes = 0;
  double share = 0, encode_mbs = 0, decode_mbs = 0, max_error = 0;
  uint64_t out_of_bound = 0;
};

class CodecsScenario final : public Scenario {
 public:
  const char* name() const override { return "codecs"; }
  const char* description() const override {
    return "bytes, speed and error of the row codecs (io/codec) on a trained table's checkpoint";
  }

  void set_defaults(CommonOptions& o) const override {
    o.backend = "host";
    o.batch = 16384;
    o.steps = 200;
  }

  void add_options(CLI::App& app) override {
    app.add_option("--rows", rows_, "rows of the table: the key space, all inserted first")
        ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 31))
        ->capture_default_str();
    app.add_option("--optimizer", optimizer_, "optimizer of the table")
        ->check(CLI::IsMember(optimizer_names()))
        ->capture_default_str();
    app.add_option("--zstd-level", zstd_level_,
                   "lossless's zstd level (negative: zstd's fast levels; the writer's is 1)")
        ->check(CLI::Range(-7, 19))
        ->capture_default_str();
    app.add_option("--dir", dir_, "the checkpoint is written under this directory")
        ->capture_default_str();
    app.add_flag("--keep", keep_, "keep the checkpoint");
  }

  int run(const CommonOptions& options, Report& report) override {
    CommonOptions o = options;
    o.key_space = rows_;
    const ScenarioDir work(dir_, name(), keep_);
    const std::string ckpt = work.path() + "/ckpt";
    std::filesystem::create_directories(ckpt);

    // Train, then checkpoint.
    const Store store(o);
    const embstore_backend_t backend = store.backend();
    embstore_table_t* table = create_table(store, "codecs", o.dim, optimizer_from_name(optimizer_));
    fill_table(table, backend, rows_, o.dim);
    const std::vector<int64_t> keys = zipf_key_stream(o.steps * o.batch, rows_, o.zipf, o.seed);
    std::vector<float> grads(o.batch * o.dim);
    SplitMix64 rng(o.seed ^ 0x636f64656373ull);
    for (float& g : grads) g = static_cast<float>(rng.next_unit() * 0.02 - 0.01);
    BackendBuffer<int64_t> d_keys(backend, o.batch);
    BackendBuffer<float> d_grads(backend, grads.size()), d_out(backend, grads.size());
    d_grads.upload(grads.data(), grads.size());
    for (size_t s = 0; s < o.steps; ++s) {
      d_keys.upload(keys.data() + s * o.batch, o.batch);
      check(embstore_lookup(table, d_keys.data(), o.batch, d_out.data(), EMBSTORE_LOOKUP_INSERT,
                            nullptr),
            "embstore_lookup");
      check(embstore_apply_gradients(table, d_keys.data(), d_grads.data(), o.batch, nullptr),
            "embstore_apply_gradients");
      check(embstore_step(store.get(), s + 1), "embstore_step");
    }
    backend_sync(backend);
    uint64_t version = 0;
    check(embstore_checkpoint(store.get(), ckpt.c_str(), EMBSTORE_CKPT_FULL, &version),
          "embstore_checkpoint");
    check(embstore_checkpoint_wait(store.get(), version), "embstore_checkpoint_wait");
    std::vector<int64_t> touched = keys;
    std::sort(touched.begin(), touched.end());
    const uint64_t touched_rows =
        static_cast<uint64_t>(std::unique(touched.begin(), touched.end()) - touched.begin());

    // Read the row file back.
    const std::string path = ckpt + "/" + io::version_dir_name(version, true) + "/" +
                             io::row_file_path(io::kManifestFormatVersion, "codecs", 0, 1);
    std::unique_ptr<io::RowFileReader> reader;
    if (int r = io::RowFileReader::open(path, {}, &reader); r < 0) {
      throw std::runtime_error(fmt::format("open {}: {}", path, r));
    }
    Part values, state;
    values.name = "values";
    state.name = "state";
    io::RowBlock b;
    int r = 0;
    while ((r = reader->next_block(&b)) == 1) {
      values.width = b.dim;
      state.width = b.state_dim;
      values.blocks.emplace_back(b.values, b.values + size_t{b.rows} * b.dim);
      if (b.state_dim > 0) {
        state.blocks.emplace_back(b.state, b.state + size_t{b.rows} * b.state_dim);
      }
    }
    if (r < 0) throw std::runtime_error(fmt::format("{}: {}", path, reader->error_detail()));

    // Every codec on every block.
    std::vector<Result> results;
    bool failed = false;
    io::BlockCodec codec_state(zstd_level_);
    for (Part* part : {&values, &state}) {
      if (part->blocks.empty()) continue;
      uint64_t none_bytes = 0;
      for (const io::Codec codec :
           {io::Codec::kNone, io::Codec::kLossless, io::Codec::kBf16, io::Codec::kInt8}) {
        if (part == &state && codec == io::Codec::kInt8) continue;
        Result res{part->name, io::codec_name(codec)};
        std::vector<std::vector<char>> encoded(part->blocks.size());
        std::string detail;
        const Stopwatch enc;
        for (size_t i = 0; i < part->blocks.size(); ++i) {
          const auto rows = static_cast<uint32_t>(part->blocks[i].size() / part->width);
          if (codec_state.encode(codec, part->blocks[i].data(), rows, part->width, &encoded[i],
                                 &detail) != 0) {
            throw std::runtime_error("encode: " + detail);
          }
          res.bytes += encoded[i].size();
        }
        const double enc_s = enc.seconds();
        std::vector<std::vector<float>> decoded(part->blocks.size());
        for (size_t i = 0; i < part->blocks.size(); ++i) decoded[i].resize(part->blocks[i].size());
        const Stopwatch dec;
        for (size_t i = 0; i < part->blocks.size(); ++i) {
          const auto rows = static_cast<uint32_t>(part->blocks[i].size() / part->width);
          if (codec_state.decode(codec, encoded[i].data(), encoded[i].size(), rows, part->width,
                                 decoded[i].data(), &detail) != 0) {
            throw std::runtime_error("decode: " + detail);
          }
        }
        const double dec_s = dec.seconds();
        check_block(codec, *part, decoded, &res);
        failed = failed || res.out_of_bound != 0;
        if (codec == io::Codec::kNone) none_bytes = res.bytes;
        res.share = static_cast<double>(res.bytes) / static_cast<double>(none_bytes);
        const double mb = static_cast<double>(part->floats()) * sizeof(float) / 1e6;
        res.encode_mbs = mb / enc_s;
        res.decode_mbs = mb / dec_s;
        results.push_back(res);
      }
    }

    report.say("{:>6} {:>8} | {:>9} {:>6} | {:>10} {:>10} | {:>10} {:>6}", "part", "codec", "bytes",
               "share", "enc MB/s", "dec MB/s", "max error", "bad");
    for (const Result& res : results) {
      report.say("{:>6} {:>8} | {:>9} {:>6.3f} | {:>10.0f} {:>10.0f} | {:>10.3g} {:>6}", res.part,
                 res.codec, si(static_cast<double>(res.bytes)), res.share, res.encode_mbs,
                 res.decode_mbs, res.max_error, res.out_of_bound);
    }
    report.say(
        "{} rows of dim {} ({}), {} of them touched by {} training steps of {} Zipf {} keys; one "
        "full checkpoint's row file, {} blocks; zstd level {}; one thread",
        rows_, o.dim, optimizer_, touched_rows, o.steps, o.batch, o.zipf, values.blocks.size(),
        zstd_level_);

    report_common(report, o, backend);
    report.set("rows", rows_);
    report.set("optimizer", optimizer_);
    report.set("rows_touched", touched_rows);
    report.set("zstd_level", zstd_level_);
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const Result& res : results) {
      nlohmann::ordered_json j;
      j["part"] = res.part;
      j["codec"] = res.codec;
      j["bytes"] = res.bytes;
      j["share_of_none"] = res.share;
      j["encode_mb_per_second"] = res.encode_mbs;
      j["decode_mb_per_second"] = res.decode_mbs;
      j["max_abs_error"] = res.max_error;
      j["out_of_bound"] = res.out_of_bound;
      list.push_back(std::move(j));
    }
    report.set("results", std::move(list));
    if (failed) report.say("FAILED: a decoded value outside its codec's bound (column 'bad')");
    return failed ? kExitMismatch : 0;
  }

 private:
  // Largest error, and rows out of their bound (lossless: blocks with any bit changed).
  static void check_block(io::Codec codec, const Part& part,
                          const std::vector<std::vector<float>>& decoded, Result* res) {
    for (size_t i = 0; i < part.blocks.size(); ++i) {
      const std::vector<float>& in = part.blocks[i];
      const std::vector<float>& out = decoded[i];
      if (io::codec_is_lossless(codec)) {
        if (std::memcmp(in.data(), out.data(), in.size() * sizeof(float)) != 0) {
          ++res->out_of_bound;
        }
        continue;
      }
      for (size_t row = 0; row < in.size(); row += part.width) {
        for (size_t k = row; k < row + part.width; ++k) {
          res->max_error = std::max(res->max_error, std::fabs(static_cast<double>(out[k]) - in[k]));
        }
        const bool ok = codec == io::Codec::kInt8
                            ? row::int8_row_within_bound(&in[row], &out[row], part.width)
                            : std::equal(in.begin() + row, in.begin() + row + part.width,
                                         out.begin() + row, row::bf16_within_bound);
        if (!ok) ++res->out_of_bound;
      }
    }
  }

  uint64_t rows_ = 1'000'000;
  std::string optimizer_ = "adagrad";
  int zstd_level_ = 1;
  std::string dir_ = "/var/tmp";
  bool keep_ = false;
};

}  // namespace

std::unique_ptr<Scenario> make_codecs_scenario() { return std::make_unique<CodecsScenario>(); }

}  // namespace embstore::perf
