// embstore-ckpt's progress line: verify, compact, reshard and export draw it on stderr when
// stderr is a terminal and clear it before their result; piped, they print nothing but the
// result; --progress always and never force either, -q silences it.
#include <poll.h>

#include "tests/tool/tool_fixtures.hpp"

using namespace embstore_test::tool;
using embstore_test::TempDir;

namespace {

// Runs embstore-ckpt with stderr on a pseudo-terminal (stdout to a file) and returns what the
// terminal received.
Result run_tool_on_terminal(const std::vector<std::string>& args) {
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  REQUIRE(master >= 0);
  REQUIRE(::grantpt(master) == 0);
  REQUIRE(::unlockpt(master) == 0);
  const std::string slave = ::ptsname(master);
  TempDir capture;
  const std::string out_path = capture.path() + "/stdout";
  const pid_t pid = spawn_tool(args, [&] {
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(slave.c_str(), O_RDWR | O_NOCTTY);
    return out >= 0 && err >= 0 && dup2(out, 1) >= 0 && dup2(err, 2) >= 0;
  });
  // Read the terminal while the tool runs: a full one would block it.
  Result r;
  int wstatus = 0;
  bool exited = false;
  for (;;) {
    pollfd p{master, POLLIN, 0};
    if (::poll(&p, 1, 50) > 0 && (p.revents & POLLIN) != 0) {
      char buf[4096];
      const ssize_t n = ::read(master, buf, sizeof buf);
      if (n > 0) {
        r.err.append(buf, static_cast<size_t>(n));
        continue;
      }
    }
    if (exited) break;  // one more poll after the exit drains what is left
    exited = waitpid(pid, &wstatus, WNOHANG) == pid;
  }
  ::close(master);
  r.status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
  r.out = read_file(out_path);
  return r;
}

// The four long commands on a chain of c, each with its own output path.
std::vector<std::pair<std::string, std::vector<std::string>>> long_commands(const Checkpoints& c,
                                                                            const TempDir& out) {
  static int n = 0;
  const std::string at = out.path() + "/" + std::to_string(n++);
  return {{"verifying", {"verify", c.dir()}},
          {"compacting", {"compact", c.dir(), "--version", "20", "--out", at + "-compact"}},
          {"resharding",
           {"reshard", c.dir(), "--version", "20", "--world-size", "3", "--out", at + "-reshard"}},
          {"exporting",
           {"export", c.dir(), "--version", "20", "--table", "users", "--out", at + "-export"}}};
}

std::vector<std::string> with(std::vector<std::string> args, std::vector<std::string> more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

}  // namespace

TEST_CASE("Piped, the long commands print their results only") {
  Checkpoints c(Checkpoints::kChain);
  c.close();
  TempDir out;
  for (const auto& [verb, args] : long_commands(c, out)) {
    const Result r = run_tool(args);
    INFO(describe(r));
    CHECK(r.status == 0);
    CHECK(!contains(r.err, verb));
    CHECK(!contains(r.err, "\r"));
  }
}

TEST_CASE("Forced by --progress always, the line goes into a file too, ended at 100%") {
  Checkpoints c(Checkpoints::kChain);
  c.close();
  TempDir out;
  for (const auto& [verb, args] : long_commands(c, out)) {
    const Result r = run_tool(with(args, {"--progress", "always"}));
    INFO(describe(r));
    CHECK(r.status == 0);
    CHECK(contains(r.err, "\r" + verb + ": "));
    CHECK(contains(r.err, verb + ": 100.0%"));
    CHECK(r.err.back() == '\n');  // a log keeps the last line whole
    CHECK(!contains(r.out, verb));  // stdout is the result alone
  }
  // -q wins over --progress always.
  for (const auto& [verb, args] : long_commands(c, out)) {
    const Result r = run_tool(with(args, {"--progress", "always", "-q"}));
    CHECK(r.status == 0);
    CHECK(!contains(r.err, verb));
  }
  const Result bad = run_tool({"verify", c.dir(), "--progress", "sometimes"});
  CHECK(bad.status == 2);
}

TEST_CASE("On a terminal the line is drawn, then cleared before the result") {
  Checkpoints c(Checkpoints::kChain);
  c.close();
  TempDir out;
  for (const auto& [verb, args] : long_commands(c, out)) {
    const Result r = run_tool_on_terminal(args);
    INFO(describe(r));
    CHECK(r.status == 0);
    const size_t drawn = r.err.find("\r" + verb + ": ");
    CHECK(drawn != std::string::npos);
    // The last thing on the terminal blanks the line and returns to its start.
    REQUIRE(r.err.size() >= 2);
    CHECK(r.err.back() == '\r');
    CHECK(r.err.find_last_not_of(' ', r.err.size() - 2) == r.err.rfind('\r', r.err.size() - 2));
  }
  for (const std::vector<std::string>& off :
       {std::vector<std::string>{"--quiet"}, std::vector<std::string>{"--progress", "never"}}) {
    for (const auto& [verb, args] : long_commands(c, out)) {
      const Result r = run_tool_on_terminal(with(args, off));
      INFO(describe(r));
      CHECK(r.status == 0);
      CHECK(!contains(r.err, verb));
    }
  }
}
