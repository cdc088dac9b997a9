#!/usr/bin/env python3
"""Checks the section citations of the repository's sources and documents.

usage: check_citations.py [ROOT]      (default: the repository this script is in)

Every "§N" / "§N.M" in the scanned files must resolve:
  * a document or publication name opens a scope that runs to the ")" closing
    the parenthesis it stands in, or to the end of its sentence, at most 300
    characters: "docs/design.md §3.2", "(docs/packed_format.md §7.2, §7.3)",
    "(docs/design.md\n// §3.1 ..., §5 ...)";
  * a "§" in the scope of "docs/<name>.md" must be a numbered heading of that
    document ("## 3. ...", "### 3.2 ...");
  * a "§" in the scope of an external name (RFC, FIPS, RoFormer, arXiv,
    Hendrycks) cites that publication and is not checked;
  * in docs/<name>.md, a "§" in no scope cites that document itself;
  * anything else (a bare "§4" in a source file) is an error.
The scanned files must not cite the team's internal inputs (the upper-case
design brief and the numbered paper summaries, FORBIDDEN below): the design
lives in docs/design.md, the papers are cited by title in its references.
Exits 1 listing every unresolved citation as FILE:LINE: message, else 0.
"""
import os
import re
import sys

SCAN_DIRS = ("src", "include", "tests", "bench", "tools", "fuzz", "python", "cmake", "docs")
SCAN_FILES = ("CMakeLists.txt", "README.md")
EXTS = (".h", ".hpp", ".c", ".cc", ".cpp", ".cu", ".cuh", ".py", ".sh", ".md", ".txt", ".cmake", ".toml", ".cfg")
SECTION = re.compile(r"§(\d+(?:\.\d+)*)")
LABEL = re.compile(r"docs/[A-Za-z0-9_.-]+\.md|\bRFC\b|\bFIPS\b|RoFormer|arXiv|Hendrycks")
HEADING = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*)\.?\s", re.M)
FORBIDDEN = re.compile(r"DESIGN\.md|papers/[0-9]{3}_")
WINDOW = 300  # characters a name's scope may span


def sections(path):
    """Numbered headings of a markdown file: {"1", "1.1", "7.2", ...}."""
    with open(path, encoding="utf-8") as f:
        return set(HEADING.findall(f.read()))


def scope_end(text, pos):
    """End of the scope of a name ending at pos: the unmatched ")" after it, or
    the end of its sentence (a "." followed by an upper-case word or nothing,
    skipping comment markers), or pos + WINDOW."""
    depth = 0
    limit = min(len(text), pos + WINDOW)
    i = pos
    while i < limit:
        c = text[i]
        if c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                return i
            depth -= 1
        elif c == "." and depth == 0 and (i + 1 == len(text) or text[i + 1].isspace()):
            j = i + 1
            while j < len(text) and (text[j].isspace() or text[j] in "/#*"):
                j += 1
            if j == len(text) or text[j].isupper():
                return i
        i += 1
    return limit


def scanned_files(root):
    for d in SCAN_DIRS:
        top = os.path.join(root, d)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(x for x in dirnames if not x.startswith("."))
            for n in sorted(filenames):
                if n.endswith(EXTS):
                    yield os.path.join(dirpath, n)
    for n in SCAN_FILES:
        p = os.path.join(root, n)
        if os.path.isfile(p):
            yield p


def check(root):
    """Returns a list of 'file:line: message' for every unresolved citation."""
    root = os.path.abspath(root)
    cache = {}
    errors = []

    def doc_sections(rel):
        if rel not in cache:
            p = os.path.join(root, rel)
            cache[rel] = sections(p) if os.path.isfile(p) else None
        return cache[rel]

    this = os.path.relpath(os.path.abspath(__file__), root)
    for path in scanned_files(root):
        rel = os.path.relpath(path, root)
        if rel == this or rel.startswith(os.path.join("tests", "tools", "test_check_citations")):
            continue  # the checker and its test spell out the forbidden names
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError:
            continue
        line_of = lambda pos: text.count("\n", 0, pos) + 1
        for m in FORBIDDEN.finditer(text):
            errors.append(f"{rel}:{line_of(m.start())}: cites '{m.group(0)}' (not in the repository; "
                          f"cite docs/design.md §N)")
        is_doc = rel.startswith("docs" + os.sep) and rel.endswith(".md")
        scopes = [(m.start(), scope_end(text, m.end()), m.group(0)) for m in LABEL.finditer(text)]
        for m in SECTION.finditer(text):
            inside = [lab for a, b, lab in scopes if a < m.start() < b]
            if inside:
                label = inside[-1]
                if not label.startswith("docs/"):
                    continue  # an external publication's section
                target = label
            elif is_doc:
                target = rel.replace(os.sep, "/")
            else:
                errors.append(f"{rel}:{line_of(m.start())}: §{m.group(1)} names no document "
                              f"(write 'docs/<name>.md §{m.group(1)}')")
                continue
            have = doc_sections(target)
            if have is None:
                errors.append(f"{rel}:{line_of(m.start())}: §{m.group(1)} cites {target}, which does not exist")
            elif m.group(1) not in have:
                errors.append(f"{rel}:{line_of(m.start())}: {target} has no section {m.group(1)} "
                              f"(it has {', '.join(sorted(have, key=lambda s: [int(x) for x in s.split('.')]))})")
    return errors


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    errors = check(root)
    for e in errors:
        print(e)
    if errors:
        print(f"check_citations: {len(errors)} unresolved citation(s)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
