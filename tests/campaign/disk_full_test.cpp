// Disk full, for real: checkpoints into a small file system (a 16 MiB ext4 image on a loop
// device, else an 8 MiB tmpfs) until it fills. Every checkpoint that fails says
// EMBSTORE_IO_ERROR with the ENOSPC text and leaves nothing half-visible: every version in
// the directory restores exactly as it was, no staging directory stays behind, training goes
// on, and once space is freed the next checkpoints succeed and hold every change since the
// last committed one. Needs root to mount; where it cannot, it says so and exits 77 (ctest:
// skipped).
#include <sys/mount.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "io/format/commit.hpp"
#include "tests/campaign/campaign_fixtures.hpp"
#include "tests/io/io_fixtures.hpp"

using namespace embstore_campaign;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kWideKeys = 4000;
constexpr uint32_t kWideDim = 128;  // SGD: 520 bytes a row, 2 MB a full checkpoint

// A small file system mounted at dir for the test's life.
class SmallFileSystem {
 public:
  explicit SmallFileSystem(const std::string& scratch) : dir_(scratch + "/mnt") {
    fs::create_directories(dir_);
    const std::string image = scratch + "/fs.img";
    const std::string quiet = " >/dev/null 2>&1";
    if (std::system(("truncate -s 16M " + image + " && mkfs.ext4 -q -F " + image + quiet +
                     " && mount -o loop " + image + " " + dir_ + quiet)
                        .c_str()) == 0) {
      kind_ = "16 MiB ext4 on a loop device";
    } else if (::mount("tmpfs", dir_.c_str(), "tmpfs", 0, "size=8m") == 0) {
      kind_ = "8 MiB tmpfs";
    }
  }
  ~SmallFileSystem() {
    if (!kind_.empty()) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return !kind_.empty(); }
  const std::string& kind() const { return kind_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_, kind_;
};

embstore_table_t* wide_table(embstore_store_t* s) {
  embstore_table_config_t c;
  embstore_table_config_init(&c);
  c.name = "wide";
  c.dim = kWideDim;
  c.optimizer = EMBSTORE_OPT_SGD;
  c.initial_capacity = kWideKeys;
  embstore_table_t* t = nullptr;
  REQUIRE(embstore_table_create(s, &c, &t) == EMBSTORE_OK);
  return t;
}

// Updates a quarter of the wide table's keys (all of them at step 1).
void train_wide(embstore_table_t* t, uint64_t step) {
  std::vector<int64_t> keys;
  for (int64_t k = 0; k < kWideKeys; ++k) {
    if (step == 1 || (k + static_cast<int64_t>(step)) % 4 == 0) keys.push_back(k);
  }
  std::vector<float> out(keys.size() * kWideDim), grads(keys.size() * kWideDim, 0.01f);
  REQUIRE(embstore_lookup(t, keys.data(), keys.size(), out.data(), EMBSTORE_LOOKUP_INSERT,
                          nullptr) == EMBSTORE_OK);
  REQUIRE(embstore_apply_gradients(t, keys.data(), grads.data(), keys.size(), nullptr) ==
          EMBSTORE_OK);
}

std::vector<float> wide_values(embstore_store_t* s) {
  embstore_table_t* t = nullptr;
  REQUIRE(embstore_table_get(s, "wide", &t) == EMBSTORE_OK);
  std::vector<int64_t> keys(kWideKeys);
  for (int64_t k = 0; k < kWideKeys; ++k) keys[static_cast<size_t>(k)] = k;
  std::vector<float> v(keys.size() * kWideDim);
  REQUIRE(embstore_lookup(t, keys.data(), keys.size(), v.data(), 0, nullptr) == EMBSTORE_OK);
  return v;
}

struct State {
  Snapshot snap;
  std::vector<float> wide;
};

State state_of(embstore_store_t* s) {
  State st;
  REQUIRE(snapshot(s, &st.snap, false));
  st.wide = wide_values(s);
  return st;
}

// Every version in dir restores as it was; no staging directory is left.
void check_directory(const std::string& dir, const std::map<uint64_t, State>& committed) {
  std::vector<embstore::io::VersionDir> versions;
  REQUIRE(embstore::io::list_versions(dir, &versions) == 0);
  for (const embstore::io::VersionDir& v : versions) {
    INFO("version " << v.name);
    REQUIRE(committed.count(v.version) == 1);  // only what was reported committed
    embstore_store_t* s = host_store();
    uint64_t got = 0;
    INFO(embstore_last_error());
    REQUIRE(embstore_restore(s, dir.c_str(), v.version, &got) == EMBSTORE_OK);
    const State st = state_of(s);
    REQUIRE(st.snap == committed.at(v.version).snap);
    REQUIRE(st.wide == committed.at(v.version).wide);
    embstore_store_destroy(s);
  }
  for (const auto& e : fs::directory_iterator(dir)) {
    INFO(e.path());
    REQUIRE(e.path().filename().string().rfind(".tmp-", 0) != 0);
  }
}

}  // namespace

