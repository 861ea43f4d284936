// Linked instead of cuda/backend/ when the library is built with -DEMBSTORE_CUDA=OFF.
#include "host/backend/backends.hpp"
#include "host/error.hpp"

namespace embstore {

bool cuda_built() { return false; }

bool cuda_device_usable(int, std::string* why) {
  if (why) *why = "this embstore was built without CUDA (-DEMBSTORE_CUDA=OFF)";
  return false;
}

std::unique_ptr<Table> make_cuda_table(TableSpec, int) {
  fail(EMBSTORE_UNSUPPORTED, "this embstore was built without CUDA (-DEMBSTORE_CUDA=OFF)");
}

void pin_host_memory(void*, size_t, int) {}
void unpin_host_memory(void*, int) {}

std::vector<int64_t> copy_keys_to_host(const int64_t*, size_t, int, void*) {
  fail(EMBSTORE_UNSUPPORTED, "this embstore was built without CUDA (-DEMBSTORE_CUDA=OFF)");
}

void copy_floats_to_device(const float*, float*, size_t, int, void*) {
  fail(EMBSTORE_UNSUPPORTED, "this embstore was built without CUDA (-DEMBSTORE_CUDA=OFF)");
}

}  // namespace embstore
