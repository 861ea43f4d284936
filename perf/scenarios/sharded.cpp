// Scenario `sharded`, run under `mpirun -np W`: training steps (a lookup with insert, then the
// gradients) through the sharded calls of W ranks, each with its own Zipf batch, against one
// process training on the same W batches concatenated, in the same run. Rounds alternate: all
// ranks train sharded, then rank 0 alone trains the one-process store on the same steps (the
// others wait at a barrier), so both stores end with the same tables. Reports steps/s of each
// (a step: every rank's batch), their ratio, and the bytes a rank sends to other ranks per step
// (counted from the routing plans: keys, rows and gradients; headers left out). Only rank 0
// prints and writes --json.
//
// With --checkpoint-dir (a directory every rank shares): then a collective full checkpoint of
// the W ranks' tables against the one process's checkpoint of the same rows (capture to
// commit), and restores from a cold page cache: the W ranks' checkpoint into W ranks, the one
// process's into one process, the W ranks' into one process and the one process's into W ranks
// (changes of world size), with the bytes the ranks read from storage in all (/proc/self/io's
// read_bytes: only what missed the page cache, which is dropped before each restore).
#include <embstore/embstore.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <vector>

#include "perf/harness.hpp"
#include "perf/report.hpp"
#include "perf/zipf.hpp"

#if defined(EMBSTORE_PERF_MPI)
#include <mpi.h>

#include "cuda/row/shard.h"
#include "host/shard/routing.hpp"
#endif

namespace embstore::perf {
namespace {

class ShardedScenario final : public Scenario {
 public:
  const char* name() const override { return "sharded"; }
  const char* description() const override {
    return "sharded training over MPI (run under mpirun -np W) vs one process on the same "
           "batches";
  }

  void set_defaults(CommonOptions& o) const override {
    o.backend = "host";
    o.dim = 64;
    o.batch = 16384;  // per rank
    o.key_space = 1'000'000;
    o.steps = 60;
  }

  void add_options(CLI::App& app) override {
    app.add_option("--rounds", rounds_, "sharded/one-process rounds; --steps split over them")
        ->check(CLI::Range(size_t{1}, size_t{1} << 20))
        ->capture_default_str();
    app.add_option("--checkpoint-dir", checkpoint_dir_,
                   "also time checkpoints and restores there (shared by every rank)");
  }

#if !defined(EMBSTORE_PERF_MPI)
  int run(const CommonOptions&, Report&) override {
    throw std::runtime_error("this embstore-perf was built without MPI");
  }
#else
  int run(const CommonOptions& o, Report& report) override {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    }
    int code = 0;
    try {
      code = run_ranks(o, report);
    } catch (...) {
      if (!initialized) MPI_Finalize();
      throw;
    }
    if (!initialized) MPI_Finalize();
    return code;
  }

 private:
  int run_ranks(const CommonOptions& o, Report& report) {
    int rank = 0, world = 1;
    MPI_Comm comm = MPI_COMM_WORLD;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &world);
    if (rank != 0) report.mute();
    if (backend_from_name(o.backend) != EMBSTORE_BACKEND_HOST) {
      throw std::runtime_error("sharded stores run on the host backend in this version");
    }
    const size_t per_round = std::max<size_t>(1, o.steps / rounds_);
    const size_t steps = per_round * rounds_;
    // Every rank's batches (rank 0's one-process store trains on all of them).
    std::vector<std::vector<int64_t> > keys(world);
    for (int q = 0; q < world; ++q) {
      keys[q] = zipf_key_stream(steps * o.batch, o.key_space, o.zipf, o.seed + 7919 * q);
    }
    std::vector<float> grads(o.batch * o.dim);
    SplitMix64 rng(o.seed ^ 0x67726164ull);
    for (float& g : grads) g = static_cast<float>(rng.next_unit() * 0.02 - 0.01);
    std::vector<float> all_grads;
    for (int q = 0; q < world; ++q) all_grads.insert(all_grads.end(), grads.begin(), grads.end());

    embstore_store_config_t sc = Store::default_config();
    sc.rank = rank;
    sc.world_size = world;
    if (world > 1) sc.mpi_comm = &comm;
    Store sharded(o, sc);
    embstore_table_t* table = create_table(sharded, "sharded", o.dim, EMBSTORE_OPT_ADAGRAD);
    std::unique_ptr<Store> single;
    embstore_table_t* single_table = nullptr;
    if (rank == 0) {
      single = std::make_unique<Store>(o);
      single_table = create_table(*single, "sharded", o.dim, EMBSTORE_OPT_ADAGRAD);
    }

