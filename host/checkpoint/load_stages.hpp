// The stages of a restore or warm start before the ranks agree. On a store of one process a
// stage runs and throws; on a sharded store each rank runs its stages on its own and keeps its
// first failure (later stages are skipped), so that every rank reaches the agreement
// (restore.cpp's agree_on_plan) and all fail or go on together.
#pragma once

#include <embstore/embstore.h>

#include "host/shard/agreement.hpp"

namespace embstore::checkpoint {

class LoadStages {
 public:
  explicit LoadStages(bool collective) : collective_(collective) {}

  template <typename F>
  void run(F&& stage) {
    if (!collective_) {
      stage();
    } else if (local_.status == EMBSTORE_OK) {
      local_ = shard::run_stage(stage);
    }
  }

  bool collective() const { return collective_; }
  const shard::LocalCheck& local() const { return local_; }

 private:
  bool collective_;
  shard::LocalCheck local_;
};

}  // namespace embstore::checkpoint
