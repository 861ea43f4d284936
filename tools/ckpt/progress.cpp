#include "tools/ckpt/progress.hpp"

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace embstore::ckpt {

bool parse_progress_when(const std::string& text, ProgressWhen* when) {
  if (text == "auto") {
    *when = ProgressWhen::kAuto;
  } else if (text == "always") {
    *when = ProgressWhen::kAlways;
  } else if (text == "never") {
    *when = ProgressWhen::kNever;
  } else {
    return false;
  }
  return true;
}

Progress::Progress(ProgressWhen when, const char* verb, Unit unit, uint64_t total)
    : verb_(verb), unit_(unit), total_(total), to_terminal_(::isatty(STDERR_FILENO) == 1) {
  enabled_ = when == ProgressWhen::kAlways || (when == ProgressWhen::kAuto && to_terminal_);
  start_ = last_ = std::chrono::steady_clock::now();
}

void Progress::update(uint64_t done) {
  if (!enabled_) return;
  done = std::min(done, total_);
  if (drawn_ && done == done_) return;
  done_ = done;
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && now - last_ < std::chrono::milliseconds(100) && done_ < total_) return;
  last_ = now;
  draw(now);
}

void Progress::finish() {
  if (!enabled_) return;
  if (!drawn_ || done_ != total_) {  // not twice at 100%
    done_ = total_;
    draw(std::chrono::steady_clock::now());
  }
  clear();
}

void Progress::clear() {
  if (!enabled_ || !drawn_) return;
  // On a terminal the line is blanked; in a file or a pipe it is ended, so that a log keeps it.
  if (to_terminal_) {
    std::fprintf(stderr, "\r%*s\r", static_cast<int>(width_), "");
  } else {
    std::fputc('\n', stderr);
  }
  std::fflush(stderr);
  drawn_ = false;
}

void Progress::draw(std::chrono::steady_clock::time_point now) {
  const double seconds = std::chrono::duration<double>(now - start_).count();
  const double percent =
      total_ == 0 ? 100.0 : 100.0 * static_cast<double>(done_) / static_cast<double>(total_);
  std::string line;
  if (unit_ == Unit::kBytes) {
    const double mib = static_cast<double>(done_) / (1024.0 * 1024.0);
    line = fmt::format("{}: {:5.1f}%  {:.1f} / {:.1f} MiB  {:.1f} MiB/s", verb_, percent, mib,
                       static_cast<double>(total_) / (1024.0 * 1024.0),
                       seconds > 0 ? mib / seconds : 0.0);
  } else {
    line = fmt::format("{}: {:5.1f}%  {} / {} rows  {:.0f} rows/s", verb_, percent, done_, total_,
                       seconds > 0 ? static_cast<double>(done_) / seconds : 0.0);
  }
  const size_t pad = width_ > line.size() ? width_ - line.size() : 0;
  std::fprintf(stderr, "\r%s%*s", line.c_str(), static_cast<int>(pad), "");
  std::fflush(stderr);
  width_ = std::max(width_, line.size());
  drawn_ = true;
}

}  // namespace embstore::ckpt
