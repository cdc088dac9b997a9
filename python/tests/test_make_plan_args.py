"""make_plan's arguments against ``ratekv plan``'s (issue 22's adversarial pass): what the CLI refuses, the
binding refuses, naming the argument; what the CLI accepts, the binding accepts, through the same library call.

  - ``seed`` / ``group_size`` for codecs that do not use them were ignored silently: refused, as the CLI refuses
    --seed / --group-size (and accepted for the codecs that use them, changing the plan);
  - ``make_plan(None)`` failed with nanobind's signature mismatch: a TypeError naming ``stats``;
  - a JSON statistics file (format "ratekv-calib-stats") was refused as "not a safetensors statistics file" while
    ``ratekv plan --stats x.json`` accepts it: accepted, and the plan equals the CLI's on the same file.

Needs neither torch nor a model (JSON statistics written here); the CLI comparison skips without the built CLI."""

import json
import os
import pathlib
import subprocess

import pytest
import torch

import ratekv
from ratekv import RatekvError

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Two layers, one KV head, head_dim 64 (32 RoPE blocks, energies falling with the block index), grad
# sensitivities and TQ-MSE curves: JSON statistics of format/calib_stats.h.
STATS = {
    "format": "ratekv-calib-stats", "version": 1,
    "model": {"arch": "llama", "n_layers": 2, "n_kv_heads": 1, "head_dim": 64, "rope_layout": "interleaved"},
    "q_block_energy": [[[4.0 / (1 + i) for i in range(32)]], [[2.0 / (1 + i) for i in range(32)]]],
    "k_block_energy": [[[1.0 + 0.1 * i for i in range(32)]], [[0.5 for _ in range(32)]]],
    "sensitivity": {"grad": {"k": [[2.0], [1.0]], "v": [[1.0], [3.0]]}},
    "curves": {"tq-mse": {"bits": [1, 2, 3, 4, 5], "beta_k": 3.5, "beta_v": 3.5, "alpha_k": [[1.0], [2.0]],
                          "alpha_v": [[1.0], [0.5]]}},
}


@pytest.fixture
def stats_json(tmp_path):
    p = tmp_path / "stats.json"
    p.write_text(json.dumps(STATS))
    return p


def cli():
    p = pathlib.Path(os.environ.get("RATEKV_CLI", ROOT / "build" / "bin" / "ratekv"))
    if not p.is_file():
        pytest.skip(f"ratekv CLI not built at {p} (set RATEKV_CLI)")
    return p


def uniform(path, **kw):
    return ratekv.make_plan(path, "uniform", k_bits=3, v_bits=3, budget_unit="code", **kw)


@pytest.mark.parametrize("kw,msg", [
    (dict(quantizer="kivi", seed=7),
     "make_plan: seed: not used by method uniform with quantizer kivi: it seeds the rotations of tq-mse, block-gtq "
     "and quarot codecs"),
    (dict(quantizer="q8_0", v_quantizer="kivi", seed=0),  # given at its default value: still given
     "make_plan: seed: not used by method uniform with quantizer q8_0 v_quantizer kivi: it seeds the rotations"),
    (dict(group_size=16),
     "make_plan: group_size: not used by method uniform with quantizer tq-mse: it is the scale group of kivi and "
     "quarot codecs"),
    (dict(quantizer="q8_0", group_size=32),
     "make_plan: group_size: not used by method uniform with quantizer q8_0: it is the scale group"),
])
def test_codec_arguments_the_codecs_do_not_use_are_refused(stats_json, kw, msg):
    with pytest.raises(RatekvError) as e:
        uniform(stats_json, **kw)
    assert str(e.value).startswith(msg), str(e.value)


def test_block_gtq_refuses_group_size_and_takes_seed(stats_json):
    with pytest.raises(RatekvError, match=r"^make_plan: group_size: not used by method block-gtq: it is the scale "
                                          r"group of kivi and quarot codecs$"):
        ratekv.make_plan(stats_json, "block-gtq", k_bits=3, v_bits=3, group_size=16)
    a = ratekv.make_plan(stats_json, "block-gtq", k_bits=3, v_bits=3, seed=1)
    b = ratekv.make_plan(stats_json, "block-gtq", k_bits=3, v_bits=3, seed=2)
    assert a.to_json() != b.to_json()  # the seed is used: it changes the plan


