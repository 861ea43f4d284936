// The writer lock of a checkpoint directory: one writer per directory, across threads, stores
// and processes. Two writers in one directory would remove each other's staging directories
// and retire each other's versions; the lock makes the second one fail before it writes.
//
// <dir>/embstore.lock carries an open file description lock (fcntl F_OFD_SETLK, a write lock
// over the whole file). It belongs to the open file, so two stores of one process exclude each
// other as two processes do, and the kernel releases it when the holder closes the file or
// dies: a crashed writer never wedges its directory. Kernels without OFD locks (before 3.15)
// get flock(). The holder writes who it is into the file (pid, host, boot id, process start
// time, since when, what), for the message of a writer that is refused. The file is never
// removed (removing a lock file races with a writer that has just opened it); a holder empties
// it when it lets go.
//
// Where the file system refuses locks (ENOLCK, EOPNOTSUPP, ENOSYS: NFS without a lock manager,
// some FUSE file systems), the lock is <dir>/embstore.lock.held, created with O_EXCL and holding
// the same record. A record of a process that is gone is taken over: on this host (same host
// name and boot id), a pid that no longer runs, or runs with another start time (the pid was
// reused), or a different boot id (the host rebooted). A record of another host cannot be
// checked from here: it refuses, and the message says to remove the file once that writer is
// known to be gone.
//
// NFS: with NFSv4, and NFSv3 with lockd, these locks go to the server and exclude writers on
// every host. The server releases the locks of a client that died when its lease runs out (90
// s by default on Linux servers), so a writer restarted on another host is refused until then.
// A mount with -o nolock keeps locks local to each client: writers on two hosts are then not
// excluded, so never share such a directory between hosts.
//
// liburing style: 0 or -errno; nothing throws.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace embstore::io {

inline constexpr const char* kLockFileName = "embstore.lock";
inline constexpr const char* kHeldFileName = "embstore.lock.held";

// Who holds a directory's lock, as its record says.
struct LockOwner {
  int64_t pid = 0;
  std::string host;
  std::string boot_id;
  uint64_t start_time = 0;  // the process's start, in clock ticks since boot (/proc/<pid>/stat)
  int64_t since = 0;        // when it took the lock, seconds since the epoch
  std::string what;         // "store", "embstore-ckpt compact"
};

// This host's name (gethostname), "unknown" when it has none.
std::string host_name();

// "pid 1234 on host trainer-7 (store), since 2026-11-23 23:17:25 UTC".
std::string describe(const LockOwner& owner);

class DirLock {
 public:
  // Takes dir's writer lock (dir must exist); what says who takes it. 0 and *out; -EBUSY when
  // another writer holds it (*detail names it); -errno when the lock file cannot be opened,
  // locked or written (*detail says which).
  static int acquire(const std::string& dir, const std::string& what, std::unique_ptr<DirLock>* out,
                     std::string* detail);
  // Lets go: empties the record, then closes (and unlocks) the file.
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

  const std::string& dir() const { return dir_; }
  // Whether the file system's locks are used (false: the O_EXCL record alone).
  bool kernel_lock() const { return !held_file_; }

 private:
  DirLock() = default;
  std::string dir_;
  int fd_ = -1;
  bool held_file_ = false;  // the lock is kHeldFileName, removed at release
};

// Whether dir's lock is held now, and by whom (for embstore-ckpt ls): 1 with *owner (the
// record may be empty when the holder has not written it yet), 0 when free, -errno.
int lock_holder(const std::string& dir, LockOwner* owner);

// Test-only: when set, hook() stands in for the result of the kernel lock calls (0: go on);
// -ENOLCK makes acquire take the O_EXCL record, as on a file system without locks. Global to
// the process; an empty function turns it off.
void set_lock_fault_injection(std::function<int()> hook);

}  // namespace embstore::io
