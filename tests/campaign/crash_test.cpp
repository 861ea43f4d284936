// The crash campaign: a trainer (a forked child on the host backend) takes full and incremental
// checkpoints with retention (keep_full 2), and is killed with SIGKILL at random moments, or at
// a chosen call of its commit protocol (fsync of a file or a directory, the rename, the fsync
// of the parent) or of its row writes. After every kill:
//   - every version directory left in place restores, exactly as a replay of the same training
//     had it at that step;
//   - the newest version the trainer was told was committed is there;
//   - EMBSTORE_LATEST restores, no older than that;
//   - a new store takes the directory over (the dead writer's lock is gone) and checkpoints
//     into it, and no leftover of the dead one survives that.
// Then embstore-ckpt compact is killed at random moments: its output directory holds no
// version or a complete one, and the next compact completes.
//
// Kills: 40 trainers and 12 compactions by default; EMBSTORE_CAMPAIGN_SCALE multiplies both
// (scripts/campaign.sh --kills 500).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "io/engine/fault.hpp"
#include "io/format/commit.hpp"
#include "tests/campaign/campaign_fixtures.hpp"
#include "tests/io/io_fixtures.hpp"

using namespace embstore_campaign;
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kSteps = 120;
constexpr uint64_t kEvery = 3;  // a checkpoint every kEvery steps

// How a trial's trainer dies.
enum class Death { kTimer, kCommitStep, kRowWrite, kNone };

const char* const kCommitSteps[] = {"fsync_file", "fsync_dir", "fsync_staging", "rename",
                                    "fsync_parent"};

// The trainer: checkpoints every kEvery steps (full or incremental by rng), retention keeps 2
// full checkpoints, and each version committed is written to report as 8 bytes. Exits 0 after
// kSteps; dies wherever death says.
[[noreturn]] void trainer(const std::string& dir, uint64_t trial_seed, Death death, int report) {
  std::mt19937_64 rng(trial_seed);
  if (death == Death::kCommitStep) {
    const std::string step = kCommitSteps[rng() % std::size(kCommitSteps)];
    const int nth = 1 + static_cast<int>(rng() % 20);
    embstore::io::set_commit_fault_injection([step, nth, count = 0](const char* s) mutable {
      if (step == s && ++count == nth) ::raise(SIGKILL);
      return 0;
    });
  } else if (death == Death::kRowWrite) {
    const int nth = 1 + static_cast<int>(rng() % 60);
    embstore::io::set_fault_injection([nth, count = 0](uint64_t, size_t) mutable {
      if (++count == nth) ::raise(SIGKILL);
      return 0;
    });
  } else {
    // Writes take a little longer, so that more kills land inside a checkpoint.
    embstore::io::set_fault_injection([](uint64_t, size_t) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      return 0;
    });
  }
  embstore_store_t* s = host_store();
  if (s == nullptr || !create_tables(s)) ::_exit(3);
  embstore_checkpoint_policy_t p;
  embstore_checkpoint_policy_init(&p);
  p.dir = dir.c_str();
  p.keep_full = 2;
  p.max_chain_length = 3;
  p.rebaseline_fraction = 0;
  if (embstore_checkpoint_set_policy(s, &p) != EMBSTORE_OK) ::_exit(4);
  for (uint64_t step = 1; step <= kSteps; ++step) {
    if (!train_step(s, step)) ::_exit(5);
    if (step % kEvery != 0) continue;
    const std::string note = "note at " + std::to_string(step);
    uint64_t v = 0;
    if (embstore_checkpoint_attach(s, "note", note.data(), note.size()) != EMBSTORE_OK ||
        embstore_checkpoint(s, dir.c_str(),
                            rng() % 4 == 0 ? EMBSTORE_CKPT_FULL : EMBSTORE_CKPT_INCREMENTAL,
                            &v) != EMBSTORE_OK ||
        embstore_checkpoint_wait(s, v) != EMBSTORE_OK) {
      ::_exit(6);
    }
    if (::write(report, &v, sizeof v) != sizeof v) ::_exit(7);
  }
  embstore_store_destroy(s);
  ::_exit(0);
}

// The tables at every checkpoint step, from the same training in this process.
std::map<uint64_t, Snapshot> replay() {
  std::map<uint64_t, Snapshot> out;
  embstore_store_t* s = host_store();
  REQUIRE(s != nullptr);
  REQUIRE(create_tables(s));
  for (uint64_t step = 1; step <= kSteps; ++step) {
    REQUIRE(train_step(s, step));
    if (step % kEvery != 0) continue;
    REQUIRE(snapshot(s, &out[step], false));
    out[step].note = "note at " + std::to_string(step);
  }
  embstore_store_destroy(s);
  return out;
}

