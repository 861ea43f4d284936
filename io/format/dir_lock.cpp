#include "io/format/dir_lock.hpp"

#include <embstore/embstore.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <ctime>
#include <mutex>
#include <utility>

#include "io/engine/engine.hpp"
#include "io/engine/regular_file.hpp"
#include "io/format/commit.hpp"
#include "io/format/layout.hpp"

namespace embstore::io {
namespace {

using detail::errno_text;

constexpr size_t kMaxRecordBytes = EMBSTORE_MAX_LOCK_RECORD_BYTES;
constexpr const char* kRecordTitle = "embstore writer lock";

std::mutex g_fault_mutex;
std::function<int()> g_fault;

int injected() {
  std::lock_guard<std::mutex> lock(g_fault_mutex);
  return g_fault ? g_fault() : 0;
}

int neg_errno() { return errno > 0 ? -errno : -EIO; }

bool locks_unsupported(int err) { return err == -ENOLCK || err == -EOPNOTSUPP || err == -ENOSYS; }

std::string read_first_line(const char* path) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  char buf[256];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return {};
  std::string s(buf, static_cast<size_t>(n));
  return s.substr(0, s.find('\n'));
}

std::string boot_id() { return read_first_line("/proc/sys/kernel/random/boot_id"); }

// Field 22 of /proc/<pid>/stat: the start time in clock ticks since boot; 0 when unknown.
uint64_t start_time(int64_t pid) {
  const std::string path = fmt::format("/proc/{}/stat", pid);
  const std::string line = read_first_line(path.c_str());
  const size_t paren = line.rfind(')');  // the command name may hold spaces and parentheses
  if (paren == std::string::npos) return 0;
  size_t pos = paren + 2;  // field 3, the state
  for (int field = 3; field < 22; ++field) {
    pos = line.find(' ', pos);
    if (pos == std::string::npos) return 0;
    ++pos;
  }
  return std::strtoull(line.c_str() + pos, nullptr, 10);
}

LockOwner this_process(const std::string& what) {
  LockOwner o;
  o.pid = ::getpid();
  o.host = host_name();
  o.boot_id = boot_id();
  o.start_time = start_time(o.pid);
  o.since = static_cast<int64_t>(std::time(nullptr));
  o.what = what;
  return o;
}

std::string format_record(const LockOwner& o) {
  return fmt::format("{}\npid {}\nhost {}\nboot_id {}\nstart_time {}\nsince {}\nwhat {}\n",
                     kRecordTitle, o.pid, o.host, o.boot_id, o.start_time, o.since, o.what);
}

// The record is written by any process that can write the directory: read as hostile text.
bool parse_record(const std::string& text, LockOwner* out) {
  LockOwner o;
  size_t pos = 0;
  bool titled = false, has_pid = false;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line == kRecordTitle) {
      titled = true;
      continue;
    }
    const size_t space = line.find(' ');
    if (space == std::string::npos) continue;
    const std::string key = line.substr(0, space), value = printable(line.substr(space + 1));
    if (key == "pid") {
      o.pid = std::strtoll(value.c_str(), nullptr, 10);
      has_pid = o.pid > 0;
    } else if (key == "host") {
      o.host = value;
    } else if (key == "boot_id") {
      o.boot_id = value;
    } else if (key == "start_time") {
      o.start_time = std::strtoull(value.c_str(), nullptr, 10);
    } else if (key == "since") {
      o.since = std::strtoll(value.c_str(), nullptr, 10);
    } else if (key == "what") {
      o.what = value;
    }
  }
  if (!titled || !has_pid) return false;
  *out = std::move(o);
  return true;
}

int read_record(int fd, std::string* text) {
  char buf[kMaxRecordBytes];
  const ssize_t n = ::pread(fd, buf, sizeof(buf), 0);
  if (n < 0) return neg_errno();
  text->assign(buf, static_cast<size_t>(n));
  return 0;
}

int write_record(int fd, const std::string& record) {
  if (::ftruncate(fd, 0) < 0) return neg_errno();
  const ssize_t n = ::pwrite(fd, record.data(), record.size(), 0);
  if (n < 0) return neg_errno();
  if (static_cast<size_t>(n) != record.size()) return -EIO;
  return ::fsync(fd) < 0 ? neg_errno() : 0;
}

