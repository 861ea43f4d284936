// White-box tests of the checkpoint commit protocol (io/format/commit.hpp): version names, staging
// directories, the fsync-rename-fsync commit with injected failures, leftover cleanup, and a
// writer killed before it commits.
#include "io/format/commit.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "tests/io/io_fixtures.hpp"

using namespace embstore::io;
namespace fs = std::filesystem;

using embstore_test::FaultGuard;
using embstore_test::TempDir;

namespace {

// Resets the global hook even when a REQUIRE fails.
struct CommitFaultGuard {
  explicit CommitFaultGuard(std::function<int(const char*)> hook) {
    set_commit_fault_injection(std::move(hook));
  }
  ~CommitFaultGuard() { set_commit_fault_injection(nullptr); }
};

void write_file(const std::string& path, const std::string& content) {
  std::ofstream f(path, std::ios::binary);
  REQUIRE(f);
  f << content;
  f.close();
  REQUIRE(f);
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// A staging dir shaped like a checkpoint: a manifest, a table subdirectory, nested
// attachments.
void fill_checkpoint(const std::string& dir) {
  write_file(dir + "/MANIFEST.json", "{\"format\":1}");
  REQUIRE(create_directories(dir + "/table_a") == 0);
  write_file(dir + "/table_a/shard-00000-of-00001.rows", std::string(10000, 'x'));
  REQUIRE(create_directories(dir + "/attachments/deep") == 0);
  write_file(dir + "/attachments/deep/blob", "attachment");
}

void check_checkpoint(const std::string& dir) {
  CHECK(read_file(dir + "/MANIFEST.json") == "{\"format\":1}");
  CHECK(read_file(dir + "/table_a/shard-00000-of-00001.rows") == std::string(10000, 'x'));
  CHECK(read_file(dir + "/attachments/deep/blob") == "attachment");
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("commit: version dir names round trip", "[commit]") {
  CHECK(version_dir_name(1000, true) == "00000000000000001000.full");
  CHECK(version_dir_name(1100, false) == "00000000000000001100.delta");
  CHECK(version_dir_name(UINT64_MAX, true) == "18446744073709551615.full");
  for (uint64_t v : {uint64_t{0}, uint64_t{1}, uint64_t{1000}, uint64_t{123456789012345},
                     UINT64_MAX - 1, UINT64_MAX}) {
    for (bool full : {true, false}) {
      uint64_t got = 7;
      bool got_full = !full;
      REQUIRE(parse_version_dir_name(version_dir_name(v, full), &got, &got_full));
      CHECK(got == v);
      CHECK(got_full == full);
    }
  }
  // Zero padding makes name order version order.
  CHECK(version_dir_name(999, true) < version_dir_name(1000, true));
}

TEST_CASE("commit: version dir names parse strictly", "[commit]") {
  const char* bad[] = {
      "",
      ".full",
      "1000.full",                       // not padded
      "0000000000000001000.full",        // 19 digits
      "000000000000000001000.full",      // 21 digits
      "00000000000000001000",            // no kind
      "00000000000000001000.",           // empty kind
      "00000000000000001000.Full",       // case matters
      "00000000000000001000.fullx",      // trailing bytes
      "00000000000000001000.full/",      // trailing slash
      "00000000000000001000.delta.tmp",  // trailing suffix
      "0000000000000000100a.full",       // not a digit
      "+0000000000000001000.full",       // sign
      " 0000000000000001000.full",       // space
      "18446744073709551616.full",       // 2^64: overflows
      "99999999999999999999.delta",      // overflows
      ".tmp-1000-0123456789abcdef",      // staging dir
  };
  for (const char* name : bad) {
    uint64_t v = 42;
    bool full = true;
    INFO(name);
    CHECK_FALSE(parse_version_dir_name(name, &v, &full));
    CHECK(v == 42);  // untouched on failure
    CHECK(full);
  }
  uint64_t v = 0;
  bool full = true;
  CHECK(parse_version_dir_name("00000000000000000000.delta", &v, &full));
  CHECK(v == 0);
  CHECK_FALSE(full);
}

TEST_CASE("commit: create_directories nests, accepts existing dirs, refuses files", "[commit]") {
  TempDir tmp;
  const std::string deep = tmp.file("a/b/c/d");
  REQUIRE(create_directories(deep) == 0);
  CHECK(fs::is_directory(deep));
  CHECK((fs::status(deep).permissions() & fs::perms::owner_all) == fs::perms::owner_all);
  // Existing, partly existing, trailing and doubled slashes.
  CHECK(create_directories(deep) == 0);
  CHECK(create_directories(tmp.file("a/b/e/")) == 0);
  CHECK(fs::is_directory(tmp.file("a/b/e")));
  CHECK(create_directories(tmp.file("a//b/./f")) == 0);
  CHECK(fs::is_directory(tmp.file("a/b/f")));
  CHECK(create_directories(tmp.path()) == 0);

  write_file(tmp.file("file"), "x");
  CHECK(create_directories(tmp.file("file")) == -ENOTDIR);
  CHECK(create_directories(tmp.file("file/sub")) == -ENOTDIR);
  CHECK(create_directories(tmp.file("a/b/file2/x")) == 0);
  write_file(tmp.file("a/b/file3"), "y");
  CHECK(create_directories(tmp.file("a/b/file3/x/y")) == -ENOTDIR);
  CHECK(create_directories("") == -ENOENT);
  // Inside a staging directory, without the fsyncs (the commit makes them durable).
  CHECK(create_directories(tmp.file("s/t/u"), /*durable=*/false) == 0);
  CHECK(fs::is_directory(tmp.file("s/t/u")));
  CHECK(create_directories(tmp.file("file/v"), /*durable=*/false) == -ENOTDIR);

  // Other errors come through as -errno.
  if (geteuid() != 0) {  // root ignores permissions
    REQUIRE(create_directories(tmp.file("ro")) == 0);
    REQUIRE(chmod(tmp.file("ro").c_str(), 0555) == 0);
    CHECK(create_directories(tmp.file("ro/x")) == -EACCES);
    chmod(tmp.file("ro").c_str(), 0755);
  }
}

TEST_CASE("commit: staging dirs are named .tmp-<version>-<nonce> and unique", "[commit]") {
  TempDir tmp;
  std::set<std::string> seen;
  for (int i = 0; i < 50; ++i) {
    std::string path;
    REQUIRE(make_staging_dir(tmp.path(), 1000, &path) == 0);
    CHECK(fs::is_directory(path));
    const std::string prefix = tmp.path() + "/.tmp-1000-";
    REQUIRE(path.compare(0, prefix.size(), prefix) == 0);
    const std::string nonce = path.substr(prefix.size());
    CHECK(nonce.size() == 16);
    CHECK(nonce.find_first_not_of("0123456789abcdef") == std::string::npos);
    CHECK(seen.insert(path).second);
  }
  CHECK(entries(tmp.path()).size() == 50);
  std::string path;
  CHECK(make_staging_dir(tmp.file("missing"), 1, &path) == -ENOENT);
}

TEST_CASE("commit: fsync_path syncs files and directories", "[commit]") {
  TempDir tmp;
  write_file(tmp.file("f"), "data");
  CHECK(fsync_path(tmp.file("f")) == 0);
  CHECK(fsync_path(tmp.path()) == 0);
  CHECK(fsync_path(tmp.file("missing")) == -ENOENT);
}

TEST_CASE("commit: commit renames a synced staging dir to its final name", "[commit]") {
  TempDir tmp;
  std::string staging;
  REQUIRE(make_staging_dir(tmp.path(), 1000, &staging) == 0);
  fill_checkpoint(staging);

  std::vector<std::string> steps;
  CommitFaultGuard guard([&](const char* step) {
    steps.push_back(step);
    return 0;
  });
  const std::string final_path = tmp.file(version_dir_name(1000, true));
  REQUIRE(commit_staging_dir(staging, final_path) == 0);
  CHECK_FALSE(fs::exists(staging));
  check_checkpoint(final_path);
  CHECK(entries(tmp.path()) == std::vector<std::string>{version_dir_name(1000, true)});

  // Three files, two subdirectories below staging plus table_a, then the staging dir, the
  // rename and the parent, in that order.
  auto count = [&](const std::string& s) { return std::count(steps.begin(), steps.end(), s); };
  CHECK(count("fsync_file") == 3);
  CHECK(count("fsync_dir") == 3);
  CHECK(count("fsync_staging") == 1);
  REQUIRE(steps.size() >= 4);
  CHECK(steps[steps.size() - 4] == "fsync_staging");
  CHECK(steps[steps.size() - 3] == "rename");
  CHECK(steps[steps.size() - 2] == "renameat2");
  CHECK(steps.back() == "fsync_parent");
}

TEST_CASE("commit: commit never replaces an existing final directory", "[commit]") {
  TempDir tmp;
  const std::string final_path = tmp.file(version_dir_name(1000, true));
  bool fallback = GENERATE(false, true);  // renameat2, or the stat-and-rename fallback
  INFO("fallback " << fallback);
  CommitFaultGuard guard(
      [&](const char* step) { return fallback && std::string(step) == "renameat2" ? -ENOSYS : 0; });
  bool empty_target = GENERATE(false, true);  // plain rename() would replace an empty dir
  INFO("empty target " << empty_target);
  REQUIRE(create_directories(final_path) == 0);
  if (!empty_target) write_file(final_path + "/MANIFEST.json", "old");

  std::string staging;
  REQUIRE(make_staging_dir(tmp.path(), 1000, &staging) == 0);
  fill_checkpoint(staging);
  CHECK(commit_staging_dir(staging, final_path) == -EEXIST);
  check_checkpoint(staging);  // untouched
  if (empty_target) {
    CHECK(entries(final_path).empty());
  } else {
    CHECK(read_file(final_path + "/MANIFEST.json") == "old");
  }

  // The fallback also commits when the name is free.
  const std::string other = tmp.file(version_dir_name(1001, true));
  REQUIRE(commit_staging_dir(staging, other) == 0);
  CHECK_FALSE(fs::exists(staging));
  check_checkpoint(other);
}

TEST_CASE("commit: a failed step leaves the staging dir and no final dir", "[commit]") {
  const char* failing = GENERATE("fsync_file", "fsync_dir", "fsync_staging", "rename");
  const int error = GENERATE(-EIO, -ENOSPC);
  INFO(failing << " " << error);
  TempDir tmp;
  std::string staging;
  REQUIRE(make_staging_dir(tmp.path(), 2000, &staging) == 0);
  fill_checkpoint(staging);
  const std::string final_path = tmp.file(version_dir_name(2000, false));
  {
    CommitFaultGuard guard(
        [&](const char* step) { return std::string(step) == failing ? error : 0; });
    CHECK(commit_staging_dir(staging, final_path) == error);
  }
  CHECK_FALSE(fs::exists(final_path));
  check_checkpoint(staging);
  std::vector<VersionDir> versions;
  REQUIRE(list_versions(tmp.path(), &versions) == 0);
  CHECK(versions.empty());

  // The caller's cleanup, then a retry that succeeds.
  REQUIRE(remove_tree(staging) == 0);
  CHECK_FALSE(fs::exists(staging));
  REQUIRE(make_staging_dir(tmp.path(), 2000, &staging) == 0);
  fill_checkpoint(staging);
  REQUIRE(commit_staging_dir(staging, final_path) == 0);
  check_checkpoint(final_path);
}

TEST_CASE("commit: a failed parent fsync is reported after the rename", "[commit]") {
  TempDir tmp;
  std::string staging;
  REQUIRE(make_staging_dir(tmp.path(), 3000, &staging) == 0);
  fill_checkpoint(staging);
  const std::string final_path = tmp.file(version_dir_name(3000, true));
  CommitFaultGuard guard(
      [](const char* step) { return std::string(step) == "fsync_parent" ? -EIO : 0; });
  CHECK(commit_staging_dir(staging, final_path) == -EIO);
  // Never half-named: the whole directory moved, under its final name.
  CHECK_FALSE(fs::exists(staging));
  check_checkpoint(final_path);
}

TEST_CASE("commit: commit of a missing staging dir fails cleanly", "[commit]") {
  TempDir tmp;
  const std::string final_path = tmp.file(version_dir_name(1, true));
  CHECK(commit_staging_dir(tmp.file(".tmp-1-missing"), final_path) == -ENOENT);
  CHECK_FALSE(fs::exists(final_path));
}

TEST_CASE("commit: remove_tree removes nested trees without following symlinks", "[commit]") {
  TempDir tmp;
  REQUIRE(create_directories(tmp.file("keep")) == 0);
  write_file(tmp.file("keep/precious"), "p");
  REQUIRE(create_directories(tmp.file("t/a/b")) == 0);
  write_file(tmp.file("t/a/b/f"), "f");
  write_file(tmp.file("t/g"), "g");
  fs::create_directory_symlink(tmp.file("keep"), tmp.file("t/a/link"));
  REQUIRE(remove_tree(tmp.file("t")) == 0);
  CHECK_FALSE(fs::exists(tmp.file("t")));
  CHECK(read_file(tmp.file("keep/precious")) == "p");
  CHECK(remove_tree(tmp.file("t")) == 0);  // missing is fine
  write_file(tmp.file("plain"), "x");
  CHECK(remove_tree(tmp.file("plain")) == 0);
  CHECK_FALSE(fs::exists(tmp.file("plain")));
}

TEST_CASE("commit: remove_leftovers removes only .tmp-* entries", "[commit]") {
  TempDir tmp;
  std::string s1, s2;
  REQUIRE(make_staging_dir(tmp.path(), 10, &s1) == 0);
  REQUIRE(make_staging_dir(tmp.path(), 20, &s2) == 0);
  fill_checkpoint(s1);
  write_file(tmp.file(".tmp-stray-file"), "x");
  REQUIRE(create_directories(tmp.file(version_dir_name(5, true))) == 0);
  write_file(tmp.file(version_dir_name(5, true)) + "/MANIFEST.json", "m");
  REQUIRE(create_directories(tmp.file(".tmpx")) == 0);  // not the prefix
  REQUIRE(create_directories(tmp.file("tmp-1")) == 0);
  write_file(tmp.file("notes.txt"), "n");

  std::vector<std::string> removed;
  REQUIRE(remove_leftovers(tmp.path(), &removed) == 0);
  std::vector<std::string> expected = {fs::path(s1).filename(), fs::path(s2).filename(),
                                       ".tmp-stray-file"};
  std::sort(expected.begin(), expected.end());
  CHECK(removed == expected);
  CHECK(entries(tmp.path()) ==
        std::vector<std::string>{".tmpx", version_dir_name(5, true), "notes.txt", "tmp-1"});
  CHECK(read_file(tmp.file(version_dir_name(5, true)) + "/MANIFEST.json") == "m");

  removed.clear();
  CHECK(remove_leftovers(tmp.path(), &removed) == 0);
  CHECK(removed.empty());
  CHECK(remove_leftovers(tmp.file("missing"), &removed) == -ENOENT);
}

TEST_CASE("commit: list_versions lists committed dirs in version order", "[commit]") {
  TempDir tmp;
  for (auto [v, full] : std::vector<std::pair<uint64_t, bool>>{
           {1100, false}, {1000, true}, {2000, true}, {1200, false}, {2000, false}, {900, true}}) {
    REQUIRE(create_directories(tmp.file(version_dir_name(v, full))) == 0);
  }
  std::string staging;
  REQUIRE(make_staging_dir(tmp.path(), 3000, &staging) == 0);  // not committed
  write_file(tmp.file(version_dir_name(4000, true)), "a file, not a checkpoint");
  REQUIRE(create_directories(tmp.file("1000.full")) == 0);
  REQUIRE(create_directories(tmp.file("00000000000000005000.full.old")) == 0);
  fs::create_directory_symlink(tmp.file(version_dir_name(1000, true)),
                               tmp.file(version_dir_name(6000, true)));

  std::vector<VersionDir> versions = {{1, true, "stale"}};
  REQUIRE(list_versions(tmp.path(), &versions) == 0);
  std::vector<std::pair<uint64_t, bool>> got;
  for (const VersionDir& v : versions) {
    CHECK(v.name == version_dir_name(v.version, v.full));
    got.emplace_back(v.version, v.full);
  }
  CHECK(got ==
        std::vector<std::pair<uint64_t, bool>>{
            {900, true}, {1000, true}, {1100, false}, {1200, false}, {2000, true}, {2000, false}});

  CHECK(list_versions(tmp.file("missing"), &versions) == -ENOENT);
  TempDir empty;
  REQUIRE(list_versions(empty.path(), &versions) == 0);
  CHECK(versions.empty());
}

TEST_CASE("commit: a writer killed before commit leaves only a leftover", "[commit]") {
  TempDir tmp;
  // One committed checkpoint that must survive the cleanup.
  std::string staging;
  REQUIRE(make_staging_dir(tmp.path(), 1000, &staging) == 0);
  fill_checkpoint(staging);
  REQUIRE(commit_staging_dir(staging, tmp.file(version_dir_name(1000, true))) == 0);

  int fds[2];
  REQUIRE(pipe(fds) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // The child: no Catch2 here, only async-signal-safe-ish plain calls and _exit on error.
    close(fds[0]);
    std::string path;
    if (make_staging_dir(tmp.path(), 1100, &path) != 0) _exit(2);
    int fd = open((path + "/MANIFEST.json").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, "{}", 2) != 2) _exit(3);
    if (write(fds[1], path.c_str(), path.size()) != static_cast<ssize_t>(path.size())) _exit(4);
    close(fds[1]);
    raise(SIGKILL);  // dies mid-checkpoint: no commit, no cleanup, no destructors
    _exit(5);
  }
  close(fds[1]);
  std::string child_staging;
  char buf[256];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) child_staging.append(buf, n);
  close(fds[0]);
  int wstatus = 0;
  REQUIRE(waitpid(pid, &wstatus, 0) == pid);
  REQUIRE(WIFSIGNALED(wstatus));
  CHECK(WTERMSIG(wstatus) == SIGKILL);

  REQUIRE_FALSE(child_staging.empty());
  CHECK(read_file(child_staging + "/MANIFEST.json") == "{}");
  std::vector<VersionDir> versions;
  REQUIRE(list_versions(tmp.path(), &versions) == 0);
  REQUIRE(versions.size() == 1);  // only the earlier commit; 1100 never happened
  CHECK(versions[0].version == 1000);

  std::vector<std::string> removed;
  REQUIRE(remove_leftovers(tmp.path(), &removed) == 0);
  CHECK(removed == std::vector<std::string>{fs::path(child_staging).filename()});
  CHECK_FALSE(fs::exists(child_staging));
  CHECK(entries(tmp.path()) == std::vector<std::string>{version_dir_name(1000, true)});
  check_checkpoint(tmp.file(version_dir_name(1000, true)));
}

TEST_CASE("commit: link_or_copy links, never replaces, and checks the size it was told",
          "[commit]") {
  TempDir tmp;
  write_file(tmp.file("from"), "twelve bytes");
  REQUIRE(link_or_copy(tmp.file("from"), tmp.file("to"), 12) == 0);
  struct stat st {};
  REQUIRE(::stat(tmp.file("to").c_str(), &st) == 0);
  CHECK(st.st_nlink == 2);  // one file system: a link
  CHECK(link_or_copy(tmp.file("from"), tmp.file("to"), 12) == -EEXIST);
  // A size that is not the file's (a manifest's word against the disk's): refused, nothing left.
  CHECK(link_or_copy(tmp.file("from"), tmp.file("other"), 13) == -EBADMSG);
  CHECK(::access(tmp.file("other").c_str(), F_OK) != 0);
  CHECK(link_or_copy(tmp.file("missing"), tmp.file("other"), 0) == -ENOENT);
}
