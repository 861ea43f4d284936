#!/usr/bin/env python3
"""The layers of docs/DESIGN.md, checked on the includes: io/ includes nothing of host/, and
cuda/row/ (the per-row logic both backends run) nothing of host/ or io/. Exits 1 listing each
include that crosses a layer the wrong way.

    check_includes.py REPO_ROOT
"""
import pathlib
import re
import sys

RULES = [("io", ("host/",)), ("cuda/row", ("host/", "io/"))]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    bad = []
    checked = 0
    for folder, forbidden in RULES:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in (".h", ".hpp", ".cpp", ".cu", ".cuh"):
                continue
            checked += 1
            for n, line in enumerate(path.read_text().splitlines(), 1):
                m = INCLUDE.match(line)
                if m and m.group(1).startswith(forbidden):
                    bad.append(f"{path.relative_to(root)}:{n}: {folder}/ includes {m.group(1)}")
    if checked == 0:
        print(f"no sources under {root}: wrong root?")
        return 1
    for b in bad:
        print(b)
    print(f"{checked} files checked, {len(bad)} includes across a layer")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
