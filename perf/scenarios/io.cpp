// Scenario `io`: throughput of the checkpoint I/O layer (io/). Writes --bytes through
// FileWriter (fsync included), reads the file back through FileReader, and writes the same
// amount through a plain buffered baseline (write() of 1 MiB chunks, then fsync) in the same
// run, so the two rates compare on the same disk under the same load.
//
// The staging buffers are filled with non-zero data once, and each chunk is stamped with its
// index, so the writer's rate is the I/O path's (a file system that compresses or dedups sees
// distinct, incompressible-enough chunks). With O_DIRECT the read-back comes from the disk;
// after a buffered write (--buffered, or where O_DIRECT is refused) it may come from the page
// cache, which the JSON notes. The files are deleted afterwards.
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "io/engine/engine.hpp"
#include "io/engine/file_reader.hpp"
#include "io/engine/file_writer.hpp"
#include "perf/harness.hpp"
#include "perf/report.hpp"
#include "perf/zipf.hpp"

namespace embstore::perf {
namespace {

constexpr size_t kBaselineChunk = size_t{1} << 20;

void io_check(int r, const std::string& what) {
  if (r < 0) throw std::runtime_error(fmt::format("{}: {}", what, std::strerror(-r)));
}

void fill(unsigned char* p, size_t n, uint64_t seed) {
  SplitMix64 rng(seed);
  for (size_t i = 0; i + 8 <= n; i += 8) {
    const uint64_t v = rng.next() | 0x0101010101010101ull;  // no zero byte anywhere
    std::memcpy(p + i, &v, 8);
  }
  for (size_t i = n & ~size_t{7}; i < n; ++i) p[i] = 0x5a;
}

// Removes the file when the scenario ends, however it ends.
struct Unlink {
  std::string path;
  ~Unlink() { ::unlink(path.c_str()); }
};

class IoScenario final : public Scenario {
 public:
  const char* name() const override { return "io"; }
  const char* description() const override {
    return "checkpoint file writer/reader throughput (io_uring, O_DIRECT) vs buffered write";
  }

  void add_options(CLI::App& app) override {
    app.add_option("--dir", dir_, "directory on the disk to measure")->required();
    app.add_option("--bytes", bytes_, "bytes per file")
        ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 44))
        ->capture_default_str();
    app.add_option("--queue-depth", queue_depth_, "reads/writes in flight")
        ->check(CLI::Range(1u, 4096u))
        ->capture_default_str();
    app.add_option("--buffer-bytes", buffer_bytes_, "bytes per write/read")
        ->check(CLI::Range(size_t{4096}, size_t{1} << 30))
        ->capture_default_str();
    app.add_flag("--no-uring", no_uring_, "force the pwrite/pread engine");
    app.add_flag("--buffered", buffered_, "no O_DIRECT");
    app.add_flag("--no-preallocate", no_preallocate_,
                 "do not pass the size to the writer (no fallocate)");
  }

