// Checkpoint calls that the checkpoint and eviction tests share; each requires OK.
#pragma once

#include <embstore/embstore.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>

namespace embstore_test {

inline void require_ok(embstore_status_t s) {
  INFO("last_error: " << embstore_last_error());
  REQUIRE(std::string(embstore_status_name(s)) == "EMBSTORE_OK");
}

// Small test tables make every delta large next to its full checkpoint: keep the chain.
inline void no_rebaseline(embstore_store_t* store) {
  embstore_checkpoint_policy_t p;
  embstore_checkpoint_policy_init(&p);
  p.max_chain_length = 0;
  p.rebaseline_fraction = 0;
  require_ok(embstore_checkpoint_set_policy(store, &p));
}

// An incremental checkpoint into dir, waited for; its version.
inline uint64_t incremental_ok(embstore_store_t* store, const std::string& dir) {
  uint64_t version = 0;
  require_ok(embstore_checkpoint(store, dir.c_str(), EMBSTORE_CKPT_INCREMENTAL, &version));
  require_ok(embstore_checkpoint_wait(store, version));
  return version;
}

}  // namespace embstore_test
