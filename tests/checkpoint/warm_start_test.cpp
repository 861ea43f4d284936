// Warm start (embstore_warm_start): tables from several checkpoints, a later source overriding
// an earlier one table by table, values only, admission counts, attachments, and every failure
// leaving the store as it was. What a table holds is compared through full checkpoints of it:
// its row file has every key with its values and optimizer state.
#include "checkpoint_fixtures.hpp"

namespace embstore_test::checkpoint {
namespace {

constexpr int64_t kKeys = 300;

// s.dir points into dir: keep dir alive while s is used.
embstore_warm_start_source_t source(const std::string& dir, const char* regex,
                                    uint64_t version = EMBSTORE_LATEST, uint32_t flags = 0) {
  embstore_warm_start_source_t s;
  embstore_warm_start_source_init(&s);
  s.dir = dir.c_str();
  s.tables_regex = regex;
  s.version = version;
  s.flags = flags;
  return s;
}

// Every row of every table of a store, key -> values and state, by table: a full checkpoint of
// it into dir, read back.
std::map<std::string, std::map<int64_t, std::vector<float>>> rows_of(
    embstore_store_t* store, const std::string& dir, const std::vector<std::string>& tables) {
  const uint64_t version = checkpoint_ok(store, dir);
  std::map<std::string, std::map<int64_t, std::vector<float>>> out;
  for (const std::string& t : tables) out[t] = read_rows(table_file(dir, version, t));
  return out;
}

// Trains each table for steps first..last on batches of seed (keys in [-kKeys/2, kKeys/2)).
void train(embstore_store_t* store, const std::vector<embstore_table_t*>& tables, uint64_t first,
           uint64_t last, uint64_t seed) {
  for (uint64_t step = first; step <= last; ++step) {
    ok(embstore_step(store, step));
    for (embstore_table_t* t : tables) {
      std::vector<int64_t> k;
      std::vector<float> g;
      step_batch(seed * 1000 + step, kKeys, 128, embstore_table_dim(t), &k, &g);
      lookup_ok(t, k);
      apply_ok(t, k, g);
    }
  }
}

void attach(embstore_store_t* store, const char* name, const std::string& bytes) {
  ok(embstore_checkpoint_attach(store, name, bytes.data(), bytes.size()));
}

std::string attachment(embstore_store_t* store, const char* name) {
  char buf[64];
  size_t bytes = 0;
  ok(embstore_restore_attachment(store, name, buf, sizeof buf, &bytes));
  return std::string(buf, bytes);
}

// Three checkpoint directories:
//   a  user_emb (Adagrad), item_emb (Adam), ctx (SGD, dim 4): full at 3, a delta at 5
//   b  user_emb and item_emb trained otherwise, extra_emb (Adagrad, dim 4): full at 7
//   c  item_emb with Adagrad (the store's has Adam): full at 2
struct Sources {
  TempDir root;
  std::string a = root.path() + "/a", b = root.path() + "/b", c = root.path() + "/c";

  Sources() {
    {
      embstore_store_t* s = make_store();
      const auto tables = std::vector<embstore_table_t*>{
          make_table(s, config_for("user_emb", 8, EMBSTORE_OPT_ADAGRAD)),
          make_table(s, config_for("item_emb", 8, EMBSTORE_OPT_ADAM)),
          make_table(s, config_for("ctx", 4, EMBSTORE_OPT_SGD))};
      train(s, tables, 1, 3, 1);
      attach(s, "note", "a");
      attach(s, "a_only", "from a");
      checkpoint_ok(s, a);
      train(s, tables, 4, 5, 1);
      attach(s, "note", "a");
      attach(s, "a_only", "from a");
      ok(embstore_checkpoint_wait(s, incremental_ok(s, a)));
      ok(embstore_store_destroy(s));
    }
    {
      embstore_store_t* s = make_store();
      const auto tables = std::vector<embstore_table_t*>{
          make_table(s, config_for("user_emb", 8, EMBSTORE_OPT_ADAGRAD)),
          make_table(s, config_for("item_emb", 8, EMBSTORE_OPT_ADAM)),
          make_table(s, config_for("extra_emb", 4, EMBSTORE_OPT_ADAGRAD))};
      train(s, tables, 1, 7, 2);
      attach(s, "note", "b");
      checkpoint_ok(s, b);
      ok(embstore_store_destroy(s));
    }
    {
      embstore_store_t* s = make_store();
      const auto tables = std::vector<embstore_table_t*>{
          make_table(s, config_for("item_emb", 8, EMBSTORE_OPT_ADAGRAD))};
      train(s, tables, 1, 2, 3);
      checkpoint_ok(s, c);
      ok(embstore_store_destroy(s));
    }
  }

