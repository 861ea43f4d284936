#include "host/shard/sharded_calls.hpp"

#include <cstring>
#include <new>
#include <numeric>
#include <vector>

#include "cuda/row/shard.h"
#include "host/error.hpp"
#include "host/shard/routing.hpp"

namespace embstore::shard {

namespace {

// What a rank tells each peer before any key moves: how many keys it sends it, whether its own
// arguments and plan passed, and its flags (which every rank must pass alike: an owner applies
// them to every rank's keys).
struct Header {
  uint64_t count;
  int32_t status;
  uint32_t flags;
};

// Stage: items of `width` bytes, counts[q] of them to (or from) rank q.
template <typename T>
std::vector<T> exchange(Communicator& comm, const std::vector<T>& send,
                        const std::vector<uint64_t>& send_counts,
                        const std::vector<uint64_t>& recv_counts, size_t width) {
  const size_t world = send_counts.size();
  std::vector<size_t> send_bytes(world), recv_bytes(world);
  size_t total = 0;
  for (size_t q = 0; q < world; ++q) {
    send_bytes[q] = send_counts[q] * width * sizeof(T);
    recv_bytes[q] = recv_counts[q] * width * sizeof(T);
    total += recv_counts[q] * width;
  }
  std::vector<T> recv(total);
  comm.all_to_all(send.data(), send_bytes.data(), recv.data(), recv_bytes.data());
  return recv;
}

// The keys this rank sends, in send order.
std::vector<int64_t> keys_in_send_order(const Route& route, const int64_t* keys) {
  std::vector<int64_t> out(route.order.size());
  for (size_t j = 0; j < route.order.size(); ++j) out[j] = keys[route.order[j]];
  return out;
}

}  // namespace

// Stage: every rank learns how many keys each peer sends it, whether every rank's arguments and
// plan passed and whether their flags agree (else every rank throws here, before any key moves).
std::vector<uint64_t> exchange_counts(Communicator& comm, const std::vector<uint64_t>& counts,
                                      const LocalCheck& check, uint32_t flags) {
  const size_t world = static_cast<size_t>(comm.size());
  std::vector<Header> out(world), in(world);
  for (size_t q = 0; q < world; ++q) {
    out[q] = {check.status == EMBSTORE_OK ? counts[q] : 0, static_cast<int32_t>(check.status),
              flags};
  }
  const std::vector<size_t> bytes(world, sizeof(Header));
  comm.all_to_all(out.data(), bytes.data(), in.data(), bytes.data());
  std::vector<int32_t> statuses(world);
  std::vector<uint64_t> received(world);
  for (size_t q = 0; q < world; ++q) {
    statuses[q] = in[q].status;
    received[q] = in[q].count;
  }
  raise_first_failure(statuses, comm.rank(), check, "the argument checks of the sharded call");
  for (size_t q = 0; q < world; ++q) {
    if (in[q].flags != flags) {
      fail(EMBSTORE_INVALID_ARGUMENT,
           "rank {} passed flags {:#x}, this rank {:#x}: every rank must pass the same flags", q,
           in[q].flags, flags);
    }
  }
  return received;
}

LocalCheck plan_lookup(const LocalCheck& check, const int64_t* keys, size_t n, bool per_occurrence,
                       uint32_t world, LookupPlan* plan) {
  LocalCheck planned = check;
  if (planned.status == EMBSTORE_OK) {
    planned = run_stage([&] {
      if (per_occurrence) {
        plan->sent.keys.assign(keys, keys + n);
        plan->sent.slot_of.resize(n);
        std::iota(plan->sent.slot_of.begin(), plan->sent.slot_of.end(), 0u);
      } else {
        plan->sent = dedupe(keys, n);
      }
      plan->route = shard::route(plan->sent.keys.data(), plan->sent.keys.size(), world);
      plan->send_keys = keys_in_send_order(plan->route, plan->sent.keys.data());
    });
  }
  if (planned.status != EMBSTORE_OK) *plan = LookupPlan{{}, shard::route(nullptr, 0, world), {}};
  return planned;
}

LocalCheck plan_gradients(const LocalCheck& check, const int64_t* keys, size_t n, uint32_t world,
                          GradientPlan* plan) {
  LocalCheck planned = check;
  if (planned.status == EMBSTORE_OK) {
    planned = run_stage([&] {
      plan->route = shard::route(keys, n, world);
      plan->send_keys = keys_in_send_order(plan->route, keys);
    });
  }
  if (planned.status != EMBSTORE_OK) *plan = GradientPlan{shard::route(nullptr, 0, world), {}};
  return planned;
}

void sharded_lookup(Table& table, Communicator& comm, const LocalCheck& check, const int64_t* keys,
                    size_t n, float* values_out, bool insert, bool per_occurrence, uint64_t step) {
  const uint32_t world = static_cast<uint32_t>(comm.size());
  const size_t dim = table.spec().dim;
  LookupPlan plan;
  const LocalCheck planned = plan_lookup(check, keys, n, per_occurrence, world, &plan);
  const Route& route = plan.route;
  const std::vector<int64_t>& send_keys = plan.send_keys;
  const std::vector<uint64_t> asked_counts =
      exchange_counts(comm, route.counts, planned, insert ? 1u : 0u);
  const std::vector<int64_t> asked = exchange(comm, send_keys, route.counts, asked_counts, 1);
  std::vector<float> answers;
  agree(comm, run_stage([&] {
          answers.resize(asked.size() * dim);
          if (!asked.empty()) {
            table.lookup(asked.data(), asked.size(), answers.data(), insert, step, nullptr);
          }
        }),
        "its part of the sharded call");
  const std::vector<float> rows = exchange(comm, answers, asked_counts, route.counts, dim);
  const std::vector<uint32_t> at = gather_order(route, plan.sent.slot_of);
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(values_out + i * dim, rows.data() + size_t{at[i]} * dim, dim * sizeof(float));
  }
}

