#include "io/format/commit.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)  // linux/fs.h; older libc headers lack it
#endif

namespace embstore::io {
namespace {

constexpr char kStagingPrefix[] = ".tmp-";
constexpr size_t kStagingPrefixLen = sizeof(kStagingPrefix) - 1;
constexpr int kStagingTries = 64;

std::mutex g_commit_fault_mutex;
std::function<int(const char*)> g_commit_fault;

int injected(const char* step) {
  std::lock_guard<std::mutex> lock(g_commit_fault_mutex);
  return g_commit_fault ? g_commit_fault(step) : 0;
}

int neg_errno() { return errno > 0 ? -errno : -EIO; }

// Closes fd on every path out of a scope.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes now and reports close()'s error, which can carry a deferred write error.
  int close() {
    int r = ::close(fd_) < 0 ? neg_errno() : 0;
    fd_ = -1;
    return r;
  }

 private:
  int fd_;
};

// The parent directory of path as given ("." for a bare name, "/" for "/x").
std::string parent_of(const std::string& path) {
  size_t end = path.size();
  while (end > 1 && path[end - 1] == '/') --end;  // "a/b/" names a/b
  size_t slash = path.rfind('/', end - 1);
  if (slash == std::string::npos) return ".";
  while (slash > 0 && path[slash - 1] == '/') --slash;
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Names in the directory open at dir_fd, without "." and "..". Takes a duplicate so dir_fd
// stays open for the caller. Listing first lets callers remove entries without disturbing
// readdir.
int list_dir(int dir_fd, std::vector<std::string>* names) {
  int dup_fd = ::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) return neg_errno();
  DIR* dir = ::fdopendir(dup_fd);
  if (dir == nullptr) {
    int r = neg_errno();
    ::close(dup_fd);
    return r;
  }
  ::rewinddir(dir);  // the duplicate shares the offset of an fd that may have been read
  int r = 0;
  for (;;) {
    errno = 0;
    dirent* e = ::readdir(dir);
    if (e == nullptr) {
      if (errno != 0) r = neg_errno();
      break;
    }
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    names->emplace_back(e->d_name);
  }
  ::closedir(dir);
  return r;
}

int list_path(const std::string& path, std::vector<std::string>* names) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return neg_errno();
  return list_dir(fd.get(), names);
}

int fsync_fd(int fd) { return ::fsync(fd) < 0 ? neg_errno() : 0; }

// Depth first: every file and subdirectory is durable before the directory that names it.
// top tells the staging dir (its own fault step) from the directories below it.
int fsync_tree(int dir_fd, bool top) {
  std::vector<std::string> names;
  if (int r = list_dir(dir_fd, &names); r < 0) return r;
  for (const std::string& name : names) {
    struct stat st;
    if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) return neg_errno();
    if (S_ISREG(st.st_mode)) {
      Fd fd(::openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
      if (fd.get() < 0) return neg_errno();
      if (int r = injected("fsync_file"); r < 0) return r;
      if (int r = fsync_fd(fd.get()); r < 0) return r;
      if (int r = fd.close(); r < 0) return r;
    } else if (S_ISDIR(st.st_mode)) {
      Fd fd(::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (fd.get() < 0) return neg_errno();
      if (int r = fsync_tree(fd.get(), false); r < 0) return r;
    }
    // Symlinks and special files have no data of their own; the directory fsync below makes
    // their entries durable.
  }
  if (int r = injected(top ? "fsync_staging" : "fsync_dir"); r < 0) return r;
  return fsync_fd(dir_fd);
}

// Renames without ever replacing final_path. renameat2(RENAME_NOREPLACE) is atomic; where the
// kernel or file system lacks it, a stat check narrows the window but cannot close it, which
// is acceptable because one writer holds a checkpoint directory (io/format/dir_lock.hpp).
int rename_noreplace(const std::string& from, const std::string& to) {
  int r = injected("renameat2");
#ifdef SYS_renameat2
  if (r == 0) {
    r = ::syscall(SYS_renameat2, AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) < 0
            ? neg_errno()
            : 0;
  }
#else
  if (r == 0) r = -ENOSYS;
#endif
  if (r != -ENOSYS && r != -EINVAL) return r;
  struct stat st;
  if (::lstat(to.c_str(), &st) == 0) return -EEXIST;
  if (errno != ENOENT) return neg_errno();
  // Plain rename() of a directory replaces an empty directory at to; the check above is what
  // keeps that from happening.
  return ::rename(from.c_str(), to.c_str()) < 0 ? neg_errno() : 0;
}

int remove_at(int dir_fd, const char* name);

// Empties the directory open at dir_fd; the first error wins, the rest is still attempted.
int remove_contents(int dir_fd) {
  std::vector<std::string> names;
  int first = list_dir(dir_fd, &names);
  for (const std::string& name : names) {
    int r = remove_at(dir_fd, name.c_str());
    if (first == 0) first = r;
  }
  return first;
}

int remove_at(int dir_fd, const char* name) {
  if (::unlinkat(dir_fd, name, 0) == 0) return 0;
  if (errno == ENOENT) return 0;
  if (errno != EISDIR && errno != EPERM) return neg_errno();  // EPERM: Linux's answer for dirs
  Fd fd(::openat(dir_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) return errno == ENOENT ? 0 : neg_errno();
  int first = remove_contents(fd.get());
  fd.close();
  if (::unlinkat(dir_fd, name, AT_REMOVEDIR) < 0 && errno != ENOENT && first == 0) {
    first = neg_errno();
  }
  return first;
}

}  // namespace

int create_directories(const std::string& path, bool durable) {
  if (path.empty()) return -ENOENT;
  // Each prefix ending before a '/' (and the whole path) is one level, shallowest first.
  size_t pos = 0;
  while (pos < path.size()) {
    size_t slash = path.find('/', pos);
    size_t end = slash == std::string::npos ? path.size() : slash;
    std::string component = path.substr(pos, end - pos);
    pos = end + 1;
    if (component.empty() || component == ".") continue;  // "//", "/./", the root
    std::string level = path.substr(0, end);
    if (::mkdir(level.c_str(), 0755) == 0) {
      if (!durable) continue;
      if (int r = fsync_path(parent_of(level)); r < 0) return r;
      continue;
    }
    if (errno != EEXIST) return neg_errno();
    struct stat st;
    if (::stat(level.c_str(), &st) < 0) return neg_errno();  // e.g. a dangling symlink
    if (!S_ISDIR(st.st_mode)) return -ENOTDIR;
  }
  return 0;
}

std::string version_dir_name(uint64_t version, bool full) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%020" PRIu64 "%s", version, full ? ".full" : ".delta");
  return buf;
}

