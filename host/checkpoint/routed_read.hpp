// A table's rows read once by the ranks of a sharded store and routed to their owners: the
// read of a restore or warm start whose chain has a version of another world size than the
// store's (at the same world size each rank reads its own shard's files, which hold only its
// keys: ChainReadOptions::skip_file).
//
// Each version's row files are shared out among the ranks (a version of the store's world size:
// each rank its own shard's file; else by bytes, the largest file to the rank with the fewest
// bytes so far), so every byte is read once in all. A rank buckets the rows it reads by owner
// (row::shard_of) and exchanges them in rounds: headers (whether the rank is still reading, has
// read its share of the version, or failed; its rows and tombstones for each rank), then the
// rows, packed. The ranks go through the chain's versions together, newest first, and a version
// ends only once every rank has read its share of it, so an owner receives a key's newer rows
// before its older ones, as read_chain_rows hands them over in one process; tombstones travel
// to the owner, which hides the keys from older versions.
#pragma once

#include "host/checkpoint/restore_plan.hpp"
#include "host/shard/agreement.hpp"
#include "host/shard/communicator.hpp"
#include "io/format/chain.hpp"

namespace embstore::checkpoint {

// Whether reading the table into the ranks of a store of world_size needs routing: some version
// of its chain was written by another number of ranks.
bool needs_routing(const RestorePlan& plan, const TablePlan& table, uint32_t world_size);

// Which of the version's row files (indexes into entry.files) each of world_size ranks reads:
// at[r] for rank r. load (one per rank) carries the bytes given out so far, for the next
// version of the same table.
std::vector<std::vector<size_t>> share_files(const io::Manifest& version,
                                             const io::TableEntry& entry, uint32_t world_size,
                                             std::vector<uint64_t>* load);

// Collective: every rank of comm calls it for the same table of the same plan (made from the
// same manifests). Hands sink the rows of the keys this rank owns, newest version first, each
// key's newest row once (when options.sink_skips_held, older rows of a key may follow: the sink
// skips them), no key whose newest row is a tombstone. Every file read gets read_row_file's
// checks (options.check_behind as there). Never throws: returns this rank's own failure (told
// to the other ranks first), or OK, also when another rank failed and this one stopped (the
// caller's agreement then fails every rank with that rank's status).
// round_bytes: the rows a rank gathers (for every owner together) before an exchange. A round
// takes about twice that on the sender (its buckets and the packed copy) and, on a receiver, up
// to that much plus one block from each of the W ranks, twice (received, then gathered for the
// sink): W x round_bytes in the worst case, when every rank's rows go to one owner.
// *stopped (may be null): true when this rank stopped because another rank failed.
inline constexpr size_t kRoutedRoundBytes = size_t{8} << 20;
shard::LocalCheck read_table_routed(shard::Communicator& comm, const RestorePlan& plan,
                                    const TablePlan& table, const io::ChainReadOptions& options,
                                    const io::RowSink& sink, size_t round_bytes = kRoutedRoundBytes,
                                    bool* stopped = nullptr) noexcept;

}  // namespace embstore::checkpoint
