#!/usr/bin/env bash
# The C API reference: Doxygen over include/embstore/embstore.h into build-docs/html (the
# configuration is docs/Doxyfile). Fails on any Doxygen warning, so every public call, type,
# struct member, enum value and macro of the header must be documented, and the comments must
# be well-formed Doxygen. Installs nothing but through scripts/setup.sh (Debian's doxygen).
#   scripts/docs.sh
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
out=build-docs
rm -rf "$out"
mkdir -p "$out"
version=$(sed -n 's/^#define EMBSTORE_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' \
  include/embstore/embstore.h | paste -sd.)
log="$out/doxygen-warnings.log"
status=0
EMBSTORE_DOCS_VERSION="$version" doxygen docs/Doxyfile 2>"$log" || status=$?
warnings=$(grep -c . "$log" || true)
# Doxygen 1.9.4 does not warn of an undocumented enum value: check them in its XML output.
if [ "$status" -eq 0 ]; then
  python3 - "$out/xml" >>"$log" <<'PY' || status=$?
import glob, sys, xml.etree.ElementTree as ET
seen = set()
for path in sorted(glob.glob(sys.argv[1] + "/*.xml")):
    for enum in ET.parse(path).getroot().iter("memberdef"):
        if enum.get("kind") != "enum":
            continue
        for value in enum.iter("enumvalue"):
            name = value.findtext("name")
            text = "".join(value.find("briefdescription").itertext()) + \
                "".join(value.find("detaileddescription").itertext())
            loc = enum.find("location")
            if not text.strip() and name not in seen:
                seen.add(name)
                print(f"{loc.get('file')}:{loc.get('line')}: error: Enum value {name} of "
                      f"enum {enum.findtext('name')} is not documented.")
sys.exit(1 if seen else 0)
PY
  warnings=$(grep -c . "$log" || true)
fi
if [ "$status" -ne 0 ] || [ "$warnings" -ne 0 ]; then
  cat "$log" >&2
  echo "docs: doxygen failed (exit $status) with $warnings warning line(s): see $log" >&2
  exit 1
fi
echo "docs: $out/html/index.html (embstore $version), 0 warnings"
