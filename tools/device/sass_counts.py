#!/usr/bin/env python3
"""Instruction-mnemonic counts per kernel from `cuobjdump -sass` output
(stdin): for every function whose mangled name contains one of the given
substrings, the count of each opcode (PRMT, LOP3, IMAD, SHF, HMMA, ...).
With --main-loop, only the instructions of the function's main loop: the
shortest backward-branch span that holds all its tensor-core instructions
(HMMA/IMMA) — for the decode kernels, the static cost of one page iteration.
Usage: cuobjdump -sass BIN | sass_counts.py [--main-loop] SUBSTR [SUBSTR ...]"""
import collections
import re
import sys

args = sys.argv[1:]
main_loop = "--main-loop" in args
want = [a for a in args if a != "--main-loop"]
funcs, cur = {}, None
for line in sys.stdin:
    m = re.search(r"Function : (\S+)", line)
    if m:
        cur = next((w for w in want if w in m.group(1)), None)
        if cur is not None:
            funcs[cur] = []
        continue
    if cur is None:
        continue
    m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)(\.[A-Z0-9_.]+)?([^;]*);", line)
    if m:
        funcs[cur].append((int(m.group(1), 16), m.group(3), m.group(5)))
for w, ins in funcs.items():
    lo, hi = 0, 1 << 62
    if main_loop:
        mma = [a for a, op, _ in ins if op in ("HMMA", "IMMA")]
        spans = []
        for addr, op, rest in ins:
            t = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
            if t and int(t.group(1), 16) < addr:
                spans.append((int(t.group(1), 16), addr))
        spans = [sp for sp in spans if mma and sp[0] <= min(mma) and max(mma) <= sp[1]]
        if spans:
            lo, hi = min(spans, key=lambda sp: sp[1] - sp[0])
    c = collections.Counter(op for addr, op, _ in ins if lo <= addr <= hi)
    total = sum(c.values())
    top = ", ".join(f"{k} {v}" for k, v in c.most_common(14))
    where = f" (main loop {lo:#x}-{hi:#x})" if main_loop else ""
    print(f"{w}{where}: {total} instructions: {top}")
