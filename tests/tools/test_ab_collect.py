#!/usr/bin/env python3
"""tools/device/ab_collect.py, which turns a tools/device/ab_decode.sh folder into a results JSON, on
synthetic bench_cuda_decode outputs: per (model, B, T, cache) the rounds of each side in file order, the
ratio of the best rounds computed by hand, the read-ceiling share (cache bytes / best new ms / the new
run's ceiling), rows present on one side only left out, a truncated JSON skipped with a message, --into adding a key to an existing file, and a
folder without rows refused with a message naming it."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(REPO, "tools", "device", "ab_collect.py")


def bench_json(rows, ceiling):
    return {"ratekv_cuda": {"read_ceiling_GBps": ceiling, "rows": rows}}


def row(model, b, t, cache, ms, splits=32, cache_bytes=1.0e8):
    return {"model": model, "B": b, "T": t, "cache": cache, "ms": ms, "splits": splits, "cache_bytes": cache_bytes}


class AbCollect(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.ab = os.path.join(self.tmp.name, "ab")
        os.makedirs(self.ab)
        files = {
            "base_1_1.json": bench_json([row("llama", 8, 131072, "K3V3", 0.26), row("qwen", 1, 4096, "K2V2", 0.02)], 3900.0),
            "new_1_1.json": bench_json([row("llama", 8, 131072, "K3V3", 0.25)], 4000.0),
            "base_1_2.json": bench_json([row("llama", 8, 131072, "K3V3", 0.255)], 3950.0),
            "new_1_2.json": bench_json([row("llama", 8, 131072, "K3V3", 0.252)], 4000.0),
        }
        for name, d in files.items():
            with open(os.path.join(self.ab, name), "w") as f:
                json.dump(d, f)
        with open(os.path.join(self.ab, "base_1_1.log"), "w") as f:
            f.write("not json\n")
        with open(os.path.join(self.ab, "new_2_1.json"), "w") as f:  # a run cut by its timeout
            f.write('{"ratekv_cuda": {"rows": [')

    def tearDown(self):
        self.tmp.cleanup()

    def run_tool(self, *args):
        return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)

    def test_rows_ratio_and_ceiling_share(self):
        out = os.path.join(self.tmp.name, "r.json")
        p = self.run_tool(self.ab, out, "--what", "w", "--command", "c", "--date", "2026-12-03")
        self.assertEqual(p.returncode, 0, p.stderr)
        d = json.load(open(out))
        self.assertEqual((d["what"], d["commands"], d["date"]), ("w", ["c"], "2026-12-03"))
        self.assertEqual(len(d["rows"]), 1)  # qwen K2V2 ran on the base side only
        r = d["rows"][0]
        self.assertEqual(r["base_ms"], [0.26, 0.255])
        self.assertEqual(r["new_ms"], [0.25, 0.252])
        self.assertAlmostEqual(r["new_over_base"], 0.25 / 0.255, places=12)
        self.assertAlmostEqual(r["new_frac_read_ceiling"], 1.0e8 / 0.25e-3 / 4000e9, places=12)  # 0.1
        self.assertIn("0.980", p.stdout)
        self.assertIn("skipped " + os.path.join(self.ab, "new_2_1.json"), p.stderr)

    def test_into_adds_a_key(self):
        out = os.path.join(self.tmp.name, "r.json")
        with open(out, "w") as f:
            json.dump({"what": "earlier", "rows": []}, f)
        p = self.run_tool(self.ab, out, "--what", "w2", "--command", "c2", "--into", "--key", "followup")
        self.assertEqual(p.returncode, 0, p.stderr)
        d = json.load(open(out))
        self.assertEqual(d["what"], "earlier")
        self.assertEqual(d["followup"]["what"], "w2")
        self.assertEqual(len(d["followup"]["rows"]), 1)

    def test_empty_folder_is_refused(self):
        empty = os.path.join(self.tmp.name, "empty")
        os.makedirs(empty)
        p = self.run_tool(empty, os.path.join(self.tmp.name, "x.json"), "--what", "w", "--command", "c")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("no base/new rows in " + empty, p.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "x.json")))


if __name__ == "__main__":
    unittest.main()
