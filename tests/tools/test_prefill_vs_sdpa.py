#!/usr/bin/env python3
"""tools/device/prefill_vs_sdpa.py (issue 18's torch side) and prefill_vs_sdpa_table.py without a
GPU or torch: the script's argument checks and pure helpers (chunk bounds, causal pair count against
a brute-force count, backend names from aten ops, the shapes against src/model/synthetic.cpp), and
the table's pairing, ratios, header facts and refusals on synthetic input files. The measurement
itself runs on the GPU machine only (tools/device/run_serving.sh, stage prefill_vs_sdpa)."""
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEV = os.path.join(REPO, "tools", "device")
SCRIPT = os.path.join(DEV, "prefill_vs_sdpa.py")
TABLE = os.path.join(DEV, "prefill_vs_sdpa_table.py")


def load_module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


had_torch = "torch" in sys.modules
pvs = load_module(SCRIPT, "prefill_vs_sdpa")


def read(path):
    with open(path) as f:
        return f.read()


def run(path, *args):
    return subprocess.run([sys.executable, path, *args], capture_output=True, text=True)


class Script(unittest.TestCase):
    def test_imports_without_torch(self):
        if not had_torch:
            self.assertNotIn("torch", sys.modules)

    def test_defaults(self):
        a = pvs.parse_args(["--out", "x.json"])
        self.assertEqual((a.model, a.prompts, a.chunk, a.what), ("llama-3.1-8b", [8192, 32768], 2048, ["attn", "hf"]))
        self.assertEqual(pvs.cases(a), [(8192, 0), (8192, 2048), (32768, 0), (32768, 2048)])

    def test_cases_chunk_zero_or_not_smaller_than_the_prompt_is_one_piece_only(self):
        self.assertEqual(pvs.cases(pvs.parse_args(["--out", "x", "--chunk", "0", "--prompts", "97,8192"])),
                         [(97, 0), (8192, 0)])
        self.assertEqual(pvs.cases(pvs.parse_args(["--out", "x", "--prompts", "2048,2049,1"])),
                         [(2048, 0), (2049, 0), (2049, 2048), (1, 0)])

    def test_bad_arguments_exit_2_with_a_message(self):
        for args, words in ((["--chunk", "-64"], "--chunk"), (["--prompts", "8192,abc"], "comma list"),
                            (["--prompts", "0"], "comma list"), (["--prompts", "8192,8192"], "twice"),
                            (["--what", "attn,decode"], "attn, hf"), (["--reps", "0"], "--reps"),
                            (["--warmup", "0"], "--warmup"), (["--model", "gpt-2"], "invalid choice"), ([], "--out")):
            r = run(SCRIPT, *(args + ([] if not args else ["--out", "x.json"])))
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertIn(words, r.stderr, args)

    def test_chunk_must_be_zero_or_a_positive_multiple_of_64(self):
        for bad in ("100", "63", "-64", "2048.5", "x"):
            r = run(SCRIPT, "--out", "x.json", "--chunk", bad)
            self.assertEqual(r.returncode, 2, (bad, r.stderr))
            self.assertIn("--chunk", r.stderr, bad)
            self.assertNotIn("Traceback", r.stderr, bad)
        for good in ("0", "64", "2048"):
            self.assertEqual(pvs.parse_args(["--out", "x.json", "--chunk", good]).chunk, int(good))

    def test_out_in_a_missing_directory_or_a_directory_is_refused_before_any_work(self):
        with tempfile.TemporaryDirectory() as d:
            for out in (os.path.join(d, "no", "such", "o.json"), d):
                r = run(SCRIPT, "--out", out)
                self.assertEqual(r.returncode, 2, (out, r.stderr))
                self.assertIn("--out", r.stderr, out)
                self.assertNotIn("CUDA", r.stderr, out)  # refused in parsing, before torch
            self.assertEqual(os.listdir(d), [])

    def test_without_torch_it_says_so(self):
        if importlib.util.find_spec("torch") is not None:
            self.skipTest("torch is installed here: the script would measure (or say there is no CUDA device)")
        with tempfile.TemporaryDirectory() as d:
            r = run(SCRIPT, "--out", os.path.join(d, "o.json"))
            self.assertEqual(r.returncode, 1)
            self.assertIn("prefill_vs_sdpa: needs torch", r.stderr)
            self.assertFalse(os.path.exists(os.path.join(d, "o.json")))

    def test_chunk_bounds(self):
        self.assertEqual(pvs.chunk_bounds(97, 64), [(0, 64), (64, 97)])
        self.assertEqual(pvs.chunk_bounds(97, 0), [(0, 97)])
        self.assertEqual(pvs.chunk_bounds(1, 2048), [(0, 1)])
        self.assertEqual(pvs.chunk_bounds(8192, 2048), [(0, 2048), (2048, 4096), (4096, 6144), (6144, 8192)])
        for T, c in ((352, 96), (32768, 2048), (131072, 2048), (5, 1)):
            b = pvs.chunk_bounds(T, c)
            self.assertEqual(b[0][0], 0)
            self.assertEqual(b[-1][1], T)
            self.assertTrue(all(b[i][1] == b[i + 1][0] for i in range(len(b) - 1)))
        for T, c in ((0, 64), (64, -1)):
            with self.assertRaises(ValueError):
                pvs.chunk_bounds(T, c)

    def test_causal_pairs_match_a_brute_force_count_for_any_chunking(self):
        for T in (1, 2, 97, 352):
            brute = sum(1 for i in range(T) for j in range(T) if j <= i)
            for c in (0, 1, 64, 96, 2048):
                self.assertEqual(pvs.causal_pairs(pvs.chunk_bounds(T, c)), brute, (T, c))
        self.assertEqual(pvs.causal_pairs(pvs.chunk_bounds(32768, 2048)), 32768 * 32769 // 2)
        self.assertEqual(pvs.attention_flop(32, 128, [(0, 8192)]), 4 * 32 * 128 * 8192 * 8193 // 2)

    def test_shapes_are_the_synthetic_configuration_of_the_engine(self):
        src = read(os.path.join(REPO, "src", "model", "synthetic.cpp"))
        block = src[src.index('if (name == "llama-3.1-8b")'):]
        block = block[:block.index("}")]
        cpp = {k: int(v) for k, v in re.findall(r"c\.(\w+) = (\d+);", block)}
        sh = pvs.shapes("llama-3.1-8b")
        self.assertEqual((sh["hq"], sh["hkv"], sh["d"], sh["layers"], sh["d_model"], sh["ffn"], sh["vocab"]),
                         (cpp["n_heads"], cpp["n_kv_heads"], cpp["head_dim"], cpp["n_layers"], cpp["d_model"],
                          cpp["d_ff"], cpp["n_vocab"]))
        self.assertEqual((sh["hq"], sh["hkv"], sh["d"], sh["layers"], sh["d_model"], sh["ffn"]),
                         (32, 8, 128, 32, 4096, 14336))

    def test_backends_from_profiler_op_names(self):
        self.assertEqual(pvs.backends_from_ops(["aten::scaled_dot_product_attention",
                                                "aten::_scaled_dot_product_flash_attention", "aten::mm"]), ["flash"])
        self.assertEqual(pvs.backends_from_ops(["aten::_scaled_dot_product_efficient_attention",
                                                "aten::_flash_attention_forward", "aten::_efficient_attention_forward"]),
                         ["efficient", "flash"])
        self.assertEqual(pvs.backends_from_ops(["aten::_scaled_dot_product_attention_math", "aten::softmax"]), ["math"])
        self.assertEqual(pvs.backends_from_ops(["aten::scaled_dot_product_attention"]), [])

    def test_error_text(self):
        class OutOfMemoryError(RuntimeError):
            pass
        self.assertTrue(pvs.error_text(OutOfMemoryError("CUDA out of memory. Tried")).startswith("out of memory: "))
        self.assertEqual(pvs.error_text(RuntimeError("No available kernel")), "RuntimeError('No available kernel')")
        self.assertEqual(len(pvs.error_text(RuntimeError("x" * 1000))), 400)

    def test_every_device_script_compiles(self):
        for name in ("prefill_vs_sdpa.py", "prefill_vs_sdpa_table.py", "e2e_peers.py", "hf_configs.py",
                     "cuda_timing.py", "sdpa_baseline.py"):
            r = subprocess.run([sys.executable, "-m", "py_compile", os.path.join(DEV, name)], capture_output=True,
                               text=True)
            self.assertEqual(r.returncode, 0, (name, r.stderr))


def rk_row(cache, prompt, chunk, tok_s, **extra):
    r = {"model": "llama-3.1-8b synthetic", "cache": cache, "device": "cuda", "test": f"pp{prompt}", "B": 1,
         "depth": 0, "prefill_mode": "serving", "chunk": chunk, "prefill_tok_s": tok_s, "prefill_tok_s_sd": 0.0,
         "ttft_ms": prompt * 1e3 / tok_s}
    r.update(extra)
    return r


def torch_doc(rows, device="NVIDIA H200", model="llama-3.1-8b"):
    return {"meta": {"model": model, "device": device, "torch": "2.11.0+cu130", "date": "2026-12-03T10:00:00",
                     "shapes": pvs.shapes("llama-3.1-8b")}, "rows": rows}


def attn(prompt, chunk, ms):
    return {"kind": "sdpa-flash-attn", "prompt": prompt, "chunk": chunk, "ms_per_layer": ms, "ms_all_layers": 32 * ms}


def hf(prompt, chunk, tok_s, seen=("flash",)):
    return {"kind": "hf-sdpa-prefill", "prompt": prompt, "chunk": chunk, "tok_s": tok_s, "ttft_ms": prompt * 1e3 / tok_s,
            "backends_seen": list(seen)}


class Table(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def path(self, name, doc=None):
        p = os.path.join(self.tmp.name, name)
        if doc is not None:
            with open(p, "w") as f:
                f.write(doc if isinstance(doc, str) else json.dumps(doc))
        return p

    def table(self, rk_docs, tdoc, extra=()):
        rk = [self.path(f"rk{i}.json", d) for i, d in enumerate(rk_docs)]
        t = self.path("torch.json", tdoc)
        out, md = self.path("out.json"), self.path("out.md")
        r = run(TABLE, "--ratekv", *rk, *extra, "--torch", t, "--out", out, "--md", md)
        return r, out, md

    def test_pairs_rows_and_computes_the_ratios(self):
        one = {"device_name": "NVIDIA H200", "rows": [rk_row("fp16", 8192, 0, 16000.0), rk_row("K3V3", 8192, 0, 15000.0)]}
        chunked = {"device_name": "NVIDIA H200", "rows": [rk_row("fp16", 8192, 2048, 19000.0),
                                                          rk_row("K3V3", 8192, 2048, 18000.0),
                                                          rk_row("K2V2", 8192, 2048, 1.0)]}  # not a table column
        t = torch_doc([attn(8192, 0, 2.5), attn(8192, 2048, 3.0), hf(8192, 0, 32000.0),
                       hf(8192, 2048, 20000.0, ("efficient", "flash"))])
        r, out, md = self.table([one, chunked], t)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = [l for l in r.stdout.splitlines() if l.startswith("| 8192")]
        self.assertEqual(lines, [
            "| 8192 | one piece | 16 000 | 15 000 | 32 000 (flash) | 0.50x | 0.47x | 2.50 (80) | 16 % |",
            "| 8192 | chunks of 2048 | 19 000 | 18 000 | 20 000 (efficient/flash) | 0.95x | 0.90x | 3.00 (96) | 22 % |"])
        self.assertIn("same GPU (NVIDIA H200)", r.stdout)
        self.assertIn("32 query / 8 KV heads, head_dim 128, 32 layers, d_model 4096, ffn 14336", r.stdout)
        self.assertEqual(read(md), r.stdout)
        doc = json.loads(read(out))
        self.assertEqual(len(doc["table"]), 2)
        self.assertAlmostEqual(doc["table"][0]["K3V3_over_hf"], 15000 / 32000)
        self.assertAlmostEqual(doc["table"][1]["flash_share_of_fp16_ttft"], 96.0 / (8192 * 1e3 / 19000))
        self.assertEqual(doc["missing"], [])

    def test_missing_files_and_error_rows_are_stated_not_fatal(self):
        one = {"device_name": "NVIDIA H200", "rows": [rk_row("fp16", 8192, 0, 16000.0)]}
        t = torch_doc([attn(32768, 0, 20.0), {"kind": "hf-sdpa-prefill", "prompt": 32768, "chunk": 0,
                                              "error": "out of memory: OutOfMemoryError('CUDA out of memory')"}])
        r, out, _ = self.table([one], t, extra=[self.path("never_written.json")])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("| 8192 | one piece | 16 000 | — | — | — | — | — | — |", r.stdout)
        self.assertIn("| 32768 | one piece | — | — | — | — | — | 20.00 (640) | — |", r.stdout)
        self.assertIn("- 32768 one piece, hf: error out of memory", r.stdout)
        self.assertIn("never_written.json (its command stopped before writing it)", r.stdout)
        self.assertEqual(len(json.loads(read(out))["missing"]), 1)

    def test_without_the_torch_side_no_shapes_are_claimed(self):
        one = {"device_name": "NVIDIA H200", "rows": [rk_row("fp16", 8192, 0, 16000.0)]}
        rk = self.path("rk.json", one)
        r = run(TABLE, "--ratekv", rk, "--torch", self.path("absent.json"), "--out", self.path("o.json"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("Shapes not recorded (no torch-side file)", r.stdout)
        self.assertNotIn("Same shapes", r.stdout)
        self.assertIn("absent.json (its command stopped before writing it)", r.stdout)

    def test_other_gpus_are_not_called_the_same(self):
        one = {"device_name": "NVIDIA H100", "rows": [rk_row("fp16", 8192, 0, 16000.0)]}
        r, _, _ = self.table([one], torch_doc([hf(8192, 0, 30000.0)]))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("same GPU", r.stdout)
        self.assertIn("GPUs differ or unknown: ['NVIDIA H100', 'NVIDIA H200']", r.stdout)

    def test_refusals(self):
        one = {"device_name": "NVIDIA H200", "rows": [rk_row("fp16", 8192, 0, 16000.0)]}
        qwen = {"rows": [rk_row("fp16", 8192, 0, 16000.0, model="qwen2.5-7b synthetic")]}
        r, out, _ = self.table([qwen], torch_doc([]))
        self.assertEqual(r.returncode, 2)
        self.assertIn("not the same shapes", r.stderr)
        self.assertFalse(os.path.exists(out))
        r, _, _ = self.table([one, one], torch_doc([]))
        self.assertEqual(r.returncode, 2)
        self.assertIn("prompt 8192 chunk 0 cache fp16 is in both", r.stderr)
        r, _, _ = self.table(["{not json"], torch_doc([]))
        self.assertEqual(r.returncode, 2)
        self.assertIn("rk0.json: not readable JSON", r.stderr)
        r, _, _ = self.table([{"benchmarks": []}], torch_doc([]))
        self.assertEqual(r.returncode, 2)
        self.assertIn("no list 'rows'", r.stderr)
        r, _, _ = self.table([one], torch_doc([{"kind": "hf-sdpa-prefill", "chunk": 0}]))
        self.assertEqual(r.returncode, 2)
        self.assertIn("without a numeric prompt", r.stderr)
        r, _, _ = self.table([{"rows": [{"cache": "fp16", "test": "pp8192", "chunk": 0}]}], torch_doc([]))
        self.assertEqual(r.returncode, 2)
        self.assertIn("neither prefill_tok_s nor error", r.stderr)

    def assertRefused(self, rk_docs, tdoc, *words, extra=()):
        r, out, md = self.table(rk_docs, tdoc, extra=extra)
        self.assertEqual(r.returncode, 2, (words, r.stdout, r.stderr))
        self.assertNotIn("Traceback", r.stderr, words)
        for w in words:
            self.assertIn(w, r.stderr)
        self.assertFalse(os.path.exists(out), words)
        self.assertFalse(os.path.exists(md), words)
        return r

    def test_duplicate_torch_rows_are_refused(self):
        one = {"device_name": "NVIDIA H200", "rows": [rk_row("fp16", 8192, 0, 16000.0)]}
        self.assertRefused([one], torch_doc([hf(8192, 0, 30000.0), attn(8192, 0, 2.0), hf(8192, 0, 31000.0)]),
                           "torch.json", "rows[0]", "rows[2]", "hf-sdpa-prefill prompt 8192 chunk 0")
        self.assertRefused([one], torch_doc([attn(8192, 2048, 2.0), attn(8192, 2048, 2.0)]),
                           "torch.json", "rows[0]", "rows[1]")

    def test_malformed_ratekv_rows_name_the_file_row_and_field(self):
        good = rk_row("fp16", 8192, 0, 16000.0)
        t = torch_doc([])
        for rows, where in (([1, "x"], "rows[0]"),
                            ([dict(good, chunk=None)], "rows[0].chunk"),
                            ([good, dict(good, cache="K3V3", chunk="2048")], "rows[1].chunk"),
                            ([dict(good, chunk=2048.7)], "rows[0].chunk"),
                            ([dict(good, chunk=True)], "rows[0].chunk"),
                            ([dict(good, chunk=-64)], "rows[0].chunk"),
                            ([dict(good, prefill_tok_s="16000")], "rows[0].prefill_tok_s"),
                            ([dict(good, prefill_tok_s=True)], "rows[0].prefill_tok_s"),
                            ([dict(good, prefill_tok_s=-1.0)], "rows[0].prefill_tok_s"),
                            ([dict(good, ttft_ms="x")], "rows[0].ttft_ms"),
                            ([dict(good, error=None)], "rows[0].error"),
                            ([dict(good, error=5)], "rows[0].error"),
                            ([dict(good, test="ppabc")], "rows[0].test"),
                            ([dict(good, test="pp0")], "rows[0].test"),
                            ([dict(good, test="pp2048.7")], "rows[0].test"),
                            ([dict(good, test=8192)], "rows[0].test"),
                            ([dict(good, cache=["fp16"])], "rows[0].cache"),
                            ([dict(good, model=["x"])], "rows[0].model"),
                            ([dict(good, prefill_mode=3)], "rows[0].prefill_mode")):
            self.assertRefused([{"device_name": "NVIDIA H200", "rows": rows}], t, "rk0.json", where)
        self.assertRefused([{"device_name": ["NVIDIA H200"], "rows": [good]}], t, "rk0.json", "device_name")

    def test_malformed_torch_side_names_the_file_row_and_field(self):
        one = {"device_name": "NVIDIA H200", "rows": [rk_row("fp16", 8192, 0, 16000.0)]}
        sh = pvs.shapes("llama-3.1-8b")
        for doc, where in (({"meta": None, "rows": []}, "meta"),
                           ({"meta": "llama", "rows": []}, "meta"),
                           (dict(torch_doc([]), rows=[1, "x"]), "rows[0]"),
                           (torch_doc([dict(hf(8192, 0, 1.0), chunk=None)]), "rows[0].chunk"),
                           (torch_doc([dict(hf(8192, 0, 1.0), prompt="8192")]), "rows[0].prompt"),
                           (torch_doc([dict(hf(8192, 0, 1.0), prompt=True)]), "rows[0].prompt"),
                           (torch_doc([dict(hf(8192, 0, 1.0), chunk=2048.7)]), "rows[0].chunk"),
                           (torch_doc([dict(hf(8192, 0, 1.0), chunk=-64)]), "rows[0].chunk"),
                           (torch_doc([dict(hf(8192, 0, 1.0), tok_s="1")]), "rows[0].tok_s"),
                           (torch_doc([dict(hf(8192, 0, 1.0), ttft_ms=[1])]), "rows[0].ttft_ms"),
                           (torch_doc([dict(attn(8192, 0, 2.0), ms_per_layer="2")]), "rows[0].ms_per_layer"),
                           (torch_doc([dict(attn(8192, 0, 2.0), ms_all_layers=None)]), "rows[0].ms_all_layers"),
                           (torch_doc([{"kind": "hf-sdpa-prefill", "prompt": 8192, "chunk": 0, "error": None}]),
                            "rows[0].error"),
                           (torch_doc([{"kind": "hf-sdpa-prefill", "prompt": 8192, "chunk": 0, "error": 5}]),
                            "rows[0].error"),
                           (torch_doc([{"kind": "hf-sdpa-prefill", "prompt": 8192, "chunk": 0}]),
                            "rows[0] has neither"),
                           (torch_doc([dict(hf(8192, 0, 1.0), backends_seen="flash")]), "rows[0].backends_seen"),
                           (torch_doc([dict(hf(8192, 0, 1.0), backends_seen=[1])]), "rows[0].backends_seen"),
                           (torch_doc([dict(hf(8192, 0, 1.0), kind="sdpa-math")]), "rows[0].kind"),
                           (torch_doc([dict(hf(8192, 0, 1.0), model="qwen2.5-7b")]), "rows[0].model"),
                           (torch_doc([dict(hf(8192, 0, 1.0), mode="chunks of 64")]), "rows[0].mode"),
                           (dict(torch_doc([]), meta=dict(torch_doc([])["meta"], device=["H200"])), "meta.device"),
                           (dict(torch_doc([]), meta=dict(torch_doc([])["meta"], model=7)), "meta.model"),
                           (dict(torch_doc([]), meta=dict(torch_doc([])["meta"], shapes=None)), "meta.shapes"),
                           (dict(torch_doc([]), meta=dict(torch_doc([])["meta"],
                                                          shapes={k: v for k, v in sh.items() if k != "hkv"})),
                            "meta.shapes.hkv"),
                           (dict(torch_doc([]), meta=dict(torch_doc([])["meta"], shapes=dict(sh, d="128"))),
                            "meta.shapes.d")):
            self.assertRefused([one], doc, "torch.json", where)

    def test_deeply_nested_json_is_refused(self):
        deep = '{"rows": [], "x": ' + "[" * 100000 + "]" * 100000 + "}"
        self.assertRefused([deep], torch_doc([]), "rk0.json")
        shallow_but_deep = '{"rows": [], "x": ' + "[" * 500 + "]" * 500 + "}"
        self.assertRefused([shallow_but_deep], torch_doc([]), "rk0.json", "nested")

    def test_non_finite_numbers_are_refused_and_the_output_is_strict_json(self):
        one = {"device_name": "NVIDIA H200", "rows": [rk_row("fp16", 8192, 0, 16000.0)]}
        t = torch_doc([hf(8192, 0, 30000.0)])
        good = json.dumps(one)
        for bad, where in ((good.replace("16000.0", "NaN", 1), "rows[0].prefill_tok_s"),
                           (good.replace("16000.0", "Infinity", 1), "rows[0].prefill_tok_s"),
                           (good.replace("16000.0", "1e999", 1), "rows[0].prefill_tok_s"),
                           (good[:-1] + ', "read_ceiling_gbps": {"fp16": NaN}}', "read_ceiling_gbps.fp16")):
            self.assertRefused([bad], t, "rk0.json", where)
        tbad = json.dumps(torch_doc([attn(8192, 0, 2.5)])).replace("2.5", "NaN", 1)
        self.assertRefused([one], tbad, "torch.json", "rows[0].ms_per_layer")
        # finite inputs whose ratio overflows: refused, never "infx" or a bare Infinity in the output
        huge = {"device_name": "NVIDIA H200", "rows": [rk_row("fp16", 8192, 0, 1e308, ttft_ms=1.0)]}
        self.assertRefused([huge], torch_doc([hf(8192, 0, 1e-300)]), "not finite")
        r, out, _ = self.table([one], t)
        self.assertEqual(r.returncode, 0, r.stderr)
        json.loads(read(out), parse_constant=lambda c: self.fail(f"{c} in the output"))

    def test_out_and_md_in_a_missing_directory_are_refused_before_writing(self):
        one = {"device_name": "NVIDIA H200", "rows": [rk_row("fp16", 8192, 0, 16000.0)]}
        rk, t = self.path("rk.json", one), self.path("t.json", torch_doc([hf(8192, 0, 30000.0)]))
        nowhere = os.path.join(self.tmp.name, "no", "such")
        for flag, args in (("--out", ["--out", os.path.join(nowhere, "o.json"), "--md", self.path("o.md")]),
                           ("--md", ["--out", self.path("o.json"), "--md", os.path.join(nowhere, "o.md")]),
                           ("--out", ["--out", self.tmp.name])):
            r = run(TABLE, "--ratekv", rk, "--torch", t, *args)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertIn(flag, r.stderr, args)
            self.assertNotIn("Traceback", r.stderr, args)
            self.assertFalse(os.path.exists(self.path("o.json")), args)
            self.assertFalse(os.path.exists(self.path("o.md")), args)

    def test_nothing_at_all_exits_1(self):
        r, _, _ = self.table([{"rows": []}], torch_doc([]))
        self.assertEqual(r.returncode, 1)
        self.assertIn("no row in any input", r.stderr)


if __name__ == "__main__":
    unittest.main()
