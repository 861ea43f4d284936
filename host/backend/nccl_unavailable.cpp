// Linked instead of cuda/backend/nccl_exchange.cu where the library is built without CUDA or
// without NCCL: sharded stores then run on the host backend only.
#include "host/backend/backends.hpp"
#include "host/error.hpp"

namespace embstore {

bool nccl_built() { return false; }

std::unique_ptr<DeviceExchange> make_nccl_exchange(void*, int, int, int) {
  fail(EMBSTORE_UNSUPPORTED,
       "this embstore was built without NCCL: a sharded store runs on the host backend");
}

}  // namespace embstore