def test_codec_arguments_the_codecs_use_change_the_plan(stats_json):
    # seed for tq-mse and quarot, group_size for kivi and quarot (in either side's quantizer).
    assert uniform(stats_json, seed=1).to_json() != uniform(stats_json, seed=2).to_json()
    assert "quarot" in uniform(stats_json, quantizer="quarot", seed=5, group_size=4).to_json()
    k16 = uniform(stats_json, quantizer="tq-mse", v_quantizer="kivi", group_size=16)
    k32 = uniform(stats_json, quantizer="tq-mse", v_quantizer="kivi")
    assert k16.to_json() != k32.to_json()
    # Not given: the defaults (seed 0, group_size 32) as before, for every quantizer.
    for q, b in (("kivi", 3), ("quarot", 3), ("q8_0", 8), ("q4_0", 4), ("tq-mse", 3), ("fp16", 16)):
        ratekv.make_plan(stats_json, "uniform", k_bits=b, v_bits=b, budget_unit="code", quantizer=q)
    assert uniform(stats_json).to_json() == uniform(stats_json, seed=0).to_json()


@pytest.mark.parametrize("kw,msg", [
    (dict(method=None), r"^make_plan: method = None: expected a string$"),
    (dict(quantizer=None), r"^make_plan: quantizer = None: expected a string$"),
    (dict(v_quantizer=3), r"^make_plan: v_quantizer = 3: expected a string$"),
    (dict(budget_unit=None), r"^make_plan: budget_unit = None: expected a string$"),
    (dict(curves_from=None), r"^make_plan: curves_from = None: expected a string$"),
    (dict(sensitivity=b"grad"), r"^make_plan: sensitivity = b'grad': expected a string$"),
    (dict(k_bits=None), r"^make_plan: k_bits = None: expected a number$"),
    (dict(v_bits="3"), r"^make_plan: v_bits = '3': expected a number$"),
    (dict(avg_bits=True), r"^make_plan: avg_bits = True: expected a number$"),
    (dict(k_bits=10**400), r"^make_plan: k_bits = 10+: expected a number in the float range$"),
])
def test_names_and_budgets_of_another_type_are_refused_naming_the_argument(stats_json, kw, msg):
    """None or another type for a name or a budget used to reach the binding (nanobind's TypeError names no
    argument) or float() ("float() argument must be ... not 'NoneType'")."""
    args = dict(k_bits=3, v_bits=3, budget_unit="code")
    args.update(kw)
    method = args.pop("method", "uniform")
    with pytest.raises(RatekvError, match=msg):
        ratekv.make_plan(stats_json, method, **args)


def test_numpy_scalar_decimal_and_fraction_budgets_are_accepted(stats_json):
    import decimal
    import fractions

    np = pytest.importorskip("numpy")
    a = ratekv.make_plan(stats_json, "uniform", k_bits=np.float32(3), v_bits=np.array(3.0), budget_unit="code")
    assert a.to_json() == uniform(stats_json).to_json()
    b = ratekv.make_plan(stats_json, "uniform", k_bits=decimal.Decimal(3), v_bits=fractions.Fraction(3),
                         budget_unit="code")
    assert b.to_json() == uniform(stats_json).to_json()


@pytest.mark.parametrize("bad", [None, 3, b"stats.json", ["stats.json"]])
def test_stats_of_another_type_is_a_type_error_naming_it(bad):
    with pytest.raises(TypeError, match=rf"^make_plan: stats is {type(bad).__name__}; expected a KVStats, a "
                                        r"CalibStats or the path of a statistics file"):
        ratekv.make_plan(bad, "uniform")


