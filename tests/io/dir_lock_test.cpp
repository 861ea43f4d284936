// The checkpoint directory's writer lock (io/format/dir_lock.hpp): one holder across stores and
// processes, a refusal that names the holder, release at exit and at a crash, and the O_EXCL
// record that stands in where the file system has no locks.
#include "io/format/dir_lock.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "tests/io/io_fixtures.hpp"

using namespace embstore::io;
using embstore_test::TempDir;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

// Makes the kernel lock calls fail as on a file system without locks, until destroyed.
struct NoKernelLocks {
  NoKernelLocks() {
    set_lock_fault_injection([] { return -ENOLCK; });
  }
  ~NoKernelLocks() { set_lock_fault_injection(nullptr); }
};

// A child process that takes dir's lock, says so on a pipe, and waits to be killed.
pid_t holder_process(const std::string& dir) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    embstore_test::die_with_parent(parent);
    ::close(fds[0]);
    std::unique_ptr<DirLock> lock;
    std::string detail;
    const char ok = DirLock::acquire(dir, "child", &lock, &detail) == 0 ? 'y' : 'n';
    if (::write(fds[1], &ok, 1) != 1) ::_exit(2);
    for (;;) ::pause();
  }
  ::close(fds[1]);
  char ok = 0;
  REQUIRE(::read(fds[0], &ok, 1) == 1);
  ::close(fds[0]);
  REQUIRE(ok == 'y');
  return pid;
}

void kill_and_reap(pid_t pid) {
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
}

}  // namespace

TEST_CASE("dir lock: one holder in a process, named to the next", "[io][lock]") {
  TempDir dir;
  std::unique_ptr<DirLock> first, second;
  std::string detail;
  REQUIRE(DirLock::acquire(dir.path(), "trainer A", &first, &detail) == 0);
  REQUIRE(first->kernel_lock());
  REQUIRE(read_file(dir.file(kLockFileName)).find("pid " + std::to_string(::getpid())) !=
          std::string::npos);
  REQUIRE(DirLock::acquire(dir.path(), "trainer B", &second, &detail) == -EBUSY);
  INFO(detail);
  REQUIRE(detail.find("locked by another writer") != std::string::npos);
  REQUIRE(detail.find("pid " + std::to_string(::getpid())) != std::string::npos);
  REQUIRE(detail.find("(trainer A)") != std::string::npos);
  REQUIRE(detail.find(" UTC") != std::string::npos);
  LockOwner owner;
  REQUIRE(lock_holder(dir.path(), &owner) == 1);
  REQUIRE(owner.pid == ::getpid());
  REQUIRE(owner.what == "trainer A");

  first.reset();  // released: the record is emptied, the file stays
  REQUIRE(read_file(dir.file(kLockFileName)).empty());
  REQUIRE(lock_holder(dir.path(), &owner) == 0);
  REQUIRE(DirLock::acquire(dir.path(), "trainer B", &second, &detail) == 0);
}

TEST_CASE("dir lock: another process's lock refuses, and its death releases it", "[io][lock]") {
  TempDir dir;
  const pid_t child = holder_process(dir.path());
  std::unique_ptr<DirLock> lock;
  std::string detail;
  REQUIRE(DirLock::acquire(dir.path(), "parent", &lock, &detail) == -EBUSY);
  REQUIRE(detail.find("pid " + std::to_string(child)) != std::string::npos);
  REQUIRE(detail.find("(child)") != std::string::npos);
  kill_and_reap(child);  // a crash: nobody lets go, the kernel does
  REQUIRE(DirLock::acquire(dir.path(), "parent", &lock, &detail) == 0);
}

TEST_CASE("dir lock: a record that is not one is still a refusal, without a name", "[io][lock]") {
  TempDir dir;
  const pid_t child = holder_process(dir.path());
  write_file(dir.file(kLockFileName), "\x1b[2Jgarbage\npid -3\n");  // anyone may write it
  std::unique_ptr<DirLock> lock;
  std::string detail;
  REQUIRE(DirLock::acquire(dir.path(), "parent", &lock, &detail) == -EBUSY);
  REQUIRE(detail.find("has not said who") != std::string::npos);
  REQUIRE(detail.find('\x1b') == std::string::npos);
  kill_and_reap(child);
}

TEST_CASE("dir lock: a missing or unwritable directory is an error, not a lock", "[io][lock]") {
  TempDir dir;
  std::unique_ptr<DirLock> lock;
  std::string detail;
  REQUIRE(DirLock::acquire(dir.file("missing"), "x", &lock, &detail) == -ENOENT);
  REQUIRE(detail.find("embstore.lock") != std::string::npos);
  // A directory named like the lock file cannot be locked.
  std::filesystem::create_directory(dir.file("d"));
  std::filesystem::create_directory(dir.file("d/embstore.lock"));
  REQUIRE(DirLock::acquire(dir.file("d"), "x", &lock, &detail) < 0);
}

TEST_CASE("dir lock: without kernel locks, an O_EXCL record excludes and dead holders go",
          "[io][lock]") {
  TempDir dir;
  NoKernelLocks no_locks;
  std::unique_ptr<DirLock> first, second;
  std::string detail;
  REQUIRE(DirLock::acquire(dir.path(), "trainer A", &first, &detail) == 0);
  REQUIRE_FALSE(first->kernel_lock());
  REQUIRE(std::filesystem::exists(dir.file(kHeldFileName)));
  REQUIRE(DirLock::acquire(dir.path(), "trainer B", &second, &detail) == -EBUSY);
  REQUIRE(detail.find("(trainer A)") != std::string::npos);
  LockOwner owner;
  REQUIRE(lock_holder(dir.path(), &owner) == 1);
  REQUIRE(owner.what == "trainer A");
  first.reset();
  REQUIRE_FALSE(std::filesystem::exists(dir.file(kHeldFileName)));
  REQUIRE(lock_holder(dir.path(), &owner) == 0);

  SECTION("a record of a process of this host that is gone is taken over") {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) ::_exit(0);
    int status = 0;
    ::waitpid(child, &status, 0);
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    write_file(dir.file(kHeldFileName), "embstore writer lock\npid " + std::to_string(child) +
                                            "\nhost " + host + "\nsince 1\nwhat crashed\n");
    REQUIRE(DirLock::acquire(dir.path(), "trainer B", &second, &detail) == 0);
    REQUIRE(read_file(dir.file(kHeldFileName)).find("what trainer B") != std::string::npos);
  }
  SECTION("a record of another host is refused, with what to do") {
    write_file(dir.file(kHeldFileName),
               "embstore writer lock\npid 1\nhost elsewhere.example\nsince 1\nwhat remote\n");
    REQUIRE(DirLock::acquire(dir.path(), "trainer B", &second, &detail) == -EBUSY);
    REQUIRE(detail.find("host elsewhere.example") != std::string::npos);
    REQUIRE(detail.find("remove " + dir.file(kHeldFileName)) != std::string::npos);
  }
  SECTION("a record of a live process of this host is refused") {
    std::filesystem::create_directory(dir.file("other"));
    const pid_t child = holder_process(dir.file("other"));  // any live pid will do
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    write_file(dir.file(kHeldFileName),
               "embstore writer lock\npid " + std::to_string(child) + "\nhost " + host + "\n");
    REQUIRE(DirLock::acquire(dir.path(), "trainer B", &second, &detail) == -EBUSY);
    kill_and_reap(child);
  }
}
