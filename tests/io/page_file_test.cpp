// White-box tests of the tier's page file (io/tier/page_file.hpp): pages through every engine
// combination the machine offers, reuse of released pages, the directory checks, injected write
// faults, a file cut behind its back, and a real full file system at allocate.
//
// As in io_test.cpp, allow_uring = false forces pread/pwrite and direct = false buffered I/O, so
// every fallback runs here. Checks that need privileges (another user, a read-only mount, a small
// mounted file system) run in a forked child, in a mount namespace of its own where it mounts;
// where the machine refuses, they say so and pass without checking (WARN).
#include "io/tier/page_file.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "io/engine/fault.hpp"
#include "tests/io/io_fixtures.hpp"

using namespace embstore::io;

using embstore_test::FaultGuard;
using embstore_test::in_memory;
using embstore_test::ReadFaultGuard;
using embstore_test::TierDir;

namespace {

struct Combo {
  bool uring, direct;
};
const Combo kCombos[] = {{true, true}, {true, false}, {false, true}, {false, false}};

PageFileOptions options_for(Combo c, size_t page_bytes = kAlignment) {
  PageFileOptions o;
  o.allow_uring = c.uring;
  o.direct = c.direct;
  o.page_bytes = page_bytes;
  return o;
}

std::unique_ptr<PageFile> create_ok(const std::string& dir, const PageFileOptions& o) {
  std::unique_ptr<PageFile> f;
  std::string detail;
  const int r = PageFile::create(dir, o, &f, &detail);
  CAPTURE(detail);
  REQUIRE(r == 0);
  REQUIRE(f != nullptr);
  return f;
}

std::vector<uint64_t> allocate_ok(PageFile& f, size_t n) {
  std::vector<uint64_t> pages;
  std::string detail;
  const int r = f.allocate(n, &pages, &detail);
  CAPTURE(detail);
  REQUIRE(r == 0);
  REQUIRE(pages.size() == n);
  return pages;
}

// Pages of caller memory at an odd address each (the page file must copy through its own aligned
// buffers), filled from a seed.
class Pages {
 public:
  Pages(size_t count, size_t page_bytes) : page_bytes_(page_bytes), bytes_(count * page_bytes + 1) {
    for (size_t i = 0; i < count; ++i) ptrs_.push_back(bytes_.data() + 1 + i * page_bytes);
  }
  void fill(uint64_t seed) {
    std::mt19937_64 rng(seed);
    for (char& c : bytes_) c = static_cast<char>(rng());
  }
  char* operator[](size_t i) { return ptrs_[i]; }
  const char* const* in() const { return ptrs_.data(); }
  char* const* out() { return ptrs_.data(); }
  size_t count() const { return ptrs_.size(); }
  size_t page_bytes() const { return page_bytes_; }

 private:
  size_t page_bytes_;
  std::vector<char> bytes_;
  std::vector<char*> ptrs_;
};

// How many of pages differ between a and b (one REQUIRE per batch, not per page).
size_t differing(Pages& a, Pages& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.count(); ++i) n += std::memcmp(a[i], b[i], a.page_bytes()) != 0;
  return n;
}

// The descriptor this process holds on a file in dir, and where /proc says it points; -1 if none.
int open_fd_in(const std::string& dir, std::string* target) {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  int found = -1;
  while (dirent* e = ::readdir(d)) {
    char link[4096];
    const std::string path = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t n = ::readlink(path.c_str(), link, sizeof(link) - 1);
    if (n <= 0) continue;
    const std::string to(link, static_cast<size_t>(n));
    if (to.rfind(dir + "/", 0) == 0) {
      found = std::atoi(e->d_name);
      *target = to;
    }
  }
  ::closedir(d);
  return found;
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  return names;
}

// Runs body in a forked child; its exit code (77: the machine refused, skipped). body writes
// what failed to stderr. The child must not touch Catch (a failed REQUIRE there would run the
// rest of the test run in the child).
int in_child(const std::function<int()>& body) {
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    embstore_test::die_with_parent(parent);
    const int code = body();
    std::fflush(nullptr);
    ::_exit(code);
  }
  REQUIRE(pid > 0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  return WEXITSTATUS(status);
}

