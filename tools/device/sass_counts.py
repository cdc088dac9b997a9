#!/usr/bin/env python3
"""Instruction-mnemonic counts per kernel from `cuobjdump -sass` output
(stdin): for every function whose mangled name contains one of the given
substrings, the count of each opcode (PRMT, LOP3, IMAD, SHF, HMMA, ...).
Usage: cuobjdump -sass BIN | sass_counts.py SUBSTR [SUBSTR ...]"""
import collections
import re
import sys

want = sys.argv[1:]
cur, counts = None, {}
for line in sys.stdin:
    m = re.search(r"Function : (\S+)", line)
    if m:
        name = m.group(1)
        cur = next((w for w in want if w in name), None)
        if cur is not None:
            counts[cur] = collections.Counter()
        continue
    if cur is None:
        continue
    m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)(\.[A-Z0-9_.]+)?", line)
    if m:
        counts[cur][m.group(2)] += 1
for w, c in counts.items():
    total = sum(c.values())
    top = ", ".join(f"{k} {v}" for k, v in c.most_common(14))
    print(f"{w}: {total} instructions: {top}")
