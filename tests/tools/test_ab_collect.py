#!/usr/bin/env python3
"""tools/device/ab_collect.py, which turns a tools/device/ab_decode.sh folder into a results JSON, on
synthetic bench_cuda_decode outputs: per (model, B, T, cache) the rounds of each side in numeric round
order (round 10 after round 2), the ratio of the best rounds and the read-ceiling share computed by hand
with the ceiling of the best new round's own run (the runs' ceilings differ), the best round's splits and
bytes, rows measured on one side only named and left out, unreadable or field-less files skipped with a
message, --field comparing another timed field (rows where it is negative left out), --into adding a new
key and keeping the rest, and the refusals: an empty folder, --into on a
missing file or an existing key, --key without --into, an existing OUT without --force, a bad --date."""
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


def row(model, b, t, cache, ms, splits=32, cache_bytes=1.0e8, rt=-1.0):
    return {"model": model, "B": b, "T": t, "cache": cache, "ms": ms, "splits": splits, "cache_bytes": cache_bytes,
            "runtime_tables_variant_ms": rt}


L = ("llama", 8, 131072, "K3V3")


class AbCollect(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.ab = os.path.join(self.tmp.name, "ab")
        os.makedirs(self.ab)
        files = {
            # the best base round is the middle one, the best new round the middle one too, with its own ceiling
            "base_1_1.json": bench_json([row(*L, 0.260, rt=0.40), row("qwen", 1, 4096, "K2V2", 0.02)], 3900.0),
            "base_1_2.json": bench_json([row(*L, 0.255, rt=0.42)], 3950.0),
            "base_1_10.json": bench_json([row(*L, 0.258, rt=0.41)], 3950.0),
            "new_1_1.json": bench_json([row(*L, 0.252, splits=40, cache_bytes=2.0e8, rt=0.37),
                                        row("gemma", 2, 64, "K1V1", 0.01)], 4000.0),
            "new_1_2.json": bench_json([row(*L, 0.250, splits=32, cache_bytes=1.0e8, rt=0.39)], 3000.0),
            "new_1_10.json": bench_json([row(*L, 0.251, splits=48, cache_bytes=3.0e8, rt=0.38)], 4100.0),
        }
        for name, d in files.items():
            with open(os.path.join(self.ab, name), "w") as f:
                json.dump(d, f)
        with open(os.path.join(self.ab, "base_1_1.log"), "w") as f:
            f.write("not json\n")
        with open(os.path.join(self.ab, "new_2_1.json"), "w") as f:  # a run cut by its timeout
            f.write('{"ratekv_cuda": {"rows": [')
        with open(os.path.join(self.ab, "new_3_1.json"), "w") as f:  # parses, but no ceiling
            json.dump({"ratekv_cuda": {"rows": []}}, f)

    def tearDown(self):
        self.tmp.cleanup()

    def run_tool(self, *args):
        return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)

    def collect(self, out, *extra):
        return self.run_tool(self.ab, out, "--what", "w", "--command", "c", *extra)

    def test_rows_ratio_and_ceiling_share(self):
        out = os.path.join(self.tmp.name, "r.json")
        p = self.collect(out, "--date", "2026-12-03")
        self.assertEqual(p.returncode, 0, p.stderr)
        d = json.load(open(out))
        self.assertEqual((d["what"], d["commands"], d["date"]), ("w", ["c"], "2026-12-03"))
        self.assertEqual(len(d["rows"]), 1)
        r = d["rows"][0]
        self.assertEqual(r["base_ms"], [0.260, 0.255, 0.258])  # rounds 1, 2, 10
        self.assertEqual(r["new_ms"], [0.252, 0.250, 0.251])
        self.assertAlmostEqual(r["new_over_base"], 0.250 / 0.255, places=12)
        # the best new round's run: 1e8 bytes in 0.250 ms against its 3000 GB/s ceiling
        self.assertAlmostEqual(r["new_frac_read_ceiling"], 1.0e8 / 0.250e-3 / 3000e9, places=12)
        self.assertEqual((r["splits"], r["cache_bytes"], r["read_ceiling_GBps"]), (32, 1.0e8, 3000.0))
        self.assertIn("0.980", p.stdout)
        self.assertIn("skipped " + os.path.join(self.ab, "new_2_1.json"), p.stderr)
        self.assertIn("skipped " + os.path.join(self.ab, "new_3_1.json"), p.stderr)
        self.assertIn("('qwen', 1, 4096, 'K2V2') measured on the base side only", p.stderr)
        self.assertIn("('gemma', 2, 64, 'K1V1') measured on the new side only", p.stderr)

    def test_field_compares_another_timed_field(self):
        out = os.path.join(self.tmp.name, "r.json")
        p = self.collect(out, "--field", "runtime_tables_variant_ms")
        self.assertEqual(p.returncode, 0, p.stderr)
        d = json.load(open(out))
        self.assertEqual(d["field"], "runtime_tables_variant_ms")
        self.assertEqual(len(d["rows"]), 1)  # qwen / gemma: not measured (-1) on their one side
        r = d["rows"][0]
        self.assertEqual(r["base_ms"], [0.40, 0.42, 0.41])
        self.assertEqual(r["new_ms"], [0.37, 0.39, 0.38])
        self.assertAlmostEqual(r["new_over_base"], 0.37 / 0.40, places=12)
        # the best new round is now round 1: its bytes and ceiling
        self.assertAlmostEqual(r["new_frac_read_ceiling"], 2.0e8 / 0.37e-3 / 4000e9, places=12)
        self.assertEqual((r["splits"], r["read_ceiling_GBps"]), (40, 4000.0))
        self.assertNotIn("measured on the", p.stderr)
        p = self.collect(os.path.join(self.tmp.name, "s.json"), "--field", "no_such_field_ms")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("KeyError", p.stderr)
        self.assertIn("no base/new rows in " + self.ab + " with field no_such_field_ms measured", p.stderr)

    def test_into_adds_a_new_key_and_keeps_the_rest(self):
        out = os.path.join(self.tmp.name, "r.json")
        with open(out, "w") as f:
            json.dump({"what": "earlier", "rows": [1, 2]}, f)
        p = self.collect(out, "--into", "--key", "second_try")
        self.assertEqual(p.returncode, 0, p.stderr)
        d = json.load(open(out))
        self.assertEqual((d["what"], d["rows"]), ("earlier", [1, 2]))
        self.assertEqual(d["second_try"]["what"], "w")
        self.assertEqual(len(d["second_try"]["rows"]), 1)
        p = self.collect(out, "--into", "--key", "rows")
        self.assertEqual(p.returncode, 2)
        self.assertIn("--key rows: " + out + " already has that key", p.stderr)
        self.assertEqual(json.load(open(out))["rows"], [1, 2])

    def test_refusals(self):
        out = os.path.join(self.tmp.name, "r.json")
        empty = os.path.join(self.tmp.name, "empty")
        os.makedirs(empty)
        p = self.run_tool(empty, out, "--what", "w", "--command", "c")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("no base/new rows in " + empty, p.stderr)
        self.assertFalse(os.path.exists(out))
        missing = os.path.join(self.tmp.name, "missing.json")
        p = self.collect(missing, "--into", "--key", "k")
        self.assertEqual(p.returncode, 2)
        self.assertIn("--into: cannot read " + missing, p.stderr)
        p = self.collect(out, "--key", "k")
        self.assertEqual(p.returncode, 2)
        self.assertIn("--key applies to --into only", p.stderr)
        p = self.collect(out, "--into")
        self.assertEqual(p.returncode, 2)
        self.assertIn("--into needs --key", p.stderr)
        p = self.collect(out, "--date", "3 Dec")
        self.assertEqual(p.returncode, 2)
        self.assertIn("--date '3 Dec': expected YYYY-MM-DD", p.stderr)
        with open(out, "w") as f:
            f.write('{"keep": 1}')
        p = self.collect(out)
        self.assertEqual(p.returncode, 2)
        self.assertIn(out + " exists: give --force", p.stderr)
        self.assertEqual(json.load(open(out)), {"keep": 1})
        p = self.collect(out, "--force")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(len(json.load(open(out))["rows"]), 1)


if __name__ == "__main__":
    unittest.main()