#define CHILD_CHECK(cond, code)                                                     \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "child check failed at line %d: %s\n", __LINE__, #cond); \
      return code;                                                                  \
    }                                                                               \
  } while (0)

// In a child: a mount namespace of its own, so that mounts go with the child. false where the
// machine does not allow it.
bool private_mounts() {
  if (::unshare(CLONE_NEWNS) != 0) return false;
  return ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0;
}

}  // namespace

TEST_CASE("page file: random pages read back equal through every engine, size and batch",
          "[io][tier]") {
  TierDir dir;
  for (const Combo c : kCombos) {
    for (const size_t page_bytes : {size_t{4096}, size_t{8192}}) {
      CAPTURE(c.uring, c.direct, page_bytes);
      auto f = create_ok(dir.path(), options_for(c, page_bytes));
      const std::string engine = f->engine();
      CAPTURE(engine);
      // The options are obeyed (where the machine refuses io_uring or O_DIRECT, the preferred
      // combinations fall back and must still pass).
      if (!c.uring) REQUIRE(engine.rfind("pread/pwrite", 0) == 0);
      if (!c.direct) REQUIRE(engine.find("O_DIRECT") == std::string::npos);
      REQUIRE(f->page_bytes() == page_bytes);
      const unsigned qd = f->queue_depth();
      REQUIRE(qd == 32);

      std::mt19937_64 rng(page_bytes + c.uring * 2 + c.direct);
      uint64_t written = 0;
      for (const size_t batch : {size_t{1}, size_t{qd - 1}, size_t{qd + 1}, size_t{1000}}) {
        CAPTURE(batch);
        std::vector<uint64_t> pages = allocate_ok(*f, batch);
        std::shuffle(pages.begin(), pages.end(), rng);  // random places in the file
        Pages data(batch, page_bytes);
        data.fill(rng());
        std::string detail;
        REQUIRE(f->write(pages, data.in(), &detail) == 0);
        written += batch * page_bytes;
        REQUIRE(f->bytes_written() == written);

        // Read back in another order into other (odd) addresses.
        std::vector<size_t> order(batch);
        for (size_t i = 0; i < batch; ++i) order[i] = i;
        std::shuffle(order.begin(), order.end(), rng);
        std::vector<uint64_t> back_pages(batch);
        for (size_t i = 0; i < batch; ++i) back_pages[i] = pages[order[i]];
        Pages back(batch, page_bytes);
        const uint64_t read_before = f->bytes_read();
        REQUIRE(f->read(back_pages, back.out(), &detail) == 0);
        REQUIRE(f->bytes_read() == read_before + batch * page_bytes);
        size_t bad = 0;
        for (size_t i = 0; i < batch; ++i) {
          bad += std::memcmp(back[i], data[order[i]], page_bytes) != 0;
        }
        REQUIRE(bad == 0);
      }
      REQUIRE(f->pages_in_use() == 1 + (qd - 1) + (qd + 1) + 1000);
      REQUIRE(f->file_pages() == f->pages_in_use());
    }
  }
}

