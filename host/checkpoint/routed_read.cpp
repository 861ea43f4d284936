#include "host/checkpoint/routed_read.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "cuda/row/shard.h"
#include "host/error.hpp"
#include "io/format/layout.hpp"
#include "io/format/manifest.hpp"
#include "io/format/row_file.hpp"

namespace embstore::checkpoint {
namespace {

enum class State : uint32_t { kReading = 0, kDone = 1, kFailed = 2 };

// What a rank sends each rank ahead of a round's rows.
struct Header {
  uint32_t state = 0;
  uint32_t pad = 0;
  uint64_t rows = 0;        // rows for the receiver
  uint64_t tombstones = 0;  // tombstones for the receiver
  uint64_t moved = 0;       // rows and tombstones this rank sends in the round, to every rank
};

// The rows for one owner, as they go on the wire: keys, then tombstones' keys, then values, then
// state.
struct Bucket {
  std::vector<int64_t> keys;
  std::vector<float> values, state;
  std::vector<int64_t> tombstones;

  void clear() {
    keys.clear();
    values.clear();
    state.clear();
    tombstones.clear();
  }
};

// A routed read's rounds. Every rank makes the same rounds: a version ends only at a round in
// which every rank has read its share and nothing moved, so a rank that fails while it takes in
// a round's rows still tells the others in a round they all make. Every vector a round needs
// but its payload is made up front; the payload's allocation is agreed on (one all_gather)
// before the rows move, so a rank short of memory stops every rank instead of leaving them
// waiting.
class RoutedRead {
 public:
  RoutedRead(shard::Communicator& comm, const io::TableEntry& table,
             const io::ChainReadOptions& options, const io::RowSink& sink, size_t round_bytes)
      : comm_(comm),
        world_(static_cast<uint32_t>(comm.size())),
        dim_(table.config.dim),
        state_dim_(table.state_dim),
        track_every_key_(!options.sink_skips_held),
        sink_(sink),
        round_bytes_(round_bytes),
        buckets_(world_),
        out_(world_),
        in_(world_),
        header_bytes_(world_, sizeof(Header)),
        send_bytes_(world_),
        recv_bytes_(world_),
        allocated_(world_) {}

  // read_row_file's block handler: rows to their owners' buckets, exchanged when enough.
  int on_block(const io::RowBlock& b, std::string* why) {
    try {
      bucket(b);
    } catch (...) {
      fail(shard::run_stage([] { throw; }));
    }
    if (!stopped_ && (pending_bytes_ < round_bytes_ || exchange(State::kReading))) return 0;
    *why = "stopped";
    return -ECANCELED;
  }

  // This rank has read its share of a version: rounds until every rank has and a round moved
  // nothing. false when a rank failed (this one included).
  bool finish_version() {
    while (exchange(State::kDone)) {
      if (all_done_ && quiet_) return true;
    }
    return false;
  }

  // This rank failed outside a round: the others learn it in the next round.
  void fail(shard::LocalCheck why) {
    own_failure_ = std::move(why);
    exchange(State::kFailed);
  }

  bool stopped() const { return stopped_; }
  shard::LocalCheck outcome() const { return own_failure_.value_or(shard::LocalCheck{}); }

 private:
  size_t row_floats() const { return size_t{dim_} + state_dim_; }

  void bucket(const io::RowBlock& b) {
    if (b.kind == io::RowBlockKind::kTombstones) {
      for (uint32_t i = 0; i < b.rows; ++i) {
        buckets_[row::shard_of(b.keys[i], world_)].tombstones.push_back(b.keys[i]);
      }
      pending_bytes_ += size_t{b.rows} * sizeof(int64_t);
      return;
    }
    for (uint32_t i = 0; i < b.rows; ++i) {
      Bucket& to = buckets_[row::shard_of(b.keys[i], world_)];
      to.keys.push_back(b.keys[i]);
      to.values.insert(to.values.end(), b.values + size_t{i} * dim_,
                       b.values + size_t{i + 1} * dim_);
      if (state_dim_ > 0) {
        to.state.insert(to.state.end(), b.state + size_t{i} * state_dim_,
                        b.state + size_t{i + 1} * state_dim_);
      }
    }
    pending_bytes_ += size_t{b.rows} * (sizeof(int64_t) + row_floats() * sizeof(float));
  }

