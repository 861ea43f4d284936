// The progress line of embstore-ckpt's long commands (verify, compact, reshard, export): one
// line on stderr, redrawn in place with \r at most ten times a second and cleared before the
// command prints its result or an error. Shown on a terminal (--progress auto, the default),
// always (--progress always: also when stderr is a file or a pipe), or never (--progress never,
// or --quiet), so that scripts piping the tool read only its results.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace embstore::ckpt {

enum class ProgressWhen { kAuto, kAlways, kNever };

// "auto", "always", "never"; false for anything else.
bool parse_progress_when(const std::string& text, ProgressWhen* when);

class Progress {
 public:
  enum class Unit { kBytes, kRows };

  // verb: "verifying", "compacting"... total: the bytes or rows the command will go through.
  Progress(ProgressWhen when, const char* verb, Unit unit, uint64_t total);
  ~Progress() { clear(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // The amount done so far, monotonic (callers add their file's or table's base).
  void update(uint64_t done);
  // Draws the line at 100% (--progress always leaves it in a log), then clears it.
  void finish();
  // Clears the line (before a result or an error message is printed).
  void clear();
  bool enabled() const { return enabled_; }

 private:
  void draw(std::chrono::steady_clock::time_point now);

  const char* verb_;
  Unit unit_;
  uint64_t total_;
  bool enabled_;
  bool to_terminal_;
  uint64_t done_ = 0;
  size_t width_ = 0;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_, last_;
};

}  // namespace embstore::ckpt