TEST_CASE("page file: pages next to each other are one read, each page landing where asked",
          "[io][tier]") {
  TierDir dir;
  for (const Combo c : kCombos) {
    for (const size_t page_bytes : {size_t{4096}, size_t{8192}}) {
      CAPTURE(c.uring, c.direct, page_bytes);
      PageFileOptions o = options_for(c, page_bytes);
      o.queue_depth = 4;  // fewer buffers than runs: they are reused
      auto f = create_ok(dir.path(), o);
      const size_t run = kReadRunBytes / page_bytes;
      REQUIRE(f->run_pages() == run);
      o.queue_depth = 128;  // a deep queue: shorter runs, the staging bounded
      REQUIRE(create_ok(dir.path(), o)->run_pages() == kStagingBytes / 128 / page_bytes);
      o.queue_depth = 4;
      const std::vector<uint64_t> pages = allocate_ok(*f, 3 * run);  // 0, 1, 2, ...
      Pages data(pages.size(), page_bytes);
      data.fill(page_bytes + c.uring * 2 + c.direct);
      std::string detail;
      REQUIRE(f->write(pages, data.in(), &detail) == 0);

      // Runs: [2, 2 + run), [2 + run, 2 + 2 * run), [2 + 2 * run, 3 * run), then 1 and 0
      // (descending: two reads), then 5 twice (a repeat is not next to itself: two reads).
      std::vector<uint64_t> asked;
      for (uint64_t p = 2; p < 3 * run; ++p) asked.push_back(p);
      for (const uint64_t p : {1, 0, 5, 5}) asked.push_back(p);
      std::vector<std::pair<uint64_t, size_t>> reads;
      Pages back(asked.size(), page_bytes);
      const uint64_t before = f->bytes_read();
      {
        ReadFaultGuard count([&](uint64_t offset, size_t bytes) {
          reads.emplace_back(offset / page_bytes, bytes / page_bytes);
          return 0;
        });
        REQUIRE(f->read(asked, back.out(), &detail) == 0);
      }
      const std::vector<std::pair<uint64_t, size_t>> want = {
          {2, run}, {2 + run, run}, {2 + 2 * run, run - 2}, {1, 1}, {0, 1}, {5, 1}, {5, 1}};
      REQUIRE(reads == want);
      REQUIRE(f->bytes_read() == before + asked.size() * page_bytes);
      size_t bad = 0;
      for (size_t i = 0; i < asked.size(); ++i) {
        bad += std::memcmp(back[i], data[asked[i]], page_bytes) != 0;
      }
      REQUIRE(bad == 0);
      // Writes stay a request a page.
      size_t writes = 0;
      {
        FaultGuard count([&](uint64_t, size_t bytes) {
          writes += bytes == page_bytes;
          return 0;
        });
        REQUIRE(f->write(pages, data.in(), &detail) == 0);
      }
      REQUIRE(writes == pages.size());
    }
  }
}

TEST_CASE("page file: write_with and read_with fill and hand each page once, in its buffer",
          "[io][tier]") {
  TierDir dir;
  for (const Combo c : kCombos) {
    CAPTURE(c.uring, c.direct);
    PageFileOptions o = options_for(c);
    o.queue_depth = 4;  // several rounds of buffers per batch
    auto f = create_ok(dir.path(), o);
    const std::vector<uint64_t> pages = allocate_ok(*f, 40);
    // A page's bytes: a pattern of its page number, so that a page handed for another is seen.
    const auto image = [](uint64_t page, char* out) {
      for (size_t b = 0; b < kAlignment; ++b) out[b] = static_cast<char>(page * 31 + b * 7);
    };
    std::vector<int> filled(pages.size(), 0);
    size_t unaligned = 0;
    std::string detail;
    REQUIRE(f->write_with(
                pages,
                [&](size_t i, char* page) {
                  ++filled[i];
                  unaligned += reinterpret_cast<uintptr_t>(page) % kAlignment != 0;
                  image(pages[i], page);
                },
                &detail) == 0);
    REQUIRE(std::count(filled.begin(), filled.end(), 1) == static_cast<long>(pages.size()));
    REQUIRE(unaligned == 0);  // the buffer a write goes from, as O_DIRECT needs

    // Runs, a page asked twice, pages out of order.
    const std::vector<uint64_t> asked = {3, 4, 5, 6, 7, 20, 20, 39, 0, 1, 38, 12};
    std::vector<int> taken(asked.size(), 0);
    size_t wrong = 0;
    std::vector<char> want(kAlignment);
    REQUIRE(f->read_with(
                asked,
                [&](size_t i, const char* page) {
                  ++taken[i];
                  image(asked[i], want.data());
                  wrong += std::memcmp(page, want.data(), kAlignment) != 0;
                },
                &detail) == 0);
    REQUIRE(std::count(taken.begin(), taken.end(), 1) == static_cast<long>(asked.size()));
    REQUIRE(wrong == 0);

    // A page not in use: refused before any I/O, nothing filled or handed.
    f->release({9});
    size_t calls = 0;
    REQUIRE(f->write_with(
                {8, 9}, [&](size_t, char*) { ++calls; }, &detail) == -EINVAL);
    REQUIRE_THAT(detail, Catch::Contains("page 9 is not allocated"));
    REQUIRE(f->read_with(
                {8, 9}, [&](size_t, const char*) { ++calls; }, &detail) == -EINVAL);
    REQUIRE(calls == 0);
    // No callback, no buffers: refused before any I/O.
    REQUIRE(f->write_with({8}, nullptr, &detail) == -EINVAL);
    REQUIRE_THAT(detail, Catch::Contains("without a callback"));
    REQUIRE(f->read_with({8}, nullptr, &detail) == -EINVAL);
    REQUIRE(f->read({8}, nullptr, &detail) == -EINVAL);
    REQUIRE_THAT(detail, Catch::Contains("without buffers"));
    char* none[] = {nullptr};
    REQUIRE(f->read({8}, none, &detail) == -EINVAL);
    REQUIRE_THAT(detail, Catch::Contains("no buffer for page 8"));

    // A failed read hands out none of the pages of its request: the run 20..23 fails, and only
    // pages of the other requests may have been handed.
    const std::vector<uint64_t> batch = {0, 20, 21, 22, 23, 30};
    std::vector<uint64_t> handed;
    int r = 0;
    {
      ReadFaultGuard fail(
          [&](uint64_t offset, size_t) { return offset == 20 * kAlignment ? -EIO : 0; });
      r = f->read_with(
          batch, [&](size_t i, const char*) { handed.push_back(batch[i]); }, &detail);
    }
    REQUIRE(r == -EIO);
    REQUIRE_THAT(detail, Catch::Contains("page 20"));
    REQUIRE(
        std::none_of(handed.begin(), handed.end(), [](uint64_t p) { return p >= 20 && p <= 23; }));
  }
}

