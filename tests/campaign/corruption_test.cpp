// The corruption campaign: a chain of four versions (a full checkpoint and three deltas, with
// admission counts, tombstones and an attachment in each) has single bytes flipped and files
// truncated, at sampled offsets of every file of every version, middle deltas included. After
// each change, restore of the version that holds the file and of the newest version either
// fails with EMBSTORE_CORRUPT naming that file, or loads exactly what was checkpointed; and
// embstore-ckpt verify of the version exits 0 exactly when restore of it succeeds.
//
// EMBSTORE_CAMPAIGN_SCALE multiplies the sampled offsets (scripts/campaign.sh runs it larger).
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "io/format/commit.hpp"
#include "tests/campaign/campaign_fixtures.hpp"
#include "tests/io/io_fixtures.hpp"

using namespace embstore_campaign;
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kVersions[] = {10, 20, 30, 40};

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

// The kind of file a path is, for the campaign's tally.
std::string kind_of(const std::string& rel, uint64_t version) {
  const std::string where = version == 10   ? "full"
                            : version == 40 ? "newest delta"
                                            : "middle delta";
  if (rel == "MANIFEST.json") return "manifest (" + where + ")";
  if (rel.find(".rows") != std::string::npos) return "row file (" + where + ")";
  if (rel.find("admission.counts") != std::string::npos) return "admission counts (" + where + ")";
  return "attachment (" + where + ")";
}

struct Tally {
  int detected = 0, harmless = 0;
};

}  // namespace

TEST_CASE("corruption campaign: every damaged byte is detected with its file named, or harmless",
          "[campaign][corruption]") {
  embstore_test::TempDir tmp;
  const std::string dir = tmp.path() + "/ckpt";
  std::map<uint64_t, Snapshot> truth;
  {
    embstore_store_t* s = host_store();
    REQUIRE(s != nullptr);
    REQUIRE(create_tables(s));
    embstore_checkpoint_policy_t p;
    embstore_checkpoint_policy_init(&p);
    p.max_chain_length = 0;  // one chain: 10 full, 20 30 40 deltas
    p.rebaseline_fraction = 0;
    REQUIRE(embstore_checkpoint_set_policy(s, &p) == EMBSTORE_OK);
    for (uint64_t step = 1; step <= 40; ++step) {
      REQUIRE(train_step(s, step));
      if (step % 10 != 0) continue;
      const std::string note = "note at " + std::to_string(step);
      REQUIRE(embstore_checkpoint_attach(s, "note", note.data(), note.size()) == EMBSTORE_OK);
      uint64_t v = 0;
      REQUIRE(embstore_checkpoint(s, dir.c_str(),
                                  step == 10 ? EMBSTORE_CKPT_FULL : EMBSTORE_CKPT_INCREMENTAL,
                                  &v) == EMBSTORE_OK);
      REQUIRE(embstore_checkpoint_wait(s, v) == EMBSTORE_OK);
      REQUIRE(snapshot(s, &truth[v], false));
      truth[v].note = note;
    }
    embstore_store_destroy(s);
  }
  for (uint64_t v : kVersions) {
    INFO("version " << v);
    const Restored r = restore(dir, v);
    INFO(r.message);
    REQUIRE(r.status == EMBSTORE_OK);
    REQUIRE(r.snap == truth[v]);
    REQUIRE(truth[v].counts.at("users").second > 0);  // admission counts in play
  }

  // Every file of every version.
  struct File {
    std::string path, rel;
    uint64_t version;
  };
  std::vector<File> files;
  for (uint64_t v : kVersions) {
    const std::string vdir = dir + "/" + embstore::io::version_dir_name(v, v == 10);
    for (const auto& e : fs::recursive_directory_iterator(vdir)) {
      if (e.is_regular_file()) {
        files.push_back({e.path().string(), fs::relative(e.path(), vdir).string(), v});
      }
    }
  }
  REQUIRE(files.size() >= 4 * 5);  // manifest, 3 row files, counts, attachment per version

  std::mt19937_64 rng(seed());
  std::map<std::string, Tally> tally;
  int trials = 0;
  auto trial = [&](const File& f, const std::string& what) {
    ++trials;
    INFO(what << " in " << f.path);
    bool all_ok = true;
    for (uint64_t v : {f.version, uint64_t{40}}) {
      const Restored r = restore(dir, v);
      INFO("restore of version " << v << ": " << embstore_status_name(r.status) << ": "
                                 << r.message);
      if (r.status == EMBSTORE_OK) {
        REQUIRE(r.version == v);
        REQUIRE(r.snap == truth[v]);  // harmless: exactly what was checkpointed
      } else {
        all_ok = false;
        REQUIRE(r.status == EMBSTORE_CORRUPT);
        REQUIRE(r.message.find(f.path) != std::string::npos);  // the file is named
      }
      if (v == f.version) {
        const Run verify =
            run(EMBSTORE_CKPT_TOOL, {"verify", dir, "--version", std::to_string(v)}, tmp.path());
        INFO("verify: exit " << verify.status << "\n" << verify.out << verify.err);
        REQUIRE((verify.status == 0) == (r.status == EMBSTORE_OK));
        if (verify.status != 0) REQUIRE(verify.err.find(f.path) != std::string::npos);
      }
    }
    Tally& t = tally[kind_of(f.rel, f.version)];
    (all_ok ? t.harmless : t.detected) += 1;
  };

  const double k = scale();
  for (const File& f : files) {
    const std::string original = read_bytes(f.path);
    const size_t size = original.size();
    REQUIRE(size > 0);
    // Flips: the first and last byte, and offsets drawn over the file.
    const int flips = static_cast<int>(k * (f.rel == "MANIFEST.json" ? 12 : 8));
    std::vector<size_t> offsets = {0, size - 1};
    for (int i = 0; i < flips; ++i) offsets.push_back(rng() % size);
    for (size_t at : offsets) {
      std::string bytes = original;
      bytes[at] = static_cast<char>(bytes[at] ^ static_cast<char>(1 + rng() % 255));
      write_bytes(f.path, bytes);
      trial(f, "byte " + std::to_string(at) + " flipped");
      write_bytes(f.path, original);
    }
    // Truncations: empty, to one byte short, to half, and to the last block boundary.
    std::vector<size_t> cuts = {0, size - 1, size / 2};
    if (size > 4096) cuts.push_back(size - 4096);
    for (size_t cut : cuts) {
      write_bytes(f.path, original.substr(0, cut));
      trial(f, "truncated to " + std::to_string(cut) + " bytes");
      write_bytes(f.path, original);
    }
    REQUIRE(read_bytes(f.path) == original);
  }

  // The tally, for the README's "Guarantees".
  std::printf("corruption campaign: %d trials over %zu files (seed %llu, scale %.1f)\n", trials,
              files.size(), static_cast<unsigned long long>(seed()), k);
  int detected = 0, harmless = 0;
  for (const auto& [kind, t] : tally) {
    std::printf("  %-32s %4d detected with the file named, %3d harmless (restored exactly)\n",
                kind.c_str(), t.detected, t.harmless);
    detected += t.detected;
    harmless += t.harmless;
  }
  std::printf("  %-32s %4d detected, %d harmless, 0 silently wrong\n", "all", detected, harmless);
  REQUIRE(detected > 0);
}
