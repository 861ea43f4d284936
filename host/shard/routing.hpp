// How a rank's batch travels to the owners of its keys in the sharded calls (issue 16): the
// plans both exchanges (MPI on the host, NCCL on the device) carry out. Owners come from
// row::shard_of, the one hash of embstore_shard_of.
//
// Lookups send each distinct key once: dedupe(), then route() of the distinct keys; the rows
// that come back (in send order) go to the caller's positions through gather_order().
// Gradients send every occurrence: route() of the whole batch, grouped by owner in batch
// order, so an owner that concatenates what it receives in rank order sums each key's
// gradients in rank order, then batch order, as one process would on the ranks' batches
// concatenated in rank order (bit-identical).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace embstore::shard {

// A batch's distinct keys in order of first occurrence, and for each position of the batch
// the index of its key among them.
struct Dedupe {
  std::vector<int64_t> keys;
  std::vector<uint32_t> slot_of;  // keys[slot_of[i]] == batch[i]
};
Dedupe dedupe(const int64_t* keys, size_t n);

// A batch grouped by owner: order[j] is the batch position sent j-th; positions owned by
// rank r are order[offsets[r] .. offsets[r + 1]), in batch order.
struct Route {
  std::vector<uint64_t> counts;   // keys for each rank (world_size)
  std::vector<uint64_t> offsets;  // exclusive prefix sum of counts (world_size + 1)
  std::vector<uint32_t> order;
};
Route route(const int64_t* keys, size_t n, uint32_t world_size);

// Where a caller's position finds its row among the rows received back in send order:
// rows_back[at[i]] is the row of batch position i (at = gather_order(route of dedupe.keys,
// dedupe.slot_of)).
std::vector<uint32_t> gather_order(const Route& route, const std::vector<uint32_t>& slot_of);

}  // namespace embstore::shard
