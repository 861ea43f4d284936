// The host backend faults the initial capacity of a table a user creates in on a thread of its
// own (Table::prefault_initial_capacity): the memory arrives without the caller's lookups paying
// for it, the rows inserted meanwhile are exactly those of a table without the prefault, and a
// table built as a restore builds it (its initial_capacity read from a manifest) commits nothing.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <thread>
#include <vector>

#include "host/backend/backends.hpp"
#include "host/backend/host_buffer.hpp"
#include "host/store/thread_pool.hpp"
#include "support/backend.hpp"

using namespace embstore_test;

namespace {

// This process's resident bytes (/proc/self/statm's second field, in pages).
uint64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

embstore_table_config_t big_table(const char* name, uint64_t initial_capacity) {
  embstore_table_config_t c = table_config(name, 64);
  c.optimizer = EMBSTORE_OPT_ADAGRAD;  // 128 floats a row: 512 bytes
  c.initial_capacity = initial_capacity;
  c.seed = 5;
  return c;
}

constexpr uint64_t kRowBytes = 512;

// Waits up to `seconds` for this process's resident bytes to grow by `bytes` over `before`;
// returns the growth last seen.
uint64_t wait_for_growth(uint64_t before, uint64_t bytes, int seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  uint64_t grown = 0;
  do {
    const uint64_t now = resident_bytes();
    grown = now > before ? now - before : 0;
    if (grown >= bytes) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (std::chrono::steady_clock::now() < deadline);
  return grown;
}

// Whether this run can see a prefault: the host backend (device memory is allocated whole at
// create) on a kernel with MADV_POPULATE_WRITE (before 5.14 pages arrive at their first touch).
bool prefault_observable() {
  if (backend() != EMBSTORE_BACKEND_HOST) {
    SUCCEED("host backend only: device memory is allocated whole at create");
    return false;
  }
  if (!embstore::HostBuffer::can_populate()) {
    WARN("this kernel has no MADV_POPULATE_WRITE: pages arrive at their first touch");
    return false;
  }
  return true;
}

}  // namespace

TEST_CASE("a host table's initial capacity is faulted in behind the caller's back",
          "[table][prefault]") {
  if (!prefault_observable()) return;
  StoreGuard store(make_store());
  const uint64_t rows = uint64_t{1} << 18;  // 128 MiB of rows
  const uint64_t before = resident_bytes();
  embstore_table_t* t = make_table(store, big_table("t", rows));
  // Nothing touches the rows here: only the prefault can make them resident.
  const uint64_t grown = wait_for_growth(before, rows * kRowBytes * 9 / 10, 60);
  INFO("resident bytes grew by " << grown);
  REQUIRE(grown >= rows * kRowBytes * 9 / 10);
  REQUIRE(stats(t).rows == 0);
}

TEST_CASE("rows inserted while the prefault runs equal those of a table without it",
          "[table][prefault]") {
  StoreGuard store(make_store());
  // 1M rows up front (512 MiB): the prefault is still running while the inserts below go on.
  embstore_table_t* big = make_table(store, big_table("big", uint64_t{1} << 20));
  embstore_table_t* small = make_table(store, big_table("small", 0));  // the default: 1024
  std::vector<int64_t> keys(50000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = static_cast<int64_t>(i * 7919) - 100000;
  for (size_t from = 0; from < keys.size(); from += 5000) {
    const std::vector<int64_t> batch(keys.begin() + from, keys.begin() + from + 5000);
    REQUIRE(lookup_ok(big, batch) == lookup_ok(small, batch));
    apply_ok(big, batch, std::vector<float>(batch.size() * 64, 0.5f));
    apply_ok(small, batch, std::vector<float>(batch.size() * 64, 0.5f));
  }
  REQUIRE(lookup_ok(big, keys, 0) == lookup_ok(small, keys, 0));
  REQUIRE(stats(big).rows == keys.size());
}

TEST_CASE("a store destroyed while a table's prefault runs", "[table][prefault]") {
  for (int round = 0; round < 3; ++round) {
    StoreGuard store(make_store());
    embstore_table_t* t = make_table(store, big_table("t", uint64_t{1} << 20));
    REQUIRE(lookup_ok(t, {1, 2, 3}).size() == 3 * 64);
  }  // the table goes with its store: the prefault stops before its memory is unmapped
}

TEST_CASE("a host table built as a restore builds it faults nothing in", "[table][prefault]") {
  if (!prefault_observable()) return;
  // A restore makes its tables from the manifest's spec, then reserve()s the rows it loads: a
  // large initial_capacity on disk reserves address space, not memory. Compared with the same
  // table asked to prefault (what embstore_table_create does), since the process's resident
  // memory also grows by what a sanitizer keeps beside the index.
  embstore::ThreadPool pool(2);
  const uint64_t rows = uint64_t{1} << 18;  // 128 MiB of rows
  const embstore::TableSpec spec = embstore::make_table_spec(big_table("t", rows));
  uint64_t before = resident_bytes();
  auto restored = embstore::make_host_table(spec, pool);
  const uint64_t grown_restored = wait_for_growth(before, rows * kRowBytes * 9 / 10, 2);
  before = resident_bytes();
  auto created = embstore::make_host_table(spec, pool);
  created->prefault_initial_capacity();
  const uint64_t grown_created = wait_for_growth(before, rows * kRowBytes * 9 / 10, 60);
  INFO("resident bytes grew by " << grown_restored << " (as a restore's) and " << grown_created
                                 << " (as a user's)");
  REQUIRE(grown_created >= grown_restored + rows * kRowBytes / 2);
}