  // The rows of the given tables at a version of dir: restored into a store, written again.
  std::map<std::string, std::map<int64_t, std::vector<float>>> rows(
      const std::string& dir, uint64_t version, const std::vector<std::string>& tables,
      const std::string& out) {
    embstore_store_t* s = make_store();
    restore_ok(s, dir, version);
    auto r = rows_of(s, out, tables);
    ok(embstore_store_destroy(s));
    return r;
  }
};

// The trainer's store: user_emb and item_emb (Adam) of its own, and "other", which no source
// has. Trained for 9 steps and checkpointed into dir at 9.
struct Trainer {
  const std::string dir;
  embstore_store_t* store;
  std::vector<embstore_table_t*> tables;

  Trainer(const std::string& d, embstore_spill_t spill = EMBSTORE_SPILL_AUTO) : dir(d) {
    embstore_store_config_t config;
    embstore_store_config_init(&config);
    config.restore_spill = spill;
    store = make_store(config);
    tables = {make_table(store, config_for("user_emb", 8, EMBSTORE_OPT_ADAGRAD)),
              make_table(store, config_for("item_emb", 8, EMBSTORE_OPT_ADAM)),
              make_table(store, config_for("other", 4, EMBSTORE_OPT_ADAGRAD))};
    train(store, tables, 1, 9, 4);
    checkpoint_ok(store, dir);
  }
  ~Trainer() { embstore_store_destroy(store); }

