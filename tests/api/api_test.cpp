// The C API's contract: lifecycle, defaults, status names, and a status plus a message for
// every bad argument.
#include <algorithm>
#include <catch2/catch.hpp>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "support/backend.hpp"

using namespace embstore_test;

namespace {

// The call failed with `status` and said why.
void require_failed(embstore_status_t got, embstore_status_t status, const char* mentions) {
  INFO("last_error: " << embstore_last_error());
  REQUIRE(embstore_status_name(got) == std::string(embstore_status_name(status)));
  REQUIRE(std::string(embstore_last_error()).find(mentions) != std::string::npos);
}

}  // namespace

TEST_CASE("version and status names", "[api]") {
  REQUIRE(embstore_version() == EMBSTORE_VERSION_CODE);
  REQUIRE(std::string(embstore_status_name(EMBSTORE_OK)) == "EMBSTORE_OK");
  REQUIRE(std::string(embstore_status_name(EMBSTORE_CORRUPT)) == "EMBSTORE_CORRUPT");
  REQUIRE(std::string(embstore_status_name(EMBSTORE_INTERNAL)) == "EMBSTORE_INTERNAL");
  REQUIRE(std::string(embstore_status_name(static_cast<embstore_status_t>(99))) ==
          "EMBSTORE_UNKNOWN_STATUS");
  // The numbers are part of the ABI.
  REQUIRE(EMBSTORE_INVALID_ARGUMENT == 1);
  REQUIRE(EMBSTORE_CAPACITY_EXCEEDED == 5);
  REQUIRE(EMBSTORE_INTERNAL == 11);
  REQUIRE(EMBSTORE_COMM_ERROR == 12);
  REQUIRE(std::string(embstore_status_name(EMBSTORE_COMM_ERROR)) == "EMBSTORE_COMM_ERROR");
  for (int s = 0; s <= 12; ++s) {
    const std::string name = embstore_status_name(static_cast<embstore_status_t>(s));
    REQUIRE(name.rfind("EMBSTORE_", 0) == 0);
    REQUIRE(name != "EMBSTORE_UNKNOWN_STATUS");
  }
}

TEST_CASE("config defaults", "[api]") {
  embstore_store_config_t sc;
  std::memset(&sc, 0xAB, sizeof(sc));
  embstore_store_config_init(&sc);
  REQUIRE(sc.struct_size == sizeof(sc));
  REQUIRE(sc.backend == EMBSTORE_BACKEND_AUTO);
  REQUIRE(sc.world_size == 1);
  REQUIRE(sc.rank == 0);
  REQUIRE(sc.nccl_comm == nullptr);
  REQUIRE(sc.staging_bytes > 0);
  REQUIRE(sc.io_queue_depth > 0);
  REQUIRE(sc.host_threads == 0);
  REQUIRE(sc.restore_spill == EMBSTORE_SPILL_AUTO);
  REQUIRE(sc.spill_dir == nullptr);
  REQUIRE(sc.mpi_comm == nullptr);
  REQUIRE(sc.comm_callbacks == nullptr);
  embstore_comm_callbacks_t cb;
  std::memset(&cb, 0xAB, sizeof(cb));
  embstore_comm_callbacks_init(&cb);
  REQUIRE(cb.struct_size == sizeof(cb));
  REQUIRE(cb.context == nullptr);
  REQUIRE(cb.all_gather == nullptr);
  REQUIRE(cb.all_to_all == nullptr);
  embstore_comm_callbacks_init(nullptr);

  embstore_table_config_t tc;
  std::memset(&tc, 0xAB, sizeof(tc));
  embstore_table_config_init(&tc);
  REQUIRE(tc.struct_size == sizeof(tc));
  REQUIRE(tc.name == nullptr);
  REQUIRE(tc.dim == 0);
  REQUIRE(tc.optimizer == EMBSTORE_OPT_ADAGRAD);
  REQUIRE(tc.learning_rate > 0.0f);
  REQUIRE(tc.max_capacity == 0);

  embstore_store_config_init(nullptr);  // no-op, no crash
  embstore_table_config_init(nullptr);
  embstore_checkpoint_policy_init(nullptr);
  embstore_warm_start_source_init(nullptr);
}