struct Outcome {
  std::vector<uint64_t> reported;  // versions the trainer was told were committed
  bool killed = false;
  double seconds = 0;
};

Outcome run_trainer(const std::string& dir, uint64_t trial_seed, Death death, double kill_after) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  std::fflush(stdout);
  std::fflush(stderr);
  const auto start = std::chrono::steady_clock::now();
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    embstore_test::die_with_parent(parent);
    ::close(fds[0]);
    trainer(dir, trial_seed, death, fds[1]);
  }
  ::close(fds[1]);
  std::atomic<bool> done{false};
  std::thread killer;
  if (death == Death::kTimer) {
    killer = std::thread([&] {
      const auto until = start + std::chrono::duration<double>(kill_after);
      while (!done.load() && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      if (!done.load()) ::kill(child, SIGKILL);
    });
  }
  Outcome o;
  uint64_t v = 0;
  while (::read(fds[0], &v, sizeof v) == sizeof v) o.reported.push_back(v);
  ::close(fds[0]);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  done.store(true);
  if (killer.joinable()) killer.join();
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  o.killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  INFO("trainer exit status " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1));
  REQUIRE((o.killed || (WIFEXITED(status) && WEXITSTATUS(status) == 0)));
  return o;
}

// The checks after a trainer's death (see the top of the file).
void check_after(const std::string& dir, const Outcome& o,
                 const std::map<uint64_t, Snapshot>& expected) {
  std::vector<embstore::io::VersionDir> versions;
  const int listed = embstore::io::list_versions(dir, &versions);
  if (o.reported.empty() && listed == -ENOENT) return;  // killed before it made the directory
  REQUIRE(listed == 0);
  uint64_t newest = 0;
  for (const embstore::io::VersionDir& v : versions) {
    INFO("version " << v.name);
    const Restored r = restore(dir, v.version);
    INFO(embstore_status_name(r.status) << ": " << r.message);
    REQUIRE(r.status == EMBSTORE_OK);
    REQUIRE(r.snap == expected.at(v.version));
    newest = std::max(newest, v.version);
  }
  if (!o.reported.empty()) {
    const uint64_t last = o.reported.back();
    INFO("the trainer was told " << last << " was committed");
    REQUIRE(std::any_of(versions.begin(), versions.end(),
                        [&](const embstore::io::VersionDir& v) { return v.version == last; }));
    const Restored latest = restore(dir, EMBSTORE_LATEST);
    REQUIRE(latest.status == EMBSTORE_OK);
    REQUIRE(latest.version >= last);
    REQUIRE(latest.version == newest);
  }
  // A new writer takes over: restore the newest, train on, checkpoint into the directory.
  if (versions.empty()) return;
  embstore_store_t* s = host_store();
  uint64_t got = 0;
  REQUIRE(embstore_restore(s, dir.c_str(), EMBSTORE_LATEST, &got) == EMBSTORE_OK);
  REQUIRE(train_step(s, got + 1));
  uint64_t v = 0;
  REQUIRE(embstore_checkpoint(s, dir.c_str(), EMBSTORE_CKPT_INCREMENTAL, &v) == EMBSTORE_OK);
  INFO(embstore_last_error());
  REQUIRE(embstore_checkpoint_wait(s, v) == EMBSTORE_OK);
  REQUIRE(embstore_store_destroy(s) == EMBSTORE_OK);
  for (const auto& e : fs::directory_iterator(dir)) {
    INFO(e.path());
    REQUIRE(e.path().filename().string().rfind(".tmp-", 0) != 0);
  }
}

}  // namespace

