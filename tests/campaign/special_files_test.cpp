// Planted files: a checkpoint directory is often shared (a serving fleet follows a training
// job's directory), so one file planted there must never crash, hang or exhaust a reader. Each
// kind of file a reader opens (the newest and an older manifest, row and count files, an
// attachment, a lease, the writer's lock and its record) is replaced by a FIFO, a link to
// /dev/zero, a directory, a socket, or (for a manifest) JSON nested 100,000 deep; then every
// reader runs in a child process with a deadline and a memory limit: restore, warm start, a
// follower, a trainer's checkpoint with retention (which reads older manifests and the
// leases), and embstore-ckpt ls, verify, inspect, compact and export. Each must return within the
// deadline, without a signal, and without running out of memory.
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tests/campaign/campaign_fixtures.hpp"
#include "tests/io/io_fixtures.hpp"

using namespace embstore_campaign;
namespace fs = std::filesystem;

namespace {

constexpr int kDeadlineSeconds = 20;
// The address space of a probe; none under a sanitizer, which reserves far more up front.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr rlim_t kMemoryLimit = 0;
#else
constexpr rlim_t kMemoryLimit = rlim_t{4} << 30;
#endif

// How a probe ended: its exit code (the status it saw), or a signal, or the deadline.
struct Outcome {
  bool exited = false;
  int code = -1;
  int signal = 0;
  bool timed_out = false;
  std::string describe() const {
    if (timed_out) return "no answer within the deadline (killed)";
    if (!exited) return "killed by signal " + std::to_string(signal);
    return "exit " + std::to_string(code);
  }
};

Outcome wait_with_deadline(pid_t pid) {
  Outcome o;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kDeadlineSeconds);
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      o.timed_out = true;
      return o;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (WIFEXITED(status)) {
    o.exited = true;
    o.code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    o.signal = WTERMSIG(status);
  }
  return o;
}

// Runs probe() in a child with the memory limit; the child exits with the status it returns.
Outcome in_child(const std::function<embstore_status_t()>& probe) {
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    embstore_test::die_with_parent(parent);
    if (kMemoryLimit != 0) {
      const rlimit limit{kMemoryLimit, kMemoryLimit};
      ::setrlimit(RLIMIT_AS, &limit);
    }
    ::_exit(static_cast<int>(probe()));
  }
  return wait_with_deadline(pid);
}

Outcome tool(const std::vector<std::string>& args, const std::string& scratch) {
  return wait_with_deadline(spawn(EMBSTORE_CKPT_TOOL, args, scratch));
}

// A version of the directory: its path.
std::string version_dir(const std::string& dir, uint64_t version, bool full) {
  char name[64];
  std::snprintf(name, sizeof(name), "/%020llu.%s", static_cast<unsigned long long>(version),
                full ? "full" : "delta");
  return dir + name;
}

// Replaces path (whatever it is) by a special file of `kind`.
void plant(const std::string& path, const std::string& kind) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (kind == "fifo") {
    REQUIRE(::mkfifo(path.c_str(), 0644) == 0);
  } else if (kind == "link to /dev/zero") {
    REQUIRE(::symlink("/dev/zero", path.c_str()) == 0);
  } else if (kind == "directory") {
    REQUIRE(::mkdir(path.c_str(), 0755) == 0);
  } else if (kind == "socket") {
    const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
    REQUIRE(s >= 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    REQUIRE(path.size() < sizeof(addr.sun_path));
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    ::close(s);  // the socket file stays
  } else if (kind == "deep JSON") {
    std::ofstream f(path, std::ios::trunc);
    f << R"({"manifest_xxh3":"0000000000000000","x":)" << std::string(100000, '[')
      << std::string(100000, ']') << "}";
  } else {
    FAIL("unknown kind " << kind);
  }
}

// The directory under test: a full checkpoint at 10 (the older version) and a newer full one
// at 20 with a delta at 30, written by the campaign's trainer (admission counts, tombstones,
// an attachment).
void write_checkpoints(const std::string& dir) {
  embstore_store_t* s = host_store();
  REQUIRE(s != nullptr);
  REQUIRE(create_tables(s));
  for (uint64_t step = 1; step <= 30; ++step) {
    REQUIRE(train_step(s, step));
    if (step % 10 != 0) continue;
    REQUIRE(embstore_checkpoint_attach(s, "note", "n", 1) == EMBSTORE_OK);
    uint64_t v = 0;
    REQUIRE(embstore_checkpoint(s, dir.c_str(),
                                step == 30 ? EMBSTORE_CKPT_INCREMENTAL : EMBSTORE_CKPT_FULL,
                                &v) == EMBSTORE_OK);
    REQUIRE(embstore_checkpoint_wait(s, v) == EMBSTORE_OK);
  }
  embstore_store_destroy(s);
}

