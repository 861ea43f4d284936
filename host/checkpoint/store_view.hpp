// What the checkpointer sees of its store: the tables, the step, the pipeline's settings, and
// how restore makes tables and puts them in. The store implements it and owns its
// checkpointer; the checkpointer includes nothing of the store.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "host/table/table.hpp"

namespace embstore::shard {
class Communicator;
}

namespace embstore::checkpoint {

// embstore_spill_t: when restore parks the tables it replaces in a spill file.
enum class SpillMode { kAuto, kNever, kAlways };

struct PipelineSettings {
  size_t staging_bytes = 0;  // the staging ring's budget
  unsigned io_queue_depth = 0;
  int staging_device = -1;  // a CUDA device to pin staging for, or -1
  SpillMode restore_spill = SpillMode::kAuto;
  std::string spill_dir;  // where restore's spill file goes
};

class StoreView {
 public:
  virtual ~StoreView() = default;

  // Every table, in name order.
  virtual std::vector<Table*> tables() = 0;
  // The step of the last embstore_step: the version a checkpoint taken now has.
  virtual uint64_t step() const = 0;
  virtual PipelineSettings pipeline() const = 0;

  // Restore: the store's table of that name (null when none), and a new table of the store's
  // backend, not yet the store's.
  virtual Table* find_table(const std::string& name) = 0;
  virtual std::unique_ptr<Table> make_table(TableSpec spec) = 0;
  // Restore's and warm start's last stage: each table replaces the store's table of its name
  // (its handle stays valid) or joins the store, and the step becomes step; new_run (restore)
  // also forgets the idle clock's marks of the run left. Fails only for memory, and then
  // before any table of the store is replaced.
  virtual void install(std::vector<std::unique_ptr<Table>> tables, uint64_t step, bool new_run) = 0;

  // Sharded stores: the communicator of collective checkpoints and restores, this rank, and
  // the world size. A store of one process: null, 0 and 1.
  virtual shard::Communicator* comm() { return nullptr; }
  virtual uint32_t rank() const { return 0; }
  virtual uint32_t world_size() const { return 1; }
};

}  // namespace embstore::checkpoint
