/* docs/tiers.md's example: a table of 20,000 rows with 2,000 of them in memory and the rest in
   an SSD tier, trained with a hot set, checkpointed, and restored into an untiered store that
   must hold the same rows.
     embstore-tiers TIER_DIR CKPT_DIR
   TIER_DIR: a directory on a disk (not tmpfs) for the tier's file, which is unnamed and gone
   when the process ends; CKPT_DIR: a checkpoint directory (created, must not hold versions).
   Host backend. Exits 0 when the restored rows equal the trained ones. ctest runs it
   ("examples: tiers"). */
#include <embstore/embstore.h>
#include <stdio.h>
#include <string.h>

#define CHECK(call)                                                        \
  do {                                                                     \
    embstore_status_t s_ = (call);                                         \
    if (s_ != EMBSTORE_OK) {                                               \
      fprintf(stderr, "%s: %s: %s\n", #call, embstore_status_name(s_),    \
              embstore_last_error());                                      \
      return 1;                                                            \
    }                                                                      \
  } while (0)

enum { ROWS = 20000, MEMORY_ROWS = 2000, BATCH = 1024, DIM = 16, STEPS = 30 };

static int64_t keys[2][BATCH]; /* this step's batch and the next one's */
static float values[BATCH * DIM], grads[BATCH * DIM];
static int64_t all[ROWS];
static float trained[ROWS * DIM], restored[ROWS * DIM];

/* The batch of step s, in keys[s % 2]: three quarters from a hot set of 1,000 keys, the rest
   from all 20,000. */
static const int64_t* make_batch(uint64_t s) {
  int64_t* k = keys[s % 2];
  uint64_t x = s * 0x9E3779B97F4A7C15ull;
  for (int i = 0; i < BATCH; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64 */
    k[i] = (int64_t)(i % 4 != 0 ? x % 1000 : x % ROWS);
  }
  return k;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s TIER_DIR CKPT_DIR\n", argv[0]);
    return 2;
  }
  for (int i = 0; i < BATCH * DIM; ++i) grads[i] = 0.25f;
  for (int i = 0; i < ROWS; ++i) all[i] = i;

  embstore_store_config_t sc;
  embstore_store_config_init(&sc);
  sc.backend = EMBSTORE_BACKEND_HOST;
  sc.tier_dir = argv[1]; /* where rows beyond a table's memory_rows live */
  embstore_store_t* store;
  CHECK(embstore_store_create(&sc, &store));

  embstore_table_config_t tc;
  embstore_table_config_init(&tc);
  tc.name = "items";
  tc.dim = DIM;
  tc.memory_rows = MEMORY_ROWS; /* at most this many rows in memory between calls */
  embstore_table_t* table;
  CHECK(embstore_table_create(store, &tc, &table));

  /* Every row once (most go down to the tier), then training with a hot set. */
  for (int i = 0; i < ROWS; i += BATCH) {
    const int n = ROWS - i < BATCH ? ROWS - i : BATCH;
    CHECK(embstore_lookup(table, all + i, n, values, EMBSTORE_LOOKUP_INSERT, NULL));
  }
  const int64_t* batch = make_batch(1);
  for (uint64_t s = 1; s <= STEPS; ++s) {
    CHECK(embstore_lookup(table, batch, BATCH, values, EMBSTORE_LOOKUP_INSERT, NULL));
    /* The next batch's rows are read in the background while this one trains. */
    const int64_t* next = make_batch(s + 1);
    CHECK(embstore_prefetch(table, next, BATCH, NULL));
    CHECK(embstore_apply_gradients(table, batch, grads, BATCH, NULL));
    CHECK(embstore_step(store, s));
    batch = next;
  }
  embstore_table_stats_t st;
  memset(&st, 0, sizeof(st));
  st.struct_size = sizeof(st);
  CHECK(embstore_table_stats(table, &st));
  printf("rows %llu: %llu in memory, %llu on disk; moved up %llu, down %llu; "
         "tier read %llu bytes, written %llu\n",
         (unsigned long long)st.rows, (unsigned long long)st.rows_in_memory,
         (unsigned long long)st.rows_on_disk, (unsigned long long)st.rows_moved_up,
         (unsigned long long)st.rows_moved_down, (unsigned long long)st.tier_bytes_read,
         (unsigned long long)st.tier_bytes_written);
  if (st.rows != ROWS || st.rows_in_memory > MEMORY_ROWS || st.rows_on_disk == 0) {
    fprintf(stderr, "unexpected tier stats\n");
    return 1;
  }

  /* The checkpoint does not know about tiers: it restores into an untiered store. */
  uint64_t version;
  CHECK(embstore_checkpoint(store, argv[2], EMBSTORE_CKPT_FULL, &version));
  CHECK(embstore_checkpoint_wait(store, version));
  CHECK(embstore_lookup(table, all, ROWS, trained, 0, NULL)); /* brings all up for the call */
  embstore_store_t* plain;
  embstore_store_config_t pc;
  embstore_store_config_init(&pc);
  pc.backend = EMBSTORE_BACKEND_HOST;
  CHECK(embstore_store_create(&pc, &plain));
  CHECK(embstore_restore(plain, argv[2], EMBSTORE_LATEST, NULL));
  embstore_table_t* back;
  CHECK(embstore_table_get(plain, "items", &back));
  CHECK(embstore_lookup(back, all, ROWS, restored, 0, NULL));
  const int same = memcmp(trained, restored, sizeof(trained)) == 0;
  printf("restored into an untiered store: %s\n", same ? "the same rows" : "DIFFERENT");
  embstore_store_destroy(plain);
  embstore_store_destroy(store);
  return same ? 0 : 1;
}
