// embstore_sharded_lookup and embstore_sharded_apply_gradients on the host backend: each rank's
// batch routed to the owners of its keys (routing.hpp), carried out there on the owner's shard,
// and the rows brought back. Stages, each a function of sharded_calls.cpp:
//   plan -> exchange counts (and every rank's argument check) -> send keys (and gradients)
//   -> the owner's part -> agree on the outcome -> rows back -> rows to the caller's positions.
#pragma once

#include <embstore/embstore.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "host/shard/agreement.hpp"
#include "host/shard/communicator.hpp"
#include "host/shard/routing.hpp"
#include "host/table/table.hpp"

namespace embstore::shard {

// A lookup's plan: the keys to send (the distinct ones, or every occurrence), grouped by owner
// (route), in send order (send_keys).
struct LookupPlan {
  Dedupe sent;
  Route route;
  std::vector<int64_t> send_keys;
};
// Stage 1 of a sharded lookup (both backends; keys in host memory). A rank whose check failed,
// or whose plan fails, gets an empty plan (it takes part sending nothing) and the failure back.
LocalCheck plan_lookup(const LocalCheck& check, const int64_t* keys, size_t n, bool per_occurrence,
                       uint32_t world, LookupPlan* plan);

// Gradients go as every occurrence, grouped by owner in batch order: the owner's concatenation
// (rank order) sums each key's gradients as one process would on the concatenated batches.
struct GradientPlan {
  Route route;
  std::vector<int64_t> send_keys;
};
LocalCheck plan_gradients(const LocalCheck& check, const int64_t* keys, size_t n, uint32_t world,
                          GradientPlan* plan);

// Stage 2 (both backends): every rank learns how many keys each peer sends it, whether every
// rank's arguments and plan passed and whether their flags agree (else every rank throws here,
// before any key moves). Returns the counts each rank sends this one.
std::vector<uint64_t> exchange_counts(Communicator& comm, const std::vector<uint64_t>& counts,
                                      const LocalCheck& check, uint32_t flags);

// check: this rank's own argument check; a failure is taken to every rank before any key
// moves, so that every rank fails the call together.
// per_occurrence: send every occurrence (an insert on a table with admission counts each).
void sharded_lookup(Table& table, Communicator& comm, const LocalCheck& check, const int64_t* keys,
                    size_t n, float* values_out, bool insert, bool per_occurrence, uint64_t step);

void sharded_apply_gradients(Table& table, Communicator& comm, const LocalCheck& check,
                             const int64_t* keys, const float* grads, size_t n, uint64_t step);

// Throws Error(INVALID_ARGUMENT) naming the first key of keys[0..n) that rank does not own.
void check_owned(const int64_t* keys, size_t n, uint32_t rank, uint32_t world_size);

}  // namespace embstore::shard
