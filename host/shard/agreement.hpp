// How the ranks of a sharded store fail together: each rank's own outcome of a stage, made known
// to every rank before anyone goes on, so that all ranks take the same path (and nobody waits in
// a collective the others have left).
#pragma once

#include <embstore/embstore.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "host/shard/communicator.hpp"

namespace embstore::shard {

// A rank's own outcome of a stage.
struct LocalCheck {
  embstore_status_t status = EMBSTORE_OK;
  std::string message;
};

// Runs stage, turning what it throws into a LocalCheck (never throws).
template <typename F>
LocalCheck run_stage(F&& stage) noexcept;

// Every rank learns every rank's status (all_gather); when one failed, every rank throws
// Error with the lowest failed rank's status: that rank its own message, the others one that
// names it and `what`.
void agree(Communicator& comm, const LocalCheck& mine, const char* what);

// agree's decision, for statuses gathered otherwise (statuses[q]: rank q's).
void raise_first_failure(const std::vector<int32_t>& statuses, int self, const LocalCheck& mine,
                         const char* what);

}  // namespace embstore::shard

#include "host/shard/agreement_inl.hpp"
