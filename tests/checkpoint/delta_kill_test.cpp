// A trainer killed (SIGKILL) while a delta checkpoint is being written: the last committed
// delta restores exactly, only a leftover remains, and a restored store extends the chain.
#include <catch2/catch.hpp>

#include "tests/checkpoint/checkpoint_fixtures.hpp"

using namespace embstore_test;
using namespace embstore_test::checkpoint;

namespace {

// What the child of the kill test tells its parent through a pipe.
struct ChildNote {
  char tag = 0;  // 'C': the delta is captured (a = version, b = rows captured, c = parent);
                 // 'H': its writer is held at its second write (a = offset, b = bytes)
  uint64_t a = 0, b = 0, c = 0, kind = 0;
};

// Reads one note, waiting at most until deadline; false on EOF, error or timeout.
bool read_note(int fd, ChildNote* note, std::chrono::steady_clock::time_point deadline) {
  char* p = reinterpret_cast<char*>(note);
  size_t got = 0;
  while (got < sizeof(*note)) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    const int r = poll(&pfd, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    const ssize_t n = read(fd, p + got, sizeof(*note) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    got += static_cast<size_t>(n);
  }
  return true;
}

// The child's record of its table at a committed version: its row count, then the values of
// the keys of key_range(keys).
bool write_state(const std::string& path, embstore_table_t* t, int64_t keys) {
  const std::vector<int64_t> all = key_range(keys);
  std::vector<float> values(all.size() * embstore_table_dim(t));
  embstore_table_stats_t st;
  std::memset(&st, 0, sizeof(st));
  st.struct_size = sizeof(st);
  if (embstore_lookup(t, all.data(), all.size(), values.data(), 0, nullptr) != EMBSTORE_OK ||
      embstore_table_stats(t, &st) != EMBSTORE_OK) {
    return false;
  }
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool written = std::fwrite(&st.rows, sizeof(st.rows), 1, f) == 1 &&
                       std::fwrite(values.data(), sizeof(float), values.size(), f) == values.size();
  return std::fclose(f) == 0 && written;
}

void read_state(const std::string& path, uint64_t* rows, std::vector<float>* values) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  in.read(reinterpret_cast<char*>(rows), sizeof(*rows));
  in.read(reinterpret_cast<char*>(values->data()),
          static_cast<std::streamsize>(values->size() * sizeof(float)));
  REQUIRE(in.gcount() == static_cast<std::streamsize>(values->size() * sizeof(float)));
  REQUIRE(in.peek() == std::char_traits<char>::eof());
}

}  // namespace

