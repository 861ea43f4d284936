// Backend factories. The store picks one at creation (host/store/store.cpp).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "host/table/table.hpp"

namespace embstore {

class ThreadPool;

std::unique_ptr<Table> make_host_table(TableSpec spec, ThreadPool& pool);

// The CUDA backend lives in cuda/backend/; a build without CUDA links
// host/backend/cuda_unavailable.cpp instead.
bool cuda_built();
// True when `device` can run the CUDA backend; otherwise *why says why.
bool cuda_device_usable(int device, std::string* why);
// Throws Error(UNSUPPORTED) without a CUDA build, Error(DEVICE_ERROR) on CUDA failures.
std::unique_ptr<Table> make_cuda_table(TableSpec spec, int device);
// Page-locks host memory that device copies target (the checkpoint staging ring), so they run
// as DMA. Without CUDA, or where it fails, the memory stays pageable: copies still work.
void pin_host_memory(void* p, size_t bytes, int device);
void unpin_host_memory(void* p, int device);

}  // namespace embstore