TEST_CASE("a full disk fails only the checkpoints that do not fit", "[campaign][disk]") {
  embstore_test::TempDir scratch;
  SmallFileSystem small(scratch.path());
  if (!small.mounted()) {
    std::printf(
        "SKIPPED: cannot mount a small file system here (needs root, and a loop device "
        "or tmpfs)\n");
    std::exit(77);
  }
  const std::string dir = small.dir() + "/ckpt";
  embstore_store_t* s = host_store();
  REQUIRE(s != nullptr);
  REQUIRE(create_tables(s));
  embstore_table_t* wide = wide_table(s);
  std::map<uint64_t, State> committed;
  int failures = 0, successes = 0;
  uint64_t step = 0;
  // Fill the file system: full checkpoints and deltas until three have failed for space.
  while (failures < 3) {
    ++step;
    REQUIRE(step < 200);
    REQUIRE(train_step(s, step));
    train_wide(wide, step);
    uint64_t v = 0;
    const auto kind = step % 3 == 1 ? EMBSTORE_CKPT_FULL : EMBSTORE_CKPT_INCREMENTAL;
    const embstore_status_t started = embstore_checkpoint(s, dir.c_str(), kind, &v);
    const embstore_status_t st = started == EMBSTORE_OK ? embstore_checkpoint_wait(s, v) : started;
    if (st == EMBSTORE_OK) {
      committed[v] = state_of(s);
      ++successes;
    } else {
      INFO(embstore_last_error());
      REQUIRE(st == EMBSTORE_IO_ERROR);
      REQUIRE(std::string(embstore_last_error()).find("No space left on device") !=
              std::string::npos);
      ++failures;
    }
    check_directory(dir, committed);
  }
  REQUIRE(successes >= 2);
  // Space again: every version but the newest full checkpoint's chain goes, by hand.
  std::vector<embstore::io::VersionDir> versions;
  REQUIRE(embstore::io::list_versions(dir, &versions) == 0);
  uint64_t newest_full = 0;
  for (const auto& v : versions) {
    if (v.full) newest_full = v.version;
  }
  for (const auto& v : versions) {
    if (v.version < newest_full) {
      fs::remove_all(dir + "/" + v.name);
      committed.erase(v.version);
    }
  }
  // The rows that failed checkpoints did not write are still dirty: the next delta holds them.
  ++step;
  REQUIRE(train_step(s, step));
  uint64_t v = 0;
  REQUIRE(embstore_checkpoint(s, dir.c_str(), EMBSTORE_CKPT_INCREMENTAL, &v) == EMBSTORE_OK);
  INFO(embstore_last_error());
  REQUIRE(embstore_checkpoint_wait(s, v) == EMBSTORE_OK);
  committed[v] = state_of(s);
  check_directory(dir, committed);
  embstore_store_destroy(s);
  std::printf(
      "disk full on %s: %d checkpoints committed, %d failed with ENOSPC, each leaving "
      "every committed version restorable\n",
      small.kind().c_str(), successes + 1, failures);
}
