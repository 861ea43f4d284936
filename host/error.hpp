// Internal errors: thrown inside the library, turned into a status and a message at the C
// boundary (host/api.cpp). io/ functions return -errno instead and are converted by callers.
#pragma once

#include <embstore/embstore.h>

#include <exception>
#include <string>
#include <utility>

#ifndef FMT_HEADER_ONLY
#define FMT_HEADER_ONLY
#endif
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

template <typename... Args>
[[noreturn]] void fail(embstore_status_t status, fmt::format_string<Args...> format,
                       Args&&... args) {
  throw Error(status, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace embstore