void sharded_apply_gradients(Table& table, Communicator& comm, const LocalCheck& check,
                             const int64_t* keys, const float* grads, size_t n, uint64_t step) {
  const uint32_t world = static_cast<uint32_t>(comm.size());
  const size_t dim = table.spec().dim;
  GradientPlan plan;
  LocalCheck planned = plan_gradients(check, keys, n, world, &plan);
  const Route& route = plan.route;
  const std::vector<int64_t>& send_keys = plan.send_keys;
  std::vector<float> grads_sent;
  if (planned.status == EMBSTORE_OK) {
    planned = run_stage([&] {
      grads_sent.resize(route.order.size() * dim);
      for (size_t j = 0; j < route.order.size(); ++j) {
        std::memcpy(grads_sent.data() + j * dim, grads + size_t{route.order[j]} * dim,
                    dim * sizeof(float));
      }
    });
  }
  const std::vector<uint64_t> got_counts = exchange_counts(comm, route.counts, planned, 0);
  const std::vector<int64_t> got_keys = exchange(comm, send_keys, route.counts, got_counts, 1);
  const std::vector<float> got_grads = exchange(comm, grads_sent, route.counts, got_counts, dim);
  agree(comm, run_stage([&] {
          if (!got_keys.empty()) {
            table.apply_gradients(got_keys.data(), got_grads.data(), got_keys.size(), step,
                                  nullptr);
          }
        }),
        "its part of the sharded call");
}

void check_owned(const int64_t* keys, size_t n, uint32_t rank, uint32_t world_size) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t owner = row::shard_of(keys[i], world_size);
    if (owner != rank) {
      fail(EMBSTORE_INVALID_ARGUMENT,
           "key {} (position {}) belongs to rank {}, not to this rank {}: route keys to their "
           "owners (embstore_shard_of), or use the sharded calls",
           keys[i], i, owner, rank);
    }
  }
}

}  // namespace embstore::shard
