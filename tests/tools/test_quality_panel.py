#!/usr/bin/env python3
"""tools/quality_panel.py on bad input (issue 22's adversarial pass): every case ends with a message
that names the file / flag and what was expected, a non-zero exit where the command cannot do what
was asked, and never a Python traceback or a silently wrong number.

  - a corrupt / truncated cell JSON (what an interrupted cell leaves): `status` names the file and
    lists the cell as unfinished, `report` leaves it out and says so (stderr and the report), `run`
    re-runs it (a fake ratekv binary stands in for `ratekv eval`);
  - --models with an unknown name: the known names are listed;
  - run --only with a bad regular expression;
  - report/status on a panel directory that does not exist (used to exit 0 with only the llama.cpp
    rows copied from issue 22), and output files in a directory that does not exist;
  - a NaN perplexity: the JSON holds null (strictly valid JSON) with the row marked, the table says nan;
  - RateQuant's side cell (side/side.json): truncated, empty, a side plan missing, a KLD of 0 or NaN: named,
    unfinished, no key weight derived (and a valid one gives the key weight computed here by hand);
  - `run` exits 1 when a cell failed; --only that matches nothing; an empty --md; Ctrl-C during `run`, `status` and `report`;
  - a non-finite or non-numeric fp16 reference perplexity: ΔPPL unavailable, not -100 % / nan %;
  - reseeded runs (evalr/): a missing field, other stored bits, a NaN seed, another number of layers;
  - wrong types in an eval cell's fields; one "finished" predicate for status / run / report (a cell lacking a
    field, a cell holding null or a list, a truncated plan file with valid params, an unreadable file).
  - `run` on a cell whose command exits 0 but whose output is not usable: one call, [FAIL], exit 1 (it used to
    re-run the cell forever); a bad plan file under a reseed cell fails that cell only (it used to stop the run);
  - an eval cell whose fp16 reference fields are missing: named on stderr (it used to be skipped silently).
Synthetic cells only (no model, no ratekv run)."""
import hashlib
import importlib.util
import io
import json
import math
import os
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "tools", "quality_panel.py")
KNOWN = ["smollm2", "qwen05", "qwen15", "gemma3"]


def run(*args, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=e)


def stat3(v):
    return {"mean": v, "sd": 0.0, "per_seed": [v]}


def eval_report(plan, ppl, kld=0.05):
    """A `ratekv eval --json` report of one deterministic plan, with the fields the panel reads."""
    nt = {"kld_mean": stat3(kld), "kld_p99": stat3(10 * kld), "top1": stat3(0.9)}
    p = {"name": plan, "method": "uniform", "deterministic": True, "ppl_kv": stat3(ppl), "ppl_k": stat3(ppl),
         "next_token": {"kv": nt, "k": nt},
         "stored": {"k_bits_per_element": 4.5, "v_bits_per_element": 4.5, "bytes_per_token": 432,
                    "k_bytes_per_token": 216},
         "mae": {"mean": 0.5, "layers_mean": [0.4, 0.6], "per_seed": [[0.4, 0.6]]}}
    return {"plans": [p], "seeds": 1, "n_chunks": 8, "n_tokens": 4096, "ppl_scored_tokens": 2040,
            "fp": {"ppl": 15.0, "next_token": {"kld_mean": 0.0}}, "fp16_cache": {"ppl": 15.25}}


def eval_cell(plan, ppl, params=None):
    return {"params": params or {"mode": "kv"}, "seconds": 1.0, "command": "ratekv eval --baseline " + plan,
            "report": eval_report(plan, ppl)}


# the parameters `run` records for smollm2's eval/q8_0 (3 seeds, K+V) and plan/uniform-K3V3 cells
Q8_PARAMS = {"tokens": 4096, "ctx": 512, "seeds": 3, "mode": "kv", "args": ["--baseline", "q8_0"]}
PLAN_ARGS = ["--method", "uniform", "--kbits", "3", "--vbits", "3", "--budget-unit", "code"]


def write_safetensors(path, tensors, meta):
    """A float32 safetensors file: tensors = {name: (flat values, shape)}, meta: the ratekv metadata object."""
    head, blob = {}, b""
    for name, (vals, shape) in tensors.items():
        data = struct.pack(f"<{len(vals)}f", *vals)
        head[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    head["__metadata__"] = {"ratekv": json.dumps(meta)}
    h = json.dumps(head).encode()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + blob)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# A side calibration for smollm2 (2 key and 2 value components of d = 2; KIVI curves alpha * beta^-b).
SIDE_KLD = {"konly-kivi2": 0.2, "vonly-kivi2": 0.08, "konly-kivi3": 0.03, "vonly-kivi3": 0.01}
GRAD_K, GRAD_V = [1.0, 2.0, 0.5, 0.5], [3.0, 1.0, 1.0, 1.0]   # per component: sums 3, 1 (K) and 4, 2 (V)
ALPHA_K, ALPHA_V, BETA_K, BETA_V = [0.5, 2.0], [1.0, 0.25], 3.0, 4.0


