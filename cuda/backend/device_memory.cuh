// Host-side helpers of the CUDA backend: CUDA errors as embstore errors, the current device for
// a scope, owning device allocations (and of mapped host memory), and the layout of a call's
// scratch buffer.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>

#include "cuda/backend/device.cuh"
#include "host/error.hpp"

namespace embstore::cuda_backend {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* what) {
  (void)cudaGetLastError();  // clear a non-sticky error so the next check does not see it
  if (e == cudaErrorMemoryAllocation) {
    fail(EMBSTORE_OUT_OF_MEMORY, "{}: {}", what, cudaGetErrorString(e));
  }
  fail(EMBSTORE_DEVICE_ERROR, "{}: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw_cuda(e, what);
}

inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

// Makes `device` current for a scope and restores the previous device after it.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) {
      check(cudaSetDevice(device), "cudaSetDevice");
      switched_ = true;
    }
  }
  // For destructors: never throws; failures leave the current device as it was.
  DeviceGuard(int device, std::nothrow_t) noexcept {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) {
      switched_ = cudaSetDevice(device) == cudaSuccess;
    }
    (void)cudaGetLastError();
  }
  ~DeviceGuard() {
    if (switched_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

// Owning device allocation (cudaMalloc / cudaFree).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, const char* what) : bytes_(bytes) {
    if (bytes == 0) return;
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      if (e == cudaErrorMemoryAllocation) {
        fail(EMBSTORE_OUT_OF_MEMORY, "cudaMalloc of {} bytes for {}: {}", bytes, what,
             cudaGetErrorString(e));
      }
      fail(EMBSTORE_DEVICE_ERROR, "cudaMalloc of {} bytes for {}: {}", bytes, what,
           cudaGetErrorString(e));
    }
    ptr_ = p;
  }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void reset() noexcept {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Owning allocation of page-locked host memory mapped into the device's address space
// (cudaHostAlloc with cudaHostAllocMapped): kernels read and write it over the bus, as they do
// device memory, through its device pointer. The device tier's rows beyond its budget.
class MappedHostBuffer {
 public:
  MappedHostBuffer() = default;
  MappedHostBuffer(size_t bytes, const char* what) {
    if (bytes == 0) return;
    void* p = nullptr;
    cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
    if (e == cudaSuccess) {
      host_ = p;
      e = cudaHostGetDevicePointer(&device_, p, 0);
      if (e == cudaSuccess) {
        bytes_ = bytes;
        return;
      }
      reset();
    }
    (void)cudaGetLastError();
    fail(e == cudaErrorMemoryAllocation ? EMBSTORE_OUT_OF_MEMORY : EMBSTORE_DEVICE_ERROR,
         "cudaHostAlloc (mapped) of {} bytes of host memory for {}: {}", bytes, what,
         cudaGetErrorString(e));
  }
  ~MappedHostBuffer() { reset(); }
  MappedHostBuffer(MappedHostBuffer&& o) noexcept
      : host_(std::exchange(o.host_, nullptr)),
        device_(std::exchange(o.device_, nullptr)),
        bytes_(std::exchange(o.bytes_, 0)) {}
  MappedHostBuffer& operator=(MappedHostBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      host_ = std::exchange(o.host_, nullptr);
      device_ = std::exchange(o.device_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  MappedHostBuffer(const MappedHostBuffer&) = delete;
  MappedHostBuffer& operator=(const MappedHostBuffer&) = delete;

  void reset() noexcept {
    if (host_ != nullptr) (void)cudaFreeHost(host_);
    host_ = nullptr;
    device_ = nullptr;
    bytes_ = 0;
  }
  // The pointer kernels use.
  template <typename T = void>
  T* device() const {
    return static_cast<T*>(device_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* host_ = nullptr;
  void* device_ = nullptr;
  size_t bytes_ = 0;
};

// A grow-only buffer of a table's calls, at least `bytes`: grown by half again (or to bytes),
// after waiting for the stream, which (after the call's wait on the previous call) covers every
// earlier use of the old buffer.
inline char* grow_only(DeviceBuffer& buffer, size_t bytes, const char* what, cudaStream_t stream) {
  if (bytes > buffer.bytes()) {
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const size_t grown = std::max(bytes, buffer.bytes() + buffer.bytes() / 2);
    buffer.reset();
    buffer = DeviceBuffer(grown, what);
  }
  return buffer.get<char>();
}

// Offsets of the sub-buffers of one call's scratch, each aligned for CUB.
struct ScratchLayout {
  size_t bytes = 0;
  size_t take(size_t n) {
    const size_t offset = (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
    bytes = offset + n;
    return offset;
  }
};

// Threads per position for row copies: the row's width rounded up to a power of two, at most
// a warp, so narrow rows do not leave most lanes idle.
inline uint32_t tile_shift_for(uint32_t columns) {
  const uint32_t width = std::min<uint32_t>(std::bit_ceil(std::max<uint32_t>(columns, 1)), 32);
  return static_cast<uint32_t>(std::countr_zero(width));
}

}  // namespace embstore::cuda_backend
