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

#include "host/shard/agreement.hpp"
#include "host/shard/communicator.hpp"
#include "host/table/table.hpp"

namespace embstore::shard {

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