bool parse_version_dir_name(const std::string& name, uint64_t* version, bool* full) {
  constexpr size_t kDigits = 20;
  if (name.size() < kDigits) return false;
  std::string suffix = name.substr(kDigits);
  bool is_full;
  if (suffix == ".full") {
    is_full = true;
  } else if (suffix == ".delta") {
    is_full = false;
  } else {
    return false;
  }
  uint64_t v = 0;
  for (size_t i = 0; i < kDigits; ++i) {
    char c = name[i];
    if (c < '0' || c > '9') return false;
    uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return false;  // 20 digits can exceed 2^64 - 1
    v = v * 10 + d;
  }
  if (version != nullptr) *version = v;
  if (full != nullptr) *full = is_full;
  return true;
}

namespace {

// 64 random bits for a hidden name.
int random_nonce(uint64_t* nonce) {
  ssize_t got = ::getrandom(nonce, sizeof(*nonce), 0);
  if (got == static_cast<ssize_t>(sizeof(*nonce))) return 0;
  // Old kernels (ENOSYS) or seccomp filters: /dev/urandom gives the same bytes.
  Fd fd(::open("/dev/urandom", O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return neg_errno();
  ssize_t n = ::read(fd.get(), nonce, sizeof(*nonce));
  if (n < 0) return neg_errno();
  return n == static_cast<ssize_t>(sizeof(*nonce)) ? 0 : -EIO;
}

}  // namespace

int make_staging_dir(const std::string& parent, uint64_t version, std::string* path_out) {
  for (int attempt = 0; attempt < kStagingTries; ++attempt) {
    uint64_t nonce = 0;
    if (int r = random_nonce(&nonce); r < 0) return r;
    char name[64];
    std::snprintf(name, sizeof(name), "%s%" PRIu64 "-%016" PRIx64, kStagingPrefix, version, nonce);
    std::string path = parent + "/" + name;
    if (::mkdir(path.c_str(), 0755) == 0) {
      if (path_out != nullptr) *path_out = std::move(path);
      return 0;
    }
    if (errno != EEXIST) return neg_errno();
  }
  return -EEXIST;
}

int fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 && errno == ENOTDIR) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return neg_errno();
  Fd guard(fd);
  if (int r = fsync_fd(fd); r < 0) return r;
  return guard.close();
}

