// Scenario `lookup`: embstore_lookup throughput on a Zipf key stream against a naive
// std::unordered_map store (perf/naive_store.hpp), both on the same stream and batch loop in
// the same run:
//   1. find-or-insert (EMBSTORE_LOOKUP_INSERT) from an empty table that grows from the default
//      initial_capacity, as in the first pass of training;
//   2. find only (flags 0) over the same stream on the now-full table.
// Both sides must return bit-identical rows: every output is checksummed and a sample of rows
// per batch is compared. The whole comparison repeats --repeat times on fresh stores, the side
// that goes first alternating, and the medians are reported: one run on a shared machine
// varies by tens of percent.
#include <embstore/embstore.h>
#include <malloc.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "host/store/store.hpp"
#include "perf/harness.hpp"
#include "perf/naive_store.hpp"
#include "perf/report.hpp"
#include "perf/zipf.hpp"

namespace embstore::perf {
namespace {

constexpr size_t kSampledRowsPerBatch = 256;

// A fixed sample of output positions per batch: rows recorded from the side that runs first
// and compared with the side that runs second.
class RowSample {
 public:
  RowSample(size_t batches, size_t batch, uint32_t dim, uint64_t seed)
      : per_batch_(std::min(batch, kSampledRowsPerBatch)), dim_(dim) {
    SplitMix64 rng(seed ^ 0x73616d706c65ull);
    positions_.resize(batches * per_batch_);
    for (size_t& p : positions_) p = rng.next() % batch;
    rows_.resize(positions_.size() * dim_);
  }

  size_t rows() const { return positions_.size(); }

  void record(size_t b, const float* out) {
    for (size_t j = 0; j < per_batch_; ++j) {
      std::memcpy(&rows_[(b * per_batch_ + j) * dim_], out + position(b, j) * dim_,
                  dim_ * sizeof(float));
    }
  }

  // Returns how many sampled rows differ; the first difference is kept for the message.
  size_t compare(size_t b, const float* out, const int64_t* keys, const char* recorded_by,
                 const char* compared) {
    size_t bad = 0;
    for (size_t j = 0; j < per_batch_; ++j) {
      const float* want = &rows_[(b * per_batch_ + j) * dim_];
      const float* got = out + position(b, j) * dim_;
      if (std::memcmp(want, got, dim_ * sizeof(float)) == 0) continue;
      if (bad++ == 0 && first_mismatch_.empty()) {
        uint32_t c = 0;
        while (c < dim_ && std::memcmp(&want[c], &got[c], sizeof(float)) == 0) ++c;
        first_mismatch_ =
            fmt::format("batch {} position {} key {} column {}: {} {}, {} {}", b, position(b, j),
                        keys[position(b, j)], c, recorded_by, want[c], compared, got[c]);
      }
    }
    return bad;
  }

  const std::string& first_mismatch() const { return first_mismatch_; }

 private:
  size_t position(size_t b, size_t j) const { return positions_[b * per_batch_ + j]; }

  size_t per_batch_;
  uint32_t dim_;
  std::vector<size_t> positions_;
  std::vector<float> rows_;
  std::string first_mismatch_;
};

struct PassResult {
  Elapsed time;
  uint64_t checksum = 0;  // of every row returned, in order
};

enum Side { kEmbstore = 0, kNaive = 1 };
constexpr const char* kSideNames[] = {"embstore", "naive"};

// One repetition: [side] for each pass.
struct Rep {
  PassResult insert[2], find[2];
  uint64_t rows[2] = {};
  size_t mismatched_rows = 0;
};

// Median of f(rep) over the repetitions.
template <typename F>
double median_of(const std::vector<Rep>& reps, F&& f) {
  std::vector<double> v;
  for (const Rep& r : reps) v.push_back(f(r));
  return median(std::move(v));
}

class LookupScenario final : public Scenario {
 public:
  const char* name() const override { return "lookup"; }
  const char* description() const override {
    return "find-or-insert and find throughput on a Zipf stream vs std::unordered_map";
  }

  void add_options(CLI::App& app) override {
    app.add_option("--optimizer", optimizer_,
                   "optimizer of the table: its state is initialized with each new row")
        ->check(CLI::IsMember(optimizer_names()))
        ->capture_default_str();
    app.add_option("--repeat", repeat_, "comparisons on fresh stores; medians are reported")
        ->check(CLI::Range(1, 1000))
        ->capture_default_str();
  }

