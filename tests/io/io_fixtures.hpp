// Fixtures shared by the io/ tests.
#pragma once

#include <linux/magic.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <system_error>
#include <utility>

#include "io/engine/fault.hpp"

namespace embstore_test {

// In a forked child, first thing: the child dies with the test process. A child left waiting
// to be killed by a test that failed first would hold ctest's output pipe open forever.
inline void die_with_parent(pid_t parent) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(1);  // the parent died before prctl
}

// A fresh directory under /tmp, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/embstore-io-test-XXXXXX";
    const char* p = mkdtemp(tmpl);
    REQUIRE(p != nullptr);
    path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Whether path is on a file system that keeps its files in memory (tmpfs, ramfs).
inline bool in_memory(const std::string& path) {
  struct statfs fs {};
  return ::statfs(path.c_str(), &fs) == 0 && (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC);
}

// A fresh directory on a disk file system (the tier's page file refuses tmpfs, and /tmp is tmpfs
// on some machines): under /tmp, else /var/tmp, else the working directory (ctest's build dir).
class TierDir {
 public:
  TierDir() {
    for (const std::string base : {"/tmp", "/var/tmp", "."}) {
      if (in_memory(base)) continue;
      std::string tmpl = base + "/embstore-tier-test-XXXXXX";
      if (::mkdtemp(tmpl.data()) != nullptr) {
        path_ = tmpl;
        break;
      }
    }
    REQUIRE_FALSE(path_.empty());
  }
  ~TierDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TierDir(const TierDir&) = delete;
  TierDir& operator=(const TierDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Installs a write fault hook and resets it even when a REQUIRE fails.
struct FaultGuard {
  explicit FaultGuard(std::function<int(uint64_t, size_t)> hook) {
    embstore::io::set_fault_injection(std::move(hook));
  }
  ~FaultGuard() { embstore::io::set_fault_injection(nullptr); }
  FaultGuard(const FaultGuard&) = delete;
  FaultGuard& operator=(const FaultGuard&) = delete;
};

// Installs a read fault hook (asked before each read of a tier page file) and resets it even
// when a REQUIRE fails.
struct ReadFaultGuard {
  explicit ReadFaultGuard(std::function<int(uint64_t, size_t)> hook) {
    embstore::io::set_read_fault_injection(std::move(hook));
  }
  ~ReadFaultGuard() { embstore::io::set_read_fault_injection(nullptr); }
  ReadFaultGuard(const ReadFaultGuard&) = delete;
  ReadFaultGuard& operator=(const ReadFaultGuard&) = delete;
};

// Holds the writer at its first write until release() (or 30 s), so that training meets rows
// of the checkpoint that are not written yet.
class HeldWriter {
 public:
  HeldWriter()
      : guard_([this](uint64_t, size_t) {
          if (writes_.fetch_add(1) == 0) {
            std::unique_lock lock(m_);
            cv_.wait_for(lock, std::chrono::seconds(30), [&] { return released_; });
          }
          return 0;
        }) {}
  ~HeldWriter() { release(); }
  void release() {
    {
      std::lock_guard lock(m_);
      released_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool released_ = false;
  std::atomic<int> writes_{0};
  FaultGuard guard_;
};

}  // namespace embstore_test