TEST_CASE("page file: released pages are reused lowest first and the file does not grow",
          "[io][tier]") {
  TierDir dir;
  for (const Combo c : kCombos) {
    CAPTURE(c.uring, c.direct);
    auto f = create_ok(dir.path(), options_for(c));
    REQUIRE(f->file_pages() == 0);
    REQUIRE(f->pages_in_use() == 0);
    REQUIRE(allocate_ok(*f, 0).empty());
    const std::vector<uint64_t> first = allocate_ok(*f, 10);
    REQUIRE(first == std::vector<uint64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
    REQUIRE(f->file_pages() == 10);

    std::string target;
    const int fd = open_fd_in(dir.path(), &target);
    REQUIRE(fd >= 0);
    struct stat st;
    REQUIRE(::fstat(fd, &st) == 0);
    REQUIRE(st.st_size == 10 * 4096);
    // fallocate: the space is the file's now, not at the first write.
    REQUIRE(st.st_blocks * 512 >= 10 * 4096);

    f->release({7, 2, 5});
    f->release({2, 99, 10});  // released already, never allocated: ignored
    REQUIRE(f->pages_in_use() == 7);
    REQUIRE(f->file_pages() == 10);
    REQUIRE(allocate_ok(*f, 2) == std::vector<uint64_t>{2, 5});
    REQUIRE(f->file_pages() == 10);
    REQUIRE(::fstat(fd, &st) == 0);
    REQUIRE(st.st_size == 10 * 4096);
    // One reused, one new.
    REQUIRE(allocate_ok(*f, 2) == std::vector<uint64_t>{7, 10});
    REQUIRE(f->file_pages() == 11);
    REQUIRE(f->pages_in_use() == 11);

    // A reused page takes new contents.
    Pages data(1, 4096);
    data.fill(3);
    std::string detail;
    REQUIRE(f->write({7}, data.in(), &detail) == 0);
    Pages back(1, 4096);
    REQUIRE(f->read({7}, back.out(), &detail) == 0);
    REQUIRE(differing(data, back) == 0);

    // Released pages are not pages to read or write.
    f->release({4});
    REQUIRE(f->write({4}, data.in(), &detail) == -EINVAL);
    REQUIRE_THAT(detail, Catch::Contains("page 4 is not allocated"));
    REQUIRE(f->read({3, 11}, back.out(), &detail) == -EINVAL);
    REQUIRE_THAT(detail, Catch::Contains("page 11 is not allocated"));
    REQUIRE(f->bytes_written() == 4096);
  }
}

TEST_CASE("page file: pages written in any order and overwritten read back the latest",
          "[io][tier]") {
  TierDir dir;
  for (const Combo c : kCombos) {
    CAPTURE(c.uring, c.direct);
    PageFileOptions o = options_for(c, 8192);
    o.queue_depth = 4;  // the ring and the buffers wrap around many times
    auto f = create_ok(dir.path(), o);
    std::vector<uint64_t> pages = allocate_ok(*f, 64);
    std::mt19937_64 rng(c.uring * 2 + c.direct);

    // Never written: zeros.
    Pages back(64, 8192);
    back.fill(1);
    std::string detail;
    REQUIRE(f->read(pages, back.out(), &detail) == 0);
    std::vector<char> zeros(8192, 0);
    for (size_t i = 0; i < 64; ++i) REQUIRE(std::memcmp(back[i], zeros.data(), 8192) == 0);

    Pages a(64, 8192);
    a.fill(10);
    std::shuffle(pages.begin(), pages.end(), rng);  // pages[i] holds a[i]
    REQUIRE(f->write(pages, a.in(), &detail) == 0);

    // Overwrite every third page, in another order.
    std::vector<uint64_t> over;
    std::vector<const char*> over_data;
    Pages b(64, 8192);
    b.fill(20);
    for (size_t i = 0; i < 64; i += 3) {
      over.push_back(pages[i]);
      over_data.push_back(b[i]);
    }
    std::vector<size_t> perm(over.size());
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<uint64_t> over_shuffled;
    std::vector<const char*> over_data_shuffled;
    for (const size_t i : perm) {
      over_shuffled.push_back(over[i]);
      over_data_shuffled.push_back(over_data[i]);
    }
    REQUIRE(f->write(over_shuffled, over_data_shuffled.data(), &detail) == 0);

    // Page by page, in reverse.
    for (size_t i = 64; i-- > 0;) {
      char* to[] = {back[i]};
      REQUIRE(f->read({pages[i]}, to, &detail) == 0);
      const char* expect = i % 3 == 0 ? b[i] : a[i];
      CAPTURE(i);
      REQUIRE(std::memcmp(back[i], expect, 8192) == 0);
    }
    // The same page read twice in one batch.
    char* twice[] = {back[0], back[1]};
    REQUIRE(f->read({pages[1], pages[1]}, twice, &detail) == 0);
    REQUIRE(std::memcmp(back[0], a[1], 8192) == 0);
    REQUIRE(std::memcmp(back[1], a[1], 8192) == 0);
  }
}

TEST_CASE("page file: create names what is wrong with the directory", "[io][tier]") {
  TierDir dir;
  std::unique_ptr<PageFile> f;
  std::string detail;

  SECTION("missing") {
    const std::string missing = dir.path() + "/no-such-dir";
    REQUIRE(PageFile::create(missing, {}, &f, &detail) == -ENOENT);
    REQUIRE_THAT(detail, Catch::Contains(missing) && Catch::Contains("does not exist"));
  }
  SECTION("a regular file") {
    const std::string file = dir.path() + "/plain";
    std::fclose(std::fopen(file.c_str(), "w"));
    REQUIRE(PageFile::create(file, {}, &f, &detail) == -ENOTDIR);
    REQUIRE_THAT(detail, Catch::Contains(file) && Catch::Contains("not a directory"));
  }
  SECTION("on tmpfs") {
    if (!in_memory("/dev/shm")) {
      WARN("SKIPPED: /dev/shm is not tmpfs here");
      return;
    }
    REQUIRE(PageFile::create("/dev/shm", {}, &f, &detail) == -EINVAL);
    REQUIRE_THAT(detail, Catch::Contains("/dev/shm") && Catch::Contains("tmpfs") &&
                             Catch::Contains("memory, not disk"));
  }
  SECTION("bad options") {
    PageFileOptions o;
    o.page_bytes = 4096 + 512;
    REQUIRE(PageFile::create(dir.path(), o, &f, &detail) == -EINVAL);
    REQUIRE_THAT(detail, Catch::Contains("page size"));
    o.page_bytes = 0;
    REQUIRE(PageFile::create(dir.path(), o, &f, &detail) == -EINVAL);
    o = {};
    o.queue_depth = 0;
    REQUIRE(PageFile::create(dir.path(), o, &f, &detail) == -EINVAL);
    REQUIRE_THAT(detail, Catch::Contains("queue depth"));
    REQUIRE(PageFile::create(dir.path(), o, nullptr, &detail) == -EINVAL);
  }
  SECTION("not writable: another user than the owner") {
    // Root ignores permissions, so the child becomes nobody first.
    REQUIRE(::chmod(dir.path().c_str(), 0755) == 0);
    const int code = in_child([&] {
      if (::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0) {
        return 77;
      }
      std::unique_ptr<PageFile> g;
      std::string why;
      const int r = PageFile::create(dir.path(), {}, &g, &why);
      std::fprintf(stderr, "as nobody: %d, %s\n", r, why.c_str());
      CHILD_CHECK(r == -EACCES, 1);
      CHILD_CHECK(why.find(dir.path()) != std::string::npos, 2);
      CHILD_CHECK(why.find("-EACCES") != std::string::npos, 3);
      return 0;
    });
    if (code == 77) {
      WARN("SKIPPED: cannot become another user here");
      return;
    }
    REQUIRE(code == 0);
    REQUIRE(entries(dir.path()).empty());
  }
  SECTION("a read-only file system") {
    const int code = in_child([&] {
      if (!private_mounts()) return 77;
      // A read-only bind mount of the directory over itself, in the child's namespace only.
      if (::mount(dir.path().c_str(), dir.path().c_str(), nullptr, MS_BIND, nullptr) != 0 ||
          ::mount(nullptr, dir.path().c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY,
                  nullptr) != 0) {
        return 77;
      }
      for (const bool unnamed : {true, false}) {
        PageFileOptions o;
        o.unnamed = unnamed;
        std::unique_ptr<PageFile> g;
        std::string why;
        const int r = PageFile::create(dir.path(), o, &g, &why);
        std::fprintf(stderr, "read-only, unnamed %d: %d, %s\n", unnamed, r, why.c_str());
        CHILD_CHECK(r == -EROFS, 1);
        CHILD_CHECK(why.find(dir.path()) != std::string::npos, 2);
        CHILD_CHECK(why.find("-EROFS") != std::string::npos, 3);
      }
      return 0;
    });
    if (code == 77) {
      WARN("SKIPPED: cannot make a read-only bind mount here (needs CAP_SYS_ADMIN)");
      return;
    }
    REQUIRE(code == 0);
  }
}

TEST_CASE("page file: nothing named is left in the directory", "[io][tier]") {
  TierDir dir;
  for (const bool unnamed : {true, false}) {
    CAPTURE(unnamed);
    PageFileOptions o;
    o.unnamed = unnamed;
    {
      auto f = create_ok(dir.path(), o);
      // Unnamed exactly where asked and the file system has O_TMPFILE.
      const int probe = ::open(dir.path().c_str(), O_TMPFILE | O_RDWR | O_EXCL | O_CLOEXEC, 0600);
      if (probe >= 0) ::close(probe);
      REQUIRE(f->unnamed() == (unnamed && probe >= 0));
      REQUIRE(entries(dir.path()).empty());
      std::vector<uint64_t> pages = allocate_ok(*f, 3);
      Pages data(3, 4096);
      data.fill(5);
      std::string detail;
      REQUIRE(f->write(pages, data.in(), &detail) == 0);
      REQUIRE(entries(dir.path()).empty());
      // The descriptor points at a file without a name.
      std::string target;
      REQUIRE(open_fd_in(dir.path(), &target) >= 0);
      CAPTURE(target);
      REQUIRE_THAT(target, Catch::EndsWith(" (deleted)"));
      REQUIRE(target.find(f->unnamed() ? "/#" : "/embstore-tier-") != std::string::npos);
    }
    REQUIRE(entries(dir.path()).empty());
    std::string target;
    REQUIRE(open_fd_in(dir.path(), &target) == -1);  // closed with the object
  }
}

TEST_CASE("page file: a fault on the 3rd write of a batch fails it, after the rest complete",
          "[io][tier]") {
  TierDir dir;
  for (const Combo c : kCombos) {
    for (const int err : {-ENOSPC, -EIO}) {
      CAPTURE(c.uring, c.direct, err);
      PageFileOptions o = options_for(c);
      o.queue_depth = 8;
      auto f = create_ok(dir.path(), o);
      const std::vector<uint64_t> pages = allocate_ok(*f, 40);
      Pages data(40, 4096);
      data.fill(7);
      std::string detail;
      int asked = 0;
      int odd_sizes = 0;  // counted, not REQUIREd: an exception must not cross the page file
      uint64_t faulted_offset = 0;
      {
        FaultGuard guard([&](uint64_t offset, size_t bytes) {
          odd_sizes += bytes != 4096;
          if (++asked != 3) return 0;
          faulted_offset = offset;
          return err;
        });
        REQUIRE(f->write(pages, data.in(), &detail) == err);
      }
      CAPTURE(detail);
      REQUIRE(odd_sizes == 0);
      REQUIRE(faulted_offset == pages[2] * 4096);
      REQUIRE_THAT(detail, Catch::Contains("page 2 ") &&
                               Catch::Contains(embstore::io::detail::errno_name(err)));
      // No write started after the fault, and the two before it were waited for: their
      // completions are counted (the count moves only when a completion is reaped).
      REQUIRE(asked == 3);
      REQUIRE(f->bytes_written() == 2 * 4096);
      Pages back(40, 4096);
      REQUIRE(f->read({pages[0], pages[1]}, back.out(), &detail) == 0);
      REQUIRE(std::memcmp(back[0], data[0], 4096) == 0);
      REQUIRE(std::memcmp(back[1], data[1], 4096) == 0);

      // With the hook gone, the same batch goes through.
      REQUIRE(f->write(pages, data.in(), &detail) == 0);
      REQUIRE(f->read(pages, back.out(), &detail) == 0);
      REQUIRE(differing(data, back) == 0);
      REQUIRE(f->bytes_written() == 42 * 4096);
    }
  }
}

TEST_CASE("page file: a page the file no longer reaches is -EIO, never data", "[io][tier]") {
  TierDir dir;
  for (const Combo c : kCombos) {
    CAPTURE(c.uring, c.direct);
    auto f = create_ok(dir.path(), options_for(c));
    const std::vector<uint64_t> pages = allocate_ok(*f, 4);
    Pages data(4, 4096);
    data.fill(9);
    std::string detail;
    REQUIRE(f->write(pages, data.in(), &detail) == 0);

    // Cut the file to one page and a half, through /proc (the file has no name).
    std::string target;
    const int fd = open_fd_in(dir.path(), &target);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, 4096 + 2048) == 0);

    Pages back(4, 4096);
    REQUIRE(f->read({0}, back.out(), &detail) == 0);
    REQUIRE(std::memcmp(back[0], data[0], 4096) == 0);
    for (const uint64_t page : {uint64_t{1}, uint64_t{3}}) {
      CAPTURE(page);
      detail.clear();
      char* to[] = {back[1]};
      REQUIRE(f->read({page}, to, &detail) == -EIO);
      REQUIRE_THAT(detail, Catch::Contains("page " + std::to_string(page)) &&
                               Catch::Contains("the file ends there"));
    }
    // A run of pages the cut goes through fails at the first page it took from.
    detail.clear();
    REQUIRE(f->read({0, 1, 2}, back.out(), &detail) == -EIO);
    REQUIRE_THAT(detail,
                 Catch::Contains("page 1 ") && Catch::Contains("after 2048 bytes: the file ends"));
    // The run's pages are never handed out: its read came back short, then at the end.
    const std::vector<uint64_t> run = {0, 1, 2};
    std::vector<uint64_t> handed;
    REQUIRE(f->read_with(
                run, [&](size_t i, const char*) { handed.push_back(run[i]); }, &detail) == -EIO);
    REQUIRE(handed.empty());
    // A batch with a cut page fails as a whole, after the others completed.
    REQUIRE(f->read({0, 3, 0}, back.out(), &detail) == -EIO);
    REQUIRE(f->read({0}, back.out(), &detail) == 0);
  }
}