TEST_CASE("crash campaign: a trainer killed at any moment leaves only versions that restore",
          "[campaign][crash]") {
  const std::map<uint64_t, Snapshot> expected = replay();
  embstore_test::TempDir tmp;
  std::mt19937_64 rng(seed());
  // How long a trainer runs undisturbed: kill times are drawn over it.
  const Outcome whole = run_trainer(tmp.path() + "/whole", rng(), Death::kNone, 0);
  REQUIRE_FALSE(whole.killed);
  REQUIRE(whole.reported.size() == kSteps / kEvery);
  check_after(tmp.path() + "/whole", whole, expected);

  const int trials = static_cast<int>(40 * scale());
  std::map<std::string, int> kills;
  for (int i = 0; i < trials; ++i) {
    const std::string dir = tmp.path() + "/t" + std::to_string(i);
    const Death death = i % 4 == 1   ? Death::kCommitStep
                        : i % 4 == 3 ? Death::kRowWrite
                                     : Death::kTimer;
    const double kill_after =
        std::uniform_real_distribution<double>(0.0, whole.seconds * 1.05)(rng);
    INFO("trial " << i << " (" << dir << ")");
    const Outcome o = run_trainer(dir, rng(), death, kill_after);
    check_after(dir, o, expected);
    if (o.killed) {
      ++kills[death == Death::kTimer        ? "at a random moment"
              : death == Death::kCommitStep ? "at a commit step"
                                            : "at a row write"];
    }
    fs::remove_all(dir);
  }
  int total = 0;
  for (const auto& [how, n] : kills) total += n;
  std::printf(
      "crash campaign: %d trainers killed of %d (seed %llu, scale %.1f; an undisturbed "
      "run took %.2f s)\n",
      total, trials, static_cast<unsigned long long>(seed()), scale(), whole.seconds);
  for (const auto& [how, n] : kills) std::printf("  %3d %s\n", n, how.c_str());
  REQUIRE(total >= trials * 3 / 4);  // most trials kill, or the campaign tests little
}

TEST_CASE("crash campaign: compact killed at any moment leaves no version or a whole one",
          "[campaign][crash]") {
  embstore_test::TempDir tmp;
  const std::string dir = tmp.path() + "/ckpt";
  // A chain to compact: the trainer undisturbed.
  std::mt19937_64 rng(seed() + 1);
  const Outcome whole = run_trainer(dir, rng(), Death::kNone, 0);
  REQUIRE_FALSE(whole.killed);
  const uint64_t source = whole.reported.back();
  const Restored truth = restore(dir, source);
  REQUIRE(truth.status == EMBSTORE_OK);

  const std::string out = tmp.path() + "/out";
  const auto start = std::chrono::steady_clock::now();
  Run first =
      run(EMBSTORE_CKPT_TOOL, {"compact", dir, "--version", "latest", "--out", out}, tmp.path());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO(first.out << first.err);
  REQUIRE(first.status == 0);
  const std::string version_dir = out + "/" + embstore::io::version_dir_name(source, true);

  // At least `trials` runs, and more (up to four times as many) until a third of that many were
  // killed before they finished: a compaction's time varies (a sanitizer's build, a loaded
  // machine), and a kill drawn after its end checks only the finished case.
  const int trials = static_cast<int>(12 * scale());
  const int wanted = trials / 3;
  int killed = 0, runs = 0;
  for (; runs < trials || (killed < wanted && runs < 4 * trials); ++runs) {
    INFO("trial " << runs);
    fs::remove_all(version_dir);
    const pid_t pid = spawn(EMBSTORE_CKPT_TOOL,
                            {"compact", dir, "--version", "latest", "--out", out}, tmp.path());
    REQUIRE(pid > 0);
    std::this_thread::sleep_for(std::chrono::duration<double>(
        std::uniform_real_distribution<double>(0.0, 0.8 * seconds)(rng)));
    ::kill(pid, SIGKILL);
    const Run r = finish(pid, tmp.path());
    if (r.status == -1) ++killed;
    std::vector<embstore::io::VersionDir> versions;
    REQUIRE(embstore::io::list_versions(out, &versions) == 0);
    REQUIRE(versions.size() <= 1);
    if (!versions.empty()) {  // finished before the kill, or killed after its rename
      const Restored r2 = restore(out, source);
      INFO(r2.message);
      REQUIRE(r2.status == EMBSTORE_OK);
      REQUIRE(r2.snap == truth.snap);
    }
  }
  // The next compact takes over (the lock of the dead one is gone) and completes.
  fs::remove_all(version_dir);
  const Run last =
      run(EMBSTORE_CKPT_TOOL, {"compact", dir, "--version", "latest", "--out", out}, tmp.path());
  INFO(last.out << last.err);
  REQUIRE(last.status == 0);
  const Restored r = restore(out, source);
  REQUIRE(r.status == EMBSTORE_OK);
  REQUIRE(r.snap == truth.snap);
  for (const auto& e : fs::directory_iterator(out)) {
    REQUIRE(e.path().filename().string().rfind(".tmp-", 0) != 0);
  }
  std::printf("crash campaign: %d compactions killed of %d (a whole one took %.3f s)\n", killed,
              runs, seconds);
  REQUIRE(killed >= wanted);  // the others finished first: also a case to check
}
