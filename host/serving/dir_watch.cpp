#include "host/serving/dir_watch.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <thread>

#include "host/error.hpp"
#include "io/engine/engine.hpp"
#include "io/format/commit.hpp"

namespace embstore::serving {

DirWatch::DirWatch(const std::string& dir, bool watch_commits) {
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) fail(EMBSTORE_IO_ERROR, "eventfd: {}", io::detail::errno_text(-errno));
  if (!watch_commits) return;
  inotify_fd_ = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (inotify_fd_ >= 0 &&
      ::inotify_add_watch(inotify_fd_, dir.c_str(), IN_MOVED_TO | IN_ONLYDIR) < 0) {
    ::close(inotify_fd_);
    inotify_fd_ = -1;
  }
}

DirWatch::~DirWatch() {
  if (inotify_fd_ >= 0) ::close(inotify_fd_);
  ::close(wake_fd_);
}

void DirWatch::stop() {
  const uint64_t one = 1;
  // The counter only grows: a failed write (it is full) still leaves it readable.
  [[maybe_unused]] const ssize_t n = ::write(wake_fd_, &one, sizeof(one));
}

bool DirWatch::drain_events() {
  alignas(inotify_event) char buf[4096];
  bool committed = false;
  for (;;) {
    const ssize_t n = ::read(inotify_fd_, buf, sizeof(buf));
    if (n <= 0) return committed;  // EAGAIN: drained
    for (ssize_t at = 0; at + static_cast<ssize_t>(sizeof(inotify_event)) <= n;) {
      const auto* e = reinterpret_cast<const inotify_event*>(buf + at);
      uint64_t version = 0;
      bool full = false;
      if (e->mask & IN_Q_OVERFLOW) committed = true;  // events were lost: look
      if (e->len > 0 && io::parse_version_dir_name(e->name, &version, &full)) committed = true;
      at += static_cast<ssize_t>(sizeof(inotify_event) + e->len);
    }
  }
}

bool DirWatch::wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {inotify_fd_, POLLIN, 0}};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    const int r =
        ::poll(fds, inotify_fd_ >= 0 ? 2 : 1, static_cast<int>(std::max<int64_t>(0, left.count())));
    if (r < 0 && errno != EINTR) {  // cannot wait on the descriptors: wait the interval out
      std::this_thread::sleep_until(deadline);
      return true;
    }
    if (fds[0].revents != 0) return false;
    if (r > 0 && (fds[1].revents & POLLIN) != 0 && drain_events()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return true;
  }
}

}  // namespace embstore::serving
