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
  - a NaN perplexity: the JSON holds null (strictly valid JSON) with the row marked, the table says nan.
Synthetic cells only (no model, no ratekv run)."""
import json
import os
import stat
import subprocess
import sys
import tempfile
import unittest

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


def eval_cell(plan, ppl):
    return {"params": {"mode": "kv"}, "seconds": 1.0, "command": "ratekv eval --baseline " + plan,
            "report": eval_report(plan, ppl)}


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


if __name__ == "__main__":
    unittest.main()