  int run(const CommonOptions&, Report& report) override {
    io::IoOptions options;
    options.queue_depth = queue_depth_;
    options.buffer_bytes = buffer_bytes_;
    options.allow_uring = !no_uring_;
    options.direct = !buffered_;
    options.size_hint = no_preallocate_ ? 0 : bytes_;
    const std::string stem = fmt::format("{}/embstore-perf-io-{}", dir_, ::getpid());
    Unlink data_file{stem + ".dat"}, baseline_file{stem + ".buffered"};

    // Writer: open to fsynced close.
    std::unique_ptr<io::FileWriter> writer;
    const Stopwatch write_clock;
    io_check(io::FileWriter::open(data_file.path, options, &writer), "open " + data_file.path);
    const std::string writer_engine = writer->engine();
    const size_t chunk = writer->buffer_bytes();
    std::unordered_set<void*> filled;
    uint64_t at = 0, index = 0;
    while (at < bytes_) {
      void* buf = nullptr;
      io_check(writer->acquire(&buf), "acquire");
      if (filled.insert(buf).second) fill(static_cast<unsigned char*>(buf), chunk, filled.size());
      std::memcpy(buf, &index, sizeof(index));
      const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, bytes_ - at));
      io_check(writer->submit(buf, n), "write " + data_file.path);
      at += n;
      ++index;
    }
    io_check(writer->finish(), "finish " + data_file.path);
    const Elapsed write_time = write_clock.elapsed();
    writer.reset();

    // Reader: open to the last chunk; checks every chunk's stamp and the total.
    std::unique_ptr<io::FileReader> reader;
    const Stopwatch read_clock;
    io_check(io::FileReader::open(data_file.path, options, &reader), "open " + data_file.path);
    const std::string reader_engine = reader->engine();
    uint64_t read_bytes = 0, expect = 0;
    bool ok = true;
    for (;;) {
      const void* data = nullptr;
      size_t n = 0;
      io_check(reader->next(&data, &n), "read " + data_file.path);
      if (n == 0) break;
      uint64_t stamp = 0;
      std::memcpy(&stamp, data, std::min(n, sizeof(stamp)));
      if (n >= sizeof(stamp) && stamp != expect) ok = false;
      ++expect;
      read_bytes += n;
    }
    const Elapsed read_time = read_clock.elapsed();
    reader.reset();
    if (read_bytes != bytes_) ok = false;

    // Baseline: what a plain program gets (page cache, then fsync).
    std::vector<unsigned char> plain(kBaselineChunk);
    fill(plain.data(), plain.size(), 1);
    const Stopwatch buffered_clock;
    const int fd =
        ::open(baseline_file.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) io_check(-errno, "open " + baseline_file.path);
    for (uint64_t done = 0, i = 0; done < bytes_; ++i) {
      std::memcpy(plain.data(), &i, sizeof(i));
      const size_t n = static_cast<size_t>(std::min<uint64_t>(plain.size(), bytes_ - done));
      size_t put = 0;
      while (put < n) {
        const ssize_t r = ::write(fd, plain.data() + put, n - put);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
          const int e = r < 0 ? -errno : -EIO;
          ::close(fd);
          io_check(e, "write " + baseline_file.path);
        }
        put += static_cast<size_t>(r);
      }
      done += n;
    }
    if (::fsync(fd) != 0) {
      const int e = -errno;
      ::close(fd);
      io_check(e, "fsync " + baseline_file.path);
    }
    ::close(fd);
    const Elapsed buffered_time = buffered_clock.elapsed();

    const double b = static_cast<double>(bytes_);
    const double writer_rate = b / write_time.wall, reader_rate = b / read_time.wall;
    const double buffered_rate = b / buffered_time.wall;
    const bool read_cached = reader_engine.find("O_DIRECT") == std::string::npos;
    report.say("io: {} bytes in {} dir, queue depth {}, {} B buffers", bytes_, dir_, queue_depth_,
               chunk);
    report.say("    writer   {:>18}  {}B/s  ({:.2f} s, fsync included)", writer_engine,
               si(writer_rate), write_time.wall);
    report.say("    reader   {:>18}  {}B/s  ({:.2f} s){}", reader_engine, si(reader_rate),
               read_time.wall, read_cached ? "  [buffered: may be served by the page cache]" : "");
    report.say(
        "    buffered {:>18}  {}B/s  ({:.2f} s, write() of 1 MiB + fsync); writer/buffered "
        "{:.2f}",
        "write+fsync", si(buffered_rate), buffered_time.wall, writer_rate / buffered_rate);
    if (!ok)
      report.say("check: FAILED: read back {} of {} bytes or a chunk out of order", read_bytes,
                 bytes_);

    report.set("dir", dir_);
    report.set("bytes", bytes_);
    report.set("queue_depth", queue_depth_);
    report.set("preallocate", !no_preallocate_);
    report.set("buffer_bytes", chunk);
    report.set("writer_engine", writer_engine);
    report.set("reader_engine", reader_engine);
    report.set("writer_seconds", write_time.wall);
    report.set("writer_cpu_seconds", write_time.cpu);
    report.set("writer_bytes_per_second", writer_rate);
    report.set("reader_seconds", read_time.wall);
    report.set("reader_cpu_seconds", read_time.cpu);
    report.set("reader_bytes_per_second", reader_rate);
    report.set("reader_may_hit_page_cache", read_cached);
    report.set("buffered_seconds", buffered_time.wall);
    report.set("buffered_cpu_seconds", buffered_time.cpu);
    report.set("buffered_bytes_per_second", buffered_rate);
    report.set("writer_over_buffered", writer_rate / buffered_rate);
    report.set("read_back_ok", ok);
    return ok ? 0 : kExitMismatch;
  }

 private:
  std::string dir_;
  uint64_t bytes_ = uint64_t{1} << 30;
  unsigned queue_depth_ = 16;
  bool no_preallocate_ = false;
  size_t buffer_bytes_ = size_t{1} << 20;
  bool no_uring_ = false;
  bool buffered_ = false;
};

}  // namespace

std::unique_ptr<Scenario> make_io_scenario() { return std::make_unique<IoScenario>(); }

}  // namespace embstore::perf
