#include "host/shard/agreement.hpp"

#include <vector>

#include "host/error.hpp"

namespace embstore::shard {

void raise_first_failure(const std::vector<int32_t>& statuses, int self, const LocalCheck& mine,
                         const char* what) {
  for (size_t q = 0; q < statuses.size(); ++q) {
    if (statuses[q] == EMBSTORE_OK) continue;
    if (static_cast<int>(q) == self) throw Error(mine.status, mine.message);
    const auto failed = static_cast<embstore_status_t>(statuses[q]);
    fail(failed, "rank {} failed {} ({}); see that rank's error", q, what,
         embstore_status_name(failed));
  }
}

void agree(Communicator& comm, const LocalCheck& mine, const char* what) {
  const int32_t status = mine.status;
  std::vector<int32_t> all(static_cast<size_t>(comm.size()));
  comm.all_gather(&status, sizeof status, all.data());
  raise_first_failure(all, comm.rank(), mine, what);
}

}  // namespace embstore::shard
