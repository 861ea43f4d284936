// The version directory's layout (io/format/layout.hpp): names, paths in both formats, and
// manifests whose names or paths would alias or leave their files refused by every reader's parser.
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

TEST_CASE("layout: a checkpoint of several ranks names each rank's files", "[io][layout]") {
  CHECK(row_file_path(2, "emb", 2, 3) == "tables/emb/shard-00002-of-00003.rows");
  CHECK(admission_file_path(2, "emb", 2, 3) == "tables/emb/admission-00002-of-00003.counts");
  CHECK(admission_file_path(2, "emb", 0, 1) == "tables/emb/admission.counts");
  CHECK(attachment_path("rng", 1, 3) == "attachments/rank-00001/rng");
  CHECK(attachment_path("rng", 0, 1) == "attachments/rng");

  // Three ranks: each rank's row file and counts, one attachment name on two ranks.
  Manifest m = manifest(2);
  m.world_size = 3;
  TableEntry t = table(2, "emb");
  t.files.clear();
  t.rows = 0;
  for (uint32_t r = 0; r < 3; ++r) {
    t.files.push_back({row_file_path(2, "emb", r, 3), 4096, 1, 7});
    t.admission.push_back({admission_file_path(2, "emb", r, 3), 24, 0, 9});
    ++t.rows;
  }
  m.tables.push_back(t);
  m.attachments.push_back({"rng", {attachment_path("rng", 0, 3), 3, 0, 5}, 0});
  m.attachments.push_back({"rng", {attachment_path("rng", 2, 3), 3, 0, 5}, 2});
  REQUIRE(refusal(m).empty());
  Manifest back;
  std::string detail;
  REQUIRE(parse_manifest(format_manifest(m), &back, &detail) == 0);
  REQUIRE(back.tables[0].admission.size() == 3);
  CHECK(back.tables[0].admission[2].path == admission_file_path(2, "emb", 2, 3));
  REQUIRE(back.attachments.size() == 2);
  CHECK(back.attachments[1].rank == 2);

  SECTION("a rank at or past the world size") {
    m.attachments[1] = {"rng", {attachment_path("rng", 3, 4), 3, 0, 5}, 3};
    CHECK(refusal(m).find("rank 3 in a world of size 3") != std::string::npos);
  }
  SECTION("one rank's attachment listed twice") {
    m.attachments[1] = m.attachments[0];
    CHECK(refusal(m).find("of rank 0 is listed twice") != std::string::npos);
  }
  SECTION("an attachment at another rank's path") {
    m.attachments[1].file.path = attachment_path("rng", 1, 3);
    CHECK(refusal(m).find("is not its attachments/rank-00002/rng") != std::string::npos);
  }
  SECTION("counts of a world size that is not the manifest's") {
    m.tables[0].admission[1].path = admission_file_path(2, "emb", 1, 4);
    CHECK(refusal(m).find("is not one of its") != std::string::npos);
  }
  SECTION("one rank's counts listed twice") {
    m.tables[0].admission[1] = m.tables[0].admission[0];
    CHECK(refusal(m).find("is named by two entries") != std::string::npos);
  }
  SECTION("a world size past the limit") {
    m.world_size = kMaxWorldSize + 1;
    CHECK(refusal(m).find("'world_size' is 65536") != std::string::npos);
  }
}

TEST_CASE("layout: a checkpoint of one rank has no rank fields and one counts file",
          "[io][layout]") {
  Manifest m = manifest(2);
  m.tables.push_back(table(2, "emb", /*admission=*/true));
  m.attachments.push_back(attachment("rng"));
  REQUIRE(refusal(m).empty());
  const std::string text = format_manifest(m);
  CHECK(text.find("\"rank\"") == std::string::npos);  // format 2 of 0.4, byte for byte
  // Two counts files in one rank's checkpoint (JSON holds one there: checked in memory).
  m.tables[0].admission.push_back(m.tables[0].admission[0]);
  m.tables[0].admission[1].path = "tables/emb/admission-00001-of-00002.counts";
  std::string why;
  CHECK(check_layout(m, &why) == -EBADMSG);
  CHECK(why.find("2 admission files in a checkpoint of one rank") != std::string::npos);
}
