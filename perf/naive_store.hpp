// The baseline a user would write first: one std::unordered_map of key -> row vector, on one
// thread. A row holds what the embstore row holds, the value and the optimizer's state, and
// gets the table's own initializers, so both sides store and initialize the same data and
// return the same values.
#pragma once

#include <cstdint>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "cuda/row/init.h"
#include "cuda/row/optimizer.h"

namespace embstore::perf {

class NaiveStore {
 public:
  NaiveStore(uint32_t dim, const row::InitParams& init, const row::OptParams& opt)
      : dim_(dim), stride_(dim + row::state_dim(opt.kind, dim)), init_(init), opt_(opt) {}

  size_t rows() const { return map_.size(); }

  // Like embstore_lookup with EMBSTORE_LOOKUP_INSERT.
  void find_or_insert(const int64_t* keys, size_t n, float* out) {
    const uint32_t dim = dim_;
    for (size_t i = 0; i < n; ++i) {
      auto [it, inserted] = map_.try_emplace(keys[i]);
      std::vector<float>& row = it->second;
      if (inserted) {
        row.resize(stride_);
        // The routines the host backend fills its new rows with: the same init work.
        row::init_row(init_, keys[i], dim, row.data());
        row::init_state(opt_, dim, row.data() + dim);
      }
      std::memcpy(out + i * dim, row.data(), dim * sizeof(float));
    }
  }

  // Like embstore_lookup without flags: keys without a row read as zeros.
  void find(const int64_t* keys, size_t n, float* out) const {
    for (size_t i = 0; i < n; ++i) {
      const auto it = map_.find(keys[i]);
      if (it == map_.end()) {
        std::memset(out + i * dim_, 0, dim_ * sizeof(float));
      } else {
        std::memcpy(out + i * dim_, it->second.data(), dim_ * sizeof(float));
      }
    }
  }

 private:
  uint32_t dim_;
  uint32_t stride_;
  row::InitParams init_;
  row::OptParams opt_;
  std::unordered_map<int64_t, std::vector<float>> map_;
};

}  // namespace embstore::perf
