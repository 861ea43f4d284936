// Checkpoints that fail or are damaged: corrupt, truncated and incomplete versions are reported
// and never loaded, a failed write or commit fails only its checkpoint (and a policy's failure
// is reported once), and a crash while writing leaves the previous version to restore.
#include <catch2/catch.hpp>

#include "tests/checkpoint/checkpoint_fixtures.hpp"

using namespace embstore_test;
using namespace embstore_test::checkpoint;

TEST_CASE("corrupt, truncated and incomplete checkpoints are reported, never loaded",
          "[checkpoint]") {
  TempDir dir;
  StoreGuard a(make_store());
  embstore_table_t* ta = make_table(a, config_for("emb", 16, EMBSTORE_OPT_ADAGRAD));
  train_step(a, ta, 1, 20000, 20000);
  checkpoint_ok(a, dir.path());
  train_step(a, ta, 2, 20000, 20000);
  checkpoint_ok(a, dir.path());
  const std::string file = table_file(dir.path(), 2, "emb");
  const std::string manifest = version_dir(dir.path(), 2) + "/MANIFEST.json";

  StoreGuard b(make_store());
  embstore_table_t* tb = make_table(b, config_for("emb", 16, EMBSTORE_OPT_ADAGRAD));
  const std::vector<float> before = lookup_ok(tb, {1, 2, 3});
  uint64_t v = 0;

  SECTION("a flipped byte in a row file") {
    flip_byte(file, 64 + 8 * 100);  // a key in the first block's payload
    require_status(embstore_restore(b, dir.path().c_str(), 2, &v), EMBSTORE_CORRUPT,
                   "shard-00000-of-00001.rows");
    REQUIRE(std::string(embstore_last_error()).find("offset 0") != std::string::npos);
  }
  SECTION("a flipped byte in a later block") {
    const auto size = fs::file_size(file);
    REQUIRE(size > 1048576 + 4096);  // several blocks
    flip_byte(file, size - 5000);
    require_status(embstore_restore(b, dir.path().c_str(), EMBSTORE_LATEST, &v), EMBSTORE_CORRUPT,
                   "offset");
  }
  SECTION("a truncated row file") {
    fs::resize_file(file, fs::file_size(file) - 4096);
    require_status(embstore_restore(b, dir.path().c_str(), 2, &v), EMBSTORE_CORRUPT, "truncated");
  }
  SECTION("a flipped byte in the manifest") {
    std::string text;
    {
      std::ifstream in(manifest);
      text.assign(std::istreambuf_iterator<char>(in), {});
    }
    const auto at = text.find("\"rows\": ");
    REQUIRE(at != std::string::npos);
    text[at + 8] = text[at + 8] == '9' ? '8' : '9';
    std::ofstream(manifest, std::ios::trunc) << text;
    require_status(embstore_restore(b, dir.path().c_str(), EMBSTORE_LATEST, &v), EMBSTORE_CORRUPT,
                   "MANIFEST.json");
  }
  SECTION("a missing manifest: not a checkpoint; LATEST falls back") {
    fs::remove(manifest);
    require_status(embstore_restore(b, dir.path().c_str(), 2, &v), EMBSTORE_CORRUPT,
                   "not a committed checkpoint");
    REQUIRE(same_bits(lookup_ok(tb, {1, 2, 3}, 0), before));
    REQUIRE(restore_ok(b, dir.path(), EMBSTORE_LATEST) == 1);
    return;
  }
  // Nothing of the store changed.
  REQUIRE(same_bits(lookup_ok(tb, {1, 2, 3}, 0), before));
  REQUIRE(stats(tb).rows == 3);
  REQUIRE(restore_ok(b, dir.path(), 1) == 1);  // the earlier version is intact
}

