// Fixtures shared by the io/ tests.
#pragma once

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <system_error>
#include <utility>

#include "io/fault.hpp"

namespace embstore_test {

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

// Installs a write fault hook and resets it even when a REQUIRE fails.
struct FaultGuard {
  explicit FaultGuard(std::function<int(uint64_t, size_t)> hook) {
    embstore::io::set_fault_injection(std::move(hook));
  }
  ~FaultGuard() { embstore::io::set_fault_injection(nullptr); }
  FaultGuard(const FaultGuard&) = delete;
  FaultGuard& operator=(const FaultGuard&) = delete;
};

}  // namespace embstore_test
