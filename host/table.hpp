// The backend-neutral table interface. A backend (host/backend/host_table.*,
// cuda/backend/cuda_table.cu) implements it over the shared per-row logic in cuda/row/.
#pragma once

#include <embstore/embstore.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda/row/init.h"
#include "cuda/row/optimizer.h"

namespace embstore {

// A validated, owning copy of embstore_table_config_t (see host/table_spec.cpp).
struct TableSpec {
  std::string name;
  uint32_t dim = 0;
  uint64_t initial_capacity = 0;
  uint64_t max_capacity = 0;  // 0: unbounded
  row::OptParams opt{};
  row::InitParams init{};
  uint32_t admit_after = 0;
  uint64_t evict_idle_steps = 0;

  uint32_t state_dim() const { return row::state_dim(opt.kind, dim); }
  uint32_t stride() const { return dim + state_dim(); }
};

// Validates config (every field) and returns the spec; throws Error(INVALID_ARGUMENT or
// UNSUPPORTED) naming the field.
TableSpec make_table_spec(const embstore_table_config_t& config);

struct TableCounters {
  uint64_t rows = 0, capacity = 0, dirty_rows = 0, inserted = 0, evicted = 0, pending_admission = 0,
           skipped_keys = 0;
};

class Table {
 public:
  explicit Table(TableSpec spec) : spec_(std::move(spec)) {}
  virtual ~Table() = default;
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;

  const TableSpec& spec() const { return spec_; }

  // Arguments are validated by the caller (host/api.cpp); pointers are backend pointers.
  virtual void lookup(const int64_t* keys, size_t n, float* values_out, bool insert, uint64_t step,
                      void* stream) = 0;
  virtual void apply_gradients(const int64_t* keys, const float* grads, size_t n, uint64_t step,
                               void* stream) = 0;
  virtual TableCounters counters() = 0;

  // Benchmarks only (embstore-perf optimizer): turns dirty marking in the fused update off to
  // measure what it costs. Not exposed in the C API: incremental checkpoints depend on it.
  virtual void set_dirty_tracking(bool on) = 0;

 private:
  TableSpec spec_;
};

}  // namespace embstore