TEST_CASE("a kill while a delta checkpoint is written leaves the last committed delta to restore",
          "[checkpoint][incremental]") {
  // The child runs the host backend (a CUDA context does not survive fork()) and makes no
  // Catch assertion: it ends with an exit code the parent reports. It commits a full at 10 and
  // deltas at 20 and 30, records its table at each, then starts the delta of 40 and holds its
  // writer at the second write, so that the first block is out and the rest of the delta's
  // rows are in flight, and says so through a pipe. The parent kills it there.
  TempDir dir, notes;
  constexpr uint32_t kDim = 32;
  auto keys_at = [](uint64_t step) { return 3000 + 100 * static_cast<int64_t>(step); };
  const int64_t kAllKeys = keys_at(40);  // every key any step drew, new keys in each delta
  auto state_file = [&](uint64_t v) { return notes.file("at-" + std::to_string(v)); };
  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  const pid_t parent = getpid();
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    die_with_parent(parent);
    close(pipe_fds[0]);
    const int out = pipe_fds[1];
    embstore_store_config_t sc;
    embstore_store_config_init(&sc);
    sc.backend = EMBSTORE_BACKEND_HOST;
    embstore_store_t* store = nullptr;
    embstore_table_t* t = nullptr;
    const embstore_table_config_t c = config_for("emb", kDim, EMBSTORE_OPT_ADAM);
    embstore_checkpoint_policy_t p;
    embstore_checkpoint_policy_init(&p);
    p.max_chain_length = 0;  // keep the chain: every incremental after the first is a delta
    p.rebaseline_fraction = 0;
    if (embstore_store_create(&sc, &store) != EMBSTORE_OK ||
        embstore_table_create(store, &c, &t) != EMBSTORE_OK ||
        embstore_checkpoint_set_policy(store, &p) != EMBSTORE_OK) {
      _exit(3);
    }
    auto train = [&](uint64_t from, uint64_t to) {
      for (uint64_t s = from; s <= to; ++s) {
        if (!host_train_step(store, t, s, keys_at(s), 2000)) _exit(4);
      }
    };
    for (uint64_t v = 10; v <= 30; v += 10) {
      train(v - 9, v);
      uint64_t got = 0;
      if (embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_INCREMENTAL, &got) !=
              EMBSTORE_OK ||
          got != v || embstore_checkpoint_wait(store, v) != EMBSTORE_OK) {
        _exit(5);
      }
      if (!write_state(state_file(v), t, kAllKeys)) _exit(6);
    }
    train(31, 40);
    embstore::io::set_fault_injection([out](uint64_t offset, size_t bytes) {
      static int writes = 0;  // the hook runs under io/'s lock
      if (++writes == 2) {
        ChildNote n;
        n.tag = 'H';
        n.a = offset;
        n.b = bytes;
        if (write(out, &n, sizeof(n)) != static_cast<ssize_t>(sizeof(n))) _exit(8);
        for (;;) pause();
      }
      return 0;
    });
    uint64_t v = 0;
    if (embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_INCREMENTAL, &v) !=
        EMBSTORE_OK) {
      _exit(7);
    }
    embstore_checkpoint_info_t info;
    std::memset(&info, 0, sizeof(info));
    info.struct_size = sizeof(info);
    if (embstore_checkpoint_info(store, v, &info) != EMBSTORE_OK) _exit(7);
    ChildNote n;
    n.tag = 'C';
    n.a = v;
    n.b = info.rows_captured;
    n.c = info.parent;
    n.kind = static_cast<uint64_t>(info.kind);
    if (write(out, &n, sizeof(n)) != static_cast<ssize_t>(sizeof(n))) _exit(8);
    embstore_checkpoint_wait(store, v);  // never returns: the writer is held
    _exit(9);
  }
  close(pipe_fds[1]);
  ChildNote captured, held;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (int i = 0; i < 2; ++i) {
    ChildNote n;
    if (!read_note(pipe_fds[0], &n, deadline)) break;
    (n.tag == 'C' ? captured : held) = n;
  }
  close(pipe_fds[0]);
  kill(child, SIGKILL);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  INFO("child exit code " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1));
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == SIGKILL);
  // It died mid-delta: version 40 captured as a delta on 30, its first block submitted.
  REQUIRE(captured.tag == 'C');
  REQUIRE(held.tag == 'H');
  REQUIRE(captured.a == 40);
  REQUIRE(captured.kind == EMBSTORE_CKPT_INCREMENTAL);
  REQUIRE(captured.c == 30);
  REQUIRE(captured.b > 0);
  REQUIRE(held.a > 0);  // a second write: the first block was not all of the delta

  // On disk: 10, 20 and 30, and only a temporary directory of 40 without a manifest.
  std::vector<embstore::io::VersionDir> versions;
  REQUIRE(embstore::io::list_versions(dir.path(), &versions) == 0);
  REQUIRE(versions.size() == 3);
  for (size_t i = 0; i < versions.size(); ++i) {
    REQUIRE(versions[i].version == 10 * (i + 1));
    REQUIRE(versions[i].full == (i == 0));
  }
  size_t leftovers = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    const std::string name = e.path().filename().string();
    if (std::any_of(versions.begin(), versions.end(),
                    [&](const embstore::io::VersionDir& v) { return v.name == name; }) ||
        name == embstore::io::kLockFileName) {
      continue;
    }
    INFO(name);
    REQUIRE(name.rfind(".tmp-40-", 0) == 0);
    REQUIRE(fs::exists(e.path() / row_file("emb")));
    REQUIRE_FALSE(fs::exists(e.path() / "MANIFEST.json"));
    ++leftovers;
  }
  REQUIRE(leftovers == 1);

  // Every committed version restores to what the child had at it; 40 does not exist.
  const std::vector<int64_t> all = key_range(kAllKeys);
  std::map<uint64_t, std::vector<float>> want;
  std::map<uint64_t, uint64_t> want_rows;
  for (uint64_t v = 10; v <= 30; v += 10) {
    want[v].resize(all.size() * kDim);
    read_state(state_file(v), &want_rows[v], &want[v]);
  }
  REQUIRE_FALSE(same_bits(want[20], want[30]));
  REQUIRE(want_rows[20] < want_rows[30]);
  for (uint64_t v = 10; v <= 20; v += 10) {
    StoreGuard s(make_store());
    REQUIRE(restore_ok(s, dir.path(), v) == v);
    REQUIRE(stats(get_table(s, "emb")).rows == want_rows[v]);
    REQUIRE(same_bits(lookup_ok(get_table(s, "emb"), all, 0), want[v]));
  }
  StoreGuard b(make_store());
  REQUIRE(restore_ok(b, dir.path(), EMBSTORE_LATEST) == 30);
  embstore_table_t* tb = get_table(b, "emb");
  REQUIRE(stats(tb).rows == want_rows[30]);
  REQUIRE(same_bits(lookup_ok(tb, all, 0), want[30]));
  uint64_t v = 0;
  require_status(embstore_restore(b, dir.path().c_str(), 40, &v), EMBSTORE_NOT_FOUND, "40");

  // The restored store extends the chain in the same directory: 40 again, as a delta on 30,
  // and the leftover is gone.
  no_rebaseline(b);
  for (uint64_t s = 31; s <= 40; ++s) train_step(b, tb, s, keys_at(s), 2000);
  REQUIRE(incremental_ok(b, dir.path()) == 40);
  embstore_checkpoint_info_t info;
  std::memset(&info, 0, sizeof(info));
  info.struct_size = sizeof(info);
  ok(embstore_checkpoint_info(b, 40, &info));
  REQUIRE(info.kind == EMBSTORE_CKPT_INCREMENTAL);
  REQUIRE(info.parent == 30);
  REQUIRE(info.rows_captured == captured.b);  // the same keys as the killed delta's
  REQUIRE(fs::exists(delta_dir(dir.path(), 40)));
  REQUIRE(embstore::io::list_versions(dir.path(), &versions) == 0);
  REQUIRE(versions.size() == 4);
  for (const auto& e : fs::directory_iterator(dir.path())) {
    REQUIRE(e.path().filename().string().rfind(".tmp-", 0) != 0);
  }
  StoreGuard c(make_store());
  REQUIRE(restore_ok(c, dir.path(), EMBSTORE_LATEST) == 40);
  REQUIRE(stats(get_table(c, "emb")).rows == stats(tb).rows);
  REQUIRE(same_bits(lookup_ok(get_table(c, "emb"), all, 0), lookup_ok(tb, all, 0)));
}