TEST_CASE("store lifecycle", "[api]") {
  embstore_store_t* store = make_store();
  REQUIRE(embstore_store_backend(store) == backend());
  REQUIRE(embstore_store_destroy(store) == EMBSTORE_OK);
  REQUIRE(embstore_store_destroy(nullptr) == EMBSTORE_OK);

  // NULL config: defaults (AUTO resolves to a concrete backend).
  embstore_store_t* auto_store = nullptr;
  REQUIRE(embstore_store_create(nullptr, &auto_store) == EMBSTORE_OK);
  const embstore_backend_t b = embstore_store_backend(auto_store);
  REQUIRE((b == EMBSTORE_BACKEND_HOST || b == EMBSTORE_BACKEND_CUDA));
  embstore_store_destroy(auto_store);
}

TEST_CASE("embstore_shard_of: the documented hash, world size 0 taken as 1", "[api]") {
  REQUIRE(embstore_shard_of(0, 0) == 0);
  REQUIRE(embstore_shard_of(-1, 1) == 0);
  // Values of the header's formula (computed outside the library; more in row_test).
  REQUIRE(embstore_shard_of(0, 1000) == 582);
  REQUIRE(embstore_shard_of(-1, 3) == 2);
  REQUIRE(embstore_shard_of(123456789, 8) == 6);
}

TEST_CASE("bad store arguments", "[api]") {
  require_failed(embstore_store_create(nullptr, nullptr), EMBSTORE_INVALID_ARGUMENT, "store_out");

  embstore_store_config_t c;
  embstore_store_t* store = reinterpret_cast<embstore_store_t*>(0x1);
  embstore_store_config_init(&c);
  c.struct_size = 8;
  require_failed(embstore_store_create(&c, &store), EMBSTORE_INVALID_ARGUMENT, "struct_size");
  REQUIRE(store == nullptr);

  embstore_store_config_init(&c);
  c.backend = static_cast<embstore_backend_t>(7);
  require_failed(embstore_store_create(&c, &store), EMBSTORE_INVALID_ARGUMENT, "backend");

  embstore_store_config_init(&c);
  c.restore_spill = static_cast<embstore_spill_t>(3);
  require_failed(embstore_store_create(&c, &store), EMBSTORE_INVALID_ARGUMENT, "restore_spill");

  // A config of 0.4.0's size (without restore_spill and later): the later fields' defaults, and
  // nothing read past it (the rest of this buffer would be an unknown restore_spill).
  std::vector<unsigned char> old_config(sizeof(c), 0xAB);
  embstore_store_config_init(&c);
  c.backend = EMBSTORE_BACKEND_HOST;
  c.struct_size = offsetof(embstore_store_config_t, restore_spill);
  std::memcpy(old_config.data(), &c, c.struct_size);
  REQUIRE(embstore_store_create(reinterpret_cast<embstore_store_config_t*>(old_config.data()),
                                &store) == EMBSTORE_OK);
  embstore_store_destroy(store);
  store = nullptr;

  embstore_store_config_init(&c);
  c.host_threads = -1;
  require_failed(embstore_store_create(&c, &store), EMBSTORE_INVALID_ARGUMENT, "host_threads");
  // At most 4 a core (at least 16): 100,000 used to start about 32k threads, or deadlock
  // where thread creation failed part-way.
  c.host_threads = 100000;
  require_failed(embstore_store_create(&c, &store), EMBSTORE_INVALID_ARGUMENT, "host_threads");
  c.host_threads = static_cast<int>(std::max(16u, 4 * std::thread::hardware_concurrency())) + 1;
  require_failed(embstore_store_create(&c, &store), EMBSTORE_INVALID_ARGUMENT, "4 per core");

  // Every limit the header documents.
  for (int depth : {0, -1, 4097}) {
    embstore_store_config_init(&c);
    c.io_queue_depth = depth;
    require_failed(embstore_store_create(&c, &store), EMBSTORE_INVALID_ARGUMENT,
                   "io_queue_depth must be 1..4096");
  }
  embstore_store_config_init(&c);
  c.io_queue_depth = 4096;
  c.backend = EMBSTORE_BACKEND_HOST;
  REQUIRE(embstore_store_create(&c, &store) == EMBSTORE_OK);
  embstore_store_destroy(store);
  store = nullptr;

  embstore_store_config_init(&c);
  c.staging_bytes = (size_t{1} << 20) - 1;
  require_failed(embstore_store_create(&c, &store), EMBSTORE_INVALID_ARGUMENT, "staging_bytes");

  embstore_store_config_init(&c);
  c.device = -1;
  require_failed(embstore_store_create(&c, &store), EMBSTORE_INVALID_ARGUMENT, "device");

  embstore_store_config_init(&c);
  c.rank = 2;
  c.world_size = 2;
  require_failed(embstore_store_create(&c, &store), EMBSTORE_INVALID_ARGUMENT, "rank");

  embstore_store_config_init(&c);
  c.world_size = 4;
  c.rank = 1;
  require_failed(embstore_store_create(&c, &store), EMBSTORE_INVALID_ARGUMENT, "communicator");
}

