#!/usr/bin/env python3
"""bench_cuda_dequant (bench/cuda/dequantize.cpp) on bad arguments and without a GPU: --help exits 0
with the usage; a bad value (trailing characters, overflow, out of range, an empty list entry, an
unknown flag) exits 2 naming the flag, before any CUDA call; a tiny run (--tokens 64 --reps 1)
exits 0 on a GPU machine and, without a usable device, 1 with one line "bench_cuda_dequant: ..."
(never an abort from an uncaught exception). The binary's path: argv[1] (ctest passes it) or
$BENCH_CUDA_DEQUANT; skipped when it is not built."""
import os
import subprocess
import sys
import unittest

BIN = sys.argv.pop(1) if len(sys.argv) > 1 else os.environ.get("BENCH_CUDA_DEQUANT", "")


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=300)


@unittest.skipUnless(BIN and os.path.exists(BIN), "bench_cuda_dequant is not built (pass its path)")
class Args(unittest.TestCase):
    def test_help_prints_the_usage_and_exits_0(self):
        for flag in ("--help", "-h"):
            r = run(flag)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("usage: bench_cuda_dequant", r.stdout)

    def test_bad_values_exit_2_naming_the_flag(self):
        for args, flag in ((["--tokens", "2048abc"], "--tokens"), (["--tokens", "2048,,4096"], "--tokens"),
                           (["--tokens", "99999999999999999999"], "--tokens"), (["--tokens", "0"], "--tokens"),
                           (["--tokens", str((1 << 24) + 1)], "--tokens"), (["--tokens", "-64"], "--tokens"),
                           (["--tokens", ""], "--tokens"), (["--reps", "0"], "--reps"), (["--reps", "2x"], "--reps"),
                           (["--kv-heads", "100000"], "--kv-heads"), (["--kv-heads", "0"], "--kv-heads"),
                           (["--kv-heads", "8.5"], "--kv-heads"), (["--head-dim", "96"], "--head-dim"),
                           (["--head-dim", "128 "], "--head-dim"), (["--tokens"], "--tokens"),
                           (["--bogus"], "--bogus")):
            r = run(*args)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertTrue(r.stderr.startswith(f"bench_cuda_dequant: {flag}"), (args, r.stderr))
            self.assertIn("usage: bench_cuda_dequant", r.stderr, args)

    def test_a_tiny_run_is_done_or_one_line_without_a_device(self):
        r = run("--tokens", "64", "--reps", "1")
        self.assertIn(r.returncode, (0, 1), r.stderr)
        if r.returncode == 1:  # no usable GPU here (or the check failed: then the table was printed)
            if "bench_cuda_dequant on" not in r.stdout:
                self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
                self.assertTrue(r.stderr.startswith("bench_cuda_dequant: "), r.stderr)
                self.assertNotIn("terminate", r.stderr)


if __name__ == "__main__":
    unittest.main()
