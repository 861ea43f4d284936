#include "io/format/manifest.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>

#include "io/engine/regular_file.hpp"
#include "io/format/admission_file.hpp"
#include "io/format/bounded_json.hpp"
#include "io/format/layout.hpp"
#include "io/format/xxh3.hpp"

namespace embstore::io {
namespace {

using nlohmann::json;

constexpr const char* kFormat = "embstore-checkpoint";
constexpr const char* kOptimizers[] = {"sgd", "adagrad", "rowwise_adagrad", "adam"};
constexpr const char* kInits[] = {"zeros", "constant", "uniform", "normal"};
// By io::Codec's value, as codec_name() spells them.
constexpr const char* kCodecs[] = {"none", "lossless", "bf16", "int8"};

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

// Thrown inside parse_manifest only; becomes -EBADMSG with its message.
struct Bad : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const json& member(const json& j, const char* key) {
  if (!j.is_object()) throw Bad("expected an object");
  auto it = j.find(key);
  if (it == j.end()) throw Bad(std::string("member '") + key + "' is missing");
  return *it;
}

uint64_t get_u64(const json& j, const char* key) {
  const json& v = member(j, key);
  if (!v.is_number_unsigned()) throw Bad(std::string("'") + key + "' is not an unsigned integer");
  return v.get<uint64_t>();
}

uint32_t get_u32(const json& j, const char* key) {
  const uint64_t v = get_u64(j, key);
  if (v > UINT32_MAX) throw Bad(std::string("'") + key + "' is out of range");
  return static_cast<uint32_t>(v);
}

double get_double(const json& j, const char* key) {
  const json& v = member(j, key);
  if (!v.is_number()) throw Bad(std::string("'") + key + "' is not a number");
  return v.get<double>();
}

// A double outside float's range would become infinity (undefined as a conversion), and
// format_manifest could not write it back.
float get_float(const json& j, const char* key) {
  const double v = get_double(j, key);
  if (!(std::fabs(v) <= std::numeric_limits<float>::max())) {
    throw Bad(std::string("'") + key + "' is out of the range of a float");
  }
  return static_cast<float>(v);
}

// A member that manifests written before it existed lack: absent means `fallback`.
template <typename T>
T get_or(const json& j, const char* key, T fallback, T (*get)(const json&, const char*)) {
  return j.is_object() && j.contains(key) ? get(j, key) : fallback;
}

std::string get_string(const json& j, const char* key) {
  const json& v = member(j, key);
  if (!v.is_string()) throw Bad(std::string("'") + key + "' is not a string");
  return v.get<std::string>();
}

uint64_t get_hex64(const json& j, const char* key) {
  const std::string s = get_string(j, key);
  if (s.size() != 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos) {
    throw Bad(std::string("'") + key + "' is not 16 hex digits");
  }
  return std::stoull(s, nullptr, 16);
}

template <size_t N>
int get_enum(const json& j, const char* key, const char* const (&names)[N]) {
  const std::string s = get_string(j, key);
  for (size_t i = 0; i < N; ++i) {
    if (s == names[i]) return static_cast<int>(i);
  }
  throw Bad(std::string("'") + key + "' has unknown value '" + printable(s) + "'");
}

// Paths inside a version directory: relative, no "..", no empty components.
std::string get_path(const json& j, const char* key) {
  const std::string p = get_string(j, key);
  bool ok = !p.empty() && p.front() != '/';
  size_t start = 0;
  while (ok && start <= p.size()) {
    size_t end = p.find('/', start);
    if (end == std::string::npos) end = p.size();
    const std::string part = p.substr(start, end - start);
    ok = !part.empty() && part != "." && part != "..";
    start = end + 1;
  }
  if (!ok) throw Bad(std::string("'") + key + "' is not a relative path: '" + printable(p) + "'");
  return p;
}

// A row file's codecs are members only when they are not none, so manifests without codecs
// stay what format 2 wrote.
json file_json(const FileEntry& f) {
  json j{{"path", f.path}, {"bytes", f.bytes}, {"rows", f.rows}, {"xxh3", hex64(f.xxh3)}};
  if (f.value_codec != Codec::kNone) j["value_codec"] = codec_name(f.value_codec);
  if (f.state_codec != Codec::kNone) j["state_codec"] = codec_name(f.state_codec);
  return j;
}

Codec get_codec(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) return Codec::kNone;
  return static_cast<Codec>(get_enum(j, key, kCodecs));
}

FileEntry file_from(const json& j, uint32_t format) {
  FileEntry f;
  f.path = get_path(j, "path");
  f.bytes = get_u64(j, "bytes");
  f.rows = get_u64(j, "rows");
  f.xxh3 = get_hex64(j, "xxh3");
  if (format >= 3) {
    f.value_codec = get_codec(j, "value_codec");
    f.state_codec = get_codec(j, "state_codec");
  }
  return f;
}

json manifest_json(const Manifest& m) {
  json tables = json::array();
  for (const TableEntry& t : m.tables) {
    const embstore_table_config_t& c = t.config;
    json files = json::array();
    for (const FileEntry& f : t.files) files.push_back(file_json(f));
    tables.push_back(json{{"name", t.name},
                          {"config",
                           {{"dim", c.dim},
                            {"initial_capacity", c.initial_capacity},
                            {"max_capacity", c.max_capacity},
                            {"optimizer", optimizer_name(c.optimizer)},
                            {"learning_rate", double{c.learning_rate}},
                            {"epsilon", double{c.epsilon}},
                            {"beta1", double{c.beta1}},
                            {"beta2", double{c.beta2}},
                            {"weight_decay", double{c.weight_decay}},
                            {"initial_accumulator", double{c.initial_accumulator}},
                            {"init", init_name(c.init)},
                            {"init_a", double{c.init_a}},
                            {"init_b", double{c.init_b}},
                            {"seed", c.seed},
                            {"admit_after", c.admit_after},
                            {"evict_idle_steps", c.evict_idle_steps},
                            {"evict_idle_seconds", c.evict_idle_seconds},
                            {"evict_when_full", c.evict_when_full},
                            {"admit_bloom_bytes", c.admit_bloom_bytes}}},
                          {"state_dim", t.state_dim},
                          {"state_layout", t.state_layout},
                          {"rows", t.rows},
                          {"table_rows", t.table_rows},
                          {"files", files}});
    if (m.format_version >= 3) {
      json& config = tables.back()["config"];
      config["value_codec"] = codec_name(static_cast<Codec>(c.value_codec));
      config["state_codec"] = codec_name(static_cast<Codec>(c.state_codec));
      config["serving_codec"] = codec_name(static_cast<Codec>(c.serving_codec));
      if (!t.serving.empty()) {
        json serving = json::array();
        for (const FileEntry& f : t.serving) serving.push_back(file_json(f));
        tables.back()["serving_files"] = serving;
      }
    }
    if (m.world_size > 1) {
      json counts = json::array();
      for (const FileEntry& f : t.admission) counts.push_back(file_json(f));
      tables.back()["admission"] = counts;
    } else if (!t.admission.empty()) {
      tables.back()["admission"] = file_json(t.admission.front());
    }
  }
  json attachments = json::array();
  for (const AttachmentEntry& a : m.attachments) {
    json f = file_json(a.file);
    f["name"] = a.name;
    if (m.world_size > 1) f["rank"] = a.rank;
    attachments.push_back(f);
  }
  json j{{"format", kFormat},
         {"format_version", m.format_version},
         {"kind", m.full ? "full" : "delta"},
         {"version", m.version},
         {"step", m.version},
         {"parent", m.parent ? json(*m.parent) : json(nullptr)},
         {"world_size", m.world_size},
         {"embstore_version", m.embstore_version},
         {"tables", tables},
         {"attachments", attachments}};
  if (m.format_version >= 2) {
    j["lineage"] = hex64(m.lineage);
    j["parent_manifest_xxh3"] = m.parent_xxh3 ? json(hex64(*m.parent_xxh3)) : json(nullptr);
  }
  if (m.format_version >= 3 && m.serving_only) {
    j["serving_only"] = true;
    j["source_manifest_xxh3"] = hex64(m.source_xxh3);
  }
  return j;
}

uint64_t body_checksum(const json& body) {
  const std::string text = body.dump();
  return xxh3_64(text.data(), text.size());
}

// A serving-only version's table holds values only: what a reader would otherwise expect of
// it (state, admission counts) is not there, and saying otherwise is a forged manifest.
void check_serving_only(const TableEntry& e) {
  if (e.state_dim != 0 || !e.state_layout.empty()) {
    throw Bad("table '" + e.name + "': state_dim " + std::to_string(e.state_dim) +
              " in a serving-only version (values only: 0)");
  }
  if (!e.admission.empty()) {
    throw Bad("table '" + e.name + "': admission counts in a serving-only version");
  }
  // (A filter no file backs would be allocated by a table a warm start creates from it.)
  if (e.config.admit_bloom_bytes != 0) {
    throw Bad("table '" + e.name + "': admit_bloom_bytes in a serving-only version");
  }
  for (const FileEntry& f : e.files) {
    if (f.state_codec != Codec::kNone) {
      throw Bad("table '" + e.name + "': row file '" + printable(f.path) +
                "' has a state codec in a serving-only version");
    }
  }
}

struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

uint32_t manifest_format_for(const Manifest& m) {
  if (m.serving_only) return kManifestFormatVersion;
  for (const TableEntry& t : m.tables) {
    if (t.config.value_codec != EMBSTORE_CODEC_NONE ||
        t.config.state_codec != EMBSTORE_CODEC_NONE ||
        t.config.serving_codec != EMBSTORE_CODEC_NONE || !t.serving.empty()) {
      return kManifestFormatVersion;
    }
    for (const FileEntry& f : t.files) {
      if (f.value_codec != Codec::kNone || f.state_codec != Codec::kNone) {
        return kManifestFormatVersion;
      }
    }
  }
  return kPlainManifestFormatVersion;
}

uint64_t new_lineage() {
  uint64_t id = 0;
  while (id == 0) {
    if (::getrandom(&id, sizeof(id), 0) != static_cast<ssize_t>(sizeof(id))) {
      std::random_device rd;  // old kernels or seccomp filters without getrandom
      id = (uint64_t{rd()} << 32) ^ rd();
    }
  }
  return id;
}

const char* optimizer_name(int optimizer) {
  return optimizer >= 0 && optimizer < 4 ? kOptimizers[optimizer] : "unknown";
}

const char* init_name(int init) { return init >= 0 && init < 4 ? kInits[init] : "unknown"; }

std::string state_layout(int optimizer) {
  switch (optimizer) {
    case EMBSTORE_OPT_ADAGRAD:
      return "accumulator[dim]";
    case EMBSTORE_OPT_ROWWISE_ADAGRAD:
      return "accumulator";
    case EMBSTORE_OPT_ADAM:
      return "m[dim] v[dim] beta1_power beta2_power";
    default:
      return "";
  }
}

std::string format_manifest(const Manifest& m, uint64_t* xxh3) {
  json j = manifest_json(m);
  const uint64_t sum = body_checksum(j);
  j["manifest_xxh3"] = hex64(sum);
  if (xxh3 != nullptr) *xxh3 = sum;
  return j.dump(2) + "\n";
}

int parse_manifest(const std::string& text, Manifest* out, std::string* detail) {
  try {
    json j = parse_bounded_json(text, kMaxManifestDepth);
    const uint64_t expected = get_hex64(j, "manifest_xxh3");
    j.erase("manifest_xxh3");
    if (body_checksum(j) != expected) throw Bad("checksum mismatch (manifest_xxh3)");
    if (get_string(j, "format") != kFormat) throw Bad("'format' is not " + std::string(kFormat));
    Manifest m;
    m.xxh3 = expected;
    m.format_version = get_u32(j, "format_version");
    if (m.format_version < kOldestManifestFormatVersion ||
        m.format_version > kManifestFormatVersion) {
      throw Bad("format_version " + std::to_string(m.format_version) + " is not supported (" +
                std::to_string(kOldestManifestFormatVersion) + " to " +
                std::to_string(kManifestFormatVersion) + " are)");
    }
    const std::string kind = get_string(j, "kind");
    if (kind != "full" && kind != "delta") throw Bad("'kind' is '" + printable(kind) + "'");
    m.full = kind == "full";
    m.version = get_u64(j, "version");
    if (get_u64(j, "step") != m.version) throw Bad("'step' differs from 'version'");
    const json& parent = member(j, "parent");
    if (!parent.is_null()) m.parent = get_u64(j, "parent");
    if (m.full == m.parent.has_value()) throw Bad("'parent' does not match 'kind'");
    m.world_size = get_u32(j, "world_size");
    if (m.world_size == 0 || m.world_size > kMaxWorldSize) {
      throw Bad("'world_size' is " + std::to_string(m.world_size) + ", not 1 to " +
                std::to_string(kMaxWorldSize));
    }
    const json& ev = member(j, "embstore_version");
    if (!ev.is_number_integer()) throw Bad("'embstore_version' is not an integer");
    m.embstore_version = ev.get<int32_t>();
    if (m.format_version >= 2) {
      m.lineage = get_hex64(j, "lineage");
      if (m.lineage == 0) throw Bad("'lineage' is 0");
      if (!member(j, "parent_manifest_xxh3").is_null()) {
        m.parent_xxh3 = get_hex64(j, "parent_manifest_xxh3");
      }
      if (m.full == m.parent_xxh3.has_value()) {
        throw Bad("'parent_manifest_xxh3' does not match 'kind'");
      }
    }
    if (m.format_version < 3 && j.contains("serving_only")) {
      throw Bad("'serving_only' in format " + std::to_string(m.format_version) + " (from 3)");
    }
    if (m.format_version >= 3 && j.contains("serving_only")) {
      const json& flag = member(j, "serving_only");
      if (!flag.is_boolean()) throw Bad("'serving_only' is not a boolean");
      m.serving_only = flag.get<bool>();
      if (m.serving_only) m.source_xxh3 = get_hex64(j, "source_manifest_xxh3");
    }
    const json& tables = member(j, "tables");
    if (!tables.is_array()) throw Bad("'tables' is not an array");
    for (const json& t : tables) {
      TableEntry e;
      e.name = get_string(t, "name");
      // Named first: every message below may quote the name.
      if (std::string why = name_problem("table", e.name); !why.empty()) throw Bad(why);
      const json& c = member(t, "config");
      // Every member is set below (members that older manifests lack get their defaults
      // there), so io/ needs nothing of the library's C API.
      e.config = embstore_table_config_t{};
      e.config.struct_size = sizeof(e.config);
      e.config.dim = get_u32(c, "dim");
      e.config.initial_capacity = get_u64(c, "initial_capacity");
      e.config.max_capacity = get_u64(c, "max_capacity");
      e.config.optimizer = static_cast<embstore_optimizer_t>(get_enum(c, "optimizer", kOptimizers));
      e.config.learning_rate = get_float(c, "learning_rate");
      e.config.epsilon = get_float(c, "epsilon");
      e.config.beta1 = get_float(c, "beta1");
      e.config.beta2 = get_float(c, "beta2");
      e.config.weight_decay = get_float(c, "weight_decay");
      e.config.initial_accumulator = get_float(c, "initial_accumulator");
      e.config.init = static_cast<embstore_init_t>(get_enum(c, "init", kInits));
      e.config.init_a = get_float(c, "init_a");
      e.config.init_b = get_float(c, "init_b");
      e.config.seed = get_u64(c, "seed");
      e.config.admit_after = get_u32(c, "admit_after");
      e.config.evict_idle_steps = get_u64(c, "evict_idle_steps");
      e.config.evict_idle_seconds = get_or(c, "evict_idle_seconds", 0.0, get_double);
      e.config.evict_when_full = get_or(c, "evict_when_full", uint32_t{0}, get_u32);
      e.config.admit_bloom_bytes = get_or(c, "admit_bloom_bytes", uint64_t{0}, get_u64);
      if (m.format_version >= 3) {
        e.config.value_codec = static_cast<embstore_codec_t>(get_codec(c, "value_codec"));
        e.config.state_codec = static_cast<embstore_codec_t>(get_codec(c, "state_codec"));
        // Absent in format 3 manifests written before values-only deltas: none.
        e.config.serving_codec = static_cast<embstore_codec_t>(get_codec(c, "serving_codec"));
        if (e.config.state_codec == EMBSTORE_CODEC_INT8) {
          throw Bad("table '" + e.name + "': state_codec 'int8', which no table may have");
        }
      }
      e.state_dim = get_u32(t, "state_dim");
      e.state_layout = get_string(t, "state_layout");
      e.rows = get_u64(t, "rows");
      e.table_rows = get_u64(t, "table_rows");
      const json& files = member(t, "files");
      if (!files.is_array()) throw Bad("'files' of table '" + e.name + "' is not an array");
      uint64_t rows = 0;
      for (const json& f : files) {
        e.files.push_back(file_from(f, m.format_version));
        if (e.files.back().state_codec == Codec::kInt8) {
          throw Bad("table '" + e.name +
                    "': a row file of optimizer state in int8, which no "
                    "writer writes");
        }
        if (rows > UINT64_MAX - e.files.back().rows) {
          throw Bad("table '" + e.name + "': file rows overflow");
        }
        rows += e.files.back().rows;
      }
      if (rows != e.rows) throw Bad("table '" + e.name + "': file rows do not add up to 'rows'");
      if (m.format_version >= 3 && t.contains("serving_files")) {
        const json& serving = member(t, "serving_files");
        if (!serving.is_array()) {
          throw Bad("'serving_files' of table '" + e.name + "' is not an array");
        }
        if (m.serving_only) {
          throw Bad("table '" + e.name + "': values-only copies in a serving-only version");
        }
        for (const json& f : serving) e.serving.push_back(file_from(f, m.format_version));
        // Each the copy of the row file at its index (check_layout checks the paths).
        if (e.serving.size() != e.files.size()) {
          throw Bad("table '" + e.name + "': " + std::to_string(e.serving.size()) +
                    " values-only files for " + std::to_string(e.files.size()) + " row files");
        }
        for (size_t i = 0; i < e.serving.size(); ++i) {
          if (e.serving[i].rows != e.files[i].rows) {
            throw Bad("table '" + e.name + "': values-only file '" + printable(e.serving[i].path) +
                      "' holds " + std::to_string(e.serving[i].rows) + " rows, its row file " +
                      std::to_string(e.files[i].rows));
          }
          if (e.serving[i].state_codec != Codec::kNone) {
            throw Bad("table '" + e.name + "': values-only file '" + printable(e.serving[i].path) +
                      "' has a state codec");
          }
        }
      }
      if (t.contains("admission")) {
        const json& counts = member(t, "admission");
        if (m.world_size == 1) {
          e.admission.push_back(file_from(counts, m.format_version));
        } else {
          if (!counts.is_array()) {
            throw Bad("'admission' of table '" + e.name + "' is not an array (world size " +
                      std::to_string(m.world_size) + ")");
          }
          for (const json& f : counts) e.admission.push_back(file_from(f, m.format_version));
        }
      }
      if (m.serving_only) check_serving_only(e);
      // A Bloom filter's counts file is its header and the whole filter: a manifest asking for
      // a filter its files cannot hold is forged or damaged (before anything is allocated). A
      // serving-only version has no counts, and so no filter (check_serving_only).
      if (e.config.admit_bloom_bytes != 0) {
        if (e.admission.empty()) {
          throw Bad("table '" + e.name + "': admit_bloom_bytes " +
                    std::to_string(e.config.admit_bloom_bytes) + " but no counts file");
        }
        for (const FileEntry& f : e.admission) {
          if (f.bytes != kAdmissionHeaderBytes + e.config.admit_bloom_bytes) {
            throw Bad("table '" + e.name + "': admit_bloom_bytes " +
                      std::to_string(e.config.admit_bloom_bytes) + " but its counts file '" +
                      printable(f.path) + "' holds " + std::to_string(f.bytes) + " bytes");
          }
        }
      }
      m.tables.push_back(std::move(e));
    }
    const json& attachments = member(j, "attachments");
    if (!attachments.is_array()) throw Bad("'attachments' is not an array");
    for (const json& a : attachments) {
      AttachmentEntry e{get_string(a, "name"), file_from(a, m.format_version)};
      if (std::string why = name_problem("attachment", e.name); !why.empty()) throw Bad(why);
      if (m.world_size > 1) {
        e.rank = get_u32(a, "rank");
      } else if (a.contains("rank")) {
        throw Bad("attachment '" + e.name + "' has a 'rank' in a checkpoint of one rank");
      }
      m.attachments.push_back(std::move(e));
    }
    if (m.serving_only && !m.attachments.empty()) {
      throw Bad("attachments in a serving-only version");
    }
    std::string why;
    if (check_layout(m, &why) < 0) throw Bad(why);
    *out = std::move(m);
    for (TableEntry& t : out->tables) t.config.name = t.name.c_str();
    return 0;
  } catch (const JsonTooDeep& e) {
    if (detail) *detail = e.what();
  } catch (const json::exception& e) {
    if (detail) *detail = e.what();
  } catch (const Bad& e) {
    if (detail) *detail = e.what();
  } catch (const std::bad_alloc&) {
    return -ENOMEM;
  }
  return -EBADMSG;
}

int write_manifest(const std::string& version_dir, const Manifest& m, uint64_t* xxh3) {
  std::string text;
  try {
    text = format_manifest(m, xxh3);
  } catch (...) {
    return -ENOMEM;
  }
  // Readers refuse a larger one: a version that could never be read must not commit.
  if (text.size() > kMaxManifestBytes) return -EFBIG;
  return write_whole_file(version_dir + "/" + kManifestName, text.data(), text.size());
}

int read_manifest(const std::string& version_dir, Manifest* out, std::string* detail) {
  std::string text;
  const std::string path = version_dir + "/" + kManifestName;
  if (int r = read_regular(path, kMaxManifestBytes, &text); r < 0) {
    if (detail != nullptr && (r == kNotRegularFile || r == -ELOOP || r == -EFBIG)) {
      *detail = r == -EFBIG ? fmt::format("{}: larger than {} bytes", path, kMaxManifestBytes)
                            : fmt::format("{}: {}", path, regular_file_error(r));
    }
    // A manifest that is not a regular file, or too large to be one of ours, is a corrupt
    // version: it is read like any other.
    return r == kNotRegularFile || r == -ELOOP || r == -EFBIG ? -EBADMSG : r;
  }
  return parse_manifest(text, out, detail);
}

int write_whole_file(const std::string& path, const void* data, size_t bytes) {
  FdCloser f{::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
  if (f.fd < 0) return -errno;
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(f.fd, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) return -EIO;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  const int fd = f.fd;
  f.fd = -1;
  return ::close(fd) == 0 ? 0 : -errno;
}

int checksum_file(const std::string& path, uint64_t* xxh3, uint64_t* bytes,
                  void (*progress)(uint64_t, void*), void* ctx) {
  FdCloser f{-1};
  if (int r = open_regular(path, 0, &f.fd); r < 0) return r;
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                 &XXH3_freeState);
  if (!state) return -ENOMEM;
  XXH3_64bits_reset(state.get());
  std::unique_ptr<char[]> buf(new (std::nothrow) char[size_t{4} << 20]);
  if (!buf) return -ENOMEM;
  uint64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(f.fd, buf.get(), size_t{4} << 20);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) break;
    xxh3_update(state.get(), buf.get(), static_cast<size_t>(n));
    total += static_cast<uint64_t>(n);
    if (progress) progress(total, ctx);
  }
  *xxh3 = XXH3_64bits_digest(state.get());
  *bytes = total;
  return 0;
}

}  // namespace embstore::io