// Whether the record's process is certainly gone: only on this host can it be checked.
bool owner_gone(const LockOwner& o) {
  if (o.host != host_name()) return false;
  const std::string boot = boot_id();
  if (!o.boot_id.empty() && !boot.empty() && o.boot_id != boot) return true;  // rebooted since
  if (o.pid <= 0) return false;
  if (::kill(static_cast<pid_t>(o.pid), 0) < 0 && errno == ESRCH) return true;
  const uint64_t now = start_time(o.pid);
  return now != 0 && o.start_time != 0 && now != o.start_time;  // the pid was reused
}

std::string busy_message(const std::string& dir, const std::string& record, bool held_file) {
  LockOwner o;
  std::string who =
      parse_record(record, &o) ? describe(o) : std::string("a writer that has not said who");
  std::string msg = fmt::format(
      "checkpoint directory '{}' is locked by another writer: {}; one writer per directory", dir,
      who);
  if (held_file) {
    msg += fmt::format(" (this file system has no locks: remove {}/{} once that writer is gone)",
                       dir, kHeldFileName);
  }
  return msg;
}

// The O_EXCL record, for file systems without locks. 0 with *fd; -EBUSY; -errno.
int acquire_held_file(const std::string& dir, const std::string& record, int* fd,
                      std::string* detail) {
  const std::string path = dir + "/" + kHeldFileName;
  for (int attempt = 0; attempt < 2; ++attempt) {
    *fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (*fd >= 0) {
      int r = write_record(*fd, record);
      if (r == 0) r = fsync_path(dir);
      if (r < 0) {
        ::close(*fd);
        ::unlink(path.c_str());
        *detail = fmt::format("{}: cannot write: {}", path, errno_text(r));
      }
      return r;
    }
    if (errno != EEXIST) {
      const int r = neg_errno();
      *detail = fmt::format("{}: cannot create: {}", path, errno_text(r));
      return r;
    }
    std::string existing;
    int rfd = -1;
    if (open_regular(path, 0, &rfd) == 0) {  // a planted FIFO must not block: no record then
      read_record(rfd, &existing);
      ::close(rfd);
    }
    LockOwner o;
    if (attempt > 0 || !parse_record(existing, &o) || !owner_gone(o)) {
      *detail = busy_message(dir, existing, true);
      return -EBUSY;
    }
    // Its owner is gone: move the record aside, and take the lock if it was that record (not
    // the live one of a writer that took it over meanwhile).
    uint64_t nonce = 0;
    if (::getrandom(&nonce, sizeof(nonce), 0) != sizeof(nonce)) nonce = ::getpid();
    const std::string aside = fmt::format("{}/.tmp-stale-lock-{:016x}", dir, nonce);
    if (::rename(path.c_str(), aside.c_str()) < 0) continue;  // gone meanwhile: try again
    std::string moved;
    int afd = -1;
    if (open_regular(aside, 0, &afd) == 0) {
      read_record(afd, &moved);
      ::close(afd);
    }
    if (moved != existing) {
      // A live record: put it back (unless yet another one is in place) and give way.
      ::link(aside.c_str(), path.c_str());
      ::unlink(aside.c_str());
      *detail = busy_message(dir, moved, true);
      return -EBUSY;
    }
    ::unlink(aside.c_str());
    std::fprintf(stderr, "embstore: took over the lock of '%s' from %s, which is gone\n",
                 dir.c_str(), describe(o).c_str());
  }
  *detail = fmt::format("{}: the lock changed hands while it was taken", path);
  return -EBUSY;
}

}  // namespace

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

std::string describe(const LockOwner& o) {
  char when[64] = "an unknown time";
  const std::time_t t = static_cast<std::time_t>(o.since);
  std::tm tm{};
  if (o.since > 0 && ::gmtime_r(&t, &tm) != nullptr) {
    std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", &tm);
  }
  return fmt::format("pid {} on host {}{}, since {}", o.pid, o.host.empty() ? "?" : o.host,
                     o.what.empty() ? std::string() : " (" + o.what + ")", when);
}