def test_json_statistics_are_read_as_the_cli_reads_them(stats_json, tmp_path):
    for p in (stats_json, str(stats_json)):
        plan = ratekv.make_plan(p, "ratequant", avg_bits=3.0, budget_unit="code")
        assert plan.method == "ratequant"
    # The same plan as `ratekv plan --stats stats.json`.
    out = tmp_path / "cli.plan.json"
    r = subprocess.run([str(cli()), "plan", "--method", "ratequant", "--bits", "3", "--budget-unit", "code",
                        "--seed", "5", "--stats", str(stats_json), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    plan = ratekv.make_plan(stats_json, "ratequant", avg_bits=3.0, budget_unit="code", seed=5)
    assert json.loads(plan.to_json()) == json.loads(out.read_text())
    # And both refuse the same bad JSON statistics with the same message (the file named).
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(dict(STATS, format="something-else")))
    r = subprocess.run([str(cli()), "plan", "--method", "block-gtq", "--stats", str(bad), "-o",
                        str(tmp_path / "x.json")], capture_output=True, text=True)
    assert r.returncode != 0
    with pytest.raises(RatekvError) as e:
        ratekv.make_plan(bad, "block-gtq")
    assert "bad.json" in str(e.value)
    assert f"error: {e.value}" in r.stdout + r.stderr, (str(e.value), r.stdout + r.stderr)


@pytest.mark.parametrize("method", ["ratequant", "uniform"])
@pytest.mark.parametrize("kw,named", [
    (dict(k_bits=5, v_bits=1), "k_bits, v_bits: conflict"),
    (dict(k_bits=3.0), "k_bits: conflicts"),  # given at the default value: still given
    (dict(v_bits=2), "v_bits: conflicts"),
])
def test_avg_bits_beside_k_bits_or_v_bits_is_refused(stats_json, method, kw, named):
    """avg_bits given with k_bits / v_bits used to win silently (the plan equalled avg_bits alone, whatever the
    per-side budgets): refused naming both arguments, as ``ratekv plan`` refuses --bits with --kbits / --vbits."""
    with pytest.raises(RatekvError) as e:
        ratekv.make_plan(stats_json, method, avg_bits=3.0, budget_unit="code", **kw)
    assert str(e.value) == (f"make_plan: {named} with avg_bits (the average budget of keys and values); give "
                            "avg_bits alone, or k_bits and v_bits"), str(e.value)


def test_avg_bits_alone_and_k_bits_v_bits_alone_are_accepted(stats_json):
    # ratequant's average defaults to (k_bits + v_bits) / 2 (docs/design.md §4.4): K4V2 alone is avg_bits 3.
    avg = ratekv.make_plan(stats_json, "ratequant", avg_bits=3.0, budget_unit="code")
    kv = ratekv.make_plan(stats_json, "ratequant", k_bits=4, v_bits=2, budget_unit="code")
    assert json.loads(avg.to_json()) == json.loads(kv.to_json())
    assert ratekv.make_plan(stats_json, "uniform", avg_bits=3.0, budget_unit="code").method == "uniform"


def test_group_size_is_named_as_the_argument_of_the_function_called():
    # head_dim 16: kivi's default scale group of 32 does not divide it. The allocator's message named
    # PlanRequest.group_size, which neither uniform_plan (it had no group_size) nor calibrate takes.
    from conftest import tiny_model

    m = tiny_model("llama", 16, 4, 2)
    cfg = ratekv.model_config(m.config)
    with pytest.raises(ratekv.RatekvError, match=r"^uniform_plan: group_size = 32: expected a divisor of head_dim 16 "
                                                  r"for kivi"):
        ratekv.uniform_plan(cfg, 3, 3, quantizer="kivi")
    assert json.loads(ratekv.uniform_plan(cfg, 3, 3, quantizer="kivi", group_size=8).to_json())["layers"][0]["heads"][0]["key"][
        "group_size"] == 8
    with pytest.raises(ratekv.RatekvError, match=r"^make_plan: group_size = 5: expected a divisor of head_dim 16"):
        ratekv.make_plan(ratekv._core.identity_stats(cfg), "uniform", quantizer="kivi", group_size=5, budget_unit="code")
    with pytest.raises(ratekv.RatekvError, match=r"^calibrate: curves: kivi quantizes in scale groups of 32 channels, "
                                                  r"which must divide head_dim; this model's head_dim is 16"):
        ratekv.calibrate(m, token_ids=torch.arange(100), ctx=64, curves="kivi,tq-mse", curve_bits=[2, 3])
