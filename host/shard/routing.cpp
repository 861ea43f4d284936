#include "host/shard/routing.hpp"

#include <unordered_map>

#include "cuda/row/shard.h"

namespace embstore::shard {

Dedupe dedupe(const int64_t* keys, size_t n) {
  Dedupe d;
  d.slot_of.resize(n);
  std::unordered_map<int64_t, uint32_t> seen;
  seen.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const auto [it, fresh] = seen.try_emplace(keys[i], static_cast<uint32_t>(d.keys.size()));
    if (fresh) d.keys.push_back(keys[i]);
    d.slot_of[i] = it->second;
  }
  return d;
}

Route route(const int64_t* keys, size_t n, uint32_t world_size) {
  Route r;
  r.counts.assign(world_size, 0);
  r.offsets.assign(size_t{world_size} + 1, 0);
  r.order.resize(n);
  std::vector<uint32_t> owner(n);
  for (size_t i = 0; i < n; ++i) {
    owner[i] = row::shard_of(keys[i], world_size);
    ++r.counts[owner[i]];
  }
  for (uint32_t w = 0; w < world_size; ++w) r.offsets[w + 1] = r.offsets[w] + r.counts[w];
  // A stable counting sort: positions keep batch order within each owner.
  std::vector<uint64_t> next(r.offsets.begin(), r.offsets.end() - 1);
  for (size_t i = 0; i < n; ++i) r.order[next[owner[i]]++] = static_cast<uint32_t>(i);
  return r;
}

std::vector<uint32_t> gather_order(const Route& route, const std::vector<uint32_t>& slot_of) {
  std::vector<uint32_t> sent_at(route.order.size());
  for (size_t j = 0; j < route.order.size(); ++j)
    sent_at[route.order[j]] = static_cast<uint32_t>(j);
  std::vector<uint32_t> at(slot_of.size());
  for (size_t i = 0; i < slot_of.size(); ++i) at[i] = sent_at[slot_of[i]];
  return at;
}

}  // namespace embstore::shard
