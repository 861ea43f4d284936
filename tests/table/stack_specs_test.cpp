// A stack of tables' two specs (host/table/stacked_table.hpp, stack_specs): the budgets split
// between them, the row limit the stack's own, admission counted above and, with a row limit, on
// the host; and the upper table's admission preview (Table::count_admission) on a host table.
#include <embstore/embstore.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <vector>

#include "host/backend/backends.hpp"
#include "host/error.hpp"
#include "host/store/thread_pool.hpp"
#include "host/table/stacked_table.hpp"
#include "host/table/table.hpp"

namespace {

embstore::TableSpec spec_with(uint64_t device_rows, uint64_t memory_rows, uint64_t max_capacity,
                              uint32_t admit_after) {
  embstore_table_config_t c;
  embstore_table_config_init(&c);
  c.name = "emb";
  c.dim = 4;
  c.optimizer = EMBSTORE_OPT_ADAGRAD;
  c.initial_capacity = 5000;
  c.device_rows = device_rows;
  c.memory_rows = memory_rows;
  c.max_capacity = max_capacity;
  c.evict_when_full = max_capacity != 0 ? 1 : 0;
  c.admit_after = admit_after;
  embstore::TableSpec s = embstore::make_table_spec(c);
  s.tier_dir = "/var/tmp";  // the store's, copied into every tiered table's spec
  return s;
}

}  // namespace

TEST_CASE("a stack's specs split the budgets and keep the row limit the stack's",
          "[table][moves]") {
  const embstore::StackSpecs s = embstore::stack_specs(spec_with(100, 800, 0, 0));
  // An eighth of memory_rows below, in memory over the SSD tier; the rest above, beside the
  // device rows.
  REQUIRE(s.lower.memory_rows == 100);
  REQUIRE(s.lower.device_rows == 0);
  REQUIRE(s.lower.tier_dir == "/var/tmp");
  REQUIRE(s.upper_rows == 100 + 800 - 100);
  REQUIRE(s.upper.device_rows == 100);
  REQUIRE(s.upper.memory_rows == 0);
  REQUIRE(s.upper.tier_dir.empty());
  REQUIRE(s.upper.gives_rows);
  REQUIRE(s.upper.initial_capacity == s.upper_rows);  // 5000 asked: capped at its budget
  REQUIRE_FALSE(s.upper.counts_on_host);
  // At least one row below.
  REQUIRE(embstore::stack_specs(spec_with(0, 3, 0, 0)).lower.memory_rows == 1);

  // The row limit: neither table has one (the stack's own, over both).
  const embstore::StackSpecs limited = embstore::stack_specs(spec_with(0, 800, 5000, 0));
  for (const embstore::TableSpec* t : {&limited.upper, &limited.lower}) {
    REQUIRE(t->max_capacity == 0);
    REQUIRE_FALSE(t->evict_when_full);
  }
  REQUIRE_FALSE(limited.upper.counts_on_host);
}

TEST_CASE("a stack counts admission above, on the host when it has a row limit",
          "[table][moves][admission]") {
  const embstore::StackSpecs admits = embstore::stack_specs(spec_with(0, 800, 0, 3));
  REQUIRE(admits.upper.admit_after == 3);
  REQUIRE(admits.lower.admit_after == 0);  // every key is first met above
  REQUIRE_FALSE(admits.upper.counts_on_host);
  const embstore::StackSpecs both = embstore::stack_specs(spec_with(0, 800, 5000, 3));
  REQUIRE(both.upper.counts_on_host);
  REQUIRE(both.lower.admit_after == 0);
}

TEST_CASE("a host table previews a call's admissions, and counts a refused call's keys",
          "[table][moves][admission]") {
  embstore::ThreadPool pool(1);
  std::unique_ptr<embstore::Table> t = embstore::make_host_table(spec_with(0, 0, 0, 3), pool);
  // Key 1 seen twice, key 2 once, key 3 three times in one call.
  const std::vector<int64_t> first = {1, 1, 2, 3, 3, 3};
  REQUIRE(t->count_admission(first.data(), first.size(), 1, false) == 1);  // key 3
  REQUIRE(t->counters().pending_admission == 0);  // the preview counted nothing
  REQUIRE(t->count_admission(first.data(), first.size(), 1, true) == 1);
  REQUIRE(t->counters().pending_admission == 3);  // counted, none admitted (no row inserted)
  REQUIRE(t->counters().rows == 0);
  // Now key 1 needs one more occurrence, key 2 two, key 3 is at the threshold.
  const std::vector<int64_t> next = {1, 2, 3};
  REQUIRE(t->count_admission(next.data(), next.size(), 2, false) == 2);
  // The lookup that follows admits what the preview said.
  std::vector<float> out(next.size() * 4);
  t->lookup(next.data(), next.size(), out.data(), true, 2, nullptr);
  REQUIRE(t->counters().rows == 2);
  REQUIRE(t->counters().pending_admission == 1);  // key 2

  // A table that does not count admission cannot be asked.
  std::unique_ptr<embstore::Table> plain = embstore::make_host_table(spec_with(0, 0, 0, 0), pool);
  try {
    plain->count_admission(next.data(), next.size(), 2, false);
    FAIL("counted on a table without admission");
  } catch (const embstore::Error& e) {
    REQUIRE(e.status() == EMBSTORE_INTERNAL);
  }
}
