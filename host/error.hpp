// Internal errors: thrown inside the library, turned into a status and a message at the C
// boundary (host/api/api.cpp). io/ functions return -errno instead and are converted by callers.
#pragma once

#include <embstore/embstore.h>

#include <cstring>
#include <exception>
#include <string>
#include <utility>

// fmt 9 turns its constexpr off under nvcc, which its C++20 consteval checks then reject
// (fmtlib/fmt#3543); nvcc 13 handles constexpr fmt as the host compiler does.
#if defined(__CUDACC__) && !defined(FMT_USE_CONSTEXPR)
#define FMT_USE_CONSTEXPR 1
#endif
// fmt from Debian's libfmt.so: its implementation compiled once, not in every translation unit
// (header-only, it cost each of ours about 10 s).
#include <fmt/format.h>

namespace embstore {

class Error : public std::exception {
 public:
  Error(embstore_status_t status, std::string message)
      : status_(status), message_(std::move(message)) {}
  embstore_status_t status() const noexcept { return status_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  embstore_status_t status_;
  std::string message_;
};

// The integer inside an enum that came through the C API. C callers may pass any int, and
// loading an out-of-range value as the enum type is undefined in C++, so validation reads it
// as an int.
template <typename Enum>
int enum_value(const Enum& e) {
  static_assert(sizeof(Enum) == sizeof(int));
  int v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

template <typename... Args>
[[noreturn]] void fail(embstore_status_t status, fmt::format_string<Args...> format,
                       Args&&... args) {
  throw Error(status, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace embstore
