#!/usr/bin/env python3
"""Markdown table from bench_cuda_decode JSON + sdpa_baseline JSON (same device run).

usage: summarize.py cuda_decode_bench.json sdpa_flash.json
"""
import json
import sys

ours = json.load(open(sys.argv[1]))
sdpa = {(r["B"], r["T"]): r for r in json.load(open(sys.argv[2]))["rows"]}
ceil = ours["copy_ceiling_GBps"]
print(f"Device: {ours['device']}; copy ceiling (D2D, read+write) {ceil:.0f} GB/s; "
      f"Llama-3.1-8B shapes (32/8 heads, d=128); one layer, one decode step.\n")
print("| B | T | cache | ms | GB/s | % ceiling | vs our fp16 kernel | vs SDPA flash fp16 |")
print("|---|---|---|---|---|---|---|---|")
for B in (1, 8):
    for T in (4096, 32768, 131072):
        s = sdpa.get((B, T), {})
        if "ms" in s:
            print(f"| {B} | {T} | sdpa-flash-fp16 | {s['ms']:.4f} | {s['GBps']:.0f} | "
                  f"{100 * s['GBps'] / ceil:.0f}% | | 1.00x |")
        else:
            print(f"| {B} | {T} | sdpa-flash-fp16 | error: {s.get('error', 'missing')} | | | | |")
        for r in ours["rows"]:
            if r["B"] != B or r["T"] != T:
                continue
            vs_fp16 = f"{r['speedup_vs_fp16_kernel']:.2f}x" if "speedup_vs_fp16_kernel" in r else "1.00x"
            vs_sdpa = f"{s['ms'] / r['ms']:.2f}x" if "ms" in s else "n/a"
            print(f"| {B} | {T} | {r['cache']} | {r['ms']:.4f} | {r['GBps']:.0f} | "
                  f"{100 * r['frac_ceiling']:.0f}% | {vs_fp16} | {vs_sdpa} |")