int commit_staging_dir(const std::string& staging, const std::string& final_path, bool* renamed) {
  if (renamed != nullptr) *renamed = false;
  {
    Fd fd(::open(staging.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (fd.get() < 0) return neg_errno();
    if (int r = fsync_tree(fd.get(), true); r < 0) return r;
  }
  if (int r = injected("rename"); r < 0) return r;
  if (int r = rename_noreplace(staging, final_path); r < 0) return r;
  if (renamed != nullptr) *renamed = true;
  // The rename is only durable once the directory holding the new name is.
  if (int r = injected("fsync_parent"); r < 0) return r;
  return fsync_path(parent_of(final_path));
}

int remove_tree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) < 0) return errno == ENOENT ? 0 : neg_errno();
  if (!S_ISDIR(st.st_mode)) {
    return ::unlink(path.c_str()) < 0 && errno != ENOENT ? neg_errno() : 0;
  }
  int first = 0;
  {
    Fd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (fd.get() < 0) return errno == ENOENT ? 0 : neg_errno();
    first = remove_contents(fd.get());
  }
  if (::rmdir(path.c_str()) < 0 && errno != ENOENT && first == 0) first = neg_errno();
  return first;
}

namespace {

int copy_file(const std::string& from, const std::string& to) {
  Fd in(::open(from.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (in.get() < 0) return neg_errno();
  Fd out(::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (out.get() < 0) return neg_errno();
  std::vector<char> buffer(size_t{1} << 20);
  for (;;) {
    const ssize_t got = ::read(in.get(), buffer.data(), buffer.size());
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return neg_errno();
    if (got == 0) break;
    for (ssize_t done = 0; done < got;) {
      const ssize_t put = ::write(out.get(), buffer.data() + done, static_cast<size_t>(got - done));
      if (put < 0 && errno == EINTR) continue;
      if (put < 0) return neg_errno();
      done += put;
    }
  }
  return out.close();
}

}  // namespace

int link_or_copy(const std::string& from, const std::string& to, uint64_t bytes) {
  int r = ::link(from.c_str(), to.c_str()) == 0 ? 0 : neg_errno();
  if (r == -EXDEV || r == -EPERM || r == -EOPNOTSUPP || r == -EMLINK) r = copy_file(from, to);
  if (r < 0) return r;
  struct stat st;
  if (::lstat(to.c_str(), &st) != 0) return neg_errno();
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != bytes) {
    ::unlink(to.c_str());
    return -EBADMSG;
  }
  return 0;
}

int retire_version(const std::string& parent, const std::string& name) {
  uint64_t nonce = 0;
  if (int r = random_nonce(&nonce); r < 0) return r;
  // A nonce: what a removal that failed half-way left never blocks the next one of that name.
  char suffix[24];
  std::snprintf(suffix, sizeof suffix, "-%016" PRIx64, nonce);
  const std::string path = parent + "/" + name;
  const std::string hidden = parent + "/.tmp-retired-" + name + suffix;
  if (std::rename(path.c_str(), hidden.c_str()) != 0) return -errno;
  return remove_tree(hidden);
}

int remove_leftovers(const std::string& parent, std::vector<std::string>* removed) {
  std::vector<std::string> names;
  if (int r = list_path(parent, &names); r < 0) return r;
  std::sort(names.begin(), names.end());
  int first = 0;
  for (const std::string& name : names) {
    if (name.compare(0, kStagingPrefixLen, kStagingPrefix) != 0) continue;
    int r = remove_tree(parent + "/" + name);
    if (r == 0) {
      if (removed != nullptr) removed->push_back(name);
    } else if (first == 0) {
      first = r;
    }
  }
  return first;
}

int list_versions(const std::string& parent, std::vector<VersionDir>* out) {
  Fd fd(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return neg_errno();
  std::vector<std::string> names;
  if (int r = list_dir(fd.get(), &names); r < 0) return r;
  std::vector<VersionDir> found;
  for (std::string& name : names) {
    VersionDir v;
    if (!parse_version_dir_name(name, &v.version, &v.full)) continue;
    struct stat st;
    // A file that merely carries a version name is not a checkpoint.
    if (::fstatat(fd.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) < 0) {
      if (errno == ENOENT) continue;  // removed by retention meanwhile
      return neg_errno();
    }
    if (!S_ISDIR(st.st_mode)) continue;
    v.name = std::move(name);
    found.push_back(std::move(v));
  }
  std::sort(found.begin(), found.end(), [](const VersionDir& a, const VersionDir& b) {
    if (a.version != b.version) return a.version < b.version;
    return a.full && !b.full;
  });
  *out = std::move(found);
  return 0;
}

void set_commit_fault_injection(std::function<int(const char* step)> hook) {
  std::lock_guard<std::mutex> lock(g_commit_fault_mutex);
  g_commit_fault = std::move(hook);
}

}  // namespace embstore::io