TEST_CASE("a failed write fails only that checkpoint, and training and later checkpoints go on",
          "[checkpoint]") {
  TempDir dir;
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config_for("emb", 8, EMBSTORE_OPT_ADAGRAD));
  const std::vector<int64_t> all = key_range(1000);
  train_step(store, t, 1, 1000, 1000);
  checkpoint_ok(store, dir.path());
  const std::vector<float> at1 = lookup_ok(t, all, 0);
  train_step(store, t, 2, 1000, 1000);
  const uint64_t rows = stats(t).rows;
  {
    const int err = GENERATE(ENOSPC, EIO);
    FaultGuard guard([err](uint64_t, size_t) { return -err; });
    uint64_t version = 0;
    ok(embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_FULL, &version));
    require_status(embstore_checkpoint_wait(store, version), EMBSTORE_IO_ERROR, std::strerror(err));
  }
  // No trace on disk but the earlier version; every row is dirty again for the next one.
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    if (e.path().filename() == embstore::io::kLockFileName) continue;
    ++entries;
    REQUIRE(e.path().filename().string().rfind(".tmp-", 0) != 0);
  }
  REQUIRE(entries == 1);
  REQUIRE(stats(t).dirty_rows == rows);
  embstore_checkpoint_stats_t cs;
  cs.struct_size = sizeof(cs);
  ok(embstore_checkpoint_stats(store, &cs));
  REQUIRE(cs.failed == 1);
  REQUIRE(cs.committed == 1);

  StoreGuard b(make_store());
  REQUIRE(restore_ok(b, dir.path(), EMBSTORE_LATEST) == 1);
  REQUIRE(same_bits(lookup_ok(get_table(b, "emb"), all, 0), at1));

  train_step(store, t, 3, 1000, 1000);
  REQUIRE(checkpoint_ok(store, dir.path()) == 3);
  REQUIRE(stats(t).dirty_rows == 0);
}

TEST_CASE("a failed policy checkpoint is reported once by embstore_step", "[checkpoint]") {
  TempDir dir;
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config_for("emb", 8, EMBSTORE_OPT_SGD));
  embstore_checkpoint_policy_t p;
  embstore_checkpoint_policy_init(&p);
  p.dir = dir.path().c_str();
  p.full_every_steps = 2;
  ok(embstore_checkpoint_set_policy(store, &p));
  {
    FaultGuard guard([](uint64_t, size_t) { return -EIO; });
    train_step(store, t, 1, 100, 16);
    train_step(store, t, 2, 100, 16);  // due: starts a checkpoint that fails
    embstore_checkpoint_stats_t cs;
    cs.struct_size = sizeof(cs);
    do {  // not embstore_checkpoint_wait: that would report the failure itself
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      ok(embstore_checkpoint_stats(store, &cs));
    } while (cs.in_flight != 0);
    REQUIRE(cs.failed == 1);
  }
  require_status(embstore_step(store, 3), EMBSTORE_IO_ERROR, "checkpoint 2");
  ok(embstore_step(store, 3));  // reported once
}

