#!/usr/bin/env python3
"""Checks the documentation (README.md and docs/*.md) against the tree it describes:

- every relative link resolves: the file exists, and for `file#anchor` or `#anchor` a heading
  with that GitHub-style slug exists in the target;
- README.md is at most 300 lines (it is the front page; guides hold the rest);
- each guide (docs/*.md except DESIGN.md and performance.md) ends with a "Try it" section that
  names at least one example file (examples/...), and every example it names exists and is run
  by a test: its path appears outside comments in tests/CMakeLists.txt, or the file is built by
  an add_executable of CMakeLists.txt or tests/CMakeLists.txt whose target a test runs
  ($<TARGET_FILE:name>), or its name appears in a tests/python file.

    check_docs.py [REPO_ROOT]      (default: two levels above this file)

Python 3 standard library only. Prints each problem and exits 1 when there is one, else 0.
"""
import os
import re
import sys
import unicodedata

README_MAX_LINES = 300
NOT_GUIDES = {"DESIGN.md", "performance.md"}

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s{0,3}(```+|~~~+)")
EXAMPLE_PATH = re.compile(r"\bexamples/[A-Za-z0-9_./-]*[A-Za-z0-9_]")


def strip_code(lines):
    """The lines outside fenced code blocks, inline code spans blanked; (number, text) pairs."""
    out, fence = [], None
    for i, line in enumerate(lines, 1):
        m = FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            continue
        if m:
            fence = m.group(1)
            continue
        out.append((i, re.sub(r"(`+)(?:(?!\1).)+?\1", lambda c: " " * len(c.group(0)), line)))
    return out


