// Whole rows moved between tables (Table::take_rows, take_coldest, put_rows; the primitives of a
// stack of tables, host/table/stacked_table.hpp), on host tables: a row keeps its values,
// optimizer state, stamp and dirty bit; neither table counts an insert or an eviction; the
// coldest rows go first, sparing the rows asked; a put of a held key changes nothing.
#include <embstore/embstore.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "host/backend/backends.hpp"
#include "host/error.hpp"
#include "host/store/thread_pool.hpp"
#include "host/table/table.hpp"

namespace {

embstore::TableSpec spec_for(const char* name) {
  embstore_table_config_t c;
  embstore_table_config_init(&c);
  c.name = name;
  c.dim = 4;
  c.optimizer = EMBSTORE_OPT_ADAGRAD;
  c.init = EMBSTORE_INIT_UNIFORM;
  c.init_a = -0.5f;
  c.init_b = 0.5f;
  c.learning_rate = 0.05f;
  return embstore::make_table_spec(c);
}

std::vector<uint8_t> held(embstore::Table& t, const std::vector<int64_t>& keys) {
  std::vector<uint8_t> out(keys.size(), 7);
  t.find_held(keys.data(), keys.size(), out.data());
  return out;
}

}  // namespace

TEST_CASE("rows moved between tables keep their values, stamps and dirty bits", "[table][moves]") {
  embstore::ThreadPool pool(1);
  std::unique_ptr<embstore::Table> a = embstore::make_host_table(spec_for("a"), pool);
  std::unique_ptr<embstore::Table> b = embstore::make_host_table(spec_for("b"), pool);
  // Keys 0..99, key k created at step k + 1 (its stamp); keys 0..9 updated at step 200.
  std::vector<float> values(4);
  for (int64_t k = 0; k < 100; ++k) {
    a->lookup(&k, 1, values.data(), true, static_cast<uint64_t>(k + 1), nullptr);
  }
  std::vector<int64_t> hot(10);
  for (int64_t k = 0; k < 10; ++k) hot[k] = k;
  const std::vector<float> grads(hot.size() * 4, 0.5f);
  a->apply_gradients(hot.data(), grads.data(), hot.size(), 200, nullptr);
  std::vector<int64_t> all(100);
  for (int64_t k = 0; k < 100; ++k) all[k] = k;
  std::vector<float> before(all.size() * 4);
  a->lookup(all.data(), all.size(), before.data(), false, 200, nullptr);
  const embstore::TableCounters a_before = a->counters();
  REQUIRE(a->live_rows() == 100);

  // The coldest: stamps 1, 2, ... but keys 0..9 are hot (stamp 200) and 10, 11 are spared.
  embstore::MovedRows moved;
  const std::vector<int64_t> spare = {10, 11, 5000};  // 5000: no row, ignored
  a->take_coldest(5, 1000, spare.data(), spare.size(), &moved);
  REQUIRE(moved.size() == 5);
  REQUIRE(moved.keys == std::vector<int64_t>{12, 13, 14, 15, 16});
  REQUIRE(moved.steps == std::vector<uint64_t>{13, 14, 15, 16, 17});
  for (const uint8_t d : moved.dirty) REQUIRE(d == 1);        // new rows, never checkpointed
  for (const uint8_t c : moved.in_snapshot) REQUIRE(c == 0);  // no snapshot in flight
  // Then two hot rows by key, and a key without a row (skipped).
  const std::vector<int64_t> take = {3, 4, 777};
  a->take_rows(take.data(), take.size(), &moved);
  REQUIRE(moved.size() == 7);
  REQUIRE(moved.steps[5] == 200);
  const uint32_t stride = a->spec().stride();
  REQUIRE(moved.records.size() == moved.size() * stride);
  for (size_t i = 0; i < moved.size(); ++i) {
    const int64_t k = moved.keys[i];
    REQUIRE(std::memcmp(moved.records.data() + i * stride, before.data() + k * 4,
                        4 * sizeof(float)) == 0);
    // Adagrad's accumulator came too: grown where the row was updated (keys 0..9), else 0.
    REQUIRE((moved.records[i * stride + 4] != 0) == (k < 10));
  }
  const embstore::TableCounters a_after = a->counters();
  REQUIRE(a_after.rows == 93);
  REQUIRE(a_after.evicted == a_before.evicted);  // a move is not an eviction
  REQUIRE(a_after.inserted == a_before.inserted);
  REQUIRE(a_after.dirty_rows == a_before.dirty_rows - 7);
  REQUIRE(held(*a, {3, 12, 20}) == std::vector<uint8_t>{0, 0, 1});

  b->reserve_put(moved.size());
  b->put_rows(moved);
  const embstore::TableCounters b_after = b->counters();
  REQUIRE(b_after.rows == 7);
  REQUIRE(b_after.inserted == 0);  // nor a put an insert
  REQUIRE(b_after.dirty_rows == 7);
  REQUIRE(held(*b, {3, 12, 20}) == std::vector<uint8_t>{1, 1, 0});
  std::vector<float> got(moved.size() * 4);
  b->lookup(moved.keys.data(), moved.size(), got.data(), false, 300, nullptr);
  for (size_t i = 0; i < moved.size(); ++i) {
    REQUIRE(std::memcmp(got.data() + i * 4, before.data() + moved.keys[i] * 4, 4 * sizeof(float)) ==
            0);
  }
  // Its stamps came along: b's coldest is a's coldest moved.
  embstore::MovedRows back;
  b->take_coldest(1, 1000, nullptr, 0, &back);
  REQUIRE(back.keys == std::vector<int64_t>{12});

  // A put of a key the table holds is a bug of the caller's: refused, nothing put.
  embstore::MovedRows again;
  again.keys = {20, 5001};
  again.steps = {1, 1};
  again.dirty = {0, 0};
  again.records.assign(2 * stride, 1.0f);
  REQUIRE_THROWS_AS(a->put_rows(again), embstore::Error);
  REQUIRE(a->live_rows() == 93);
  REQUIRE(held(*a, {5001}) == std::vector<uint8_t>{0});
}
