// The store: backend choice, the table registry, the global step. The C handles
// embstore_store / embstore_table are these structs. Its checkpointer sees it as a
// checkpoint::StoreView.
#pragma once

#include <embstore/embstore.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "host/backend/backends.hpp"
#include "host/checkpoint/checkpointer.hpp"
#include "host/eviction/idle_clock.hpp"
#include "host/shard/communicator.hpp"
#include "host/store/thread_pool.hpp"
#include "host/table/table.hpp"

struct embstore_table {
  embstore_store* store;
  std::unique_ptr<embstore::Table> impl;
  uint32_t dim = 0;           // impl's, kept here: a restore replaces impl, never with another dim
  double idle_pass_time = 0;  // when embstore_step last ran the idle rules (IdleClock time)
};

namespace embstore {

// The calls that use a store's tables from any thread (lookups, updates, stats, eviction,
// step) against restore and warm start, which replace the tables: neither runs under the
// other. A call made while a replacement runs fails with BUSY; a replacement that finds calls
// in flight fails with BUSY too, or waits for them where it must not fail alone (a sharded
// store's collective restore).
class TableCalls {
 public:
  // One call in flight, for its scope; throws Error(BUSY) during a replacement.
  class Scope {
   public:
    explicit Scope(TableCalls& calls);
    ~Scope() { calls_.in_flight_.fetch_sub(1); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    TableCalls& calls_;
  };
  // A replacement, for its scope; throws Error(BUSY) when calls are in flight and !wait.
  class Replacement {
   public:
    Replacement(TableCalls& calls, bool wait);
    ~Replacement() { calls_.replacing_.store(false); }
    Replacement(const Replacement&) = delete;
    Replacement& operator=(const Replacement&) = delete;

   private:
    TableCalls& calls_;
  };

 private:
  // Sequentially consistent: a call raises in_flight_ then reads replacing_, a replacement
  // sets replacing_ then reads in_flight_, so at least one of two racing sees the other.
  std::atomic<uint64_t> in_flight_{0};
  std::atomic<bool> replacing_{false};
};

}  // namespace embstore

struct embstore_store {
  // Validates config and picks the backend; throws embstore::Error.
  explicit embstore_store(const embstore_store_config_t& config);

  ~embstore_store();

  embstore_table* create_table(const embstore_table_config_t& config);
  embstore_table* find_table(const char* name);  // nullptr if none
  // Every table, in name order.
  std::vector<embstore_table*> tables();
  // A table of this store's backend, not registered.
  std::unique_ptr<embstore::Table> make_table_impl(embstore::TableSpec spec);
  // Registers impl under its spec's name; throws Error(ALREADY_EXISTS).
  embstore_table* adopt_table(std::unique_ptr<embstore::Table> impl);
  // Removes a table adopted by a restore whose install failed (no handle was given out).
  void forget_table(const std::string& name) noexcept;

  // embstore_step's part: the step moves from previous to step; runs the idle rules that are
  // due. Returns the rows evicted.
  uint64_t on_step(uint64_t previous, uint64_t step);
  // embstore_table_evict: the table's idle rules now.
  uint64_t evict_idle(embstore_table* table);

  embstore_backend_t backend;
  int device;
  size_t staging_bytes;
  unsigned io_queue_depth;
  embstore::checkpoint::SpillMode restore_spill;
  std::string spill_dir;
  std::string tier_dir;  // empty: no SSD tier
  int rank = 0, world_size = 1;
  // Sharded stores only: the exchange of the sharded calls, one at a time (comm_mutex).
  std::unique_ptr<embstore::shard::Communicator> comm;
  // Sharded CUDA stores only: the sharded calls' device data path (NCCL), beside comm.
  std::unique_ptr<embstore::DeviceExchange> device_exchange;
  std::mutex comm_mutex;
  std::unique_ptr<embstore::ThreadPool> pool;  // host backend, and CUDA stores with a tier_dir
  std::atomic<uint64_t> step{0};
  embstore::IdleClock idle_clock;
  embstore::TableCalls table_calls;

 private:
  std::unique_ptr<embstore::Table> make_stacked_table(embstore::TableSpec spec);
  static bool stacks_host_tiers();
  // Evicts the table's rows idle by its rules at (step, now); returns how many.
  uint64_t run_idle_rules(embstore_table* table, uint64_t step, double now);

  std::mutex mutex_;  // guards tables_
  std::map<std::string, std::unique_ptr<embstore_table>, std::less<>> tables_;

  // What the checkpointer sees of the store.
  class CheckpointView final : public embstore::checkpoint::StoreView {
   public:
    explicit CheckpointView(embstore_store& store) : store_(store) {}
    std::vector<embstore::Table*> tables() override;
    uint64_t step() const override;
    embstore::checkpoint::PipelineSettings pipeline() const override;
    embstore::Table* find_table(const std::string& name) override;
    std::unique_ptr<embstore::Table> make_table(embstore::TableSpec spec) override;
    void install(std::vector<std::unique_ptr<embstore::Table>> tables, uint64_t step,
                 bool new_run) override;
    embstore::shard::Communicator* comm() override { return store_.comm.get(); }
    uint32_t rank() const override { return static_cast<uint32_t>(store_.rank); }
    uint32_t world_size() const override { return static_cast<uint32_t>(store_.world_size); }

   private:
    embstore_store& store_;
  };
  CheckpointView checkpoint_view_{*this};

 public:
  // Last: it is destroyed first, waiting for the checkpoint in flight while tables still exist.
  std::unique_ptr<embstore::checkpoint::Checkpointer> checkpointer;
};