TEST_CASE("table create and get", "[api]") {
  StoreGuard store(make_store());
  embstore_table_config_t c = table_config("user_id", 16);
  embstore_table_t* t = make_table(store, c);
  REQUIRE(embstore_table_dim(t) == 16);
  REQUIRE(embstore_table_dim(nullptr) == 0);

  embstore_table_t* found = nullptr;
  REQUIRE(embstore_table_get(store, "user_id", &found) == EMBSTORE_OK);
  REQUIRE(found == t);

  embstore_table_t* dup = nullptr;
  require_failed(embstore_table_create(store, &c, &dup), EMBSTORE_ALREADY_EXISTS, "user_id");
  REQUIRE(dup == nullptr);

  require_failed(embstore_table_get(store, "item_id", &found), EMBSTORE_NOT_FOUND, "item_id");
  REQUIRE(found == nullptr);
  require_failed(embstore_table_get(store, nullptr, &found), EMBSTORE_INVALID_ARGUMENT, "name");
  require_failed(embstore_table_get(nullptr, "user_id", &found), EMBSTORE_INVALID_ARGUMENT,
                 "store");
  require_failed(embstore_table_get(store, "user_id", nullptr), EMBSTORE_INVALID_ARGUMENT,
                 "table_out");
}

TEST_CASE("bad table configs", "[api]") {
  StoreGuard store(make_store());
  embstore_table_t* t = nullptr;
  auto expect = [&](embstore_table_config_t c, embstore_status_t status, const char* mentions) {
    require_failed(embstore_table_create(store, &c, &t), status, mentions);
    REQUIRE(t == nullptr);
  };
  const embstore_table_config_t good = table_config("t", 8);

  require_failed(embstore_table_create(store, nullptr, &t), EMBSTORE_INVALID_ARGUMENT, "config");
  require_failed(embstore_table_create(nullptr, &good, &t), EMBSTORE_INVALID_ARGUMENT, "store");
  require_failed(embstore_table_create(store, &good, nullptr), EMBSTORE_INVALID_ARGUMENT,
                 "table_out");

  auto c = good;
  c.struct_size = sizeof(size_t);
  expect(c, EMBSTORE_INVALID_ARGUMENT, "struct_size");
  c = good;
  c.name = nullptr;
  expect(c, EMBSTORE_INVALID_ARGUMENT, "name");
  c.name = "";
  expect(c, EMBSTORE_INVALID_ARGUMENT, "name");
  c.name = "has space";
  expect(c, EMBSTORE_INVALID_ARGUMENT, "has space");
  c.name = "a/b";
  expect(c, EMBSTORE_INVALID_ARGUMENT, "a/b");
  c.name = "..";
  expect(c, EMBSTORE_INVALID_ARGUMENT, "reserved");
  const std::string long_name(129, 'x');
  c.name = long_name.c_str();
  expect(c, EMBSTORE_INVALID_ARGUMENT, "128");
  c = good;
  c.dim = 0;
  expect(c, EMBSTORE_INVALID_ARGUMENT, "dim");
  c.dim = 4097;
  expect(c, EMBSTORE_INVALID_ARGUMENT, "dim");
  c = good;
  c.initial_capacity = 100;
  c.max_capacity = 50;
  expect(c, EMBSTORE_INVALID_ARGUMENT, "max_capacity");
  c = good;
  c.optimizer = static_cast<embstore_optimizer_t>(9);
  expect(c, EMBSTORE_INVALID_ARGUMENT, "optimizer");
  c = good;
  c.learning_rate = -1.0f;
  expect(c, EMBSTORE_INVALID_ARGUMENT, "learning_rate");
  c = good;
  c.learning_rate = std::numeric_limits<float>::quiet_NaN();
  expect(c, EMBSTORE_INVALID_ARGUMENT, "learning_rate");
  c = good;
  c.optimizer = EMBSTORE_OPT_ADAM;
  c.beta1 = 1.0f;
  expect(c, EMBSTORE_INVALID_ARGUMENT, "beta");
  c = good;
  c.epsilon = 0.0f;
  c.initial_accumulator = 0.0f;
  expect(c, EMBSTORE_INVALID_ARGUMENT, "epsilon");
  c = good;
  c.init = static_cast<embstore_init_t>(12);
  expect(c, EMBSTORE_INVALID_ARGUMENT, "initializer");
  c = good;
  c.init = EMBSTORE_INIT_UNIFORM;
  c.init_a = 1.0f;
  c.init_b = 0.0f;
  expect(c, EMBSTORE_INVALID_ARGUMENT, "init_a <= init_b");
  c = good;
  c.init = EMBSTORE_INIT_NORMAL;
  c.init_b = -1.0f;
  expect(c, EMBSTORE_INVALID_ARGUMENT, "deviation");
  // Ranges whose float arithmetic overflows: every value would be infinite.
  c = good;
  c.init = EMBSTORE_INIT_UNIFORM;
  c.init_a = -3e38f;
  c.init_b = 3e38f;
  expect(c, EMBSTORE_INVALID_ARGUMENT, "overflows");
  c = good;
  c.init = EMBSTORE_INIT_NORMAL;
  c.init_a = 0.0f;
  c.init_b = 1e38f;
  expect(c, EMBSTORE_INVALID_ARGUMENT, "overflows");
  c = good;
  c.admit_bloom_bytes = 1 << 16;  // a filter with nothing to count
  expect(c, EMBSTORE_INVALID_ARGUMENT, "admit_bloom_bytes");
  c.admit_after = 2;
  c.admit_bloom_bytes = 63;
  expect(c, EMBSTORE_INVALID_ARGUMENT, "at least 64");
  c.admit_bloom_bytes = EMBSTORE_MAX_ADMIT_BLOOM_BYTES + 1;  // refused before any allocation
  expect(c, EMBSTORE_INVALID_ARGUMENT, "at most");
  c.admit_bloom_bytes = uint64_t{1} << 40;
  expect(c, EMBSTORE_INVALID_ARGUMENT, "16 GiB");
  c.admit_bloom_bytes = 64;
  c.admit_after = 256;  // one-byte counters
  expect(c, EMBSTORE_INVALID_ARGUMENT, "at most 255");
  c = good;
  c.evict_idle_seconds = -1.0;
  expect(c, EMBSTORE_INVALID_ARGUMENT, "evict_idle_seconds");
  c = good;
  c.evict_idle_seconds = std::numeric_limits<double>::quiet_NaN();
  expect(c, EMBSTORE_INVALID_ARGUMENT, "evict_idle_seconds");
  c = good;
  c.evict_when_full = 2;
  expect(c, EMBSTORE_INVALID_ARGUMENT, "evict_when_full");
  c = good;
  c.struct_size = offsetof(embstore_table_config_t, evict_idle_steps);
  expect(c, EMBSTORE_INVALID_ARGUMENT, "struct_size");

  // Nothing above created a table.
  embstore_table_t* found = nullptr;
  REQUIRE(embstore_table_get(store, "t", &found) == EMBSTORE_NOT_FOUND);
  // A good one still works after all the failures.
  make_table(store, good);
}