    std::vector<float> rows(o.batch * o.dim), all_rows(world * o.batch * o.dim);
    std::vector<int64_t> all_keys(world * o.batch);
    auto sharded_steps = [&](size_t first) {
      const Stopwatch t;
      for (size_t s = first; s < first + per_round; ++s) {
        const int64_t* k = keys[rank].data() + s * o.batch;
        check(embstore_step(sharded.get(), s + 1), "embstore_step");
        check(embstore_sharded_lookup(table, k, o.batch, rows.data(), EMBSTORE_LOOKUP_INSERT,
                                      nullptr),
              "embstore_sharded_lookup");
        check(embstore_sharded_apply_gradients(table, k, grads.data(), o.batch, nullptr),
              "embstore_sharded_apply_gradients");
      }
      MPI_Barrier(comm);
      return t.seconds();
    };
    auto single_steps = [&](size_t first) {
      const Stopwatch t;
      if (rank == 0) {
        for (size_t s = first; s < first + per_round; ++s) {
          for (int q = 0; q < world; ++q) {
            std::copy_n(keys[q].data() + s * o.batch, o.batch, all_keys.data() + q * o.batch);
          }
          check(embstore_step(single->get(), s + 1), "embstore_step");
          check(embstore_lookup(single_table, all_keys.data(), all_keys.size(), all_rows.data(),
                                EMBSTORE_LOOKUP_INSERT, nullptr),
                "embstore_lookup");
          check(embstore_apply_gradients(single_table, all_keys.data(), all_grads.data(),
                                         all_keys.size(), nullptr),
                "embstore_apply_gradients");
        }
      }
      MPI_Barrier(comm);
      return t.seconds();
    };

    std::vector<double> sharded_rates, single_rates;
    double sharded_total = 0, single_total = 0;
    for (size_t r = 0; r < rounds_; ++r) {
      const double a = sharded_steps(r * per_round);
      const double b = single_steps(r * per_round);
      sharded_total += a;
      single_total += b;
      sharded_rates.push_back(per_round / a);
      single_rates.push_back(per_round / b);
    }

    // What this rank sends to others per step, from the routing plans of its batches.
    double sent = 0;
    const uint32_t w = static_cast<uint32_t>(world);
    for (size_t s = 0; s < steps; ++s) {
      const int64_t* k = keys[rank].data() + s * o.batch;
      const shard::Dedupe d = shard::dedupe(k, o.batch);
      size_t distinct_out = 0, occurrences_out = 0;
      for (int64_t key : d.keys) distinct_out += row::shard_of(key, w) != uint32_t(rank);
      for (size_t i = 0; i < o.batch; ++i)
        occurrences_out += row::shard_of(k[i], w) != uint32_t(rank);
      // lookup: keys out, their rows back (sent by the owners: about as many); gradients: key
      // and row of every occurrence.
      sent += distinct_out * (8.0 + 4.0 * o.dim) + occurrences_out * (8.0 + 4.0 * o.dim);
    }
    const double bytes_per_step = sent / steps;
    double all_bytes = 0;
    MPI_Reduce(&bytes_per_step, &all_bytes, 1, MPI_DOUBLE, MPI_SUM, 0, comm);

    report_common(report, o, EMBSTORE_BACKEND_HOST);
    report.set("ranks", world);
    report.set("rounds", rounds_);
    const double sharded_rate = steps / sharded_total, single_rate = steps / single_total;
    report.set("sharded_steps_per_second", sharded_rate);
    report.set("single_steps_per_second", single_rate);
    report.set("sharded_over_single", sharded_rate / single_rate);
    report.set("sharded_steps_per_second_median", median(sharded_rates));
    report.set("single_steps_per_second_median", median(single_rates));
    report.set("bytes_to_other_ranks_per_step_per_rank", all_bytes / world);
    report.say("sharded: {} ranks x {} keys per step, dim {}, {} steps in {} rounds", world,
               o.batch, o.dim, steps, rounds_);
    report.say("  sharded      {:8.2f} steps/s (median of rounds {:.2f})", sharded_rate,
               median(sharded_rates));
    report.say("  one process  {:8.2f} steps/s (median of rounds {:.2f})", single_rate,
               median(single_rates));
    report.say("  ratio sharded/one process: {:.2f}", sharded_rate / single_rate);
    report.say("  sent to other ranks: {}B per rank per step", si(all_bytes / world));
    if (!checkpoint_dir_.empty()) time_checkpoints(o, report, sharded, single.get(), comm);
    return 0;
  }