int DirLock::acquire(const std::string& dir, const std::string& what, std::unique_ptr<DirLock>* out,
                     std::string* detail) {
  const std::string path = dir + "/" + kLockFileName;
  const std::string record = format_record(this_process(what));
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd < 0) {
    const int r = neg_errno();
    *detail = fmt::format("{}: cannot open the directory's lock: {}", path, errno_text(r));
    return r;
  }
  if (struct stat st; ::fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    *detail = fmt::format("{}: the directory's lock is not a regular file: remove it", path);
    return kNotRegularFile;
  }
  int r = injected();
  if (r == 0) {
    struct flock fl {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    r = ::fcntl(fd, F_OFD_SETLK, &fl) < 0 ? neg_errno() : 0;
    if (r == -EINVAL) r = ::flock(fd, LOCK_EX | LOCK_NB) < 0 ? neg_errno() : 0;  // before 3.15
  }
  std::unique_ptr<DirLock> lock(new DirLock());
  lock->dir_ = dir;
  if (locks_unsupported(r)) {
    ::close(fd);
    static std::once_flag logged;
    std::call_once(logged, [&] {
      std::fprintf(stderr,
                   "embstore: the file system of '%s' refuses locks (%s): one writer per "
                   "directory rests on %s alone\n",
                   dir.c_str(), errno_text(r).c_str(), kHeldFileName);
    });
    int held = -1;
    if (int e = acquire_held_file(dir, record, &held, detail); e < 0) return e;
    lock->fd_ = held;
    lock->held_file_ = true;
    *out = std::move(lock);
    return 0;
  }
  if (r == -EAGAIN || r == -EACCES || r == -EWOULDBLOCK) {
    std::string existing;
    read_record(fd, &existing);
    ::close(fd);
    *detail = busy_message(dir, existing, false);
    return -EBUSY;
  }
  if (r == 0) r = write_record(fd, record);
  if (r < 0) {
    ::close(fd);
    *detail = fmt::format("{}: cannot lock the directory: {}", path, errno_text(r));
    return r;
  }
  lock->fd_ = fd;
  *out = std::move(lock);
  return 0;
}

DirLock::~DirLock() {
  if (fd_ < 0) return;
  if (held_file_) ::unlink((dir_ + "/" + kHeldFileName).c_str());
  // Emptied while still held: a writer that gets the lock next never reads a stale record.
  if (::ftruncate(fd_, 0) < 0) {
    // Nothing to do: the record only explains a refusal.
  }
  ::close(fd_);
}

int lock_holder(const std::string& dir, LockOwner* owner) {
  std::string record;
  const std::string held = dir + "/" + kHeldFileName;
  int fd = -1;
  int r = open_regular(held, 0, &fd);
  if (r == 0) {  // a file system without locks: the file is the lock
    r = read_record(fd, &record);
    ::close(fd);
    if (r < 0) return r;
    *owner = LockOwner{};
    parse_record(record, owner);
    return 1;
  }
  // A .held that is not a regular file (a FIFO, a link) is held as acquire_held_file sees it
  // (it cannot create one), by a writer that has not said who.
  if (r == kNotRegularFile || r == -ELOOP) {
    *owner = LockOwner{};
    return 1;
  }
  const std::string path = dir + "/" + kLockFileName;  // no .held (or unreadable): the lock
  r = open_regular(path, 0, &fd);
  if (r < 0) return r == -ENOENT ? 0 : r;
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  r = ::fcntl(fd, F_OFD_GETLK, &fl) < 0 ? neg_errno() : 0;
  if (r == 0 && fl.l_type == F_UNLCK) {
    ::close(fd);
    return 0;
  }
  if (r == -EINVAL) {  // no OFD locks: whether flock would block says it
    r = ::flock(fd, LOCK_SH | LOCK_NB) < 0 ? neg_errno() : 0;
    if (r == 0) {
      ::flock(fd, LOCK_UN);
      ::close(fd);
      return 0;
    }
    if (r == -EWOULDBLOCK) r = 0;
  }
  if (r < 0) {
    ::close(fd);
    return r;
  }
  r = read_record(fd, &record);
  ::close(fd);
  if (r < 0) return r;
  *owner = LockOwner{};
  parse_record(record, owner);
  return 1;
}

void set_lock_fault_injection(std::function<int()> hook) {
  std::lock_guard<std::mutex> lock(g_fault_mutex);
  g_fault = std::move(hook);
}

}  // namespace embstore::io