def side_key_weight_by_hand(b_list=(2, 3)):
    """The key weight of the side calibration above, written out: geometric mean over b of (KLD_K/KLD_V) /
    (P_K/P_V), P_K(b) = (3*0.5 + 1*2) * 3^-b, P_V(b) = (4*1 + 2*0.25) * 4^-b."""
    logs = []
    for b in b_list:
        pk = (3 * 0.5 + 1 * 2.0) * BETA_K ** -b
        pv = (4 * 1.0 + 2 * 0.25) * BETA_V ** -b
        logs.append(math.log((SIDE_KLD[f"konly-kivi{b}"] / SIDE_KLD[f"vonly-kivi{b}"]) / (pk / pv)))
    return math.exp(sum(logs) / len(logs))


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def strict_loads(text):
    def refuse(c):
        raise ValueError(f"non-standard JSON constant {c}")
    return json.loads(text, parse_constant=refuse)


TRUNCATED = '{"params": {"tokens": 4096, "ctx": 512, "seeds": 1, "mo'  # an interrupted write


class QualityPanelBadInput(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = os.path.join(self.tmp.name, "panel")
        os.makedirs(self.root)

    def tearDown(self):
        self.tmp.cleanup()

    def no_traceback(self, r):
        self.assertNotIn("Traceback", r.stdout + r.stderr, r.stdout + r.stderr)

    def test_corrupt_cell_status_names_the_file_and_lists_it_unfinished(self):
        bad = os.path.join(self.root, "smollm2", "eval", "q8_0.json")
        write(bad, TRUNCATED)
        write(os.path.join(self.root, "smollm2", "plans", "uniform-K3V3.json"), "{}")
        write(os.path.join(self.root, "smollm2", "plans", "uniform-K3V3.json.params.json"), "{\"par")
        r = run("status", "--out", self.root, "--models", "smollm2")
        self.no_traceback(r)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(bad, r.stderr)
        self.assertIn("not valid JSON", r.stderr)
        self.assertIn("unfinished", r.stderr)
        self.assertIn("----  smollm2/eval/q8_0\n", r.stdout)
        self.assertIn("uniform-K3V3.json.params.json", r.stderr)
        self.assertIn("----  smollm2/plan/uniform-K3V3\n", r.stdout)

    def test_corrupt_cell_report_leaves_it_out_and_says_so(self):
        write(os.path.join(self.root, "smollm2", "eval", "q4_0.json"), json.dumps(eval_cell("q4_0", 16.5)))
        bad = os.path.join(self.root, "smollm2", "eval", "q8_0.json")
        write(bad, TRUNCATED)
        md, js = os.path.join(self.tmp.name, "p.md"), os.path.join(self.tmp.name, "p.json")
        r = run("report", "--out", self.root, "--models", "smollm2", "--md", md, "--json", js)
        self.no_traceback(r)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(bad, r.stderr)
        self.assertIn("not valid JSON", r.stderr)
        with open(js) as f:
            doc = strict_loads(f.read())
        plans = [row["plan"] for row in doc["models"]["smollm2"]["rows"]]
        self.assertIn("q4_0", plans)
        self.assertNotIn("q8_0", plans)
        self.assertEqual(doc["models"]["smollm2"]["skipped_cells"][0]["file"], "smollm2/eval/q8_0.json")
        with open(md) as f:
            text = f.read()
        self.assertIn("smollm2/eval/q8_0.json", text)
        self.assertIn("Left out (unfinished", text)
        # the good row's numbers: PPL 16.5 against the fp16 cache's 15.25
        self.assertIn("| 16.500 | 8.2 % |", text)

    def test_corrupt_cell_run_reruns_it(self):
        # A fake `ratekv`: writes a valid eval report where --json says and logs its call.
        fake = os.path.join(self.tmp.name, "ratekv")
        calls = os.path.join(self.tmp.name, "calls.txt")
        write(fake, "#!" + sys.executable + "\n"
              "import json, sys\n"
              f"open({calls!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
              "out = sys.argv[sys.argv.index('--json') + 1]\n"
              f"json.dump({eval_report('q8_0', 15.3)!r}, open(out, 'w'))\n")
        os.chmod(fake, os.stat(fake).st_mode | stat.S_IXUSR)
        bad = os.path.join(self.root, "smollm2", "eval", "q8_0.json")
        write(bad, TRUNCATED)
        r = run("run", "--out", self.root, "--models", "smollm2", "--only", "^smollm2/eval/q8_0$",
                env={"RATEKV_BIN": fake, "RATEKV_NICE": "0"})
        self.no_traceback(r)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn(bad, r.stderr)
        with open(calls) as f:
            self.assertEqual(len(f.read().splitlines()), 1)
        with open(bad) as f:
            doc = strict_loads(f.read())
        self.assertEqual(doc["report"]["plans"][0]["ppl_kv"]["mean"], 15.3)
        # finished now: a second run does not call ratekv again
        r = run("run", "--out", self.root, "--models", "smollm2", "--only", "^smollm2/eval/q8_0$",
                env={"RATEKV_BIN": fake, "RATEKV_NICE": "0"})
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(calls) as f:
            self.assertEqual(len(f.read().splitlines()), 1)

    def test_unknown_model_lists_the_known_names(self):
        for cmd in ("run", "status", "report"):
            r = run(cmd, "--out", self.root, "--models", "smollm2,bogus")
            self.no_traceback(r)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("--models", r.stderr)
            self.assertIn("'bogus'", r.stderr)
            self.assertIn(", ".join(KNOWN), r.stderr)

    def test_bad_only_pattern(self):
        r = run("run", "--out", self.root, "--only", "(", "--dry-run")
        self.no_traceback(r)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--only '(': not a valid regular expression", r.stderr)

    def test_missing_directories(self):
        missing = os.path.join(self.tmp.name, "nonexistent", "dir", "x")
        for cmd in ("report", "status"):
            r = run(cmd, "--out", missing)
            self.no_traceback(r)
            self.assertNotEqual(r.returncode, 0, r.stdout)
            self.assertIn(f"--out {missing}: ", r.stderr)
            self.assertNotIn("llama.cpp", r.stdout)  # the numbers are not a report
        r = run("run", "--out", missing, "--dry-run")
        self.no_traceback(r)
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertIn(f"--out {missing}: ", r.stderr)
        self.assertFalse(os.path.exists(os.path.dirname(missing)))
        # output files in a directory that does not exist: refused before anything is written
        write(os.path.join(self.root, "smollm2", "eval", "q4_0.json"), json.dumps(eval_cell("q4_0", 16.5)))
        for flag in ("--md", "--json", "--png"):
            r = run("report", "--out", self.root, "--models", "smollm2", flag, missing)
            self.no_traceback(r)
            self.assertNotEqual(r.returncode, 0, r.stdout)
            self.assertIn(f"{flag} {missing}: ", r.stderr)
        # a panel directory without any finished cell of the models asked for
        r = run("report", "--out", self.root, "--models", "qwen15")
        self.no_traceback(r)
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertIn("no finished cell", r.stderr)

    def test_nan_perplexity_is_null_in_the_json_and_nan_in_the_table(self):
        write(os.path.join(self.root, "smollm2", "eval", "q4_0.json"), json.dumps(eval_cell("q4_0", float("nan"))))
        write(os.path.join(self.root, "smollm2", "eval", "q8_0.json"), json.dumps(eval_cell("q8_0", 15.5)))
        md, js = os.path.join(self.tmp.name, "p.md"), os.path.join(self.tmp.name, "p.json")
        r = run("report", "--out", self.root, "--models", "smollm2", "--md", md, "--json", js)
        self.no_traceback(r)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(js) as f:
            doc = strict_loads(f.read())
        rows = {row["plan"]: row for row in doc["models"]["smollm2"]["rows"]}
        self.assertIsNone(rows["q4_0"]["ppl"])
        self.assertIsNone(rows["q4_0"]["ppl_rel"])
        self.assertEqual(rows["q4_0"]["ppl_status"], "nan")
        self.assertAlmostEqual(rows["q8_0"]["ppl"], 15.5)
        self.assertAlmostEqual(rows["q8_0"]["ppl_rel"], 15.5 / 15.25 - 1)
        with open(md) as f:
            lines = [ln for ln in f.read().splitlines() if ln.startswith("| q4_0 ")]
        self.assertEqual(len(lines), 1)
        self.assertIn("| nan (failed) |", lines[0])
        self.assertIn("nan", r.stderr)  # and the run says so

    # ---- helpers of the cases below

    def side_panel(self, side_doc_text):
        """smollm2's statistics, its four side plans and side/side.json = side_doc_text (with the parameters `run`
        records, so that only the content decides whether the cell is finished)."""
        m = os.path.join(self.root, "smollm2")
        write_safetensors(os.path.join(m, "calib_stats.safetensors"),
                          {"grad_sq_k_post": (GRAD_K, [2, 2]), "grad_sq_v": (GRAD_V, [2, 2]),
                           "curves.kivi.alpha_k": (ALPHA_K, [2]), "curves.kivi.alpha_v": (ALPHA_V, [2])},
                          {"curves": {"kivi": {"beta_k": BETA_K, "beta_v": BETA_V}}})
        plans = []
        for name in ("konly-kivi2", "vonly-kivi2", "konly-kivi3", "vonly-kivi3"):
            write(os.path.join(m, "side", name + ".json"), json.dumps({"layers": [], "name": name}))
            plans.append(f"smollm2/side/{name}.json")
        params = {"tokens": 2048, "ctx": 512, "seeds": 1, "mode": "side", "plans": plans,
                  "plans_sha256": [sha256(os.path.join(self.root, x)) for x in plans]}
        write(os.path.join(m, "side", "side.json"), side_doc_text(params) if callable(side_doc_text) else side_doc_text)
        write(os.path.join(m, "eval", "q4_0.json"), json.dumps(eval_cell("q4_0", 16.5)))
        return os.path.join(m, "side", "side.json")

    @staticmethod
    def side_doc(params, klds=None, drop=None):
        klds = dict(SIDE_KLD, **(klds or {}))
        plans = [{"name": n, "next_token": {"kv": {"kld_mean": {"mean": v, "sd": 0.0, "per_seed": [v]}}}}
                 for n, v in klds.items() if n != drop]
        return json.dumps({"params": params, "seconds": 1.0, "command": "ratekv eval side", "note": None,
                           "report": {"plans": plans, "text": {"file": "calib.txt"}, "n_tokens": 2048}})

    def report(self, models="smollm2"):
        md, js = os.path.join(self.tmp.name, "p.md"), os.path.join(self.tmp.name, "p.json")
        for f in (md, js):
            if os.path.exists(f):
                os.remove(f)
        r = run("report", "--out", self.root, "--models", models, "--md", md, "--json", js)
        self.no_traceback(r)
        doc = text = None
        if os.path.exists(js):
            with open(js) as f:
                doc = strict_loads(f.read())
            with open(md) as f:
                text = f.read()
        return r, doc, text

    def fake_ratekv(self, body=None):
        """A fake `ratekv` that logs its call and writes a valid eval report of q8_0 (PPL 15.3) where --json says."""
        fake = os.path.join(self.tmp.name, "ratekv")
        calls = os.path.join(self.tmp.name, "calls.txt")
        write(fake, "#!" + sys.executable + "\n"
              "import json, sys, time\n"
              f"open({calls!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
              + (body or "") +
              "out = sys.argv[sys.argv.index('--json') + 1]\n"
              f"json.dump({eval_report('q8_0', 15.3)!r}, open(out, 'w'))\n")
        os.chmod(fake, os.stat(fake).st_mode | stat.S_IXUSR)
        return fake, calls

    # ---- 1: the side cell

    def test_side_cell_valid_gives_the_key_weight_by_hand(self):
        self.side_panel(lambda params: self.side_doc(params))
        r = run("run", "--out", self.root, "--models", "smollm2", "--only", "rq/plan/ratequant-kivi-2.5-kw$",
                "--dry-run")
        self.no_traceback(r)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        kw = side_key_weight_by_hand()
        self.assertIn(f"--key-weight {kw:.4g}", r.stdout)
        r, doc, text = self.report()
        self.assertEqual(r.returncode, 0, r.stderr)
        sc = doc["models"]["smollm2"]["ratequant_side_calibration"]
        self.assertAlmostEqual(sc["estimators"]["grad"]["key_weight"], kw, places=5)
        self.assertIn("RateQuant side calibration", text)
        r = run("status", "--out", self.root, "--models", "smollm2")
        self.assertIn("done  smollm2/side/eval\n", r.stdout)

    def test_side_cell_bad_input_is_named_and_unfinished(self):
        cases = {  # content -> what stderr must name
            "truncated": (lambda p: self.side_doc(p)[:70], "not valid JSON"),
            "empty object": (lambda p: "{}", "no field report"),
            "a side plan missing": (lambda p: self.side_doc(p, drop="vonly-kivi3"), "'vonly-kivi3'"),
            "KLD 0": (lambda p: self.side_doc(p, klds={"vonly-kivi2": 0.0}),
                      "report.plans[vonly-kivi2].next_token.kv.kld_mean.mean is 0.0; expected a positive finite"),
            "KLD NaN": (lambda p: self.side_doc(p, klds={"konly-kivi3": float("nan")}),
                        "report.plans[konly-kivi3].next_token.kv.kld_mean.mean is nan"),
        }
        for case, (content, named) in cases.items():
            with self.subTest(case):
                self.tmp.cleanup()
                self.setUp()
                side = self.side_panel(content)
                r = run("status", "--out", self.root, "--models", "smollm2")
                self.no_traceback(r)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn("----  smollm2/side/eval\n", r.stdout)
                self.assertNotIn("ratequant-kivi-2.5-kw", r.stdout)
                self.assertIn(side, r.stderr)
                self.assertIn(named, r.stderr)
                r = run("run", "--out", self.root, "--models", "smollm2", "--only", "side/eval|rq/plan", "--dry-run")
                self.no_traceback(r)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                self.assertIn("[run ] smollm2/side/eval", r.stdout)  # re-run
                self.assertNotIn("--key-weight", r.stdout)
                r, doc, text = self.report()
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn(side, r.stderr)
                self.assertNotIn("ratequant_side_calibration", doc["models"]["smollm2"])
                self.assertIn("smollm2/side/side.json", text)  # listed as left out

    # ---- 2, 11: run's exit status, --only matching nothing, an empty --md

    def test_run_fails_when_a_cell_fails(self):
        r = run("run", "--out", self.root, "--models", "smollm2", "--only", "^smollm2/eval/q(8|4)_0$",
                env={"RATEKV_BIN": os.path.join(self.tmp.name, "nonexistent"), "RATEKV_NICE": "0"})
        self.no_traceback(r)
        self.assertIn("[FAIL] smollm2/eval/q8_0", r.stdout)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("2 of 2 cells failed", r.stderr)
        fake, calls = self.fake_ratekv()  # one of two fails: still 1, and says which
        r = run("run", "--out", self.root, "--models", "smollm2", "--only", "^smollm2/eval/q(8|4)_0$",
                env={"RATEKV_BIN": fake, "RATEKV_NICE": "0", "RATEKV_ASSETS": os.path.join(self.tmp.name, "a")})
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertNotIn("failed", r.stderr)

    def test_only_matching_nothing_and_empty_output_paths(self):
        r = run("run", "--out", self.root, "--models", "smollm2", "--only", "zzz")
        self.no_traceback(r)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("no cell matches --only 'zzz'", r.stderr)
        self.assertIn("smollm2/calibrate", r.stderr)  # names some cells
        write(os.path.join(self.root, "smollm2", "eval", "q4_0.json"), json.dumps(eval_cell("q4_0", 16.5)))
        for flag in ("--md", "--json", "--png"):
            r = run("report", "--out", self.root, "--models", "smollm2", flag, "")
            self.no_traceback(r)
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
            self.assertIn(f"{flag}: an empty path", r.stderr)
            self.assertEqual(r.stdout, "")

    def test_run_fails_a_cell_whose_output_is_not_usable_once(self):
        # A fake `ratekv eval` that exits 0 with a report lacking report.plans.0.mae (which the report reads): the
        # cell is run once, fails (named, with the field), and `run` exits 1. The fake gives up after 3 calls so that
        # the old behaviour (re-running the cell forever) ends and fails this test instead of hanging it.
        fake, calls = self.fake_ratekv(
            f"if len(open({os.path.join(self.tmp.name, 'calls.txt')!r}).read().splitlines()) > 3: sys.exit(9)\n"
            "_dump = json.dump\n"
            "def dump(d, f):\n"
            "    d['plans'][0].pop('mae')\n"
            "    _dump(d, f)\n"
            "json.dump = dump\n")
        r = subprocess.run([sys.executable, SCRIPT, "run", "--out", self.root, "--models", "smollm2", "--only",
                            "^smollm2/eval/q(8|4)_0$"], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, RATEKV_BIN=fake, RATEKV_NICE="0"))
        self.no_traceback(r)
        with open(calls) as f:
            self.assertEqual(len(f.read().splitlines()), 2)  # one call per cell
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("[FAIL] smollm2/eval/q8_0: output not usable (not a finished eval cell (no field "
                      "report.plans.0.mae", r.stdout)
        self.assertIn("[FAIL] smollm2/eval/q4_0: output not usable", r.stdout)
        self.assertNotIn("[done]", r.stdout)
        self.assertIn("2 of 2 cells failed", r.stderr)
        self.assertIn(os.path.join(self.root, "smollm2", "eval", "q8_0.json"), r.stderr)
        r = run("status", "--out", self.root, "--models", "smollm2")
        self.assertIn("----  smollm2/eval/q8_0\n", r.stdout)

    def test_bad_plan_under_a_reseed_cell_fails_that_cell_only(self):
        m = os.path.join(self.root, "qwen05", "plans")
        group = {"kind": "tq-mse", "groups": [{"bits": 3, "seed": 12345}]}
        good = {"layers": [{"heads": [{"key": group, "value": {"kind": "fp16"}}]}]}
        write(os.path.join(m, "gtq+off-K3V3.json"), json.dumps(good))
        cases = {"no layers": ('{"name": "x"}', 'not a plan file'),
                 "truncated": ('{"layers": [{"heads', 'not a plan file'),
                 "heads not a list": ('{"layers": [{"heads": 7}]}', 'not a plan file'),
                 "no rotation seed": ('{"layers": [{"heads": [{"key": {"kind": "kivi"}, "value": {"kind": "kivi"}}]}]}',
                                      'no rotation seed to re-mix')}
        for case, (content, said) in cases.items():
            with self.subTest(case):
                bad = os.path.join(m, "gtq+off-K2V2.json")
                write(bad, content)
                for f in os.listdir(m):
                    if ".r1." in f:
                        os.remove(os.path.join(m, f))
                r = run("run", "--out", self.root, "--models", "qwen05", "--only",
                        r"^qwen05/reseed/gtq\+off-K(2V2|3V3)\.r1$", env={"RATEKV_NICE": "0"})
                self.no_traceback(r)
                self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
                self.assertIn(f"[FAIL] qwen05/reseed/gtq+off-K2V2.r1: reseed: {bad}: {said}", r.stdout)
                self.assertIn("1 of 2 cells failed: qwen05/reseed/gtq+off-K2V2.r1", r.stderr)
                self.assertFalse(os.path.exists(os.path.join(m, "gtq+off-K2V2.r1.json")))
                with open(os.path.join(m, "gtq+off-K3V3.r1.json")) as f:  # the other cell still ran
                    seed = json.load(f)["layers"][0]["heads"][0]["key"]["groups"][0]["seed"]
                self.assertNotEqual(seed, 12345)
                r = run("status", "--out", self.root, "--models", "qwen05")
                self.assertIn("done  qwen05/reseed/gtq+off-K3V3.r1\n", r.stdout)
                self.assertIn("----  qwen05/reseed/gtq+off-K2V2.r1\n", r.stdout)

    # ---- 10: Ctrl-C

    def test_interrupt_during_run(self):
        started = os.path.join(self.tmp.name, "started")
        fake, calls = self.fake_ratekv(f"open({started!r}, 'w').close()\ntime.sleep(60)\n")
        e = dict(os.environ, RATEKV_BIN=fake, RATEKV_NICE="0")
        p = subprocess.Popen([sys.executable, SCRIPT, "run", "--out", self.root, "--models", "smollm2", "--only",
                              "^smollm2/eval/q8_0$"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
        t0 = time.time()
        while not os.path.exists(started) and time.time() - t0 < 30:
            time.sleep(0.05)
        self.assertTrue(os.path.exists(started))
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 130, out + err)
        self.assertNotIn("Traceback", out + err)
        self.assertIn("interrupted; the current cell (smollm2/eval/q8_0.json) stays unfinished and is re-run next "
                      "time", err)
        self.assertFalse(os.path.exists(os.path.join(self.root, "smollm2", "eval", "q8_0.json")))
        self.assertFalse(os.path.exists(os.path.join(self.root, "smollm2", "eval", "q8_0.json.report")))
        r = run("status", "--out", self.root, "--models", "smollm2")
        self.assertIn("----  smollm2/eval/q8_0\n", r.stdout)

    def test_interrupt_during_status_and_report(self):
        """Ctrl-C while `status` / `report` reads a cell: exit 130 with one line, no traceback (as `run`). A FIFO as
        the cell file holds the command in its read until SIGINT comes (no timing guess: the writer end opens only
        once the command has opened the file)."""
        fifo = os.path.join(self.root, "smollm2", "eval", "q8_0.json")
        os.makedirs(os.path.dirname(fifo))
        os.mkfifo(fifo)
        for cmd in ("status", "report"):
            with self.subTest(cmd=cmd):
                p = subprocess.Popen([sys.executable, SCRIPT, cmd, "--out", self.root, "--models", "smollm2"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                t0, w = time.time(), None
                while w is None and time.time() - t0 < 30:
                    try:
                        w = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO until the command opens it to read
                    except OSError:
                        time.sleep(0.05)
                self.assertIsNotNone(w)
                try:
                    time.sleep(0.2)
                    p.send_signal(signal.SIGINT)
                    out, err = p.communicate(timeout=30)
                finally:
                    os.close(w)
                self.assertEqual(p.returncode, 130, out + err)
                self.assertNotIn("Traceback", out + err)
                lines = [ln for ln in err.splitlines() if ln.strip()]
                self.assertEqual(len(lines), 1, err)
                self.assertIn(f"quality_panel {cmd}: interrupted", lines[0])

    # ---- 3: the fp16 reference

    def test_failed_fp16_reference_makes_delta_ppl_unavailable(self):
        for ref, said in ((float("inf"), "inf"), (float("nan"), "nan"), ("16.0", '"16.0"'), (0.0, "0.0")):
            with self.subTest(ref=ref):
                doc = eval_cell("q4_0", 16.5)
                doc["report"]["fp16_cache"]["ppl"] = ref
                path = os.path.join(self.root, "smollm2", "eval", "q4_0.json")
                write(path, json.dumps(doc))
                write(os.path.join(self.root, "smollm2", "eval", "q8_0.json"), json.dumps(eval_cell("q8_0", 15.5)))
                r, out, text = self.report()
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn(path, r.stderr)
                self.assertIn(f"report.fp16_cache.ppl is {said}", r.stderr)
                rows = {row["plan"]: row for row in out["models"]["smollm2"]["rows"]}
                self.assertIsNone(rows["q4_0"]["ppl_rel"])
                self.assertIsNone(rows["q8_0"]["ppl_rel"])
                self.assertAlmostEqual(rows["q8_0"]["ppl"], 15.5)
                self.assertIsNone(rows["fp16"]["ppl"])
                line = [ln for ln in text.splitlines() if ln.startswith("| q8_0 ")][0]
                self.assertIn("| 15.500 | n/a (fp16 reference failed) |", line)
                self.assertNotIn("-100.0 %", text)
                self.assertNotIn("nan %", text)

    def test_unusable_fp16_reference_fields_are_named(self):
        # eval/q4_0.json's own row is whole (the fields eval_row reads) but its fp16 reference is not: it is named
        # with the field, and the reference comes from the next cell (q8_0, whose fp16 cache PPL is 15.0)
        edits = {"report.fp16_cache.ppl": lambda rep: rep.update(fp16_cache={}),
                 "report.fp16_cache is 5": lambda rep: rep.update(fp16_cache=5),
                 "report.fp.next_token": lambda rep: rep["fp"].pop("next_token")}
        for named, edit in edits.items():
            with self.subTest(named):
                doc = eval_cell("q4_0", 16.5)
                edit(doc["report"])
                path = os.path.join(self.root, "smollm2", "eval", "q4_0.json")
                write(path, json.dumps(doc))
                good = eval_cell("q8_0", 15.5)
                good["report"]["fp16_cache"]["ppl"] = 15.0
                write(os.path.join(self.root, "smollm2", "eval", "q8_0.json"), json.dumps(good))
                r, out, text = self.report()
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn(path, r.stderr)
                self.assertIn(named, r.stderr)
                rows = {row["plan"]: row for row in out["models"]["smollm2"]["rows"]}
                self.assertEqual(rows["fp16"]["ppl"], 15.0)
                self.assertEqual(rows["fp16"]["command"], "(reference of eval/q8_0.json)")
                self.assertAlmostEqual(rows["q4_0"]["ppl_rel"], 16.5 / 15.0 - 1)

    # ---- 4: reseeded runs

    def reseed_panel(self, r1=None, r2=None):
        """qwen05's gtq+off-K3V3 row: seed 0 (PPL 20), seeds 1 and 2 in evalr/ (PPL 22, 24), each edited by r1/r2."""
        m = os.path.join(self.root, "qwen05")
        paths = []
        for s, ppl, edit in ((0, 20.0, None), (1, 22.0, r1), (2, 24.0, r2)):
            doc = eval_cell("gtq+off-K3V3", ppl)
            doc["report"]["plans"][0]["deterministic"] = False
            if edit:
                edit(doc["report"]["plans"][0])
            path = os.path.join(m, "eval", "gtq+off-K3V3.json") if s == 0 else \
                os.path.join(m, "evalr", f"gtq+off-K3V3.r{s}.json")
            write(path, json.dumps(doc))
            paths.append(path)
        return paths

    def reseed_row(self):
        r, doc, text = self.report("qwen05")
        self.assertEqual(r.returncode, 0, r.stderr)
        return r, {row["plan"]: row for row in doc["models"]["qwen05"]["rows"]}["gtq+off-K3V3"], text

    def test_reseeded_runs(self):
        self.reseed_panel()
        r, row, _ = self.reseed_row()  # control: 3 seeds, mean 22, sample sd 2
        self.assertEqual(row["seeds"], 3)
        self.assertAlmostEqual(row["ppl"], 22.0)
        self.assertAlmostEqual(row["ppl_sd"], 2.0)
        # a missing ppl_kv: named; seeds from there on left out
        p = self.reseed_panel(r1=lambda pl: pl.pop("ppl_kv"))
        r, row, _ = self.reseed_row()
        self.assertIn(p[1], r.stderr)
        self.assertIn("ppl_kv", r.stderr)
        self.assertEqual(row["seeds"], 1)
        self.assertAlmostEqual(row["ppl"], 20.0)
        # other stored bits: excluded, both files named
        p = self.reseed_panel(r1=lambda pl: pl["stored"].update(k_bits_per_element=3.25))
        r, row, _ = self.reseed_row()
        self.assertIn(p[1], r.stderr)
        self.assertIn(p[0], r.stderr)
        self.assertIn("stored K bits 3.25 differ", r.stderr)
        self.assertEqual(row["seeds"], 2)
        self.assertAlmostEqual(row["ppl"], 22.0)  # seeds 0 and 2
        # a NaN seed: excluded and counted
        p = self.reseed_panel(r2=lambda pl: pl["ppl_kv"].update(mean=float("nan"), per_seed=[float("nan")]))
        r, row, text = self.reseed_row()
        self.assertIn(p[2], r.stderr)
        self.assertEqual(row["seeds"], 2)
        self.assertAlmostEqual(row["ppl"], 21.0)
        self.assertAlmostEqual(row["ppl_sd"], math.sqrt(2.0))
        self.assertEqual(row["ppl_status"], "1 of 3 seeds failed (perplexity not finite; left out)")
        self.assertNotIn("nan ± nan", text)
        self.assertIn("| 21.000 ± 1.414 (1 of 3 seeds failed", text)
        # another number of layers in a seed's per-layer MAE: excluded, both files named
        p = self.reseed_panel(r1=lambda pl: pl["mae"].update(layers_mean=[0.4, 0.6, 0.7]))
        r, row, _ = self.reseed_row()
        self.assertIn(p[1], r.stderr)
        self.assertIn("has 3 layers", r.stderr)
        self.assertEqual(row["seeds"], 2)
        self.assertEqual(len(row["mae_layers"]), 2)

    # ---- 5: wrong types in an eval cell

    def test_wrong_types_in_an_eval_cell(self):
        edits = {
            "report.plans.0.ppl_kv.mean": lambda pl: pl["ppl_kv"].update(mean="16.5"),
            "report.plans.0.next_token.kv.top1.mean": lambda pl: pl["next_token"]["kv"]["top1"].update(mean="0.9"),
            "report.plans.0.stored.k_bits_per_element": lambda pl: pl["stored"].update(k_bits_per_element=None),
        }
        for fieldname, edit in edits.items():
            with self.subTest(fieldname):
                doc = eval_cell("q8_0", 15.5, Q8_PARAMS)
                edit(doc["report"]["plans"][0])
                bad = os.path.join(self.root, "smollm2", "eval", "q8_0.json")
                write(bad, json.dumps(doc))
                write(os.path.join(self.root, "smollm2", "eval", "q4_0.json"), json.dumps(eval_cell("q4_0", 16.5)))
                r, out, text = self.report()
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn(bad, r.stderr)
                self.assertIn(fieldname, r.stderr)
                # a whole file with a bad field is not what an interrupted write leaves: not said to be
                self.assertNotIn("interrupted", r.stderr)
                self.assertIn("its cell counts as unfinished (`run` re-runs it)", r.stderr)
                plans = [row["plan"] for row in out["models"]["smollm2"]["rows"]]
                self.assertIn("q4_0", plans)
                self.assertNotIn("q8_0", plans)
                self.assertIn("smollm2/eval/q8_0.json", text)  # left out, said
                r = run("status", "--out", self.root, "--models", "smollm2")
                self.assertIn("----  smollm2/eval/q8_0\n", r.stdout)

    # ---- 9: one "finished" predicate

    def test_status_run_report_agree_on_a_cell_lacking_a_field(self):
        doc = eval_cell("q8_0", 15.5, Q8_PARAMS)
        del doc["report"]["plans"][0]["stored"]
        bad = os.path.join(self.root, "smollm2", "eval", "q8_0.json")
        write(bad, json.dumps(doc))
        r = run("status", "--out", self.root, "--models", "smollm2")
        self.no_traceback(r)
        self.assertIn("----  smollm2/eval/q8_0\n", r.stdout)
        self.assertIn(f"{bad}: not a finished eval cell (no field report.plans.0.stored)", r.stderr)
        r, _, text = self.report()  # report says the same of it
        self.assertIn(f"{bad}: not a finished eval cell (no field report.plans.0.stored)", r.stderr)
        self.assertIn("`smollm2/eval/q8_0.json` (not a finished eval cell", text)
        fake, calls = self.fake_ratekv()
        r = run("run", "--out", self.root, "--models", "smollm2", "--only", "^smollm2/eval/q8_0$",
                env={"RATEKV_BIN": fake, "RATEKV_NICE": "0"})
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(calls) as f:
            self.assertEqual(len(f.read().splitlines()), 1)  # re-run
        r = run("status", "--out", self.root, "--models", "smollm2")
        self.assertIn("done  smollm2/eval/q8_0\n", r.stdout)

    def test_cells_holding_null_or_a_list_and_truncated_plan_files(self):
        for content in ("null", "[1, 2]"):
            with self.subTest(content):
                bad = os.path.join(self.root, "smollm2", "eval", "q8_0.json")
                write(bad, content)
                write(os.path.join(self.root, "smollm2", "eval", "q4_0.json"), json.dumps(eval_cell("q4_0", 16.5)))
                for cmd in ("status", "report"):
                    r = run(cmd, "--out", self.root, "--models", "smollm2")
                    self.no_traceback(r)
                    self.assertEqual(r.returncode, 0, r.stderr)
                    self.assertIn(f"{bad}: not a JSON object", r.stderr)
        plan = os.path.join(self.root, "smollm2", "plans", "uniform-K3V3.json")
        write(plan, '{"layers": [{"heads": [')
        write(plan + ".params.json", json.dumps({"params": {"args": PLAN_ARGS}, "seconds": 1.0}))
        r = run("status", "--out", self.root, "--models", "smollm2")
        self.assertIn("----  smollm2/plan/uniform-K3V3\n", r.stdout)
        self.assertIn(plan + ": not valid JSON", r.stderr)
        write(plan, '{"layers": []}')  # control: the same cell with a whole plan file is done
        r = run("status", "--out", self.root, "--models", "smollm2")
        self.assertIn("done  smollm2/plan/uniform-K3V3\n", r.stdout)

    def test_unreadable_file_says_permission_not_interrupted(self):
        spec = importlib.util.spec_from_file_location("quality_panel", SCRIPT)
        qp = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(qp)
        err = io.StringIO()
        with mock.patch("builtins.open", side_effect=PermissionError(13, "Permission denied")), \
                mock.patch("sys.stderr", err):
            self.assertIsNone(qp.load_json("/panel/smollm2/eval/q8_0.json"))
        self.assertIn("/panel/smollm2/eval/q8_0.json: cannot be read (Permission denied)", err.getvalue())
        self.assertIn("permissions", err.getvalue())
        self.assertNotIn("interrupted", err.getvalue())

    def test_per_layer_mae_of_another_length_is_refused(self):
        a, b = eval_cell("gtq-K3V3", 16.0), eval_cell("uniform-K3V3", 16.5)
        b["report"]["plans"][0]["mae"]["layers_mean"] = [0.5, 0.7, 0.9]
        write(os.path.join(self.root, "smollm2", "eval", "gtq-K3V3.json"), json.dumps(a))
        write(os.path.join(self.root, "smollm2", "eval", "uniform-K3V3.json"), json.dumps(b))
        r, doc, _ = self.report()
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("uniform-K3V3.json) 3", r.stderr)
        self.assertEqual(doc["models"]["smollm2"]["mae_comparisons"], [])
        b["report"]["plans"][0]["mae"]["layers_mean"] = [0.5, 0.7]  # control: same length, compared
        write(os.path.join(self.root, "smollm2", "eval", "uniform-K3V3.json"), json.dumps(b))
        r, doc, _ = self.report()
        c = doc["models"]["smollm2"]["mae_comparisons"][0]
        self.assertEqual((c["a"], c["b"], c["layers_lower"], c["n_layers"]), ("gtq-K3V3", "uniform-K3V3", 2, 2))
        self.assertAlmostEqual(c["mean_reduction"], ((1 - 0.4 / 0.5) + (1 - 0.6 / 0.7)) / 2)


if __name__ == "__main__":
    unittest.main()
