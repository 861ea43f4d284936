// run_stage's template body (agreement.hpp).
#pragma once

#include <exception>
#include <new>

#include "host/error.hpp"

namespace embstore::shard {

template <typename F>
LocalCheck run_stage(F&& stage) noexcept {
  try {
    stage();
    return {};
  } catch (const Error& e) {
    return {e.status(), e.what()};
  } catch (const std::bad_alloc&) {
    return {EMBSTORE_OUT_OF_MEMORY, "host memory allocation failed"};
  } catch (const std::exception& e) {
    return {EMBSTORE_INTERNAL, e.what()};
  } catch (...) {
    return {EMBSTORE_INTERNAL, "unknown exception"};
  }
}

}  // namespace embstore::shard
