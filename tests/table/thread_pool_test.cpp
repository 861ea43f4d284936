// The host backend's thread pool when threads cannot be created: it joins the workers it
// started and fails with OUT_OF_MEMORY (it used to unwind past a condition variable its
// started workers waited on, and deadlock).
#include "host/store/thread_pool.hpp"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "host/error.hpp"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define EMBSTORE_TEST_SANITIZED 1
#endif

TEST_CASE("a pool that cannot start its threads joins them and fails with OUT_OF_MEMORY",
          "[table][thread_pool]") {
#if defined(EMBSTORE_TEST_SANITIZED)
  WARN("not under a sanitizer: they reserve more address space than the limit leaves");
  return;
#endif
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // Room for a few 8 MiB thread stacks, not for 200: creation fails part-way.
    const rlimit limit{rlim_t{512} << 20, rlim_t{512} << 20};
    if (::setrlimit(RLIMIT_AS, &limit) != 0) ::_exit(10);
    try {
      embstore::ThreadPool pool(200);
      ::_exit(11);  // all 200 started under the limit: the test shows nothing
    } catch (const embstore::Error& e) {
      ::_exit(e.status() == EMBSTORE_OUT_OF_MEMORY ? 0 : 12);
    } catch (...) {
      ::_exit(13);
    }
  }
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (::waitpid(pid, &status, WNOHANG) != pid) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      FAIL("the pool deadlocked");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
}