TEST_CASE("page file: a full file system fails allocate, and nothing is handed out", "[io][tier]") {
  TierDir dir;
  const std::string image = dir.path() + "/fs.img";
  const std::string mnt = dir.path() + "/mnt";
  REQUIRE(::mkdir(mnt.c_str(), 0755) == 0);
  const int code = in_child([&] {
    if (!private_mounts()) return 77;
    const std::string quiet = " >/dev/null 2>&1";
    if (std::system(("truncate -s 16M " + image + " && mkfs.ext4 -q -F " + image + quiet +
                     " && mount -o loop " + image + " " + mnt + quiet)
                        .c_str()) != 0) {
      return 77;
    }
    std::unique_ptr<PageFile> f;
    std::string why;
    CHILD_CHECK(PageFile::create(mnt, {}, &f, &why) == 0, 1);
    std::vector<uint64_t> pages;
    CHILD_CHECK(f->allocate(4, &pages, &why) == 0, 2);
    Pages data(8, 4096);
    data.fill(11);
    CHILD_CHECK(f->write(pages, data.in(), &why) == 0, 3);
    struct statvfs before {};
    CHILD_CHECK(::statvfs(mnt.c_str(), &before) == 0, 4);

    // 32 MiB into 16: refused whole.
    std::vector<uint64_t> more = {12345};
    const int r = f->allocate(8192, &more, &why);
    std::fprintf(stderr, "allocate on a full file system: %d, %s\n", r, why.c_str());
    CHILD_CHECK(r == -ENOSPC, 5);
    CHILD_CHECK(why.find(mnt) != std::string::npos, 6);
    CHILD_CHECK(why.find("33554432 more bytes") != std::string::npos, 7);
    CHILD_CHECK(more == std::vector<uint64_t>{12345}, 8);
    CHILD_CHECK(f->pages_in_use() == 4 && f->file_pages() == 4, 9);
    // The space fallocate took before it gave up is free again.
    struct statvfs after {};
    CHILD_CHECK(::statvfs(mnt.c_str(), &after) == 0, 10);
    CHILD_CHECK(after.f_bfree + 16 >= before.f_bfree, 11);

    // Reuse first, then room that fits: still all or nothing from a clean state.
    f->release({pages[1]});
    CHILD_CHECK(f->allocate(8192, &more, &why) == -ENOSPC, 12);
    CHILD_CHECK(f->pages_in_use() == 3, 13);
    CHILD_CHECK(f->allocate(3, &more, &why) == 0, 14);
    CHILD_CHECK((more == std::vector<uint64_t>{1, 4, 5}), 15);
    CHILD_CHECK(f->write(more, data.in() + 4, &why) == 0, 16);
    Pages back(8, 4096);
    const std::vector<uint64_t> all = {0, 1, 2, 3, 4, 5};
    CHILD_CHECK(f->read(all, back.out(), &why) == 0, 17);
    const int expect[] = {0, 4, 2, 3, 5, 6};  // page 1 now holds data[4]
    for (int i = 0; i < 6; ++i) CHILD_CHECK(std::memcmp(back[i], data[expect[i]], 4096) == 0, 18);
    f.reset();
    ::umount2(mnt.c_str(), MNT_DETACH);
    return 0;
  });
  if (code == 77) {
    WARN("SKIPPED: cannot mount a small file system here (needs CAP_SYS_ADMIN and a loop device)");
    return;
  }
  REQUIRE(code == 0);
}
