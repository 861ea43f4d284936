// The test-only allocation fault hook of HostBuffer (host_buffer.hpp).
#include "host/backend/host_buffer.hpp"

#include <atomic>
#include <functional>
#include <mutex>
#include <utility>

namespace embstore {
namespace {

std::atomic<bool> armed{false};  // the hot path reads only this
std::mutex hook_mutex;
std::function<bool(size_t)> hook;

}  // namespace

void set_host_alloc_fault(std::function<bool(size_t bytes)> fault) {
  std::lock_guard lock(hook_mutex);
  hook = std::move(fault);
  armed.store(static_cast<bool>(hook));
}

bool host_alloc_fault(size_t bytes) {
  if (!armed.load(std::memory_order_relaxed)) return false;
  std::lock_guard lock(hook_mutex);
  return hook && hook(bytes);
}

}  // namespace embstore
