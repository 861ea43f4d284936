#include <embstore/embstore.h>
#include <stdio.h>

int main(void) {
  embstore_store_config_t sc;
  embstore_store_t* store = NULL;
  embstore_store_config_init(&sc);
  sc.backend = EMBSTORE_BACKEND_HOST;
  if (embstore_store_create(&sc, &store) != EMBSTORE_OK) {
    fprintf(stderr, "create: %s\n", embstore_last_error());
    return 1;
  }
  if (embstore_version() != EMBSTORE_VERSION_CODE) return 1;
  printf("consumer: embstore %d\n", embstore_version());
  return embstore_store_destroy(store) == EMBSTORE_OK ? 0 : 1;
}
