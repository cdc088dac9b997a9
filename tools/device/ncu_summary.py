#!/usr/bin/env python3
"""Summarise Nsight Compute raw CSV pages (ncu --csv --page raw) of the packed
decode kernels into one small JSON and a markdown table (issue 19: achieved
DRAM bandwidth, issue-slot utilisation, top stall reasons).

Usage: ncu_summary.py --out-json F.json --out-md F.md [--read-ceiling GBps]
                      LABEL=FILE.csv [LABEL=FILE.csv ...]

Each CSV holds one or more profiled launches (rows after the two header rows:
metric names, then units). Per launch it reports: kernel name, duration,
DRAM bytes read/written and the read bandwidth (GB/s, and its fraction of
--read-ceiling when given: the read-only probe of bench_cuda_decode on the
same machine), issue-slot utilisation (smsp__issue_active, % of peak over
active cycles), instructions per cycle, occupancy, and the five largest warp
stall reasons (smsp__average_warps_issue_stalled_<reason>_per_issue_active:
warps stalled on <reason> per issued instruction) with their share of all
stalls. A metric ncu did not report is null.
"""
import argparse
import csv
import json
import re
import sys

STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
WANT = {
    "duration_ns": ["gpu__time_duration.sum"],
    "dram_read_bytes": ["dram__bytes_read.sum"],
    "dram_write_bytes": ["dram__bytes_write.sum"],
    "dram_read_per_s": ["dram__bytes_read.sum.per_second"],
    "dram_pct_peak": ["gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                      "dram__throughput.avg.pct_of_peak_sustained_elapsed"],
    "issue_active_pct": ["smsp__issue_active.avg.pct_of_peak_sustained_active",
                         "sm__issue_active.avg.pct_of_peak_sustained_active"],
    "ipc_active": ["sm__inst_executed.avg.per_cycle_active"],
    "achieved_occupancy_pct": ["sm__warps_active.avg.pct_of_peak_sustained_active"],
    "alu_pipe_pct": ["sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active"],
    "fma_pipe_pct": ["sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active"],
    "tensor_pipe_pct": ["sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                        "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active"],
    "registers_per_thread": ["launch__registers_per_thread"],
    "grid_size": ["launch__grid_size"],
}
# Units ncu may print for the metrics above, to plain SI numbers.
SCALE = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9, "byte": 1.0, "Kbyte": 1e3,
         "Mbyte": 1e6, "Gbyte": 1e9, "byte/second": 1.0, "Kbyte/second": 1e3, "Mbyte/second": 1e6,
         "Gbyte/second": 1e9, "Tbyte/second": 1e12}


def num(v, unit=""):
    try:
        x = float(str(v).replace(",", ""))
    except ValueError:
        return None
    return x * SCALE.get(unit, 1.0)


def launches(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    # ncu prints log lines (==PROF==) before the CSV: start at the header row.
    start = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if start is None:
        return []
    head, units = rows[start], rows[start + 1]
    out = []
    for r in rows[start + 2:]:
        if len(r) != len(head):
            continue
        out.append({h: (v, u) for h, v, u in zip(head, r, units)})
    return out


def summarise(label, rec, read_ceiling):
    def get(names):
        for n in names:
            if n in rec:
                return num(*rec[n])
        return None

    s = {"label": label, "kernel": rec.get("Kernel Name", ("?", ""))[0][:120]}
    for k, names in WANT.items():
        s[k] = get(names)
    if s["dram_read_per_s"] is None and s["dram_read_bytes"] and s["duration_ns"]:
        s["dram_read_per_s"] = s["dram_read_bytes"] / (s["duration_ns"] * 1e-9)
    s["dram_read_GBps"] = s["dram_read_per_s"] / 1e9 if s["dram_read_per_s"] else None
    del s["dram_read_per_s"]
    if read_ceiling and s["dram_read_GBps"]:
        s["frac_read_ceiling"] = s["dram_read_GBps"] / read_ceiling
    stalls = {}
    for name, (v, u) in rec.items():
        m = STALL.match(name)
        if m and num(v) is not None and not m.group(1).endswith("_not_issued"):
            stalls[m.group(1)] = num(v)
    total = sum(stalls.values())
    top = sorted(stalls.items(), key=lambda kv: -kv[1])[:5]
    s["stalls_per_issue_total"] = total if stalls else None
    s["top_stalls"] = [{"reason": k, "per_issue": v, "share": (v / total if total else None)} for k, v in top]
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-json", required=True)
    ap.add_argument("--out-md", required=True)
    ap.add_argument("--read-ceiling", type=float, default=0.0, help="read-only probe GB/s of the same machine")
    ap.add_argument("inputs", nargs="+", help="LABEL=FILE.csv")
    a = ap.parse_args()
    res = []
    for item in a.inputs:
        label, _, path = item.partition("=")
        if not path:
            sys.exit(f"ncu_summary.py: '{item}' is not LABEL=FILE.csv")
        recs = launches(path)
        if not recs:
            print(f"ncu_summary.py: no profiled launch in {path}", file=sys.stderr)
        for i, r in enumerate(recs):
            res.append(summarise(label if len(recs) == 1 else f"{label}#{i}", r, a.read_ceiling))
    json.dump({"read_ceiling_GBps": a.read_ceiling or None, "kernels": res}, open(a.out_json, "w"), indent=1)

    def f(x, fmt):
        return "—" if x is None else format(x, fmt)

    lines = ["| kernel | µs | DRAM read GB/s | of read ceiling | issue active % | IPC | occupancy % | ALU % | "
             "top stalls (warps per issued instr., share) |", "|---|---|---|---|---|---|---|---|---|"]
    for s in res:
        st = "; ".join(f"{t['reason']} {t['per_issue']:.2f} ({100 * (t['share'] or 0):.0f} %)" for t in s["top_stalls"][:3])
        lines.append(f"| {s['label']} | {f((s['duration_ns'] or 0) / 1e3 if s['duration_ns'] else None, '.1f')} | "
                     f"{f(s['dram_read_GBps'], '.0f')} | {f(100 * s['frac_read_ceiling'] if s.get('frac_read_ceiling') else None, '.0f')} % | "
                     f"{f(s['issue_active_pct'], '.1f')} | {f(s['ipc_active'], '.2f')} | "
                     f"{f(s['achieved_occupancy_pct'], '.1f')} | {f(s['alu_pipe_pct'], '.1f')} | {st} |")
    open(a.out_md, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
