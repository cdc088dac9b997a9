#!/usr/bin/env python3
"""tools/device/cuda_timing.py, the CUDA-event timing loop shared by prefill_vs_sdpa.py, e2e_peers.py and
sdpa_baseline.py, without a GPU: it imports without torch, refuses bad reps before importing torch, and
against a recording stand-in for torch.cuda it is checked for the order of flush / events / call in every
rep, the flush bytes, and the returned element (statistics.median_high of the scripted times). With a
CUDA torch (the GPU machine) one real measurement is checked too; here that case skips. Also: the three
scripts hold no copy of the loop any more, and run --help from another working directory."""
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import types
import unittest
from unittest import mock

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEV = os.path.join(REPO, "tools", "device")
USERS = ("prefill_vs_sdpa.py", "e2e_peers.py", "sdpa_baseline.py")

had_torch = "torch" in sys.modules
spec = importlib.util.spec_from_file_location("cuda_timing", os.path.join(DEV, "cuda_timing.py"))
ct = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ct)


def fake_torch(times, log):
    """A module standing in for torch: Event.elapsed_time returns the next of `times`; every call is logged."""
    it = iter(times)

    class Event:
        def __init__(self, enable_timing=False):
            assert enable_timing
            log.append(("new",))

        def record(self):
            log.append(("record",))

        def synchronize(self):
            log.append(("sync",))

        def elapsed_time(self, other):
            log.append(("elapsed",))
            return next(it)

    t = types.ModuleType("torch")
    t.cuda = types.SimpleNamespace(Event=Event)
    t.uint8 = "uint8"
    t.empty = lambda *shape, dtype=None, device=None: log.append(("empty", shape, dtype, device)) or "buffer"
    return t


class Flush:
    def __init__(self, log):
        self.log = log

    def fill_(self, v):
        self.log.append(("fill", v))


class Helper(unittest.TestCase):
    def test_imports_without_torch(self):
        if not had_torch:
            self.assertNotIn("torch", sys.modules)
        r = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import cuda_timing; "
                            "print('torch' in sys.modules)", DEV], capture_output=True, text=True)
        self.assertEqual((r.returncode, r.stdout.strip()), (0, "False"), r.stderr)

    def test_bad_reps_refused_before_torch_is_imported(self):
        with mock.patch.dict(sys.modules, {"torch": None}):  # `import torch` would raise ImportError
            for reps in (0, -1, 2.0, True, "3", None):
                with self.assertRaisesRegex(ValueError, "reps must be an int >= 1"):
                    ct.median_ms(lambda: None, reps)
            with self.assertRaises(ImportError):
                ct.median_ms(lambda: None, 1)

    def test_order_of_one_rep_and_the_flush_byte(self):
        log = []
        with mock.patch.dict(sys.modules, {"torch": fake_torch([1.0] * 300, log)}):
            ct.median_ms(lambda: log.append(("fn",)), 300, Flush(log))
        rep = [("new",), ("new",), ("record",), ("fn",), ("record",), ("sync",), ("elapsed",)]
        self.assertEqual(len(log), 300 * 8)
        for i in range(300):
            self.assertEqual(log[8 * i:8 * i + 8], [("fill", i % 256)] + rep, i)

    def test_no_flush_no_fill(self):
        log = []
        with mock.patch.dict(sys.modules, {"torch": fake_torch([2.0, 1.0, 3.0], log)}):
            self.assertEqual(ct.median_ms(lambda: None, 3), 2.0)
        self.assertNotIn("fill", [e[0] for e in log])

    def test_returns_the_median_high_of_the_times(self):
        for times in ([5.0], [2.0, 1.0], [3.0, 9.0, 1.0, 4.0, 7.0], [0.5, 0.25, 8.0, 0.75, 0.125, 2.0],
                      [1.0, 1.0, 1.0, 0.5]):
            log = []
            with mock.patch.dict(sys.modules, {"torch": fake_torch(times, log)}):
                self.assertEqual(ct.median_ms(lambda: None, len(times), Flush(log)), statistics.median_high(times),
                                 times)

    def test_an_error_in_fn_propagates(self):
        log = []

        def fn():
            raise RuntimeError("CUDA error: an illegal memory access")
        with mock.patch.dict(sys.modules, {"torch": fake_torch([1.0], log)}):
            with self.assertRaisesRegex(RuntimeError, "illegal memory access"):
                ct.median_ms(fn, 3)

    def test_flush_buffer_is_512_mib_of_uint8_on_the_device(self):
        log = []
        with mock.patch.dict(sys.modules, {"torch": fake_torch([], log)}):
            self.assertEqual(ct.l2_flush_buffer("cuda:1"), "buffer")
            ct.l2_flush_buffer()
        self.assertEqual(ct.FLUSH_BYTES, 536870912)
        self.assertEqual(log, [("empty", (536870912,), "uint8", "cuda:1"), ("empty", (536870912,), "uint8", "cuda")])

    def test_on_a_gpu(self):
        # In a child process: this process stays torch-free (test_prefill_vs_sdpa.py checks that in a shared pytest run).
        code = ("import sys; sys.path.insert(0, sys.argv[1]); import torch, cuda_timing as ct\n"
                "if not torch.cuda.is_available(): print('skip'); raise SystemExit\n"
                "flush = ct.l2_flush_buffer()\n"
                "ms = ct.median_ms(lambda: torch.cuda._sleep(10_000_000), 3, flush)  # ~5 ms at ~2 GHz\n"
                "print(ms, flush[0].item(), flush[-1].item())\n")
        if importlib.util.find_spec("torch") is None:
            self.skipTest("no torch")
        r = subprocess.run([sys.executable, "-c", code, DEV], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        if r.stdout.strip() == "skip":
            self.skipTest("no CUDA device (the GPU machine runs this)")
        ms, first, last = r.stdout.split()
        self.assertTrue(0.5 < float(ms) < 1000.0, ms)
        self.assertEqual((first, last), ("2", "2"))  # the last rep's byte, over the whole buffer


class Scripts(unittest.TestCase):
    def test_no_other_copy_of_the_loop(self):
        for name in sorted(os.listdir(DEV)):
            if name.endswith(".py") and name != "cuda_timing.py":
                with open(os.path.join(DEV, name)) as f:
                    text = f.read()
                self.assertNotIn("Event(enable_timing", text, name)
                self.assertNotIn("512 << 20", text, name)
        for name in USERS:
            with open(os.path.join(DEV, name)) as f:
                self.assertIn("from cuda_timing import", f.read(), name)

    def test_help_from_another_working_directory(self):
        # e2e_peers.py and sdpa_baseline.py import torch before parsing their arguments
        names = USERS if importlib.util.find_spec("torch") is not None else ("prefill_vs_sdpa.py",)
        with tempfile.TemporaryDirectory() as tmp:
            for name in names:
                r = subprocess.run([sys.executable, os.path.join(DEV, name), "--help"], cwd=tmp, capture_output=True,
                                   text=True)
                self.assertEqual(r.returncode, 0, (name, r.stderr))
                self.assertIn("usage:", r.stdout, name)


if __name__ == "__main__":
    unittest.main()
