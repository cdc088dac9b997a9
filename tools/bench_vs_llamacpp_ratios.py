#!/usr/bin/env python3
"""ratekv / llama.cpp CPU speed ratios from the two JSON files of one run of
tools/bench_vs_llamacpp.sh.

    tools/bench_vs_llamacpp_ratios.py LLAMACPP_JSON RATEKV_JSON [OUT_MD]

LLAMACPP_JSON: {"records": [llama-bench JSON records]}, as the script writes it.
RATEKV_JSON: Google Benchmark JSON of bench/bench_forward.

Pairs, by what they measure:
  prefill of N tokens  llama-bench pp<N> (n_prompt N, n_gen 0)     BM_Prefill/<N>
  decode at depth D    llama-bench tg<G>@d<D> (n_gen G, n_depth D)  BM_Decode/<D>
(bench_forward decodes 16 tokens at depth D, llama-bench G: both report tokens
per second over their decode steps). Each ratekv row needs the counter
tokens_per_second; aggregates and errored runs are skipped. Prints a Markdown
table (ratekv / llama.cpp > 1: ratekv faster) and writes it to OUT_MD if given.
Exits 1 naming the benchmarks it saw when nothing pairs.
"""
import json
import re
import sys


def llama_key(r):
    """('prefill', N) or ('decode', depth) of a llama-bench record."""
    if r["n_gen"] == 0:
        return ("prefill", r["n_prompt"]), f"pp{r['n_prompt']}"
    return ("decode", r.get("n_depth", 0)), f"tg{r['n_gen']}@d{r.get('n_depth', 0)}"


OURS = re.compile(r"^BM_(Prefill|Decode)/(\d+)(/|$)")


def ratekv_key(name):
    m = OURS.match(name)
    if not m:
        return None
    return ("prefill" if m.group(1) == "Prefill" else "decode", int(m.group(2)))


def main(argv):
    if len(argv) not in (3, 4):
        sys.exit("usage: " + __doc__.strip().splitlines()[3].strip())
    llama = json.load(open(argv[1]))["records"]
    ours = json.load(open(argv[2])).get("benchmarks", [])
    ref = {}
    for r in llama:
        k, label = llama_key(r)
        ref[k] = (label, r["avg_ts"], r.get("stddev_ts", 0.0))
    rows, seen = [], []
    for b in ours:
        seen.append(b["name"])
        if b.get("run_type") == "aggregate" or b.get("error_occurred") or "tokens_per_second" not in b:
            continue
        k = ratekv_key(b["name"])
        if k in ref:
            label, ts, sd = ref[k]
            rows.append((f"{k[0]} {'of' if k[0] == 'prefill' else 'at depth'} {k[1]}", label, ts, sd,
                         b["name"].split("/min_time")[0], b["tokens_per_second"]))
    if not rows:
        sys.exit("bench_vs_llamacpp_ratios.py: no ratekv benchmark pairs with a llama-bench test "
                 f"(llama-bench: {', '.join(v[0] for v in ref.values()) or 'none'}; "
                 f"ratekv: {', '.join(seen) or 'none'}); expected BM_Prefill/<N> or BM_Decode/<depth> "
                 "with a tokens_per_second counter")
    lines = ["| test | llama.cpp tok/s (± sd) | ratekv tok/s | ratekv / llama.cpp |", "|---|---:|---:|---:|"]
    lines += [f"| {t} ({label} / {name}) | {ts:.1f} ± {sd:.1f} | {o:.1f} | {o / ts:.2f}x |"
              for t, label, ts, sd, name, o in rows]
    text = "\n".join(lines) + "\n"
    if len(argv) == 4:
        open(argv[3], "w").write(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main(sys.argv)
