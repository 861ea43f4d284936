// W ranks of a sharded store as W threads of one process, meeting through the callback table
// (embstore_comm_callbacks_t) in shared memory: for tests that need no MPI, and run under the
// sanitizers.
#pragma once

#include <embstore/embstore.h>

#include <atomic>
#include <barrier>
#include <cstring>
#include <thread>
#include <vector>

#include "collective_scenario.hpp"
#include "sharded_scenario.hpp"

namespace embstore_test::threads {

// W ranks meeting in memory: each callback publishes its buffers, waits for every rank, copies
// its part, and waits again before the buffers may change.
struct Group {
  explicit Group(int w) : world(w), barrier(w), send(w), send_bytes(w) {}
  int world;
  std::barrier<> barrier;
  std::vector<const char*> send;
  std::vector<const size_t*> send_bytes;
  int fail_all_to_all_from = -1;  // the n-th all_to_all (counted per group) and later fail
  // The same for all_gather, for fail_all_gather_count calls from there. Atomic: a rank arms
  // it while the others may be inside a call.
  std::atomic<int> fail_all_gather_from{-1};
  int fail_all_gather_count = 1 << 30;
};

struct Member {
  Group* group;
  int rank;
  int all_to_all_calls = 0;
  int all_gather_calls = 0;
};

inline int all_gather(void* context, const void* send, size_t bytes, void* recv) {
  auto* m = static_cast<Member*>(context);
  Group& g = *m->group;
  g.send[m->rank] = static_cast<const char*>(send);
  g.barrier.arrive_and_wait();
  for (int q = 0; q < g.world; ++q) {
    std::memcpy(static_cast<char*>(recv) + q * bytes, g.send[q], bytes);
  }
  g.barrier.arrive_and_wait();
  // Every rank exchanges, then fails: a rank that returned early would leave the others in
  // the barrier.
  const int call = m->all_gather_calls++;
  const int fail_from = g.fail_all_gather_from.load();
  return fail_from >= 0 && call >= fail_from && call - fail_from < g.fail_all_gather_count ? 6 : 0;
}

inline int all_to_all(void* context, const void* send, const size_t* send_bytes, void* recv,
                      const size_t* recv_bytes) {
  auto* m = static_cast<Member*>(context);
  Group& g = *m->group;
  g.send[m->rank] = static_cast<const char*>(send);
  g.send_bytes[m->rank] = send_bytes;
  g.barrier.arrive_and_wait();
  bool ok = true;
  size_t at = 0;
  for (int q = 0; q < g.world; ++q) {
    size_t from = 0;  // rank q's part for this rank starts after its parts for lower ranks
    for (int p = 0; p < m->rank; ++p) from += g.send_bytes[q][p];
    ok = ok && g.send_bytes[q][m->rank] == recv_bytes[q];
    if (ok && recv_bytes[q] > 0) {
      std::memcpy(static_cast<char*>(recv) + at, g.send[q] + from, recv_bytes[q]);
    }
    at += recv_bytes[q];
  }
  g.barrier.arrive_and_wait();
  const int call = m->all_to_all_calls++;
  if (g.fail_all_to_all_from >= 0 && call >= g.fail_all_to_all_from) return 5;
  return ok ? 0 : 1;
}

inline embstore_store_config_t config_for(Member* member, embstore_comm_callbacks_t* callbacks) {
  embstore_comm_callbacks_init(callbacks);
  callbacks->context = member;
  callbacks->all_gather = all_gather;
  callbacks->all_to_all = all_to_all;
  embstore_store_config_t c;
  embstore_store_config_init(&c);
  c.backend = EMBSTORE_BACKEND_HOST;
  c.host_threads = 1;
  c.rank = member->rank;
  c.world_size = member->group->world;
  c.comm_callbacks = callbacks;
  return c;
}

// Runs body(config, rank) on `world` threads, each a rank of one Group; returns their outcomes.
template <typename F>
std::vector<embstore_test::sharded::Outcome> on_ranks(int world, F&& body) {
  Group group(world);
  std::vector<Member> members(world);
  std::vector<embstore_test::sharded::Outcome> outcomes(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    members[r] = {&group, r};
    ranks.emplace_back([&, r] {
      embstore_comm_callbacks_t callbacks;
      outcomes[r] = body(config_for(&members[r], &callbacks), r);
    });
  }
  for (std::thread& t : ranks) t.join();
  return outcomes;
}

// `writers` ranks (threads) train and checkpoint into dir (collective::write, its
// serving_deltas_rank); the first failure described, or "" when none failed.
inline std::string write_checkpoint(int writers, const std::string& dir,
                                    int serving_deltas_rank = -1,
                                    const std::string& serving_dir = "") {
  for (const auto& o : on_ranks(writers, [&](embstore_store_config_t c, int r) {
         return embstore_test::collective::write(c, r, writers, dir, 1 << 30, serving_deltas_rank,
                                                 serving_dir);
       })) {
    if (o.failures > 0) return "writer: " + o.first;
  }
  return "";
}

}  // namespace embstore_test::threads