  // What this process has read from storage so far (read_bytes of /proc/self/io), 0 where the
  // kernel does not say.
  static uint64_t storage_read_bytes() {
    std::ifstream io("/proc/self/io");
    std::string field;
    uint64_t value = 0;
    while (io >> field >> value) {
      if (field == "read_bytes:") return value;
    }
    return 0;
  }

  // Seconds of body on every rank (the slowest rank's), between barriers.
  static double timed(MPI_Comm comm, const std::function<void()>& body) {
    MPI_Barrier(comm);
    const Stopwatch t;
    body();
    double mine = t.seconds(), slowest = 0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
    return slowest;
  }

  void time_checkpoints(const CommonOptions& o, Report& report, const Store& sharded,
                        const Store* single, MPI_Comm comm) {
    int rank = 0, world = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &world);
    const std::string many = checkpoint_dir_ + "/sharded", one = checkpoint_dir_ + "/one";
    if (rank == 0) {
      std::error_code ec;
      std::filesystem::remove_all(many, ec);
      std::filesystem::remove_all(one, ec);
    }
    MPI_Barrier(comm);
    const uint64_t version = 1'000'000;
    check(embstore_step(sharded.get(), version), "embstore_step");
    if (single != nullptr) check(embstore_step(single->get(), version), "embstore_step");
    const double write_many = timed(comm, [&] {
      check(embstore_checkpoint(sharded.get(), many.c_str(), EMBSTORE_CKPT_FULL, nullptr),
            "embstore_checkpoint");
      check(embstore_checkpoint_wait(sharded.get(), version), "embstore_checkpoint_wait");
    });
    const double write_one = timed(comm, [&] {
      if (single == nullptr) return;
      check(embstore_checkpoint(single->get(), one.c_str(), EMBSTORE_CKPT_FULL, nullptr),
            "embstore_checkpoint");
      check(embstore_checkpoint_wait(single->get(), version), "embstore_checkpoint_wait");
    });
    uint64_t bytes_many = 0, bytes_one = 0;
    if (rank == 0) {
      bytes_many = drop_from_page_cache(many);
      bytes_one = drop_from_page_cache(one);
    }
    // Restores into new stores, from a cold page cache.
    auto restore_into = [&](const std::string& dir, bool sharded_store) {
      embstore_store_config_t c = Store::default_config();
      if (sharded_store) {
        c.rank = rank;
        c.world_size = world;
        if (world > 1) c.mpi_comm = &comm;
      }
      Store store(o, c);
      check(embstore_restore(store.get(), dir.c_str(), version, nullptr), "embstore_restore");
    };
    // Bytes the ranks read from storage in all (/proc/self/io), with the page cache dropped.
    auto bytes_read = [&](const std::function<void()>& body) {
      const uint64_t before = storage_read_bytes();
      body();
      uint64_t mine = storage_read_bytes() - before, all = 0;
      MPI_Allreduce(&mine, &all, 1, MPI_UINT64_T, MPI_SUM, comm);
      return all;
    };
    double read_many = 0, read_one_into_many = 0;
    // A first restore, not timed: a process's first restore pays once for what later ones
    // reuse (the heap's growth, the reader's threads), which made whichever restore came first
    // look 1.5 to 2 times slower.
    restore_into(many, true);
    if (rank == 0) drop_from_page_cache(many);
    const uint64_t read_many_bytes =
        bytes_read([&] { read_many = timed(comm, [&] { restore_into(many, true); }); });
    if (rank == 0) drop_from_page_cache(many);
    const double read_one = timed(comm, [&] {
      if (rank == 0) restore_into(one, false);
    });
    const double read_many_into_one = timed(comm, [&] {
      if (rank == 0) restore_into(many, false);
    });
    if (rank == 0) drop_from_page_cache(one);
    // A change of world size into W ranks: the one process's checkpoint, the same rows, read
    // in shares and routed to the owners.
    const uint64_t read_one_into_many_bytes =
        bytes_read([&] { read_one_into_many = timed(comm, [&] { restore_into(one, true); }); });
    report.set("checkpoint_bytes", bytes_many);
    report.set("checkpoint_one_process_bytes", bytes_one);
    report.set("checkpoint_seconds", write_many);
    report.set("checkpoint_one_process_seconds", write_one);
    report.set("checkpoint_over_one_process", write_many / write_one);
    report.set("restore_seconds", read_many);
    report.set("restore_one_process_seconds", read_one);
    report.set("restore_over_one_process", read_many / read_one);
    report.set("restore_into_one_process_seconds", read_many_into_one);
    report.set("restore_bytes_read", read_many_bytes);
    report.set("restore_resharded_seconds", read_one_into_many);
    report.set("restore_resharded_over_same_size", read_one_into_many / read_many);
    report.set("restore_resharded_bytes_read", read_one_into_many_bytes);
    report.say(
        "  full checkpoint, {} ranks: {:.3f} s ({}B); one process, same rows: {:.3f} s "
        "({}B); ratio {:.2f}",
        world, write_many, si(bytes_many), write_one, si(bytes_one), write_many / write_one);
    report.say(
        "  restore (cold cache), {} ranks: {:.3f} s, reading {}B in all; one process: "
        "{:.3f} s; ratio {:.2f}",
        world, read_many, si(read_many_bytes), read_one, read_many / read_one);
    report.say(
        "  restore of the one process's checkpoint into {} ranks (resharded, routed): {:.3f} "
        "s, reading {}B in all ({}B on disk); over the same-size restore {:.2f}",
        world, read_one_into_many, si(read_one_into_many_bytes), si(bytes_one),
        read_one_into_many / read_many);
    report.say("  restore of the {} ranks' checkpoint into one process: {:.3f} s", world,
               read_many_into_one);
    if (world >= 3) time_from_fewer_ranks(o, report, comm, many, version, read_many);
  }

  // W >= 3: ranks 0..W-2 restore the W ranks' checkpoint (W -> W-1, timed) and checkpoint it
  // again, a checkpoint of the same rows by W-1 ranks; then all W ranks restore that one
  // (W-1 -> W: every file shared out, rows routed), against the same-size restore.
  void time_from_fewer_ranks(const CommonOptions& o, Report& report, MPI_Comm comm,
                             const std::string& many, uint64_t version, double read_many) {
    int rank = 0, world = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &world);
    const std::string fewer_dir = checkpoint_dir_ + "/fewer";
    if (rank == 0) {
      std::error_code ec;
      std::filesystem::remove_all(fewer_dir, ec);
      drop_from_page_cache(many);
    }
    MPI_Comm fewer;
    MPI_Comm_split(comm, rank < world - 1 ? 0 : MPI_UNDEFINED, rank, &fewer);
    const double read_into_fewer = timed(comm, [&] {
      if (fewer == MPI_COMM_NULL) return;
      embstore_store_config_t c = Store::default_config();
      c.rank = rank;
      c.world_size = world - 1;
      c.mpi_comm = &fewer;
      Store store(o, c);
      check(embstore_restore(store.get(), many.c_str(), version, nullptr), "embstore_restore");
      check(embstore_checkpoint(store.get(), fewer_dir.c_str(), EMBSTORE_CKPT_FULL, nullptr),
            "embstore_checkpoint");
      check(embstore_checkpoint_wait(store.get(), version), "embstore_checkpoint_wait");
    });
    if (fewer != MPI_COMM_NULL) MPI_Comm_free(&fewer);
    uint64_t fewer_bytes = 0;
    if (rank == 0) fewer_bytes = drop_from_page_cache(fewer_dir);
    MPI_Bcast(&fewer_bytes, 1, MPI_UINT64_T, 0, comm);
    double read_from_fewer = 0;
    const uint64_t before = storage_read_bytes();
    read_from_fewer = timed(comm, [&] {
      embstore_store_config_t c = Store::default_config();
      c.rank = rank;
      c.world_size = world;
      c.mpi_comm = &comm;
      Store store(o, c);
      check(embstore_restore(store.get(), fewer_dir.c_str(), version, nullptr), "embstore_restore");
    });
    uint64_t mine = storage_read_bytes() - before, read_bytes = 0;
    MPI_Allreduce(&mine, &read_bytes, 1, MPI_UINT64_T, MPI_SUM, comm);
    report.set("restore_from_fewer_ranks_seconds", read_from_fewer);
    report.set("restore_from_fewer_ranks_over_same_size", read_from_fewer / read_many);
    report.set("restore_from_fewer_ranks_bytes_read", read_bytes);
    report.set("restore_into_fewer_ranks_and_checkpoint_seconds", read_into_fewer);
    report.say(
        "  restore of a {} ranks' checkpoint of the same rows into {} ranks (resharded): {:.3f} "
        "s, reading {}B in all ({}B on disk); over the same-size restore {:.2f}",
        world - 1, world, read_from_fewer, si(read_bytes), si(fewer_bytes),
        read_from_fewer / read_many);
    report.say("  ({} -> {} ranks restore and the {} ranks' checkpoint: {:.3f} s)", world,
               world - 1, world - 1, read_into_fewer);
  }
#endif

  size_t rounds_ = 6;
  std::string checkpoint_dir_;
};

}  // namespace

std::unique_ptr<Scenario> make_sharded_scenario() { return std::make_unique<ShardedScenario>(); }

}  // namespace embstore::perf
