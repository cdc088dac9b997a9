"""The examples under python/examples run as README.md gives them (a change of the API's argument checks broke
generate_packed.py's default run once, unnoticed: calibrate refused its sens_seqs without sensitivity)."""

import os
import pathlib
import subprocess
import sys

import ratekv
from conftest import ROOT, assets_dir, smollm2_path


def run_example(name: str, *args: str) -> str:
    env = dict(os.environ)
    # The package the tests import (an install or PYTHONPATH=<build>/python), for the child too.
    pkg_parent = str(pathlib.Path(ratekv.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, env.get("PYTHONPATH", "")) if p)
    env["RATEKV_ASSETS"] = str(assets_dir())
    r = subprocess.run([sys.executable, str(ROOT / "python" / "examples" / name), *args], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_generate_packed_example_default_run():
    smollm2_path()  # skips without the asset
    out = run_example("generate_packed.py", "--calib-tokens", "256", "--new-tokens", "4")
    assert "plan: block-gtq, achieved 3.2" in out, out
    packed = next(line for line in out.splitlines() if line.startswith("packed :"))
    assert len(packed) > len("packed : ''"), out  # some text was generated from the packed cache
    assert "packed cache " in out and "an fp16 cache: " in out, out
