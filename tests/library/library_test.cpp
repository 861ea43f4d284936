// What libembstore.so carries: only embstore_* symbols exported, and (in CUDA builds) device
// code for every architecture asked for, with the fused optimizer kernels. Reads the ELF file
// directly: cuobjdump is not installed everywhere.
#include <elf.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::vector<char> read_file(const char* path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

template <typename T>
T at(const std::vector<char>& f, size_t offset) {
  REQUIRE(offset + sizeof(T) <= f.size());
  T v;
  std::memcpy(&v, f.data() + offset, sizeof(T));
  return v;
}

std::vector<Elf64_Shdr> sections(const std::vector<char>& f) {
  const auto eh = at<Elf64_Ehdr>(f, 0);
  REQUIRE(std::memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0);
  REQUIRE(eh.e_ident[EI_CLASS] == ELFCLASS64);
  std::vector<Elf64_Shdr> out;
  for (int i = 0; i < eh.e_shnum; ++i) {
    out.push_back(at<Elf64_Shdr>(f, eh.e_shoff + size_t{eh.e_shentsize} * i));
  }
  return out;
}

std::string section_name(const std::vector<char>& f, const std::vector<Elf64_Shdr>& secs,
                         const Elf64_Shdr& s) {
  const auto eh = at<Elf64_Ehdr>(f, 0);
  return std::string(f.data() + secs[eh.e_shstrndx].sh_offset + s.sh_name);
}

// Entries of the CUDA fat binaries in .nv_fatbin (layout as documented by the CUDA binary
// utilities: a blob header, then entries each with its own header and payload).
struct FatbinEntry {
  uint16_t kind;  // 1: PTX, 2: ELF (cubin)
  uint32_t arch;  // 80 for sm_80
  bool compressed;
  std::string payload;
};

std::vector<FatbinEntry> fatbin_entries(const std::vector<char>& f, const Elf64_Shdr& s) {
  constexpr uint32_t kMagic = 0xBA55ED50u;
  std::vector<FatbinEntry> out;
  size_t pos = s.sh_offset;
  const size_t end = s.sh_offset + s.sh_size;
  while (pos + 16 <= end) {
    if (at<uint32_t>(f, pos) != kMagic) {
      pos += 8;  // blobs are 8-byte aligned; skip padding
      continue;
    }
    const uint16_t header_size = at<uint16_t>(f, pos + 6);
    const uint64_t fat_size = at<uint64_t>(f, pos + 8);
    size_t e = pos + header_size;
    const size_t blob_end = e + fat_size;
    REQUIRE(blob_end <= end);
    while (e + 48 <= blob_end) {
      FatbinEntry entry;
      entry.kind = at<uint16_t>(f, e);
      const uint32_t entry_header = at<uint32_t>(f, e + 4);
      const uint64_t size = at<uint64_t>(f, e + 8);
      const uint32_t compressed_size = at<uint32_t>(f, e + 16);
      entry.arch = at<uint32_t>(f, e + 28);
      const uint64_t flags = at<uint64_t>(f, e + 40);
      entry.compressed = compressed_size != 0 || (flags & 0x2000) != 0;
      REQUIRE(e + entry_header + size <= blob_end);
      entry.payload.assign(f.data() + e + entry_header, size);
      out.push_back(std::move(entry));
      e += entry_header + size;
    }
    pos = blob_end;
  }
  return out;
}

}  // namespace

TEST_CASE("only embstore_* symbols are exported", "[library]") {
  const auto f = read_file(EMBSTORE_LIBRARY_PATH);
  const auto secs = sections(f);
  const Elf64_Shdr* dynsym = nullptr;
  for (const auto& s : secs) {
    if (s.sh_type == SHT_DYNSYM) dynsym = &s;
  }
  REQUIRE(dynsym != nullptr);
  const Elf64_Shdr& strtab = secs[dynsym->sh_link];
  std::set<std::string> exported;
  for (size_t off = 0; off + sizeof(Elf64_Sym) <= dynsym->sh_size; off += sizeof(Elf64_Sym)) {
    const auto sym = at<Elf64_Sym>(f, dynsym->sh_offset + off);
    if (sym.st_shndx == SHN_UNDEF || sym.st_name == 0) continue;
    const int bind = ELF64_ST_BIND(sym.st_info);
    if (bind != STB_GLOBAL && bind != STB_WEAK) continue;
    exported.insert(f.data() + strtab.sh_offset + sym.st_name);
  }
  for (const auto& name : exported) {
    INFO(name);
    REQUIRE(name.rfind("embstore_", 0) == 0);
  }
  for (const char* api : {"embstore_store_create", "embstore_lookup", "embstore_apply_gradients",
                          "embstore_last_error", "embstore_restore", "embstore_warm_start"}) {
    INFO(api);
    REQUIRE(exported.count(api) == 1);
  }
}

TEST_CASE("device code for every architecture, with the fused optimizer kernels", "[library]") {
  const auto f = read_file(EMBSTORE_LIBRARY_PATH);
  const auto secs = sections(f);
  const Elf64_Shdr* fatbin = nullptr;
  for (const auto& s : secs) {
    if (section_name(f, secs, s) == ".nv_fatbin") fatbin = &s;
  }
  if (!EMBSTORE_EXPECT_CUDA) {
    REQUIRE(fatbin == nullptr);  // a host-only build carries no device code
    return;
  }
  REQUIRE(fatbin != nullptr);
  const auto entries = fatbin_entries(f, *fatbin);
  REQUIRE(!entries.empty());

  std::set<uint32_t> wanted;
  std::stringstream archs(EMBSTORE_CUDA_ARCHS);
  for (std::string a; std::getline(archs, a, ',');) wanted.insert(std::stoul(a));
  REQUIRE(!wanted.empty());
  for (uint32_t arch : wanted) {
    CAPTURE(arch);
    bool cubin = false, kernels = false;
    for (const auto& e : entries) {
      if (e.kind != 2 || e.arch != arch) continue;
      cubin = true;
      REQUIRE_FALSE(e.compressed);  // built with --no-compress so this check can read it
      if (e.payload.find("fused_update") != std::string::npos) kernels = true;
    }
    REQUIRE(cubin);
    REQUIRE(kernels);
  }
}
