#include "io/format/lease.hpp"

#include <dirent.h>
#include <embstore/embstore.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "io/engine/engine.hpp"
#include "io/engine/regular_file.hpp"
#include "io/format/bounded_json.hpp"
#include "io/format/chain.hpp"
#include "io/format/dir_lock.hpp"
#include "io/format/layout.hpp"

namespace embstore::io {
namespace {

using detail::errno_text;

constexpr size_t kMaxLeaseBytes = EMBSTORE_MAX_LEASE_BYTES;
constexpr int kMaxLeaseDepth = 4;  // a lease is one flat object
constexpr size_t kMaxIdLength = 64;
constexpr const char* kTmpSuffix = ".tmp";
constexpr int kLeaseFormat = 1;

int neg_errno() { return errno > 0 ? -errno : -EIO; }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool valid_id(const std::string& id) {
  return !id.empty() && id.size() <= kMaxIdLength && valid_name(id) && !ends_with(id, kTmpSuffix);
}

std::string lease_path(const std::string& dir, const std::string& id) {
  return dir + "/" + kLeasePrefix + id;
}

int write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return neg_errno();
    done += static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace

int64_t wall_clock_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string new_lease_id() {
  std::string host;
  for (char c : host_name()) {
    if (host.size() == 24) break;
    if (valid_name(std::string(1, c)) && c != '.') host.push_back(c);
  }
  uint32_t random = 0;
  if (::getrandom(&random, sizeof(random), 0) != sizeof(random)) {
    random = static_cast<uint32_t>(wall_clock_ms());
  }
  return fmt::format("{}-{}-{:08x}", host.empty() ? "host" : host, ::getpid(), random);
}

std::string format_lease(const Lease& lease) {
  nlohmann::json j;
  j["embstore_lease"] = kLeaseFormat;
  j["pid"] = lease.pid;
  j["host"] = lease.host;
  j["version"] = lease.version;
  j["expires_ms"] = lease.expires_ms;
  j["what"] = lease.what;
  return j.dump(2) + "\n";
}

int parse_lease(const std::string& text, Lease* out, std::string* why) {
  if (text.size() > kMaxLeaseBytes) {
    *why = fmt::format("{} bytes, more than a lease's {}", text.size(), kMaxLeaseBytes);
    return -EBADMSG;
  }
  Lease l;
  try {
    const nlohmann::json j = parse_bounded_json(text, kMaxLeaseDepth);
    if (!j.is_object()) throw std::runtime_error("not a JSON object");
    const auto number = [&](const char* key) -> const nlohmann::json& {
      const auto it = j.find(key);
      if (it == j.end()) throw std::runtime_error(fmt::format("'{}' is missing", key));
      if (!it->is_number_integer()) {
        throw std::runtime_error(fmt::format("'{}' is not an integer", key));
      }
      return *it;
    };
    const auto text_of = [&](const char* key) {
      const auto it = j.find(key);
      return it != j.end() && it->is_string() ? printable(it->get<std::string>()) : std::string();
    };
    if (number("embstore_lease").get<int64_t>() != kLeaseFormat) {
      throw std::runtime_error("unknown lease format");
    }
    l.pid = number("pid").get<int64_t>();
    if (!number("version").is_number_unsigned()) throw std::runtime_error("'version' < 0");
    l.version = number("version").get<uint64_t>();
    l.expires_ms = number("expires_ms").get<int64_t>();
    l.host = text_of("host");
    l.what = text_of("what");
  } catch (const std::exception& e) {
    *why = e.what();
    return -EBADMSG;
  }
  *out = std::move(l);
  return 0;
}

int write_lease(const std::string& dir, const Lease& lease, std::string* detail) {
  if (!valid_id(lease.id)) {
    *detail = fmt::format("lease id '{}' is not a valid name", printable(lease.id));
    return -EINVAL;
  }
  const std::string path = lease_path(dir, lease.id), tmp = path + kTmpSuffix;
  // A new file of its own: whatever is planted at the tmp name (a FIFO would block the open,
  // holding the follower's poll) goes first, and O_EXCL refuses one planted meanwhile.
  ::unlink(tmp.c_str());
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd < 0) {
    const int r = neg_errno();
    *detail = fmt::format("{}: {}", tmp, errno_text(r));
    return r;
  }
  int r = write_all(fd, format_lease(lease));
  if (::close(fd) < 0 && r == 0) r = neg_errno();
  if (r == 0 && std::rename(tmp.c_str(), path.c_str()) != 0) r = neg_errno();
  if (r < 0) {
    ::unlink(tmp.c_str());
    *detail = fmt::format("{}: {}", path, errno_text(r));
  }
  return r;
}

int remove_lease(const std::string& dir, const std::string& id) {
  if (!valid_id(id)) return -EINVAL;
  const std::string path = lease_path(dir, id);
  ::unlink((path + kTmpSuffix).c_str());
  return ::unlink(path.c_str()) < 0 && errno != ENOENT ? neg_errno() : 0;
}

int read_leases(const std::string& dir, std::vector<Lease>* out,
                std::vector<std::string>* skipped) {
  out->clear();
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return neg_errno();
  const std::string prefix = kLeasePrefix;
  std::vector<std::string> ids;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string id = name.substr(prefix.size());
    if (ends_with(id, kTmpSuffix)) continue;  // being written, or left by a crash
    if (!valid_id(id)) {
      if (skipped != nullptr) skipped->push_back(printable(name) + ": not a valid lease name");
      continue;
    }
    ids.push_back(id);
  }
  ::closedir(d);
  std::sort(ids.begin(), ids.end());
  for (const std::string& id : ids) {
    std::string text, why;
    Lease l;
    // A planted FIFO or link to /dev/zero must not hang or fill a trainer's retention.
    int r = read_regular(lease_path(dir, id), kMaxLeaseBytes, &text);
    if (r == -ENOENT) continue;  // removed since the listing
    if (r == -EFBIG)
      why = fmt::format("more than a lease's {} bytes", kMaxLeaseBytes);
    else if (r == kNotRegularFile || r == -ELOOP)
      why = regular_file_error(r);
    else if (r < 0)
      why = errno_text(r);
    else if (parse_lease(text, &l, &why) == 0) {
      l.id = id;
      out->push_back(std::move(l));
      continue;
    }
    if (skipped != nullptr) skipped->push_back(prefix + id + ": " + why);
  }
  return 0;
}

uint64_t oldest_leased_version(const std::string& dir, const std::vector<VersionDir>& versions,
                               int64_t now_ms, std::vector<std::string>* skipped) {
  std::vector<Lease> leases;
  if (read_leases(dir, &leases, skipped) < 0) return UINT64_MAX;
  uint64_t oldest = UINT64_MAX;
  CheckpointDir checkpoints(dir, versions);
  for (const Lease& lease : leases) {
    if (lease.expires_ms <= now_ms) {
      // Compared without subtracting from expires_ms, which the file may set to anything.
      if (lease.expires_ms < now_ms - kStaleLeaseMs) remove_lease(dir, lease.id);
      continue;
    }
    for (size_t i = 0; i < checkpoints.versions().size(); ++i) {
      if (checkpoints.versions()[i].version != lease.version) continue;
      std::vector<ChainLink> chain;
      std::string detail;
      const uint64_t base = checkpoints.chain(i, &chain, &detail) == 0
                                ? chain.back().manifest->version
                                : lease.version;
      oldest = std::min(oldest, base);
    }
  }
  return oldest;
}

}  // namespace embstore::io
