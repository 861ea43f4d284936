/* A serving replica beside the demo's trainer, in plain C through the follower calls of
   embstore.h: it follows the checkpoint directory that `embstore-demo train` writes.

     embstore-follow DIR [--interval-ms N] [--wait-seconds S]

   Waits for the first committed version (up to S seconds, default 60) and serves it, while a
   background thread applies each new delta (woken by inotify, else every N ms, default 100).
   Each time the version changes it prints what it serves: the deltas applied, the lag from
   commit to visibility, and how far the served embeddings of the demo's 1000 most frequent ids
   are from their training targets (a distance that falls as training goes on). On SIGINT or
   SIGTERM it polls once more, checks that its rows of those ids equal a restore of the same
   version bit for bit, and exits 0; 1 when they differ or a call fails. */
#include <embstore/embstore.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define HOT_IDS 1000

/* The demo's tables (examples/train_demo.cpp): ids are Zipf ranks spread out by a constant, and
   training pulls each embedding towards a fixed target. */
static const char* const kTables[] = {"user_id", "item_id"};
static int64_t hot_id(int rank) { return (int64_t)rank * 2654435761LL; }
static float target(int64_t key, uint32_t col) {
  return sinf(0.001f * (float)(key % 100003) + 0.37f * (float)col);
}

static volatile sig_atomic_t stop_requested = 0;
static void on_signal(int sig) {
  (void)sig;
  stop_requested = 1;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL); /* a signal ends it early: the loops check stop_requested */
}

static int failed(embstore_status_t st, const char* what) {
  if (st == EMBSTORE_OK) return 0;
  fprintf(stderr, "embstore-follow: %s: %s: %s\n", what, embstore_status_name(st),
          embstore_last_error());
  return 1;
}

/* The rows of the hot ids of table t (HOT_IDS x dim, malloc'ed), read through the follower. */
static float* served_rows(embstore_follower_t* f, const char* table, const int64_t* keys,
                          uint32_t* dim) {
  if (failed(embstore_follower_table_dim(f, table, dim), "embstore_follower_table_dim"))
    return NULL;
  float* rows = malloc(sizeof(float) * HOT_IDS * *dim);
  if (rows == NULL) return NULL;
  if (failed(embstore_follower_lookup(f, table, keys, HOT_IDS, rows, NULL),
             "embstore_follower_lookup")) {
    free(rows);
    return NULL;
  }
  return rows;
}

/* Mean squared distance of the served rows of the hot ids from their targets. */
static double distance(embstore_follower_t* f, const char* table, const int64_t* keys) {
  uint32_t dim = 0;
  float* rows = served_rows(f, table, keys, &dim);
  if (rows == NULL) return NAN;
  double sum = 0;
  for (int i = 0; i < HOT_IDS; ++i) {
    for (uint32_t c = 0; c < dim; ++c) {
      const double d = rows[(size_t)i * dim + c] - target(keys[i], c);
      sum += d * d;
    }
  }
  free(rows);
  return sum / ((double)HOT_IDS * dim);
}

/* Whether the follower's rows of the hot ids equal a restore of the version it serves. */
static int equals_restore(embstore_follower_t* f, const char* dir, uint64_t version,
                          const int64_t* keys) {
  embstore_store_config_t sc;
  embstore_store_config_init(&sc);
  sc.backend = EMBSTORE_BACKEND_HOST; /* host memory, as the follower's lookups */
  embstore_store_t* store = NULL;
  if (failed(embstore_store_create(&sc, &store), "embstore_store_create")) return 0;
  int same = !failed(embstore_restore(store, dir, version, NULL), "embstore_restore");
  for (size_t t = 0; same && t < sizeof kTables / sizeof kTables[0]; ++t) {
    embstore_table_t* table = NULL;
    uint32_t dim = 0;
    float* served = served_rows(f, kTables[t], keys, &dim);
    float* restored = malloc(sizeof(float) * HOT_IDS * dim);
    same = served != NULL && restored != NULL &&
           !failed(embstore_table_get(store, kTables[t], &table), "embstore_table_get") &&
           !failed(embstore_lookup(table, keys, HOT_IDS, restored, 0, NULL), "embstore_lookup") &&
           memcmp(served, restored, sizeof(float) * HOT_IDS * dim) == 0;
    free(served);
    free(restored);
  }
  embstore_store_destroy(store);
  return same;
}

