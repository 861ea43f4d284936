#include "host/checkpoint/outcomes.hpp"

#include <algorithm>
#include <chrono>

namespace embstore::checkpoint {

embstore_checkpoint_info_t Outcomes::info_of(const Job& job, const StagingRing* ring,
                                             bool committed) {
  embstore_checkpoint_info_t info{};
  info.struct_size = sizeof(info);
  info.status = EMBSTORE_OK;
  info.in_flight = 1;
  info.kind = job.full ? EMBSTORE_CKPT_FULL : EMBSTORE_CKPT_INCREMENTAL;
  info.version = job.version;
  info.parent = job.parent.value_or(EMBSTORE_LATEST);
  info.from_policy = job.from_policy ? 1 : 0;
  for (const TableJob& t : job.tables) info.rows_captured += t.captured;
  info.rows_written = committed ? job.rows : 0;
  info.bytes_written = committed ? job.bytes : 0;
  info.capture_seconds = job.capture_seconds;
  info.write_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - job.captured_at).count();
  const StallStats now = ring != nullptr ? ring->stats() : job.ring_at_capture;
  info.stall_seconds = job.wait_seconds + (now.seconds_total - job.ring_at_capture.seconds_total);
  info.copy_on_write_rows = now.copy_on_write_rows - job.ring_at_capture.copy_on_write_rows;
  return info;
}

void Outcomes::ended(const Job& job, embstore_status_t status, const std::string& message,
                     const embstore_checkpoint_info_t& info) {
  if (outcomes_.size() >= kMax) outcomes_.erase(outcomes_.begin());
  Outcome& o = outcomes_[job.version];
  o.status = status;
  o.message = message;
  o.from_policy = job.from_policy;
  o.told = false;
  o.info = info;
  o.info.status = status;
  o.info.in_flight = 0;
  if (status != EMBSTORE_OK) {
    ++failed_;
    return;
  }
  ++committed_;
  if (!job.full) ++deltas_committed_;
  last_version_ = job.version;
  rows_written_ += job.rows;
  bytes_written_ += job.bytes;
}

bool Outcomes::info(uint64_t version, embstore_checkpoint_info_t* out) const {
  auto it = outcomes_.find(version);
  if (it == outcomes_.end()) return false;
  *out = it->second.info;
  return true;
}

bool Outcomes::take(uint64_t version, embstore_status_t* status, std::string* message) {
  auto it = outcomes_.find(version);
  if (it == outcomes_.end()) return false;
  it->second.told = true;
  *status = it->second.status;
  *message = it->second.message;
  return true;
}

bool Outcomes::take_untold(bool policy_only, embstore_status_t* status, std::string* message) {
  for (auto& [version, o] : outcomes_) {
    if (o.status == EMBSTORE_OK || o.told || (policy_only && !o.from_policy)) continue;
    o.told = true;
    *status = o.status;
    *message = o.message;
    return true;
  }
  return false;
}

void Outcomes::waited(double seconds) {
  wait_stall_total_ += seconds;
  wait_stall_max_ = std::max(wait_stall_max_, seconds);
}

embstore_checkpoint_stats_t Outcomes::stats(const StallStats& rings, bool in_flight,
                                            uint64_t deferred) const {
  embstore_checkpoint_stats_t s{};
  s.struct_size = sizeof(s);
  s.committed = committed_;
  s.failed = failed_;
  s.last_version = last_version_;
  s.in_flight = in_flight ? 1 : 0;
  s.rows_written = rows_written_;
  s.bytes_written = bytes_written_;
  s.copy_on_write_rows = rings.copy_on_write_rows;
  s.stall_seconds_total = wait_stall_total_ + rings.seconds_total;
  s.stall_seconds_max = std::max(wait_stall_max_, rings.seconds_max);
  s.capture_seconds_last = capture_seconds_last_;
  s.deltas_committed = deltas_committed_;
  s.deferred = deferred;
  return s;
}

}  // namespace embstore::checkpoint
