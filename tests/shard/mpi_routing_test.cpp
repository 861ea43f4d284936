// The sharded calls' routing plans (host/shard/routing.hpp) over a real MPI exchange, run by
// ctest under `mpirun -np W`: each rank routes its own batch with counts-then-payload
// all-to-alls, the owners answer and sum, and every rank checks its answers. Gradient sums must
// equal, bit for bit, one process's left fold over the ranks' batches concatenated in rank
// order (each rank recomputes every batch, which are deterministic). Exit 0 when every rank
// passes. Not a Catch2 program: its ranks must agree on the outcome.
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "cuda/row/shard.h"
#include "host/shard/routing.hpp"

namespace {

using embstore::shard::Dedupe;
using embstore::shard::Route;

std::vector<int64_t> batch_of(int rank, size_t n) {
  std::mt19937_64 rng(777 + rank);
  std::vector<int64_t> keys(n);
  for (int64_t& k : keys) k = static_cast<int64_t>(rng() % 500) - 200;
  return keys;
}

std::vector<float> grads_of(int rank, size_t n) {
  std::mt19937 rng(31 + rank);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = u(rng) * (1 + static_cast<float>(i % 5) * 1e3f);
  return g;
}

// Counts, then a payload of T, from each rank to each rank. counts[r]: items for rank r.
template <typename T>
std::vector<T> exchange(const std::vector<T>& send, const std::vector<int>& counts,
                        std::vector<int>* recv_counts, MPI_Datatype type, MPI_Comm comm) {
  const int world = static_cast<int>(counts.size());
  recv_counts->assign(world, 0);
  MPI_Alltoall(counts.data(), 1, MPI_INT, recv_counts->data(), 1, MPI_INT, comm);
  std::vector<int> send_at(world, 0), recv_at(world, 0);
  for (int r = 1; r < world; ++r) {
    send_at[r] = send_at[r - 1] + counts[r - 1];
    recv_at[r] = recv_at[r - 1] + (*recv_counts)[r - 1];
  }
  std::vector<T> recv(static_cast<size_t>(recv_at[world - 1] + (*recv_counts)[world - 1]));
  MPI_Alltoallv(send.data(), counts.data(), send_at.data(), type, recv.data(), recv_counts->data(),
                recv_at.data(), type, comm);
  return recv;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm comm;  // as embstore will: a duplicate, so no message matches the caller's
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  const uint32_t w = static_cast<uint32_t>(world);
  long failures = 0;

  // Lookup: distinct keys to their owners, rows (key * 0.5) back, gathered to positions.
  const std::vector<int64_t> keys = batch_of(rank, 3000);
  const Dedupe d = embstore::shard::dedupe(keys.data(), keys.size());
  const Route r = embstore::shard::route(d.keys.data(), d.keys.size(), w);
  std::vector<int64_t> send_keys(r.order.size());
  for (size_t j = 0; j < r.order.size(); ++j) send_keys[j] = d.keys[r.order[j]];
  std::vector<int> counts(r.counts.begin(), r.counts.end()), recv_counts;
  const std::vector<int64_t> asked = exchange(send_keys, counts, &recv_counts, MPI_INT64_T, comm);
  std::vector<float> answers(asked.size());
  for (size_t j = 0; j < asked.size(); ++j) {
    failures += embstore::row::shard_of(asked[j], w) != static_cast<uint32_t>(rank);
    answers[j] = static_cast<float>(asked[j]) * 0.5f;
  }
  std::vector<int> back_counts;
  const std::vector<float> rows_back =
      exchange(answers, recv_counts, &back_counts, MPI_FLOAT, comm);
  failures += back_counts != counts;
  const std::vector<uint32_t> at = embstore::shard::gather_order(r, d.slot_of);
  for (size_t i = 0; i < keys.size(); ++i) {
    failures += rows_back[at[i]] != static_cast<float>(keys[i]) * 0.5f;
  }

  // Gradients: every occurrence to its owner, in batch order; the owner folds what it
  // receives (segments in rank order).
  const std::vector<float> grads = grads_of(rank, keys.size());
  const Route gr = embstore::shard::route(keys.data(), keys.size(), w);
  std::vector<int64_t> gkeys(gr.order.size());
  std::vector<float> gvals(gr.order.size());
  for (size_t j = 0; j < gr.order.size(); ++j) {
    gkeys[j] = keys[gr.order[j]];
    gvals[j] = grads[gr.order[j]];
  }
  std::vector<int> gcounts(gr.counts.begin(), gr.counts.end()), grecv;
  const std::vector<int64_t> got_keys = exchange(gkeys, gcounts, &grecv, MPI_INT64_T, comm);
  const std::vector<float> got_vals = exchange(gvals, gcounts, &grecv, MPI_FLOAT, comm);
  std::map<int64_t, float> sums;
  for (size_t j = 0; j < got_keys.size(); ++j) sums[got_keys[j]] += got_vals[j];
  std::map<int64_t, float> expected;  // one process, batches concatenated in rank order
  for (int q = 0; q < world; ++q) {
    const std::vector<int64_t> k = batch_of(q, 3000);
    const std::vector<float> g = grads_of(q, k.size());
    for (size_t i = 0; i < k.size(); ++i) {
      if (embstore::row::shard_of(k[i], w) == static_cast<uint32_t>(rank)) expected[k[i]] += g[i];
    }
  }
  failures += sums.size() != expected.size();
  for (const auto& [key, sum] : expected) {
    const auto it = sums.find(key);
    failures += it == sums.end() || std::memcmp(&it->second, &sum, sizeof sum) != 0;
  }

  long total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_LONG, MPI_SUM, comm);
  if (rank == 0) {
    std::printf("mpi_routing_test: %d ranks, %ld failures\n", world, total);
  }
  MPI_Comm_free(&comm);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
