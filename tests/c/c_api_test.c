/* The public header from plain C99: a small training loop through the C API. */
#include <embstore/embstore.h>
#include <stdio.h>
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
  int i;

  CHECK(embstore_version() == EMBSTORE_VERSION_CODE);
  CHECK(strcmp(embstore_status_name(EMBSTORE_NOT_FOUND), "EMBSTORE_NOT_FOUND") == 0);

  embstore_store_config_init(&sc);
  sc.backend = EMBSTORE_BACKEND_HOST; /* pointers below are host memory */
  CHECK(embstore_store_create(&sc, &store) == EMBSTORE_OK);
  CHECK(embstore_store_backend(store) == EMBSTORE_BACKEND_HOST);

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
  /* key 3 saw two gradients of 1 summed: moved by 0.5 * 2; key -9 by 0.5. */
  CHECK(again[0] == values[0] - 1.0f);
  CHECK(again[8] == values[8] - 0.5f);

  memset(&stats, 0, sizeof(stats));
  stats.struct_size = sizeof(stats);
  CHECK(embstore_table_stats(table, &stats) == EMBSTORE_OK);
  CHECK(stats.rows == 3 && stats.inserted == 3 && stats.dirty_rows == 3);

  CHECK(embstore_lookup(NULL, keys, 4, values, 0, NULL) == EMBSTORE_INVALID_ARGUMENT);
  CHECK(strlen(embstore_last_error()) > 0);

  CHECK(embstore_store_destroy(store) == EMBSTORE_OK);
  if (failures == 0) printf("c_api_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
