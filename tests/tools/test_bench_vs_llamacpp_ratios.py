#!/usr/bin/env python3
"""tools/bench_vs_llamacpp_ratios.py: pairs llama-bench tests with bench_forward's
benchmarks by what they measure. On the committed idle-machine run
(bench/results/llamacpp_cpu.json, ratekv_cpu.json) it must give the ratios that
bench/results/cpu_vs_llamacpp_idle.md computed by hand; on synthetic files it
must pair exactly (no prefix matches) and fail naming what it saw."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "tools", "bench_vs_llamacpp_ratios.py")
RESULTS = os.path.join(REPO, "bench", "results")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def llama_record(n_prompt, n_gen, n_depth, ts, sd=1.0):
    return {"n_prompt": n_prompt, "n_gen": n_gen, "n_depth": n_depth, "avg_ts": ts, "stddev_ts": sd}


def ratekv_bench(name, tps, **extra):
    b = {"name": name, "run_type": "iteration", "tokens_per_second": tps}
    b.update(extra)
    return b


class Ratios(unittest.TestCase):
    def write(self, llama_records, benchmarks):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        d = tmp.name
        lp, rp = os.path.join(d, "llama.json"), os.path.join(d, "ratekv.json")
        json.dump({"records": llama_records}, open(lp, "w"))
        json.dump({"benchmarks": benchmarks}, open(rp, "w"))
        return lp, rp, os.path.join(d, "ratios.md")

    def test_committed_idle_run_gives_the_hand_made_ratios(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "ratios.md")
            r = run(os.path.join(RESULTS, "llamacpp_cpu.json"), os.path.join(RESULTS, "ratekv_cpu.json"), out)
            self.assertEqual(r.returncode, 0, r.stderr)
            rows = [l for l in r.stdout.splitlines() if l.startswith("| prefill") or l.startswith("| decode")]
            self.assertEqual([row.split("|")[-2].strip() for row in rows], ["1.16x", "0.66x", "1.07x", "0.88x"])
            self.assertIn("(tg128@d2048 / BM_Decode/2048)", rows[3])
            self.assertEqual(open(out).read(), r.stdout)

    def test_pairs_exactly_and_skips_aggregates_and_errors(self):
        lp, rp, out = self.write(
            [llama_record(512, 0, 0, 200.0), llama_record(0, 16, 512, 20.0)],
            [ratekv_bench("BM_Prefill/5120/min_time:2.000/real_time", 1.0),  # not pp512
             ratekv_bench("BM_Prefill/512/min_time:2.000/real_time", 300.0),
             ratekv_bench("BM_Prefill/512_mean", 999.0, run_type="aggregate"),
             ratekv_bench("BM_Decode/512/min_time:2.000/real_time", 999.0, error_occurred=True),
             ratekv_bench("BM_Decode/512/min_time:2.000/real_time", 10.0)])
        r = run(lp, rp, out)
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = [l for l in r.stdout.splitlines() if l.startswith("| prefill") or l.startswith("| decode")]
        self.assertEqual(rows, ["| prefill of 512 (pp512 / BM_Prefill/512) | 200.0 ± 1.0 | 300.0 | 1.50x |",
                                "| decode at depth 512 (tg16@d512 / BM_Decode/512) | 20.0 ± 1.0 | 10.0 | 0.50x |"])

    def test_nothing_to_pair_names_what_it_saw(self):
        lp, rp, out = self.write([llama_record(2048, 0, 0, 100.0)], [ratekv_bench("BM_Prefill/512", 1.0)])
        r = run(lp, rp, out)
        self.assertEqual(r.returncode, 1)
        self.assertIn("llama-bench: pp2048", r.stderr)
        self.assertIn("ratekv: BM_Prefill/512", r.stderr)
        self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    unittest.main()