  // The rows of tables in the trainer's full checkpoint of version.
  std::map<std::string, std::map<int64_t, std::vector<float>>> rows_at(
      uint64_t version, const std::vector<std::string>& names) const {
    std::map<std::string, std::map<int64_t, std::vector<float>>> out;
    for (const std::string& t : names) out[t] = read_rows(table_file(dir, version, t));
    return out;
  }
};

TEST_CASE("Warm start takes each table from the last source that matches it", "[warm_start]") {
  Sources src;
  TempDir work;
  Trainer trainer(work.path() + "/own");
  const auto before = trainer.rows_at(9, {"user_emb", "item_emb", "other"});

  const embstore_warm_start_source_t sources[] = {
      source(src.a, ".*"),                 // user_emb, item_emb, ctx
      source(src.b, "user_.*|extra_emb"),  // user_emb, extra_emb: over a's
      source(src.c, "item_emb", EMBSTORE_LATEST, EMBSTORE_WARM_START_VALUES_ONLY)};  // over a's
  ok(embstore_warm_start(trainer.store, sources, 3));

  // The next checkpoint in the store's own directory is full, though a delta on version 9 is
  // asked for: no delta could hold the loaded rows.
  ok(embstore_step(trainer.store, 10));
  uint64_t version = 0;
  ok(embstore_checkpoint(trainer.store, trainer.dir.c_str(), EMBSTORE_CKPT_INCREMENTAL, &version));
  ok(embstore_checkpoint_wait(trainer.store, version));
  REQUIRE(version == 10);
  embstore_checkpoint_info_t info{};
  info.struct_size = sizeof info;
  ok(embstore_checkpoint_info(trainer.store, 10, &info));
  CHECK(info.kind == EMBSTORE_CKPT_FULL);

  const auto a = src.rows(src.a, 5, {"ctx"}, work.path() + "/a5");
  const auto b = src.rows(src.b, 7, {"user_emb", "extra_emb"}, work.path() + "/b7");
  const auto c = src.rows(src.c, 2, {"item_emb"}, work.path() + "/c2");
  const auto after = trainer.rows_at(10, {"user_emb", "item_emb", "other", "ctx", "extra_emb"});
  CHECK(after.at("user_emb") == b.at("user_emb"));    // b overrides a
  CHECK(after.at("extra_emb") == b.at("extra_emb"));  // created from b's manifest
  CHECK(after.at("ctx") == a.at("ctx"));              // a's chain applied (version 5)
  CHECK(after.at("other") == before.at("other"));     // no source matches it: kept
  CHECK(after.at("user_emb") != before.at("user_emb"));
  // item_emb: c's values, and (values only) the optimizer state of a new row of the store's
  // Adam table: first and second moments 0, then the beta powers at 1.
  const auto& items = after.at("item_emb");
  REQUIRE(items.size() == c.at("item_emb").size());
  for (const auto& [key, row] : c.at("item_emb")) {
    INFO("key " << key);
    const auto& got = items.at(key);
    REQUIRE(got.size() == 8 + 8 * 2 + 2);
    CHECK(std::equal(got.begin(), got.begin() + 8, row.begin()));
    CHECK(std::all_of(got.begin() + 8, got.begin() + 24, [](float x) { return x == 0.0f; }));
    CHECK(std::all_of(got.begin() + 24, got.end(), [](float x) { return x == 1.0f; }));
  }
  // Tables created by warm start have their source's configuration.
  embstore_table_t* extra = get_table(trainer.store, "extra_emb");
  CHECK(embstore_table_dim(extra) == 4);
  // Attachments of every source, a later one's over an earlier one's.
  CHECK(attachment(trainer.store, "note") == "b");
  CHECK(attachment(trainer.store, "a_only") == "from a");
}

TEST_CASE("Warm start carries admission counts, except with values only", "[warm_start]") {
  TempDir dir;
  const std::string src = dir.path() + "/src";
  embstore_table_config_t counted = config_for("counted", 4, EMBSTORE_OPT_ADAGRAD);
  counted.admit_after = 2;
  {
    embstore_store_t* s = make_store();
    embstore_table_t* t = make_table(s, counted);
    lookup_ok(t, {777}, EMBSTORE_LOOKUP_INSERT);   // counted once: no row yet
    lookup_ok(t, {1, 1}, EMBSTORE_LOOKUP_INSERT);  // admitted
    ok(embstore_step(s, 1));
    checkpoint_ok(s, src);
    ok(embstore_store_destroy(s));
  }
  for (uint32_t flags : {0u, EMBSTORE_WARM_START_VALUES_ONLY}) {
    INFO("flags " << flags);
    embstore_store_t* s = make_store();
    const embstore_warm_start_source_t one = source(src, "counted", EMBSTORE_LATEST, flags);
    ok(embstore_warm_start(s, &one, 1));
    embstore_table_t* t = get_table(s, "counted");
    CHECK(stats(t).rows == 1);
    lookup_ok(t, {777}, EMBSTORE_LOOKUP_INSERT);  // the second time it is seen, with the counts
    CHECK(stats(t).rows == (flags == 0 ? 2u : 1u));
    ok(embstore_store_destroy(s));
  }
}

TEST_CASE("A failed warm start leaves the store as it was", "[warm_start]") {
  Sources src;
  TempDir work;
  // Replaced tables are parked in a spill file while their replacements load, and read back
  // when the warm start fails.
  Trainer trainer(work.path() + "/own", EMBSTORE_SPILL_ALWAYS);
  const std::vector<std::string> names{"user_emb", "item_emb", "other"};
  const auto before = trainer.rows_at(9, names);
  const std::string missing = work.path() + "/missing";

  SECTION("a regex that matches no table") {
    const embstore_warm_start_source_t s[] = {source(src.a, ".*"), source(src.b, "users?")};
    require_status(embstore_warm_start(trainer.store, s, 2), EMBSTORE_NOT_FOUND, "no table of");
  }
  SECTION("a regex that does not compile") {
    const embstore_warm_start_source_t s[] = {source(src.a, "user_(")};
    require_status(embstore_warm_start(trainer.store, s, 1), EMBSTORE_INVALID_ARGUMENT,
                   "tables_regex");
  }
  SECTION("a source that does not exist, or lacks the version") {
    const embstore_warm_start_source_t s[] = {source(src.a, ".*"), source(missing, ".*")};
    require_status(embstore_warm_start(trainer.store, s, 2), EMBSTORE_NOT_FOUND, "missing");
    const embstore_warm_start_source_t v[] = {source(src.a, ".*", 4)};
    require_status(embstore_warm_start(trainer.store, v, 1), EMBSTORE_NOT_FOUND);
  }
  SECTION("another optimizer's state without values only") {
    const embstore_warm_start_source_t s[] = {source(src.a, ".*"), source(src.c, "item_emb")};
    require_status(embstore_warm_start(trainer.store, s, 2), EMBSTORE_INVALID_ARGUMENT, "item_emb");
  }
  SECTION("another dim, even for values only") {
    TempDir other;
    embstore_store_t* s = make_store();
    make_table(s, config_for("other", 6, EMBSTORE_OPT_ADAGRAD));
    checkpoint_ok(s, other.path());
    ok(embstore_store_destroy(s));
    const embstore_warm_start_source_t w[] = {
        source(src.a, ".*"),
        source(other.path(), "other", EMBSTORE_LATEST, EMBSTORE_WARM_START_VALUES_ONLY)};
    require_status(embstore_warm_start(trainer.store, w, 2), EMBSTORE_INVALID_ARGUMENT, "dim");
  }
  SECTION("a corrupt row file of the table loaded last, after the others loaded") {
    // Tables load in name order: ctx, extra_emb, item_emb (parked), user_emb (parked).
    flip_byte(table_file(src.b, 7, "user_emb"), 200);
    const embstore_warm_start_source_t s[] = {source(src.a, ".*"), source(src.b, ".*")};
    require_status(embstore_warm_start(trainer.store, s, 2), EMBSTORE_CORRUPT, "user_emb");
  }
  SECTION("arguments") {
    embstore_warm_start_source_t s = source(src.a, ".*");
    require_status(embstore_warm_start(trainer.store, &s, 0), EMBSTORE_INVALID_ARGUMENT, "n is 0");
    require_status(embstore_warm_start(trainer.store, nullptr, 1), EMBSTORE_INVALID_ARGUMENT,
                   "sources");
    require_status(embstore_warm_start(nullptr, &s, 1), EMBSTORE_INVALID_ARGUMENT, "store");
    s.flags = 2;
    require_status(embstore_warm_start(trainer.store, &s, 1), EMBSTORE_INVALID_ARGUMENT, "flags");
    s.flags = 0;
    s.tables_regex = nullptr;
    require_status(embstore_warm_start(trainer.store, &s, 1), EMBSTORE_INVALID_ARGUMENT,
                   "tables_regex");
    const std::string empty;  // source() keeps a pointer into it
    s = source(empty, ".*");
    require_status(embstore_warm_start(trainer.store, &s, 1), EMBSTORE_INVALID_ARGUMENT, "dir");
    s = source(src.a, ".*");
    s.struct_size = 8;
    require_status(embstore_warm_start(trainer.store, &s, 1), EMBSTORE_INVALID_ARGUMENT,
                   "struct_size");
  }
  // Nothing changed: the same tables (no table created), the same rows and state.
  embstore_table_t* t = nullptr;
  CHECK(embstore_table_get(trainer.store, "ctx", &t) == EMBSTORE_NOT_FOUND);
  CHECK(rows_of(trainer.store, work.path() + "/after", names) == before);
}

TEST_CASE("A source built before the flags field is read without flags", "[warm_start]") {
  Sources src;
  embstore_store_t* s = make_store();
  embstore_warm_start_source_t old = source(src.c, ".*");
  old.flags = EMBSTORE_WARM_START_VALUES_ONLY;  // past its struct_size: not read
  old.struct_size = offsetof(embstore_warm_start_source_t, flags);
  ok(embstore_step(s, 3));
  ok(embstore_warm_start(s, &old, 1));
  TempDir work;
  CHECK(checkpoint_ok(s, work.path() + "/step") == 3);  // warm start keeps the step
  CHECK(rows_of(s, work.path() + "/after", {"item_emb"}) ==
        src.rows(src.c, 2, {"item_emb"}, work.path() + "/c2"));  // with c's Adagrad state
  ok(embstore_store_destroy(s));
}

// Table regexes come from callers: at most EMBSTORE_MAX_TABLES_REGEX_BYTES, RE2's syntax,
// matched in time linear in the name. The patterns below backtrack exponentially in the name's
// length in std::regex (tens of seconds at 31 bytes; the 128-byte name never finishes), and
// 25,000 nested parentheses overflowed its compiler's stack: a regression crashes this test or
// holds it until ctest's timeout.
TEST_CASE("Table regexes of warm start sources: a length limit, RE2 syntax, linear time",
          "[warm_start][regex]") {
  TempDir dir;
  const std::string a30b = std::string(30, 'a') + "b";
  const std::string a127b = std::string(127, 'a') + "b";  // the longest name
  {
    embstore_store_t* s = make_store();
    for (const std::string& name : {a30b, a127b}) {
      lookup_ok(make_table(s, config_for(name.c_str(), 4, EMBSTORE_OPT_SGD)), {1, 2, 3});
    }
    checkpoint_ok(s, dir.path());
    ok(embstore_store_destroy(s));
  }
  embstore_store_t* s = make_store();
  const auto warm = [&](const std::string& regex) {
    const embstore_warm_start_source_t src = source(dir.path(), regex.c_str());
    return embstore_warm_start(s, &src, 1);
  };
  const auto has = [&](const std::string& name) {
    embstore_table_t* t = nullptr;
    return embstore_table_get(s, name.c_str(), &t) == EMBSTORE_OK;
  };

  SECTION("at most EMBSTORE_MAX_TABLES_REGEX_BYTES") {
    std::string longest = a30b + "|";
    longest.resize(EMBSTORE_MAX_TABLES_REGEX_BYTES, 'x');
    require_status(warm(longest + "x"), EMBSTORE_INVALID_ARGUMENT,
                   "1025 bytes, more than EMBSTORE_MAX_TABLES_REGEX_BYTES (1024)");
    require_status(warm(std::string(100000, 'a')), EMBSTORE_INVALID_ARGUMENT,
                   "EMBSTORE_MAX_TABLES_REGEX_BYTES");
    CHECK_FALSE(has(a30b));
    ok(warm(longest));
    CHECK(has(a30b));
    CHECK_FALSE(has(a127b));
  }
  SECTION("deep nesting") {
    require_status(warm(std::string(25000, '(') + "a" + std::string(25000, ')')),
                   EMBSTORE_INVALID_ARGUMENT, "EMBSTORE_MAX_TABLES_REGEX_BYTES");
    const std::string nested = std::string(500, '(') + "a+b" + std::string(500, ')');
    REQUIRE(nested.size() <= EMBSTORE_MAX_TABLES_REGEX_BYTES);
    ok(warm(nested));
    CHECK(has(a30b));
    CHECK(has(a127b));
  }
  SECTION("patterns that backtrack exponentially match nothing, promptly") {
    for (const char* regex : {"(a+)+$", "(a|a)*$", "(.*a){20}$", "((a*)*)*c", "(a|aa)+", "(a*)*"}) {
      INFO("tables_regex " << regex);
      require_status(warm(regex), EMBSTORE_NOT_FOUND, "no table of");
    }
    CHECK_FALSE(has(a30b));
    ok(warm("(a+)+b"));  // while what they should match, they match
    CHECK(has(a30b));
    CHECK(has(a127b));
  }
  SECTION("no backreferences or lookaround") {
    require_status(warm("(a)\\1*b"), EMBSTORE_INVALID_ARGUMENT, "not an RE2 regular expression");
    require_status(warm("(?=a)a*b"), EMBSTORE_INVALID_ARGUMENT, "not an RE2 regular expression");
    require_status(warm(".*(?<!b)"), EMBSTORE_INVALID_ARGUMENT, "not an RE2 regular expression");
    CHECK_FALSE(has(a30b));
  }
  ok(embstore_store_destroy(s));
}

}  // namespace
}  // namespace embstore_test::checkpoint
