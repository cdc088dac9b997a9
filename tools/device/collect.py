#!/usr/bin/env python3
"""Merges one device run's outputs (run_cuda.sh's $OUT) into one results JSON.

usage: collect.py OUT_DIR RESULT.json --commit C --note TEXT
Reads cuda_decode_bench.json, sdpa_flash.json, demo.json, test_cuda.json and
all.log (sanitizer summaries) when present.
"""
import argparse
import datetime
import json
import os
import re

ap = argparse.ArgumentParser()
ap.add_argument("out_dir")
ap.add_argument("result")
ap.add_argument("--commit", required=True)
ap.add_argument("--note", required=True)
ap.add_argument("--command", default="PREBUILT=.devbin tools/device/run_cuda.sh (device tool, nvidia-h200)")
a = ap.parse_args()


def load(name):
    p = os.path.join(a.out_dir, name)
    return json.load(open(p)) if os.path.exists(p) else None


R = {"commit": a.commit, "command": a.command, "date": datetime.date.today().isoformat(), "note": a.note,
     "ratekv_cuda": load("cuda_decode_bench.json"), "torch_sdpa_flash": load("sdpa_flash.json")}
demo = load("demo.json")
if demo:
    R["memory_demo"] = demo.get("memory_demo")
t = load("test_cuda.json")
if t:
    R["tests"] = {"tests": t.get("tests"), "failures": t.get("failures"), "errors": t.get("errors")}
log = os.path.join(a.out_dir, "all.log")
if os.path.exists(log):
    text = open(log).read()
    R["sanitizer"] = {"memcheck": re.findall(r"ERROR SUMMARY: .*", text),
                      "racecheck": re.findall(r"RACECHECK SUMMARY: .*", text)}
json.dump(R, open(a.result, "w"), indent=1)
print("wrote", a.result)