TEST_CASE("bad data path arguments", "[api]") {
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, table_config("t", 4));
  const int64_t key = 1;
  float out[4];
  const float grad[4] = {1, 1, 1, 1};

  require_failed(embstore_lookup(nullptr, &key, 1, out, 0, nullptr), EMBSTORE_INVALID_ARGUMENT,
                 "table");
  require_failed(embstore_lookup(t, nullptr, 1, out, 0, nullptr), EMBSTORE_INVALID_ARGUMENT,
                 "keys");
  require_failed(embstore_lookup(t, &key, 1, nullptr, 0, nullptr), EMBSTORE_INVALID_ARGUMENT,
                 "values_out");
  require_failed(embstore_lookup(t, &key, 1, out, 0x80, nullptr), EMBSTORE_INVALID_ARGUMENT,
                 "flags");
  require_failed(embstore_apply_gradients(nullptr, &key, grad, 1, nullptr),
                 EMBSTORE_INVALID_ARGUMENT, "table");
  require_failed(embstore_apply_gradients(t, nullptr, grad, 1, nullptr), EMBSTORE_INVALID_ARGUMENT,
                 "keys");
  require_failed(embstore_apply_gradients(t, &key, nullptr, 1, nullptr), EMBSTORE_INVALID_ARGUMENT,
                 "grads");
  require_failed(embstore_lookup(t, &key, size_t{1} << 33, out, 0, nullptr),
                 EMBSTORE_INVALID_ARGUMENT, "batch");
  // The documented limit: 2^32 - 1 keys a call; the refusal comes before any key is read.
  require_failed(embstore_lookup(t, &key, size_t{1} << 32, out, 0, nullptr),
                 EMBSTORE_INVALID_ARGUMENT, "at most 4294967295 per call");
  require_failed(embstore_apply_gradients(t, &key, grad, size_t{1} << 32, nullptr),
                 EMBSTORE_INVALID_ARGUMENT, "at most 4294967295 per call");

  // n == 0 is a no-op, with or without pointers.
  REQUIRE(embstore_lookup(t, nullptr, 0, nullptr, EMBSTORE_LOOKUP_INSERT, nullptr) == EMBSTORE_OK);
  REQUIRE(embstore_apply_gradients(t, nullptr, nullptr, 0, nullptr) == EMBSTORE_OK);
  REQUIRE(stats(t).rows == 0);

  require_failed(embstore_step(nullptr, 1), EMBSTORE_INVALID_ARGUMENT, "store");
  embstore_table_stats_t s;
  s.struct_size = 4;
  require_failed(embstore_table_stats(t, &s), EMBSTORE_INVALID_ARGUMENT, "struct_size");
  s.struct_size = offsetof(embstore_table_stats_t, admitted) - 1;
  require_failed(embstore_table_stats(t, &s), EMBSTORE_INVALID_ARGUMENT, "struct_size");
  // A caller built against 0.2 gets the fields it knows; the newer ones are left alone.
  s.struct_size = offsetof(embstore_table_stats_t, admitted);
  s.admitted = 12345;
  REQUIRE(embstore_table_stats(t, &s) == EMBSTORE_OK);
  REQUIRE(s.admitted == 12345);
  require_failed(embstore_table_stats(t, nullptr), EMBSTORE_INVALID_ARGUMENT, "out");
  require_failed(embstore_table_stats(nullptr, &s), EMBSTORE_INVALID_ARGUMENT, "table");
}

