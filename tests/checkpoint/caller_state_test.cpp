// What embstore's calls leave behind on the caller's thread: the vector registers' upper halves
// unused (x86-64; tests/support/vector_state.hpp says why). Found on 2026-12-04: every delta read
// its parent's manifest through libxxhash's AVX-512 path, which returns without vzeroupper, and
// the trainer's baseline SSE code after it ran slower (a Zipf sampler 10 times, Python floats 3).
#include <catch2/catch.hpp>
#include <functional>

#include "io/format/xxh3.hpp"
#include "tests/checkpoint/checkpoint_fixtures.hpp"
#include "tests/support/vector_state.hpp"

using namespace embstore_test;
using namespace embstore_test::checkpoint;

namespace {

// Runs call with the upper halves cleared first; checks that they are still unused after it.
void leaves_clear(const char* what, const std::function<void()>& call) {
  embstore::io::clear_vector_upper();
  REQUIRE_FALSE(*vector_upper_in_use());
  call();
  INFO(what);
  CHECK_FALSE(*vector_upper_in_use());
}

}  // namespace

TEST_CASE("checkpoints and restores leave the caller's vector registers' upper halves unused",
          "[checkpoint]") {
  if (!vector_upper_in_use().has_value()) {
    WARN("this CPU cannot tell (no XGETBV with ECX = 1): nothing checked");
    return;
  }
  TempDir dir;
  StoreGuard store(make_store());
  embstore_table_t* plain = make_table(store, config_for("plain", 64, EMBSTORE_OPT_ADAGRAD));
  embstore_table_config_t coded = config_for("coded", 64, EMBSTORE_OPT_ADAGRAD);
  coded.value_codec = EMBSTORE_CODEC_LOSSLESS;
  coded.state_codec = EMBSTORE_CODEC_BF16;
  embstore_table_t* packed = make_table(store, coded);
  no_rebaseline(store);
  // Rows enough that every row file is far past XXH3's 240-byte short path.
  leaves_clear("training", [&] {
    train_step(store, plain, 1, 2000, 500);
    train_step(store, packed, 1, 2000, 500);
  });
  uint64_t full = 0;
  leaves_clear("a full checkpoint", [&] {
    ok(embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_FULL, &full));
  });
  leaves_clear("its wait", [&] { ok(embstore_checkpoint_wait(store, full)); });
  for (uint64_t s = 2; s <= 4; ++s) {
    train_step(store, plain, s, 2000, 500);
    train_step(store, packed, s, 2000, 500);
    uint64_t delta = 0;
    // A delta reads and hashes its parent's manifest on the calling thread.
    leaves_clear("an incremental checkpoint", [&] {
      ok(embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_INCREMENTAL, &delta));
    });
    leaves_clear("its wait", [&] { ok(embstore_checkpoint_wait(store, delta)); });
    REQUIRE(fs::exists(delta_dir(dir.path(), delta)));
  }
  const std::vector<int64_t> all = key_range(2000);
  const std::vector<float> want_plain = lookup_ok(plain, all, 0);

  StoreGuard back(make_store());
  embstore_table_t* restored_plain =
      make_table(back, config_for("plain", 64, EMBSTORE_OPT_ADAGRAD));
  make_table(back, coded);
  uint64_t version = 0;
  // The full and its three deltas: manifests, row files and encoded blocks hashed and checked.
  leaves_clear("a restore",
               [&] { ok(embstore_restore(back, dir.path().c_str(), EMBSTORE_LATEST, &version)); });
  REQUIRE(version == 4);
  REQUIRE(same_bits(lookup_ok(restored_plain, all, 0), want_plain));
}