int main(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') {
    fprintf(stderr, "usage: embstore-follow DIR [--interval-ms N] [--wait-seconds S]\n");
    return 2;
  }
  const char* dir = argv[1];
  unsigned long interval_ms = 100, wait_seconds = 60;
  for (int i = 2; i < argc; i += 2) {
    char* end = NULL;
    const unsigned long value =
        i + 1 < argc && argv[i + 1][0] != '-' ? strtoul(argv[i + 1], &end, 10) : 0;
    if (end == NULL || end == argv[i + 1] || *end != '\0') {
      fprintf(stderr, "embstore-follow: '%s' needs a number\n", argv[i]);
      return 2;
    }
    if (strcmp(argv[i], "--interval-ms") == 0 && value > 0 && value <= 30000) {
      interval_ms = value;
    } else if (strcmp(argv[i], "--wait-seconds") == 0 && value <= 86400) {
      wait_seconds = value;
    } else {
      fprintf(stderr, "embstore-follow: unknown or out-of-range option '%s %s'\n", argv[i],
              argv[i + 1]);
      return 2;
    }
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);

  int64_t keys[HOT_IDS];
  for (int i = 0; i < HOT_IDS; ++i) keys[i] = hot_id(i + 1);

  /* A replica may start before the trainer's first checkpoint: NOT_FOUND until it commits. */
  embstore_follower_config_t config;
  embstore_follower_config_init(&config);
  config.dir = dir;
  config.backend = EMBSTORE_BACKEND_HOST;
  config.poll_interval_ms = (uint32_t)interval_ms;
  embstore_follower_t* f = NULL;
  embstore_status_t st = EMBSTORE_NOT_FOUND;
  for (unsigned long waited_ms = 0; !stop_requested; waited_ms += 200) {
    st = embstore_follower_create(&config, &f);
    if (st != EMBSTORE_NOT_FOUND || waited_ms >= wait_seconds * 1000) break;
    sleep_ms(200);
  }
  if (f == NULL) return failed(st, "embstore_follower_create");

  uint64_t shown = 0;
  embstore_status_t last_status = EMBSTORE_OK;
  while (!stop_requested) {
    embstore_follower_stats_t s;
    s.struct_size = sizeof s;
    if (failed(embstore_follower_stats(f, &s), "embstore_follower_stats")) break;
    if (s.version != shown) {
      shown = s.version;
      printf(
          "serving version %6llu  deltas applied %4llu  whole loads %llu  lag p50 %6.1f ms  "
          "p99 %6.1f ms  distance to targets: user_id %.4f item_id %.4f\n",
          (unsigned long long)s.version, (unsigned long long)s.versions_applied,
          (unsigned long long)s.full_loads, s.lag_p50_seconds * 1e3, s.lag_p99_seconds * 1e3,
          distance(f, "user_id", keys), distance(f, "item_id", keys));
      fflush(stdout);
    }
    if (s.last_poll_status != last_status && s.last_poll_status != EMBSTORE_OK) {
      fprintf(stderr, "embstore-follow: a poll failed (%s); still serving version %llu\n",
              embstore_status_name(s.last_poll_status), (unsigned long long)s.version);
    }
    last_status = s.last_poll_status;
    sleep_ms(100);
  }

  /* Versions only move forward: when the version served is the same after the comparison, no
     background poll moved on while the rows were read. */
  int ok = 0;
  for (int attempt = 0; attempt < 5; ++attempt) {
    uint64_t version = 0, after = 0;
    if (failed(embstore_follower_poll(f, &version), "embstore_follower_poll")) break;
    const int same = equals_restore(f, dir, version, keys);
    if (failed(embstore_follower_version(f, &after), "embstore_follower_version")) break;
    if (after != version) continue;
    ok = same;
    printf(ok ? "stopped at version %llu: the rows served equal a restore of it\n"
              : "stopped at version %llu: the rows served DIFFER from a restore of it\n",
           (unsigned long long)version);
    break;
  }
  embstore_follower_destroy(f);
  return ok ? 0 : 1;
}
