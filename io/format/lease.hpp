// Follower leases: how a reader of a checkpoint directory (a serving follower) keeps the
// trainer's retention from deleting the versions it still reads.
//
//   <dir>/embstore.lease.<id>     one per follower, rewritten whole (written beside as
//                                 <name>.tmp, then renamed over it: readers never see half)
//
// A lease names the version its holder serves; retention keeps that version's chain (back to
// its full checkpoint) and everything newer, so the deltas a follower applies next and the
// newest version it may load whole stay too. A lease ends at its expiry (wall-clock
// milliseconds since the epoch): a follower renews it while it runs, and one that died stops
// counting once it expires. Expiry compares clocks of the follower's host and the trainer's: on
// a shared file system keep their clocks synchronized (NTP), well within the lease's length.
//
// The files are written by whatever can write the directory: read as hostile text (size
// capped, every field checked); one that does not parse is no lease.
//
// liburing style: 0 or -errno; nothing throws.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/format/commit.hpp"

namespace embstore::io {

inline constexpr const char* kLeasePrefix = "embstore.lease.";

struct Lease {
  std::string id;  // the file's name after kLeasePrefix: [A-Za-z0-9_.-]{1,64}, no ".tmp" end
  int64_t pid = 0;
  std::string host;
  uint64_t version = 0;    // the version its holder serves (or is about to load)
  int64_t expires_ms = 0;  // wall clock, milliseconds since the epoch
  std::string what;        // "follower of prog"
};

// Wall-clock milliseconds since the epoch.
int64_t wall_clock_ms();

// A new lease id: this host's name (its valid characters), the pid and random bits.
std::string new_lease_id();

// Writes (replaces) dir's lease lease.id. 0, or -errno with *detail.
int write_lease(const std::string& dir, const Lease& lease, std::string* detail);
// Removes dir's lease id (and a leftover of its writing). 0 also when it is not there.
int remove_lease(const std::string& dir, const std::string& id);

// Every lease file in dir, parsed: the ones that parse in *out (sorted by id), the others'
// names and reasons in *skipped (may be null). -ENOENT when dir is missing.
int read_leases(const std::string& dir, std::vector<Lease>* out, std::vector<std::string>* skipped);

// Leases that expired this long ago are removed by oldest_leased_version's caller's retention.
inline constexpr int64_t kStaleLeaseMs = 3600 * 1000;

// For retention: the oldest version of dir that its live leases (expiry after now_ms) need, the
// full checkpoint that each leased version's chain starts from (the version itself where the
// chain does not read: a broken chain needs nothing older); UINT64_MAX when no live lease names
// a version of dir. Leases that expired more than kStaleLeaseMs ago are removed. Lease files
// that do not parse are no lease; their reasons go to *skipped (may be null).
// versions: dir's listing (list_versions), which the caller has already.
uint64_t oldest_leased_version(const std::string& dir, const std::vector<VersionDir>& versions,
                               int64_t now_ms, std::vector<std::string>* skipped);

// The text of a lease file, and its reading back (0, or -EBADMSG with the reason in *why).
std::string format_lease(const Lease& lease);
int parse_lease(const std::string& text, Lease* out, std::string* why);

}  // namespace embstore::io