  // A bucket's bytes on the wire: keys, tombstones, values, state; padded to 8 bytes so that
  // every segment's keys are aligned.
  size_t wire_bytes(const Header& h) const {
    const size_t bytes =
        (h.rows + h.tombstones) * sizeof(int64_t) + h.rows * row_floats() * sizeof(float);
    return (bytes + 7) & ~size_t{7};
  }

  // One round: every rank's headers, the payload's allocation agreed, then the rows. Delivers
  // what came in to the sink unless someone failed. false when the read stops: a rank said it
  // failed or could not allocate, or this one failed taking in rows (it tells the others in one
  // more round, which they make: that round moved rows, so it ended no version). A failure of
  // the communicator itself stops this rank only (the others may then wait for it until the
  // trainer's job ends them).
  bool exchange(State mine) {
    try {
      return exchange_or_throw(mine);
    } catch (...) {
      own_failure_ = shard::run_stage([] { throw; });
    }
    stopped_ = true;
    return false;
  }

  bool exchange_or_throw(State mine) {
    uint64_t moved = 0;
    for (uint32_t q = 0; q < world_; ++q)
      moved += buckets_[q].keys.size() + buckets_[q].tombstones.size();
    for (uint32_t q = 0; q < world_; ++q) {
      out_[q] = Header{static_cast<uint32_t>(mine), 0, buckets_[q].keys.size(),
                       buckets_[q].tombstones.size(), moved};
    }
    comm_.all_to_all(out_.data(), header_bytes_.data(), in_.data(), header_bytes_.data());

    size_t send_total = 0, recv_total = 0;
    for (uint32_t q = 0; q < world_; ++q) {
      send_bytes_[q] = wire_bytes(out_[q]);
      recv_bytes_[q] = wire_bytes(in_[q]);
      send_total += send_bytes_[q];
      recv_total += recv_bytes_[q];
    }
    const shard::LocalCheck allocation = shard::run_stage([&] {
      send_.assign(send_total, 0);
      recv_.resize(recv_total);
    });
    const int32_t mine_ok = allocation.status == EMBSTORE_OK ? 1 : 0;
    comm_.all_gather(&mine_ok, sizeof mine_ok, allocated_.data());
    if (allocation.status != EMBSTORE_OK && !own_failure_) own_failure_ = allocation;
    for (int32_t ok : allocated_) {
      if (ok == 0) {
        stopped_ = true;
        return false;
      }
    }
    char* p = send_.data();
    for (uint32_t q = 0; q < world_; ++q) {
      Bucket& b = buckets_[q];
      char* segment = p;
      p = put(p, b.keys.data(), b.keys.size() * sizeof(int64_t));
      p = put(p, b.tombstones.data(), b.tombstones.size() * sizeof(int64_t));
      p = put(p, b.values.data(), b.values.size() * sizeof(float));
      p = put(p, b.state.data(), b.state.size() * sizeof(float));
      p = segment + send_bytes_[q];
      b.clear();
    }
    pending_bytes_ = 0;
    comm_.all_to_all(send_.data(), send_bytes_.data(), recv_.data(), recv_bytes_.data());

    bool failed = false;
    all_done_ = true;
    quiet_ = true;
    for (const Header& h : in_) {
      failed = failed || h.state == static_cast<uint32_t>(State::kFailed);
      all_done_ = all_done_ && h.state == static_cast<uint32_t>(State::kDone);
      quiet_ = quiet_ && h.moved == 0;
    }
    if (failed) {
      stopped_ = true;
      return false;
    }
    if (!own_failure_ && !deliver()) return exchange(State::kFailed);
    return true;
  }

