/* The public header from plain C99: a small training loop through the C API. */
/* mkdtemp for the checkpoint directory; the header itself needs nothing beyond C99. */
#define _POSIX_C_SOURCE 200809L
#include <embstore/embstore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond)                                                                           \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: %s\n", __FILE__, __LINE__, #cond, \
              embstore_last_error());                                                         \
      ++failures;                                                                             \
    }                                                                                         \
  } while (0)

int main(void) {
  embstore_store_config_t sc;
  embstore_table_config_t tc;
  embstore_store_t* store = NULL;
  embstore_table_t* table = NULL;
  embstore_table_t* found = NULL;
  embstore_table_stats_t stats;
  int64_t keys[4] = {3, -9, 3, 12};
  float values[4 * 8];
  float again[4 * 8];
  float grads[4 * 8];
  float sharded_rows[4 * 8];
  embstore_comm_callbacks_t callbacks;
  int i;

  CHECK(embstore_version() == EMBSTORE_VERSION_CODE);
  CHECK(strcmp(embstore_status_name(EMBSTORE_NOT_FOUND), "EMBSTORE_NOT_FOUND") == 0);
  CHECK(embstore_shard_of(123456789, 8) == 6u);

  /* Two ranks need a communicator: callbacks without functions are refused. */
  embstore_comm_callbacks_init(&callbacks);
  CHECK(callbacks.struct_size == sizeof(callbacks) && callbacks.all_to_all == NULL);
  embstore_store_config_init(&sc);
  sc.backend = EMBSTORE_BACKEND_HOST;
  sc.world_size = 2;
  sc.comm_callbacks = &callbacks;
  CHECK(embstore_store_create(&sc, &store) == EMBSTORE_INVALID_ARGUMENT && store == NULL);

  embstore_store_config_init(&sc);
  CHECK(sc.tier_dir == NULL);
  sc.backend = EMBSTORE_BACKEND_HOST; /* pointers below are host memory */
  CHECK(embstore_store_create(&sc, &store) == EMBSTORE_OK);
  CHECK(embstore_store_backend(store) == EMBSTORE_BACKEND_HOST);

  embstore_table_config_init(&tc);
  CHECK(tc.device_rows == 0 && tc.memory_rows == 0);
  tc.name = "tiered";
  tc.dim = 8;
  tc.memory_rows = 10; /* the store has no tier_dir for the rest */
  CHECK(embstore_table_create(store, &tc, &table) == EMBSTORE_INVALID_ARGUMENT && table == NULL);
  CHECK(strstr(embstore_last_error(), "tier_dir") != NULL);
  embstore_table_config_init(&tc);
  tc.name = "item_id";
  tc.dim = 8;
  tc.optimizer = EMBSTORE_OPT_SGD;
  tc.learning_rate = 0.5f;
  CHECK(embstore_table_create(store, &tc, &table) == EMBSTORE_OK);
  CHECK(embstore_table_create(store, &tc, &found) == EMBSTORE_ALREADY_EXISTS);
  CHECK(strstr(embstore_last_error(), "item_id") != NULL);
  CHECK(embstore_table_get(store, "item_id", &found) == EMBSTORE_OK && found == table);

  CHECK(embstore_step(store, 1) == EMBSTORE_OK);
  CHECK(embstore_lookup(table, keys, 4, values, EMBSTORE_LOOKUP_INSERT, NULL) == EMBSTORE_OK);
  CHECK(memcmp(values, values + 2 * 8, 8 * sizeof(float)) == 0); /* key 3 twice: one row */
  for (i = 0; i < 4 * 8; ++i) grads[i] = 1.0f;
  CHECK(embstore_apply_gradients(table, keys, grads, 4, NULL) == EMBSTORE_OK);
  CHECK(embstore_lookup(table, keys, 4, again, 0, NULL) == EMBSTORE_OK);
  /* A store of one rank: the sharded calls are the plain ones. */
  CHECK(embstore_sharded_lookup(table, keys, 4, sharded_rows, 0, NULL) == EMBSTORE_OK);
  CHECK(memcmp(sharded_rows, again, sizeof(again)) == 0);
  /* key 3 saw two gradients of 1 summed: moved by 0.5 * 2; key -9 by 0.5. */
  CHECK(again[0] == values[0] - 1.0f);
  CHECK(again[8] == values[8] - 0.5f);

  memset(&stats, 0, sizeof(stats));
  stats.struct_size = sizeof(stats);
  CHECK(embstore_table_stats(table, &stats) == EMBSTORE_OK);
  CHECK(stats.rows == 3 && stats.inserted == 3 && stats.dirty_rows == 3 && stats.admitted == 3);
  CHECK(stats.pending_admission == 0);
  CHECK(stats.rows_in_memory == 3 && stats.rows_on_disk == 0 && stats.rows_moved_down == 0);
  /* An untiered table has nothing to bring up. */
  CHECK(embstore_prefetch(table, keys, 4, NULL) == EMBSTORE_OK);
  CHECK(embstore_prefetch(NULL, keys, 4, NULL) == EMBSTORE_INVALID_ARGUMENT);

  CHECK(embstore_lookup(NULL, keys, 4, values, 0, NULL) == EMBSTORE_INVALID_ARGUMENT);
  CHECK(strlen(embstore_last_error()) > 0);

  /* A checkpoint and a restore into a new store, with an attachment. */
  {
    char dir[] = "/tmp/embstore-c-test-XXXXXX";
    char sub[64];
    char back[8] = {0};
    size_t bytes = 0;
    uint64_t version = 0, restored_version = 0;
    embstore_checkpoint_stats_t cs;
    embstore_store_t* restored = NULL;
    embstore_table_t* copy = NULL;
    CHECK(mkdtemp(dir) != NULL);
    sprintf(sub, "%s/ckpt", dir);
    CHECK(embstore_checkpoint_attach(store, "state", "abc", 3) == EMBSTORE_OK);
    CHECK(embstore_checkpoint(store, sub, EMBSTORE_CKPT_FULL, &version) == EMBSTORE_OK);
    CHECK(version == 1);
    CHECK(embstore_checkpoint_wait(store, version) == EMBSTORE_OK);
    memset(&cs, 0, sizeof(cs));
    cs.struct_size = sizeof(cs);
    CHECK(embstore_checkpoint_stats(store, &cs) == EMBSTORE_OK);
    CHECK(cs.committed == 1 && cs.rows_written == 3 && cs.last_version == 1);

    CHECK(embstore_store_create(&sc, &restored) == EMBSTORE_OK);
    CHECK(embstore_restore(restored, sub, EMBSTORE_LATEST, &restored_version) == EMBSTORE_OK);
    CHECK(restored_version == 1);
    CHECK(embstore_table_get(restored, "item_id", &copy) == EMBSTORE_OK);
    CHECK(embstore_lookup(copy, keys, 4, values, 0, NULL) == EMBSTORE_OK);
    CHECK(memcmp(values, again, sizeof(values)) == 0);
    CHECK(embstore_restore_attachment(restored, "state", back, sizeof(back), &bytes) ==
          EMBSTORE_OK);
    CHECK(bytes == 3 && memcmp(back, "abc", 3) == 0);
    CHECK(embstore_restore(restored, dir, 7, NULL) == EMBSTORE_NOT_FOUND);
    CHECK(embstore_store_destroy(restored) == EMBSTORE_OK);
    sprintf(sub, "rm -rf %s", dir);
    CHECK(system(sub) == 0);
  }

  CHECK(embstore_store_destroy(store) == EMBSTORE_OK);
  if (failures == 0) printf("c_api_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
