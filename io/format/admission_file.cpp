#include "io/format/admission_file.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unordered_map>

namespace embstore::io {
namespace {

constexpr char kMagic[8] = {'E', 'M', 'B', 'A', 'D', 'M', 'I', 'T'};
constexpr uint32_t kFormat = 1;

int bad(std::string* detail, std::string why) {
  if (detail) *detail = std::move(why);
  return -EBADMSG;
}

}  // namespace

const char* admission_kind_name(AdmissionKind kind) {
  switch (kind) {
    case AdmissionKind::kExact:
      return "exact";
    case AdmissionKind::kBloom:
      return "Bloom filter";
    case AdmissionKind::kExactDelta:
      return "exact delta";
  }
  return "unknown";
}

std::vector<char> format_admission_file(const AdmissionFile& f) {
  const bool bloom = f.kind == AdmissionKind::kBloom;
  const bool delta = f.kind == AdmissionKind::kExactDelta;
  const uint64_t n = bloom ? f.counters.size() : f.entries.size();
  const size_t removed = delta ? 8 + f.removed.size() * sizeof(int64_t) : 0;
  const size_t payload = bloom ? f.counters.size() : n * sizeof(AdmissionEntry);
  std::vector<char> out(kAdmissionHeaderBytes + removed + payload);
  char* p = out.data();
  const auto k = static_cast<uint32_t>(f.kind);
  std::memcpy(p, kMagic, 8);
  std::memcpy(p + 8, &k, 4);
  std::memcpy(p + 12, &kFormat, 4);
  std::memcpy(p + 16, &n, 8);
  p += kAdmissionHeaderBytes;
  if (delta) {
    const uint64_t r = f.removed.size();
    std::memcpy(p, &r, 8);
    if (r > 0) std::memcpy(p + 8, f.removed.data(), r * sizeof(int64_t));
    p += removed;
  }
  if (bloom) {
    if (n > 0) std::memcpy(p, f.counters.data(), n);
  } else {
    for (AdmissionEntry e : f.entries) {
      e.reserved = 0;
      std::memcpy(p, &e, sizeof e);
      p += sizeof e;
    }
  }
  return out;
}

int parse_admission_file(const std::string& bytes, AdmissionFile* out, std::string* detail) {
  if (bytes.size() < kAdmissionHeaderBytes || std::memcmp(bytes.data(), kMagic, 8) != 0) {
    return bad(detail, "no EMBADMIT header");
  }
  uint32_t kind = 0, format = 0;
  uint64_t n = 0;
  std::memcpy(&kind, bytes.data() + 8, 4);
  std::memcpy(&format, bytes.data() + 12, 4);
  std::memcpy(&n, bytes.data() + 16, 8);
  if (format != kFormat) {
    return bad(detail, fmt::format("format {}, this version reads {}", format, kFormat));
  }
  if (kind > 2) return bad(detail, fmt::format("counting kind {}", kind));
  AdmissionFile f;
  f.kind = static_cast<AdmissionKind>(kind);
  const char* p = bytes.data() + kAdmissionHeaderBytes;
  uint64_t left = bytes.size() - kAdmissionHeaderBytes;
  if (f.kind == AdmissionKind::kBloom) {
    if (left != n) {
      return bad(detail, fmt::format("{} bytes, a filter of {} counters needs {}", bytes.size(), n,
                                     kAdmissionHeaderBytes + n));
    }
    f.counters.assign(p, p + n);
    *out = std::move(f);
    return 0;
  }
  if (f.kind == AdmissionKind::kExactDelta) {
    uint64_t r = 0;
    if (left < 8) return bad(detail, "the removed-key count is cut off");
    std::memcpy(&r, p, 8);
    p += 8;
    left -= 8;
    if (r > left / 8) return bad(detail, fmt::format("{} removed keys do not fit", r));
    f.removed.resize(r);
    if (r > 0) std::memcpy(f.removed.data(), p, r * 8);
    p += r * 8;
    left -= r * 8;
  }
  if (n > left / sizeof(AdmissionEntry) || left != n * sizeof(AdmissionEntry)) {
    return bad(detail, fmt::format("{} bytes of entries, {} entries need {}", left, n,
                                   n * sizeof(AdmissionEntry)));
  }
  f.entries.resize(n);
  if (n > 0) std::memcpy(f.entries.data(), p, n * sizeof(AdmissionEntry));
  for (const AdmissionEntry& e : f.entries) {
    if (e.count == 0) return bad(detail, fmt::format("key {} has count 0", e.key));
    if (e.reserved != 0) return bad(detail, fmt::format("key {}: reserved field not 0", e.key));
  }
  std::vector<int64_t> keys(n);
  for (uint64_t i = 0; i < n; ++i) keys[i] = f.entries[i].key;
  std::sort(keys.begin(), keys.end());
  if (auto d = std::adjacent_find(keys.begin(), keys.end()); d != keys.end()) {
    return bad(detail, fmt::format("key {} is listed twice", *d));
  }
  *out = std::move(f);
  return 0;
}

int merge_admission_files(const std::vector<std::string>& oldest_first, AdmissionFile* out,
                          std::string* detail) {
  std::vector<AdmissionFile> files(oldest_first.size());
  for (size_t i = 0; i < files.size(); ++i) {
    if (int r = parse_admission_file(oldest_first[i], &files[i], detail); r < 0) return r;
  }
  return merge_admission(std::move(files), out, detail);
}

int combine_rank_admission(std::vector<AdmissionFile> ranks, AdmissionFile* out,
                           std::string* detail) {
  if (ranks.empty()) return bad(detail, "no admission files to combine");
  AdmissionFile all = std::move(ranks.front());
  for (size_t i = 1; i < ranks.size(); ++i) {
    AdmissionFile& f = ranks[i];
    if (f.kind != all.kind) {
      return bad(detail, std::string("ranks wrote admission counts of kinds ") +
                             admission_kind_name(all.kind) + " and " + admission_kind_name(f.kind));
    }
    if (all.kind == AdmissionKind::kBloom) {
      if (f.counters.size() != all.counters.size()) {
        return bad(detail, "ranks wrote Bloom filters of different sizes");
      }
      for (size_t c = 0; c < f.counters.size(); ++c) {
        all.counters[c] = static_cast<uint8_t>(std::min(255, all.counters[c] + f.counters[c]));
      }
    } else {
      all.entries.insert(all.entries.end(), f.entries.begin(), f.entries.end());
      all.removed.insert(all.removed.end(), f.removed.begin(), f.removed.end());
    }
  }
  std::sort(all.entries.begin(), all.entries.end(),
            [](const AdmissionEntry& a, const AdmissionEntry& b) { return a.key < b.key; });
  std::sort(all.removed.begin(), all.removed.end());
  for (size_t i = 1; i < all.entries.size(); ++i) {
    if (all.entries[i].key == all.entries[i - 1].key) {
      return bad(detail, "key " + std::to_string(all.entries[i].key) +
                             " has admission counts from two ranks");
    }
  }
  if (std::adjacent_find(all.removed.begin(), all.removed.end()) != all.removed.end()) {
    return bad(detail, "a removed key is listed by two ranks");
  }
  *out = std::move(all);
  return 0;
}

int merge_admission(std::vector<AdmissionFile> files, AdmissionFile* out, std::string* detail) {
  size_t start = files.size();  // the newest whole file
  while (start > 0 && files[start - 1].kind == AdmissionKind::kExactDelta) --start;
  if (start == 0) return bad(detail, "the chain's counts start with a delta");
  --start;
  if (start + 1 == files.size()) {  // nothing to apply: the file as it is
    *out = std::move(files[start]);
    return 0;
  }
  if (files[start].kind == AdmissionKind::kBloom) {
    return bad(detail, "exact count changes follow a Bloom filter");
  }
  std::unordered_map<int64_t, AdmissionEntry> counts;
  counts.reserve(files[start].entries.size());
  for (size_t i = start; i < files.size(); ++i) {
    for (int64_t k : files[i].removed) counts.erase(k);
    for (const AdmissionEntry& e : files[i].entries) counts[e.key] = e;
  }
  AdmissionFile merged;
  merged.kind = AdmissionKind::kExact;
  merged.entries.reserve(counts.size());
  for (const auto& [key, e] : counts) merged.entries.push_back(e);
  std::sort(merged.entries.begin(), merged.entries.end(),
            [](const AdmissionEntry& a, const AdmissionEntry& b) { return a.key < b.key; });
  *out = std::move(merged);
  return 0;
}

}  // namespace embstore::io