  int run(const CommonOptions& o, Report& report) override {
    batches_ = o.steps;
    total_ = batches_ * o.batch;
    const Stopwatch generation;
    keys_ = zipf_key_stream(total_, o.key_space, o.zipf, o.seed);
    const double generation_seconds = generation.seconds();

    std::vector<Rep> reps;
    RowSample sample(batches_, o.batch, o.dim, o.seed);
    for (size_t i = 0; i < repeat_; ++i) {
      reps.push_back(run_once(o, i % 2 == 1, sample));
      // The freed naive map stays in the heap, already faulted in, while the table's arena
      // goes back to the kernel: give it back too, or later repetitions favour the naive side.
      malloc_trim(0);
    }

    const auto rate = [&](double seconds) { return total_ / seconds; };
    const double insert_rate =
        median_of(reps, [&](const Rep& r) { return rate(r.insert[kEmbstore].time.wall); });
    const double insert_naive_rate =
        median_of(reps, [&](const Rep& r) { return rate(r.insert[kNaive].time.wall); });
    const double find_rate =
        median_of(reps, [&](const Rep& r) { return rate(r.find[kEmbstore].time.wall); });
    const double find_naive_rate =
        median_of(reps, [&](const Rep& r) { return rate(r.find[kNaive].time.wall); });
    // Speedups are paired within a repetition, then the median is taken.
    std::vector<double> speedups, find_speedups;
    for (const Rep& r : reps) {
      speedups.push_back(r.insert[kNaive].time.wall / r.insert[kEmbstore].time.wall);
      find_speedups.push_back(r.find[kNaive].time.wall / r.find[kEmbstore].time.wall);
    }
    const double speedup = median(speedups), find_speedup = median(find_speedups);
    const double cpu_speedup = median_of(reps, [](const Rep& r) {
      return r.insert[kNaive].time.cpu / r.insert[kEmbstore].time.cpu;
    });
    const double find_cpu_speedup = median_of(
        reps, [](const Rep& r) { return r.find[kNaive].time.cpu / r.find[kEmbstore].time.cpu; });

    // Every pass of every repetition must return the same rows.
    const uint64_t checksum = reps[0].insert[kEmbstore].checksum;
    size_t mismatched = 0;
    bool checksums_equal = true, rows_equal = true;
    for (const Rep& r : reps) {
      mismatched += r.mismatched_rows;
      for (int side : {kEmbstore, kNaive}) {
        checksums_equal = checksums_equal && r.insert[side].checksum == checksum &&
                          r.find[side].checksum == checksum;
      }
      rows_equal = rows_equal && r.rows[kEmbstore] == r.rows[kNaive];
    }
    const bool ok = mismatched == 0 && checksums_equal && rows_equal;

    report.say(
        "lookup: embstore {}keys/s, naive {}keys/s, speedup {:.2f}x  (find-or-insert; "
        "cpu-time speedup {:.2f}x)",
        si(insert_rate), si(insert_naive_rate), speedup, cpu_speedup);
    report.say(
        "find:   embstore {}keys/s, naive {}keys/s, speedup {:.2f}x  (find only; cpu-time "
        "speedup {:.2f}x)",
        si(find_rate), si(find_naive_rate), find_speedup, find_cpu_speedup);
    std::string per_rep;
    for (size_t i = 0; i < reps.size(); ++i) {
      per_rep += fmt::format(" {:.2f}/{:.2f}", speedups[i], find_speedups[i]);
    }
    report.say("        medians of {} repetitions; speedups find-or-insert/find:{}", repeat_,
               per_rep);
    report.say(
        "        {} keys in {} batches of {}, dim {}, zipf {} over {} keys -> {} rows ({}); "
        "backend {}, {} thread(s); naive on 1 thread",
        total_, batches_, o.batch, o.dim, o.zipf, o.key_space, reps[0].rows[kEmbstore], optimizer_,
        backend_name(backend_), o.threads);
    if (ok) {
      report.say("check:  identical: {} sampled rows per pass, output checksum {:016x}",
                 sample.rows(), checksum);
    } else {
      report.say("check:  MISMATCH: {} sampled rows differ, checksums {}, row counts {}; first: {}",
                 mismatched, checksums_equal ? "equal" : "differ", rows_equal ? "equal" : "differ",
                 sample.first_mismatch().empty() ? "-" : sample.first_mismatch());
    }

    report_common(report, o, backend_);
    report.set("optimizer", optimizer_);
    report.set("repeat", repeat_);
    report.set("keys", total_);
    report.set("rows", reps[0].rows[kEmbstore]);
    report.set("initial_capacity", initial_capacity_);
    report.set("capacity", capacity_);
    report.set("stream_generation_seconds", generation_seconds);
    // The same figures for both passes; the find pass's keys carry a "find_" prefix.
    auto report_pass = [&](const std::string& p, double rate, double naive_rate, double median,
                           const std::vector<double>& all, double cpu) {
      report.set(p + "embstore_seconds", total_ / rate);
      report.set(p + "naive_seconds", total_ / naive_rate);
      report.set(p + "embstore_keys_per_second", rate);
      report.set(p + "naive_keys_per_second", naive_rate);
      report.set(p + "speedup", median);
      report.set(p + "speedup_min", *std::min_element(all.begin(), all.end()));
      report.set(p + "speedup_max", *std::max_element(all.begin(), all.end()));
      report.set(p + "speedup_cpu", cpu);
    };
    report_pass("", insert_rate, insert_naive_rate, speedup, speedups, cpu_speedup);
    report_pass("find_", find_rate, find_naive_rate, find_speedup, find_speedups, find_cpu_speedup);
    report.set("sampled_rows", 2 * repeat_ * sample.rows());
    report.set("mismatched_rows", mismatched);
    report.set("checksums_equal", checksums_equal);
    report.set("checksum", fmt::format("{:016x}", checksum));
    report.set("identical", ok);
    return ok ? 0 : kExitMismatch;
  }