  static char* put(char* p, const void* data, size_t bytes) {
    if (bytes > 0) std::memcpy(p, data, bytes);
    return p + bytes;
  }

  // The rows received, rank by rank, to the sink: tombstones hide their keys from older
  // versions; rows of hidden keys (and, for a sink that does not skip the keys it holds, repeats
  // of keys already handed over) are left out. false, with own_failure_, when that failed.
  bool deliver() {
    const shard::LocalCheck c = shard::run_stage([&] {
      const char* p = recv_.data();
      for (const Header& h : in_) {
        const auto* keys = reinterpret_cast<const int64_t*>(p);
        const int64_t* tombstones = keys + h.rows;
        const auto* values = reinterpret_cast<const float*>(tombstones + h.tombstones);
        const float* state = values + h.rows * dim_;
        p += wire_bytes(h);
        for (uint64_t i = 0; i < h.tombstones; ++i) seen_.insert(tombstones[i]);
        keys_.clear();
        values_.clear();
        state_.clear();
        for (uint64_t i = 0; i < h.rows; ++i) {
          const bool drop =
              track_every_key_ ? !seen_.insert(keys[i]).second : seen_.count(keys[i]) != 0;
          if (drop) continue;
          keys_.push_back(keys[i]);
          values_.insert(values_.end(), values + i * dim_, values + (i + 1) * dim_);
          state_.insert(state_.end(), state + i * state_dim_, state + (i + 1) * state_dim_);
        }
        if (keys_.empty()) continue;
        io::RowBlock b;
        b.rows = static_cast<uint32_t>(keys_.size());
        b.dim = dim_;
        b.state_dim = state_dim_;
        b.keys = keys_.data();
        b.values = values_.data();
        b.state = state_dim_ > 0 ? state_.data() : nullptr;
        std::string why;
        if (sink_(b, &why) < 0) {
          embstore::fail(EMBSTORE_CORRUPT, "table rows routed to this rank: {}", why);
        }
      }
    });
    if (c.status == EMBSTORE_OK) return true;
    own_failure_ = c;
    return false;
  }

  shard::Communicator& comm_;
  const uint32_t world_;
  const uint32_t dim_, state_dim_;
  const bool track_every_key_;
  const io::RowSink& sink_;
  const size_t round_bytes_;
  std::vector<Bucket> buckets_;
  size_t pending_bytes_ = 0;
  // A round's headers and sizes (made up front), and its payload.
  std::vector<Header> out_, in_;
  std::vector<size_t> header_bytes_, send_bytes_, recv_bytes_;
  std::vector<int32_t> allocated_;
  std::vector<char> send_, recv_;
  // Keys received as tombstones (they hide older rows), and with track_every_key_ every key
  // handed over.
  std::unordered_set<int64_t> seen_;
  std::vector<int64_t> keys_;
  std::vector<float> values_, state_;
  bool all_done_ = false;
  bool quiet_ = false;
  bool stopped_ = false;
  std::optional<shard::LocalCheck> own_failure_;
};

}  // namespace

bool needs_routing(const RestorePlan& plan, const TablePlan& table, uint32_t world_size) {
  for (const io::ChainLink& c : plan.chain) {
    for (const io::TableEntry& e : c.manifest->tables) {
      if (e.name == table.entry->name && c.manifest->world_size != world_size) return true;
    }
  }
  return false;
}

std::vector<std::vector<size_t>> share_files(const io::Manifest& version,
                                             const io::TableEntry& entry, uint32_t world_size,
                                             std::vector<uint64_t>* load) {
  std::vector<std::vector<size_t>> at(world_size);
  const size_t n = entry.files.size();
  // The store's own layout: each rank its own shard's file.
  bool own_layout = version.world_size == world_size && n == world_size;
  for (size_t j = 0; own_layout && j < n; ++j) {
    own_layout = entry.files[j].path == io::row_file_path(version.format_version, entry.name,
                                                          static_cast<uint32_t>(j), world_size);
  }
  if (own_layout) {
    for (size_t j = 0; j < n; ++j) {
      at[j].push_back(j);
      (*load)[j] += entry.files[j].bytes;
    }
    return at;
  }
  // Else the largest file first, each to the rank with the fewest bytes so far (the lowest
  // such rank): the same on every rank, from the same manifest.
  std::vector<size_t> order(n);
  for (size_t j = 0; j < n; ++j) order[j] = j;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return entry.files[a].bytes > entry.files[b].bytes; });
  for (size_t j : order) {
    const auto least = std::min_element(load->begin(), load->end());
    at[static_cast<size_t>(least - load->begin())].push_back(j);
    *least += entry.files[j].bytes;
  }
  for (std::vector<size_t>& files : at) std::sort(files.begin(), files.end());
  return at;
}

