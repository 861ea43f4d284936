/* The README's C example, whole: a table trained for a few steps with checkpoints (a full one,
   then a delta of the rows changed since), restored into a new store, read back and compared.
     embstore-quickstart DIR     (DIR: a checkpoint directory; created, must not hold versions)
   Host backend, so that the arrays below are host memory; on the CUDA backend the same calls
   take device pointers and a stream. Exits 0 when the restored rows equal the trained ones.
   ctest runs it ("examples: the README's C quickstart"). */
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

enum { N = 1000, DIM = 8 };

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const char* dir = argv[1];
  static int64_t keys[N];
  static float values[N * DIM], grads[N * DIM], restored[N * DIM];
  for (int i = 0; i < N; ++i) keys[i] = i;
  for (int i = 0; i < N * DIM; ++i) grads[i] = 0.5f;

  /* --- the README's example starts here --- */
  embstore_store_config_t sc;
  embstore_store_config_init(&sc);
  sc.backend = EMBSTORE_BACKEND_HOST; /* AUTO (the default): CUDA where usable */
  embstore_store_t* store;
  CHECK(embstore_store_create(&sc, &store));

  embstore_table_config_t tc;
  embstore_table_config_init(&tc);
  tc.name = "items";
  tc.dim = DIM;
  tc.optimizer = EMBSTORE_OPT_ADAGRAD;
  embstore_table_t* items;
  CHECK(embstore_table_create(store, &tc, &items));

  uint64_t version;
  for (uint64_t step = 1; step <= 3; ++step) {
    size_t n = step == 1 ? N : 16; /* the batch: 1000 new keys, then 16 of them */
    CHECK(embstore_step(store, step));
    CHECK(embstore_lookup(items, keys, n, values, EMBSTORE_LOOKUP_INSERT, NULL)); /* forward */
    CHECK(embstore_apply_gradients(items, keys, grads, n, NULL));                 /* backward */
    embstore_ckpt_kind_t kind = step == 1 ? EMBSTORE_CKPT_FULL : EMBSTORE_CKPT_INCREMENTAL;
    CHECK(embstore_checkpoint(store, dir, kind, &version)); /* returns once captured */
    CHECK(embstore_checkpoint_wait(store, version));        /* committed, or why not */
  }
  CHECK(embstore_lookup(items, keys, N, values, 0, NULL));
  CHECK(embstore_store_destroy(store));

  /* After a restart: a new store gets every table back from the newest version's chain. */
  CHECK(embstore_store_create(&sc, &store));
  CHECK(embstore_restore(store, dir, EMBSTORE_LATEST, &version));
  CHECK(embstore_table_get(store, "items", &items));
  CHECK(embstore_lookup(items, keys, N, restored, 0, NULL));
  CHECK(embstore_store_destroy(store));
  /* --- and ends here --- */

  if (version != 3 || memcmp(values, restored, sizeof values) != 0) {
    fprintf(stderr, "restored version %llu does not equal what was trained\n",
            (unsigned long long)version);
    return 1;
  }
  printf("restored version %llu: %d rows of dim %d equal the trained ones\n",
         (unsigned long long)version, N, DIM);
  return 0;
}
