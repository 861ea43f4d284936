// Results of one scenario run: a short human summary on stdout and one flat JSON object
// (figures in base units: seconds, bytes, per-second rates; plus the parameters used).
#pragma once

#include <fmt/core.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>

namespace embstore::perf {

class Report {
 public:
  explicit Report(std::string scenario) { json_["scenario"] = std::move(scenario); }

  // One JSON field. Keys keep the order they were first set in, so files diff well.
  template <typename T>
  void set(const std::string& key, T&& value) {
    json_[key] = std::forward<T>(value);
  }

  // One line of the human summary, printed at once so long runs show progress.
  template <typename... Args>
  void say(fmt::format_string<Args...> format, Args&&... args) {
    if (muted_) return;
    fmt::print(stdout, format, std::forward<Args>(args)...);
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }

  const nlohmann::ordered_json& json() const { return json_; }

  // Neither prints nor writes: for the ranks of a multi-process scenario other than rank 0.
  void mute() { muted_ = true; }

  // Throws std::runtime_error when the file cannot be written.
  void write_json(const std::string& path) const {
    if (muted_) return;
    std::ofstream out(path, std::ios::trunc);
    out << json_.dump(2) << '\n';
    out.close();
    if (!out) throw std::runtime_error("cannot write " + path);
  }

 private:
  nlohmann::ordered_json json_ = nlohmann::ordered_json::object();
  bool muted_ = false;
};

// 12300000 -> "12.3 M" (then the caller's unit): rates read at a glance.
inline std::string si(double value) {
  const char* prefix = "";
  if (value >= 1e9) {
    value /= 1e9;
    prefix = "G";
  } else if (value >= 1e6) {
    value /= 1e6;
    prefix = "M";
  } else if (value >= 1e3) {
    value /= 1e3;
    prefix = "k";
  }
  return fmt::format("{:.3g} {}", value, prefix);
}

}  // namespace embstore::perf