TEST_CASE("every int64 is a valid key", "[api]") {
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, table_config("t", 3));
  const std::vector<int64_t> keys = {INT64_MIN, INT64_MAX, -1, 0, 1, INT64_MIN + 1};
  const auto first = lookup_ok(t, keys);
  REQUIRE(stats(t).rows == keys.size());
  // They are distinct rows that read back the same.
  REQUIRE(lookup_ok(t, keys, 0) == first);
  REQUIRE(stats(t).rows == keys.size());
}

TEST_CASE("last_error is per thread and kept across successes", "[api]") {
  embstore_table_t* t = nullptr;
  REQUIRE(embstore_table_get(nullptr, "x", &t) == EMBSTORE_INVALID_ARGUMENT);
  const std::string msg = embstore_last_error();
  REQUIRE(msg.find("embstore_table_get") != std::string::npos);
  REQUIRE(embstore_version() > 0);
  REQUIRE(embstore_store_destroy(nullptr) == EMBSTORE_OK);
  REQUIRE(std::string(embstore_last_error()) == msg);

  std::string other;
  std::thread([&] { other = embstore_last_error(); }).join();
  REQUIRE(other.empty());
}

TEST_CASE("checkpoint calls check their arguments", "[api]") {
  StoreGuard store(make_store());
  uint64_t version = 0;
  require_failed(embstore_checkpoint(nullptr, "/tmp/x", EMBSTORE_CKPT_FULL, &version),
                 EMBSTORE_INVALID_ARGUMENT, "store");
  require_failed(
      embstore_checkpoint(store, "/tmp/x", static_cast<embstore_ckpt_kind_t>(5), &version),
      EMBSTORE_INVALID_ARGUMENT, "kind");
  require_failed(embstore_checkpoint(store, nullptr, EMBSTORE_CKPT_FULL, &version),
                 EMBSTORE_INVALID_ARGUMENT, "dir");
  require_failed(embstore_checkpoint(store, "", EMBSTORE_CKPT_FULL, &version),
                 EMBSTORE_INVALID_ARGUMENT, "dir is empty");
  require_failed(embstore_checkpoint_wait(store, 12345), EMBSTORE_NOT_FOUND, "12345");
  require_failed(embstore_checkpoint_wait(nullptr, 1), EMBSTORE_INVALID_ARGUMENT, "store");
  require_failed(embstore_restore(store, nullptr, EMBSTORE_LATEST, &version),
                 EMBSTORE_INVALID_ARGUMENT, "dir");
  require_failed(embstore_restore(store, "/nonexistent/embstore-ckpt", EMBSTORE_LATEST, &version),
                 EMBSTORE_NOT_FOUND, "does not exist");
  require_failed(embstore_checkpoint_attach(store, "rng", nullptr, 4), EMBSTORE_INVALID_ARGUMENT,
                 "data");
  require_failed(embstore_checkpoint_attach(store, "../x", "abcd", 4), EMBSTORE_INVALID_ARGUMENT,
                 "attachment name");
  require_failed(embstore_checkpoint_attach(store, nullptr, "abcd", 4), EMBSTORE_INVALID_ARGUMENT,
                 "attachment name");
  REQUIRE(embstore_checkpoint_attach(store, "empty", nullptr, 0) == EMBSTORE_OK);

  embstore_checkpoint_policy_t policy;
  embstore_checkpoint_policy_init(&policy);
  REQUIRE(policy.struct_size == sizeof(policy));
  REQUIRE(policy.dir == nullptr);
  REQUIRE(embstore_checkpoint_set_policy(store, &policy) == EMBSTORE_OK);  // off
  policy.full_every_steps = 10;
  require_failed(embstore_checkpoint_set_policy(store, &policy), EMBSTORE_INVALID_ARGUMENT,
                 "no dir");
  // set_policy makes its dir: one of the test's own, not a shared /tmp/x (a file there failed it)
  char dir[] = "/tmp/embstore-api-test-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  policy.dir = dir;
  policy.full_every_seconds = -1;
  require_failed(embstore_checkpoint_set_policy(store, &policy), EMBSTORE_INVALID_ARGUMENT,
                 "seconds");
  policy.full_every_seconds = std::nan("");
  require_failed(embstore_checkpoint_set_policy(store, &policy), EMBSTORE_INVALID_ARGUMENT,
                 "seconds");
  policy.full_every_seconds = 0;
  policy.rebaseline_fraction = -0.5;
  require_failed(embstore_checkpoint_set_policy(store, &policy), EMBSTORE_INVALID_ARGUMENT,
                 "seconds");
  REQUIRE(policy.max_chain_length == 32);
  policy.rebaseline_fraction = 0.5;
  policy.incremental_every_steps = 5;
  // A caller built before the rebaseline fields: accepted, with their defaults.
  policy.struct_size = offsetof(embstore_checkpoint_policy_t, max_chain_length);
  REQUIRE(embstore_checkpoint_set_policy(store, &policy) == EMBSTORE_OK);
  policy.full_every_steps = 0;
  policy.incremental_every_steps = 0;
  policy.dir = nullptr;
  REQUIRE(embstore_checkpoint_set_policy(store, &policy) == EMBSTORE_OK);  // off again
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  policy.struct_size = 8;
  require_failed(embstore_checkpoint_set_policy(store, &policy), EMBSTORE_INVALID_ARGUMENT,
                 "struct_size");

  embstore_checkpoint_stats_t cs;
  cs.struct_size = 4;
  require_failed(embstore_checkpoint_stats(store, &cs), EMBSTORE_INVALID_ARGUMENT, "struct_size");
  cs.struct_size = sizeof(cs);
  REQUIRE(embstore_checkpoint_stats(store, &cs) == EMBSTORE_OK);
  REQUIRE(cs.committed == 0);
  REQUIRE(cs.last_version == EMBSTORE_LATEST);

  embstore_warm_start_source_t src;
  embstore_warm_start_source_init(&src);
  REQUIRE(src.version == EMBSTORE_LATEST);
  REQUIRE(std::string(src.tables_regex) == ".*");
  REQUIRE(src.flags == 0);
  require_failed(embstore_warm_start(store, &src, 1), EMBSTORE_INVALID_ARGUMENT, "dir is NULL");
  src.dir = "/nonexistent/embstore-warm-start";
  require_failed(embstore_warm_start(store, &src, 1), EMBSTORE_NOT_FOUND, "embstore-warm-start");
  size_t bytes = 0;
  require_failed(embstore_restore_attachment(store, "rng", nullptr, 0, &bytes), EMBSTORE_NOT_FOUND,
                 "rng");
  require_failed(embstore_restore_attachment(store, "rng", nullptr, 0, nullptr),
                 EMBSTORE_INVALID_ARGUMENT, "bytes_out");
}