shard::LocalCheck read_table_routed(shard::Communicator& comm, const RestorePlan& plan,
                                    const TablePlan& table, const io::ChainReadOptions& options,
                                    const io::RowSink& sink, size_t round_bytes,
                                    bool* stopped) noexcept {
  if (stopped != nullptr) *stopped = false;
  // Only the set-up can fail before the first round (memory for a few vectors): a rank failing
  // there leaves the others waiting, so it comes before anything else.
  const uint32_t world = static_cast<uint32_t>(comm.size());
  const uint32_t rank = static_cast<uint32_t>(comm.rank());
  const io::TableEntry& newest = *table.entry;
  std::optional<RoutedRead> read;
  std::vector<uint64_t> load;
  std::string detail;
  const shard::LocalCheck setup = shard::run_stage([&] {
    read.emplace(comm, newest, options, sink, round_bytes);
    load.assign(world, 0);
    detail.reserve(256);
  });
  if (setup.status != EMBSTORE_OK) return setup;
  const auto finish = [&] {
    if (stopped != nullptr) *stopped = read->stopped() && read->outcome().status == EMBSTORE_OK;
    return read->outcome();
  };
  const io::RowSink on_block = [&](const io::RowBlock& b, std::string* why) {
    return read->on_block(b, why);
  };
  for (const io::ChainLink& c : plan.chain) {
    auto it = std::find_if(c.manifest->tables.begin(), c.manifest->tables.end(),
                           [&](const io::TableEntry& e) { return e.name == newest.name; });
    if (it == c.manifest->tables.end()) continue;  // created after that version
    // Every rank has the same manifests (the ranks agreed on them), so every rank stops here
    // alike, without a round.
    if (it->config.dim != newest.config.dim || it->state_dim != newest.state_dim) {
      return shard::LocalCheck{EMBSTORE_CORRUPT, "a table changes shape along the chain: " +
                                                     c.path + ", '" + newest.name + "'"};
    }
    // What can fail here outside a round (memory, reading a file) is told in the next round.
    try {
      const std::vector<std::vector<size_t>> shares = share_files(*c.manifest, *it, world, &load);
      for (size_t j : shares[rank]) {
        const io::FileEntry& f = it->files[j];
        const int r = io::read_row_file(c.path + "/" + f.path, f, *it, c.manifest->full, on_block,
                                        &detail, options.check_behind);
        if (r < 0 && read->stopped()) return finish();
        if (r < 0) {
          read->fail(
              shard::LocalCheck{r == -EBADMSG ? EMBSTORE_CORRUPT : EMBSTORE_IO_ERROR, detail});
          return finish();
        }
      }
    } catch (...) {
      read->fail(shard::run_stage([] { throw; }));
      return finish();
    }
    if (!read->finish_version()) return finish();
  }
  return finish();
}

}  // namespace embstore::checkpoint
