// Catch2 main with a --backend option. A CUDA run on a machine where the CUDA backend cannot
// start exits 77, which ctest reports as skipped (never as passed).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

#include "support/backend.hpp"

namespace embstore_test {
embstore_backend_t g_backend = EMBSTORE_BACKEND_HOST;
}

int main(int argc, char** argv) {
  Catch::Session session;
  std::string backend = "host";
  using namespace Catch::clara;
  auto cli = session.cli() |
             Opt(backend, "host|cuda")["--backend"]("backend the tests run on (default host)");
  session.cli(cli);
  if (int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;

  if (backend == "cuda") {
    embstore_test::g_backend = EMBSTORE_BACKEND_CUDA;
    const auto& cfg = session.configData();
    const bool listing = cfg.listTests || cfg.listTestNamesOnly || cfg.listTags;
    if (!listing) {
      embstore_store_config_t config;
      embstore_store_config_init(&config);
      config.backend = EMBSTORE_BACKEND_CUDA;
      embstore_store_t* store = nullptr;
      const embstore_status_t st = embstore_store_create(&config, &store);
      if (st != EMBSTORE_OK) {
        std::printf("SKIPPED: CUDA backend unavailable (%s: %s)\n", embstore_status_name(st),
                    embstore_last_error());
        return 77;
      }
      embstore_store_destroy(store);
    }
  } else if (backend != "host") {
    std::fprintf(stderr, "unknown --backend '%s' (host|cuda)\n", backend.c_str());
    return 2;
  }
  return session.run();
}
