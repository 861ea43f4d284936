// Waiting for a checkpoint directory to change: a follower's background thread wakes when a
// version is committed into the directory (a rename into it: inotify IN_MOVED_TO, names that
// parse as version directories only), when its interval passes, or when it is stopped. Where
// inotify is missing or refuses (an old kernel, a full inotify limit, file systems that do not
// report other hosts' changes, such as NFS), only the interval wakes it.
#pragma once

#include <chrono>
#include <string>

namespace embstore::serving {

class DirWatch {
 public:
  // Throws Error (IO_ERROR) when the wake-up descriptor cannot be made. Without watch_commits,
  // only the interval and stop() wake it.
  DirWatch(const std::string& dir, bool watch_commits);
  ~DirWatch();
  DirWatch(const DirWatch&) = delete;
  DirWatch& operator=(const DirWatch&) = delete;

  // Returns true when a version was committed or timeout passed (the caller polls either way);
  // false once stop() was called.
  bool wait(std::chrono::milliseconds timeout);
  // Any thread: wakes wait(), which returns false from now on.
  void stop();
  // Whether inotify watches the directory.
  bool watching() const { return inotify_fd_ >= 0; }

 private:
  bool drain_events();  // whether any event named a version directory
  int inotify_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd: stop() writes it
};

}  // namespace embstore::serving