 private:
  // One comparison on a fresh store and a fresh naive map. Timing is per batch, so checksums
  // and samples stay outside the measured time.
  Rep run_once(const CommonOptions& o, bool naive_first, RowSample& sample) {
    Store store(o);
    backend_ = store.backend();
    embstore_table_t* table =
        create_table(store, "perf_lookup", o.dim, optimizer_from_name(optimizer_));
    initial_capacity_ = table_stats(table).capacity;
    if (device_keys_ == nullptr) {
      // Keys live where the backend reads them for the whole run, so no copy is timed.
      device_keys_ = std::make_unique<BackendBuffer<int64_t>>(backend_, total_);
      device_keys_->upload(keys_.data(), total_);
      out_ = std::make_unique<BackendBuffer<float>>(backend_, o.batch * o.dim);
      naive_out_.resize(o.batch * o.dim);
    }
    NaiveStore naive(o.dim, table->impl->spec().init, table->impl->spec().opt);

    Rep rep;
    auto pass = [&](Side side, bool insert, bool first) {
      PassResult r;
      for (size_t b = 0; b < batches_; ++b) {
        const int64_t* batch_keys = keys_.data() + b * o.batch;
        const Stopwatch t;
        if (side == kEmbstore) {
          check(embstore_lookup(table, device_keys_->data() + b * o.batch, o.batch, out_->data(),
                                insert ? EMBSTORE_LOOKUP_INSERT : 0, nullptr),
                "embstore_lookup");
          backend_sync(backend_);
        } else if (insert) {
          naive.find_or_insert(batch_keys, o.batch, naive_out_.data());
        } else {
          naive.find(batch_keys, o.batch, naive_out_.data());
        }
        r.time += t.elapsed();
        const float* view =
            side == kEmbstore ? out_->host_view(0, o.batch * o.dim, scratch_) : naive_out_.data();
        r.checksum = checksum_floats(view, o.batch * o.dim, r.checksum);
        if (first) {
          sample.record(b, view);
        } else {
          rep.mismatched_rows +=
              sample.compare(b, view, batch_keys, kSideNames[1 - side], kSideNames[side]);
        }
      }
      return r;
    };
    const Side a = naive_first ? kNaive : kEmbstore, b = naive_first ? kEmbstore : kNaive;
    rep.insert[a] = pass(a, true, true);
    rep.insert[b] = pass(b, true, false);
    const embstore_table_stats_t stats = table_stats(table);
    rep.rows[kEmbstore] = stats.rows;
    rep.rows[kNaive] = naive.rows();
    capacity_ = stats.capacity;
    rep.find[a] = pass(a, false, true);
    rep.find[b] = pass(b, false, false);
    return rep;
  }

  std::string optimizer_ = "adagrad";  // the table default
  size_t repeat_ = 3;

  size_t batches_ = 0, total_ = 0;
  std::vector<int64_t> keys_;
  embstore_backend_t backend_ = EMBSTORE_BACKEND_HOST;
  std::unique_ptr<BackendBuffer<int64_t>> device_keys_;
  std::unique_ptr<BackendBuffer<float>> out_;
  std::vector<float> naive_out_, scratch_;
  uint64_t initial_capacity_ = 0, capacity_ = 0;
};

}  // namespace

std::unique_ptr<Scenario> make_lookup_scenario() { return std::make_unique<LookupScenario>(); }

}  // namespace embstore::perf
