// The version directory's layout (io/format/layout.hpp): names, paths in both formats, and manifests
// whose names or paths would alias or leave their files refused by every reader's parser.
#include "io/format/layout.hpp"

#include <catch2/catch.hpp>
#include <string>

#include "io/format/manifest.hpp"

using namespace embstore::io;

namespace {

TableEntry table(uint32_t format, const std::string& name, bool admission = false) {
  TableEntry t;
  t.name = name;
  embstore_table_config_init(&t.config);
  t.config.name = nullptr;
  t.config.dim = 4;
  t.state_dim = 4;
  t.state_layout = state_layout(EMBSTORE_OPT_ADAGRAD);
  t.rows = 1;
  t.table_rows = 1;
  t.files.push_back({row_file_path(format, name, 0, 1), 4096, 1, 7});
  if (admission) t.admission = {FileEntry{admission_file_path(format, name), 24, 0, 9}};
  return t;
}

Manifest manifest(uint32_t format) {
  Manifest m;
  m.format_version = format;
  m.version = 10;
  m.lineage = format >= 2 ? 42 : 0;
  return m;
}

AttachmentEntry attachment(const std::string& name) {
  return {name, {attachment_path(name), 3, 0, 5}};
}

// parse_manifest's verdict on m, as every reader sees it: "" when it parses.
std::string refusal(const Manifest& m) {
  Manifest back;
  std::string detail;
  const int r = parse_manifest(format_manifest(m), &back, &detail);
  if (r == 0) return "";
  REQUIRE(r == -EBADMSG);
  REQUIRE_FALSE(detail.empty());
  return detail;
}

}  // namespace

TEST_CASE("layout: names are one path component of [A-Za-z0-9_.-]", "[io][layout]") {
  for (const char* good : {"a", "emb.v2-x", "MANIFEST.json", "attachments", "tables", "..a", "_"}) {
    INFO(good);
    REQUIRE(valid_name(good));
  }
  for (const char* bad : {"", ".", "..", "a/b", "../x", "/etc", "a b", "a\nb", "tab\t"}) {
    INFO(bad);
    REQUIRE_FALSE(valid_name(bad));
  }
  REQUIRE(valid_name(std::string(128, 'x')));
  REQUIRE_FALSE(valid_name(std::string(129, 'x')));
  REQUIRE(name_problem("table", "a/b").find("0x2f at 1") != std::string::npos);
  REQUIRE(printable("ok\x1b[31m\\") == "ok\\x1b[31m\\x5c");
}

TEST_CASE("layout: each format names its files", "[io][layout]") {
  REQUIRE(row_file_path(2, "emb", 0, 1) == "tables/emb/shard-00000-of-00001.rows");
  REQUIRE(row_file_path(2, "emb", 3, 8) == "tables/emb/shard-00003-of-00008.rows");
  REQUIRE(admission_file_path(2, "emb") == "tables/emb/admission.counts");
  REQUIRE(row_file_path(1, "emb", 0, 1) == "emb/shard-00000-of-00001.rows");
  REQUIRE(admission_file_path(1, "emb") == "emb/admission.counts");
  REQUIRE(attachment_path("rng") == "attachments/rng");
}

TEST_CASE("layout: format 2 keeps tables, attachments and the manifest apart", "[io][layout]") {
  // Names that collided in format 1 are all valid together now.
  Manifest m = manifest(2);
  m.tables.push_back(table(2, "attachments", true));
  m.tables.push_back(table(2, "MANIFEST.json"));
  m.tables.push_back(table(2, "tables"));
  m.attachments.push_back(attachment("shard-00000-of-00001.rows"));
  m.attachments.push_back(attachment("MANIFEST.json"));
  m.attachments.push_back(attachment("admission.counts"));
  REQUIRE(refusal(m) == "");
}

TEST_CASE("layout: format 1 names that alias one file are refused", "[io][layout]") {
  SECTION("a table 'attachments' and an attachment named like its row file") {
    Manifest m = manifest(1);
    m.tables.push_back(table(1, "attachments"));
    m.attachments.push_back(attachment("shard-00000-of-00001.rows"));
    REQUIRE(refusal(m).find("named by two entries") != std::string::npos);
  }
  SECTION("a table named like the manifest") {
    Manifest m = manifest(1);
    m.tables.push_back(table(1, "MANIFEST.json"));
    REQUIRE(refusal(m).find("collides with the manifest") != std::string::npos);
  }
  SECTION("a table 'attachments' with counts and an attachment 'admission.counts'") {
    Manifest m = manifest(1);
    m.tables.push_back(table(1, "attachments", true));
    m.attachments.push_back(attachment("admission.counts"));
    REQUIRE(refusal(m).find("named by two entries") != std::string::npos);
  }
  SECTION("names that do not meet are fine") {
    Manifest m = manifest(1);
    m.tables.push_back(table(1, "attachments"));
    m.attachments.push_back(attachment("x"));
    REQUIRE(refusal(m) == "");
  }
}

TEST_CASE("layout: a manifest cannot steer a file anywhere else", "[io][layout]") {
  Manifest m = manifest(2);
  m.tables.push_back(table(2, "emb", true));
  m.attachments.push_back(attachment("rng"));
  REQUIRE(refusal(m) == "");
  SECTION("a table name that climbs out") {
    m.tables[0].name = "../../../x";
    REQUIRE(refusal(m).find("table name '../../../x' has character 0x2f") != std::string::npos);
  }
  SECTION("a table name with a control character") {
    m.tables[0].name = "e\x1b";
    REQUIRE(refusal(m).find("'e\\x1b' has character 0x1b") != std::string::npos);
  }
  SECTION("an attachment name with a separator") {
    m.attachments[0].name = "a/b";
    m.attachments[0].file.path = "attachments/a/b";
    REQUIRE(refusal(m).find("attachment name") != std::string::npos);
  }
  SECTION("a row file that is another table's") {
    m.tables.push_back(table(2, "other"));
    m.tables[0].files[0].path = m.tables[1].files[0].path;
    REQUIRE(refusal(m).find("not one of its") != std::string::npos);
  }
  SECTION("a row file at an attachment's path") {
    m.tables[0].files[0].path = "attachments/rng";
    REQUIRE(refusal(m).find("not one of its") != std::string::npos);
  }
  SECTION("an admission file that is the row file") {
    m.tables[0].admission[0].path = m.tables[0].files[0].path;
    REQUIRE(refusal(m).find("not one of its") != std::string::npos);
  }
  SECTION("an attachment at a table's path") {
    m.attachments[0].file.path = "tables/emb/admission.counts";
    REQUIRE(refusal(m).find("not its") != std::string::npos);
  }
  SECTION("a shard file of another world size") {
    m.tables[0].files[0].path = row_file_path(2, "emb", 1, 2);
    REQUIRE(refusal(m).find("world size 1") != std::string::npos);
  }
  SECTION("one row file listed twice") {
    m.tables[0].files.push_back(m.tables[0].files[0]);
    m.tables[0].rows = 2;
    REQUIRE(refusal(m).find("named by two entries") != std::string::npos);
  }
  SECTION("a table listed twice") {
    m.tables.push_back(m.tables[0]);
    REQUIRE(refusal(m).find("listed twice") != std::string::npos);
  }
  SECTION("an attachment listed twice") {
    m.attachments.push_back(m.attachments[0]);
    REQUIRE(refusal(m).find("listed twice") != std::string::npos);
  }
}