TEST_CASE("a crash while writing leaves the previous checkpoint to restore", "[checkpoint]") {
  // Crash safety lives in io/ and is the same for every backend; the child runs the host
  // backend, with host memory, because a CUDA context does not survive fork(). Only the
  // restore at the end uses the tested backend.
  TempDir dir;
  auto train = [](embstore_store_t* store, embstore_table_t* t, uint64_t from, uint64_t to) {
    for (uint64_t s = from; s <= to; ++s) {
      if (!host_train_step(store, t, s, 5000, 2000)) return false;
    }
    return true;
  };
  auto host_store = [] {
    embstore_store_config_t c;
    embstore_store_config_init(&c);
    c.backend = EMBSTORE_BACKEND_HOST;
    embstore_store_t* s = nullptr;
    REQUIRE(embstore_store_create(&c, &s) == EMBSTORE_OK);
    return s;
  };
  const pid_t parent = getpid();
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    die_with_parent(parent);
    // Child: commit version 10, then start version 20 with slow writes and wait to be killed.
    embstore_store_t* store = host_store();
    embstore_table_t* t = nullptr;
    const embstore_table_config_t c = config_for("emb", 32, EMBSTORE_OPT_ADAM);
    if (embstore_table_create(store, &c, &t) != EMBSTORE_OK || !train(store, t, 1, 10)) _exit(3);
    uint64_t v = 0;
    if (embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_FULL, &v) != EMBSTORE_OK ||
        embstore_checkpoint_wait(store, v) != EMBSTORE_OK) {
      _exit(4);
    }
    if (!train(store, t, 11, 20)) _exit(6);
    embstore::io::set_fault_injection([](uint64_t, size_t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      return 0;
    });
    if (embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_FULL, &v) != EMBSTORE_OK) {
      _exit(5);
    }
    for (;;) pause();
  }
  // Parent: kill the child once the temporary directory of version 20 holds data.
  bool writing = false;
  for (int i = 0; i < 3000 && !writing; ++i) {
    // The child renames and removes directories meanwhile: errors end a scan, not the test.
    std::error_code ec;
    for (fs::recursive_directory_iterator it(dir.path(), ec), end; !ec && it != end;
         it.increment(ec)) {
      const std::string p = it->path().string();
      std::error_code fec;
      if (p.find("/.tmp-20-") != std::string::npos && it->is_regular_file(fec) &&
          it->file_size(fec) > 0 && !fec) {
        writing = true;
      }
    }
    if (!writing) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(child, SIGKILL);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(writing);
  REQUIRE(WIFSIGNALED(status));

  // The same training in this process gives the rows of version 10 to compare with.
  embstore_store_t* expected_store = host_store();
  StoreGuard expected_guard(expected_store);
  embstore_table_t* te = nullptr;
  const embstore_table_config_t c = config_for("emb", 32, EMBSTORE_OPT_ADAM);
  REQUIRE(embstore_table_create(expected_store, &c, &te) == EMBSTORE_OK);
  REQUIRE(train(expected_store, te, 1, 10));

  StoreGuard b(make_store());
  REQUIRE(restore_ok(b, dir.path(), EMBSTORE_LATEST) == 10);
  const std::vector<int64_t> all = key_range(5000);
  std::vector<float> want(all.size() * 32);
  REQUIRE(embstore_lookup(te, all.data(), all.size(), want.data(), 0, nullptr) == EMBSTORE_OK);
  REQUIRE(same_bits(lookup_ok(get_table(b, "emb"), all, 0), want));

  // The next checkpoint into dir removes the leftover.
  embstore_table_t* tb = get_table(b, "emb");
  train_step(b, tb, 11, 5000, 100);
  checkpoint_ok(b, dir.path());
  for (const auto& e : fs::directory_iterator(dir.path())) {
    REQUIRE(e.path().filename().string().rfind(".tmp-", 0) != 0);
  }
}

TEST_CASE("a commit whose last fsync fails leaves no version behind", "[checkpoint]") {
  TempDir dir;
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config_for("emb", 8, EMBSTORE_OPT_SGD));
  train_step(store, t, 1, 100);
  {
    embstore::io::set_commit_fault_injection(
        [](const char* step) { return std::strcmp(step, "fsync_parent") == 0 ? -EIO : 0; });
    struct Reset {
      ~Reset() { embstore::io::set_commit_fault_injection(nullptr); }
    } reset;
    uint64_t version = 0;
    ok(embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_FULL, &version));
    require_status(embstore_checkpoint_wait(store, version), EMBSTORE_IO_ERROR, "commit");
  }
  REQUIRE_FALSE(fs::exists(version_dir(dir.path(), 1)));
  uint64_t v = 0;
  require_status(embstore_restore(store, dir.path().c_str(), EMBSTORE_LATEST, &v),
                 EMBSTORE_NOT_FOUND, "no committed checkpoint");
  REQUIRE(checkpoint_ok(store, dir.path()) == 1);  // the same step again, now committed
}