def slug(text):
    """GitHub's heading anchor: the heading's text, markup removed, lower case, punctuation
    other than '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links keep their text
    text = re.sub(r"<[^>]+>", "", text)                      # inline HTML
    text = text.replace("`", "").strip().lower()
    kept = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in "-_ " or cat[0] in "LN" or cat == "Mn":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        seen, result = {}, set()
        for _, line in strip_code(lines):
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            result.add(base if n == 0 else f"{base}-{n}")
        cache[path] = result
    return cache[path]


def check_links(root, doc, problems):
    with open(doc, encoding="utf-8") as f:
        lines = f.read().splitlines()
    rel = os.path.relpath(doc, root)
    for number, line in strip_code(lines):
        targets = [m.group(1) for m in LINK.finditer(line)]
        m = REF_DEF.match(line)
        if m:
            targets.append(m.group(1))
        for target in targets:
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
                continue  # http:, https:, mailto: ...: not checked here
            path, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
            if not os.path.realpath(dest).startswith(os.path.realpath(root) + os.sep):
                problems.append(f"{rel}:{number}: link {target!r} leaves the repository")
                continue
            if not os.path.exists(dest):
                problems.append(f"{rel}:{number}: link {target!r}: {os.path.relpath(dest, root)}"
                                " does not exist")
                continue
            if anchor:
                if not dest.endswith(".md") or os.path.isdir(dest):
                    problems.append(f"{rel}:{number}: link {target!r}: an anchor into a file "
                                    "that is not Markdown")
                elif anchor not in anchors(dest):
                    problems.append(f"{rel}:{number}: link {target!r}: no heading with the "
                                    f"anchor #{anchor} in {os.path.relpath(dest, root)}")


def without_cmake_comments(text):
    # '#' starts a comment except inside a quoted argument or ${...}/$<...> (not needed here:
    # those never contain '#' in these files, but quoted test names may).
    out = []
    for line in text.splitlines():
        quoted, cut = False, len(line)
        for i, ch in enumerate(line):
            if ch == '"' and (i == 0 or line[i - 1] != "\\"):
                quoted = not quoted
            elif ch == "#" and not quoted:
                cut = i
                break
        out.append(line[:cut])
    return "\n".join(out)


def tested_examples(root):
    """How to tell whether a test runs an example: (CMake text of the tests without comments,
    {source path -> target} of executables built from examples/, Python test texts)."""
    tests_cmake = ""
    path = os.path.join(root, "tests", "CMakeLists.txt")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            tests_cmake = without_cmake_comments(f.read())
    targets = {}
    for cm in ("CMakeLists.txt", os.path.join("tests", "CMakeLists.txt")):
        p = os.path.join(root, cm)
        if not os.path.exists(p):
            continue
        with open(p, encoding="utf-8") as f:
            text = without_cmake_comments(f.read())
        for m in re.finditer(r"add_executable\(\s*([A-Za-z0-9_.+-]+)([^)]*)\)", text):
            for src in EXAMPLE_PATH.findall(m.group(2)):
                targets.setdefault(src, set()).add(m.group(1))
    python_tests = []
    pdir = os.path.join(root, "tests", "python")
    if os.path.isdir(pdir):
        for name in sorted(os.listdir(pdir)):
            if name.endswith(".py"):
                with open(os.path.join(pdir, name), encoding="utf-8") as f:
                    text = "\n".join(l.split("#", 1)[0] for l in f.read().splitlines())
                python_tests.append((name, text))
    return tests_cmake, targets, python_tests


def run_by_a_test(example, tested):
    tests_cmake, targets, python_tests = tested
    if example in tests_cmake:
        return "tests/CMakeLists.txt"
    for target in sorted(targets.get(example, ())):
        if f"$<TARGET_FILE:{target}>" in tests_cmake:
            return f"tests/CMakeLists.txt (as {target})"
    base = os.path.basename(example)
    for name, text in python_tests:
        if example in text or re.search(r"[\"']" + re.escape(base) + r"[\"']", text):
            return f"tests/python/{name}"
    return None


def check_try_it(root, doc, tested, problems):
    rel = os.path.relpath(doc, root)
    with open(doc, encoding="utf-8") as f:
        lines = f.read().splitlines()
    start = None
    for i, line in enumerate(lines):
        m = HEADING.match(line)
        if m and m.group(2).strip().lower() == "try it":
            start = i
    if start is None:
        problems.append(f"{rel}: no \"Try it\" section")
        return
    level = len(HEADING.match(lines[start]).group(1))
    section = []
    for line in lines[start + 1:]:
        m = HEADING.match(line)
        if m and len(m.group(1)) <= level:
            break
        section.append(line)
    if any(HEADING.match(l) and len(HEADING.match(l).group(1)) <= level
           for l in lines[start + 1:]):
        problems.append(f"{rel}: the \"Try it\" section is not the last one")
    named = sorted(set(EXAMPLE_PATH.findall("\n".join(section))))
    if not named:
        problems.append(f"{rel}: its \"Try it\" section names no example file (examples/...)")
    for example in named:
        if not os.path.isfile(os.path.join(root, example)):
            problems.append(f"{rel}: \"Try it\" names {example}, which does not exist")
        elif not run_by_a_test(example, tested):
            problems.append(f"{rel}: \"Try it\" names {example}, which no test runs "
                            "(not in tests/CMakeLists.txt or tests/python)")


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1
                           else os.path.join(os.path.dirname(__file__), "..", ".."))
    problems = []
    readme = os.path.join(root, "README.md")
    docs_dir = os.path.join(root, "docs")
    docs = sorted(os.path.join(docs_dir, n) for n in os.listdir(docs_dir) if n.endswith(".md"))
    for doc in [readme] + docs:
        check_links(root, doc, problems)
    with open(readme, encoding="utf-8") as f:
        n = len(f.read().splitlines())
    if n > README_MAX_LINES:
        problems.append(f"README.md: {n} lines, more than {README_MAX_LINES}")
    tested = tested_examples(root)
    guides = [d for d in docs if os.path.basename(d) not in NOT_GUIDES]
    for doc in guides:
        check_try_it(root, doc, tested, problems)
    for p in problems:
        print("FAIL", p)
    print(f"checked {len(docs) + 1} files: README.md ({n} lines) and {len(docs)} under docs/, "
          f"{len(guides)} guides' \"Try it\": {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