// The readers, each as a probe returning the status it got.
std::vector<std::pair<std::string, std::function<embstore_status_t()>>> readers(
    const std::string& dir) {
  auto restore_version = [dir](uint64_t version) {
    return [dir, version] {
      embstore_store_t* s = host_store();
      if (s == nullptr) return EMBSTORE_INTERNAL;
      uint64_t got = 0;
      const embstore_status_t st = embstore_restore(s, dir.c_str(), version, &got);
      embstore_store_destroy(s);
      return st;
    };
  };
  return {
      {"restore latest", restore_version(EMBSTORE_LATEST)},
      {"restore 10", restore_version(10)},
      {"warm start",
       [dir] {
         embstore_store_t* s = host_store();
         if (s == nullptr) return EMBSTORE_INTERNAL;
         embstore_warm_start_source_t src;
         embstore_warm_start_source_init(&src);
         src.dir = dir.c_str();
         const embstore_status_t st = embstore_warm_start(s, &src, 1);
         embstore_store_destroy(s);
         return st;
       }},
      {"follower",
       [dir] {
         embstore_follower_config_t c;
         embstore_follower_config_init(&c);
         c.dir = dir.c_str();
         c.backend = EMBSTORE_BACKEND_HOST;
         embstore_follower_t* f = nullptr;
         embstore_status_t st = embstore_follower_create(&c, &f);
         if (st == EMBSTORE_OK) {
           st = embstore_follower_poll(f, nullptr);
           embstore_follower_destroy(f);
         }
         return st;
       }},
      {"trainer with retention",
       [dir] {
         embstore_store_t* s = host_store();
         if (s == nullptr || !create_tables(s) || !train_step(s, 40)) return EMBSTORE_INTERNAL;
         embstore_checkpoint_policy_t p;
         embstore_checkpoint_policy_init(&p);
         p.keep_full = 1;  // reads the older manifests and the leases
         embstore_status_t st = embstore_checkpoint_set_policy(s, &p);
         uint64_t v = 0;
         if (st == EMBSTORE_OK) st = embstore_checkpoint(s, dir.c_str(), EMBSTORE_CKPT_FULL, &v);
         if (st == EMBSTORE_OK) st = embstore_checkpoint_wait(s, v);
         embstore_store_destroy(s);
         return st;
       }},
  };
}

}  // namespace

TEST_CASE("planted special files never crash, hang or exhaust a reader", "[campaign][special]") {
  embstore_test::TempDir tmp;
  const std::string pristine = tmp.path() + "/pristine";
  write_checkpoints(pristine);
  struct Target {
    std::string name;
    std::string path;  // relative to the directory
    std::vector<std::string> kinds;
  };
  const std::vector<std::string> all = {"fifo", "link to /dev/zero", "directory", "socket"};
  std::vector<std::string> manifest_kinds = all;
  manifest_kinds.push_back("deep JSON");
  const std::string newest = fs::path(version_dir("", 30, false)).filename();
  const std::string older = fs::path(version_dir("", 10, true)).filename();
  std::string row_file, counts_file, attachment;
  for (const auto& e : fs::recursive_directory_iterator(pristine + "/" + newest)) {
    const std::string rel = fs::relative(e.path(), pristine).string();
    if (rel.find(".rows") != std::string::npos && row_file.empty()) row_file = rel;
    if (rel.find(".counts") != std::string::npos && counts_file.empty()) counts_file = rel;
    if (rel.find("attachments/") != std::string::npos && e.is_regular_file()) attachment = rel;
  }
  REQUIRE_FALSE(row_file.empty());
  REQUIRE_FALSE(counts_file.empty());
  REQUIRE_FALSE(attachment.empty());
  const std::vector<Target> targets = {
      {"the newest manifest", newest + "/MANIFEST.json", manifest_kinds},
      {"an older manifest", older + "/MANIFEST.json", manifest_kinds},
      {"a row file", row_file, all},
      {"admission counts", counts_file, all},
      {"an attachment", attachment, all},
      {"a lease", "embstore.lease.planted", all},
      {"the writer's lock", "embstore.lock", all},
      {"the lock's record where locks do not work", "embstore.lock.held", all},
  };

  int probes = 0;
  for (const Target& target : targets) {
    for (const std::string& kind : target.kinds) {
      const std::string dir = tmp.path() + "/planted";
      std::error_code ec;
      fs::remove_all(dir, ec);
      fs::copy(pristine, dir, fs::copy_options::recursive);
      plant(dir + "/" + target.path, kind);
      for (const auto& [reader, probe] : readers(dir)) {
        CAPTURE(target.name, kind, reader);
        const Outcome o = in_child(probe);
        INFO(o.describe());
        REQUIRE(o.exited);
        REQUIRE(o.code != EMBSTORE_OUT_OF_MEMORY);
        REQUIRE(o.code != EMBSTORE_INTERNAL);
        ++probes;
      }
      const std::string out = tmp.path() + "/out";
      for (const std::vector<std::string>& args :
           {std::vector<std::string>{"ls", dir}, std::vector<std::string>{"verify", dir},
            std::vector<std::string>{"inspect", dir, "--version", "30", "--table", "users"},
            std::vector<std::string>{"compact", dir, "--version", "latest", "--out", out},
            std::vector<std::string>{"export", dir, "--version", "latest", "--table", "users",
                                     "--out", out + "-export"}}) {
        CAPTURE(target.name, kind, args[0]);
        const Outcome o = tool(args, tmp.path());
        INFO(o.describe() << "\n" << slurp(tmp.path() + "/stderr"));
        REQUIRE(o.exited);
        REQUIRE(o.code < 100);  // exit codes of the tool, not a crash reported by a shell
        REQUIRE(o.code != 2);   // a usage error: the probe read nothing
        ++probes;
        fs::remove_all(out, ec);
        fs::remove_all(out + "-export", ec);
      }
    }
  }
  REQUIRE(probes > 300);
}
