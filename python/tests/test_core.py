"""Core API: plans, the allocators through the binding, fake quantization, the custom ops
under torch.compile (CPU). References: the CLI (`ratekv plan` on the same statistics, the same
C++ allocators: checks the binding passes every request field), TurboQuant-MSE's closed-form
distortion (docs/design.md §2), eager execution of the same ops."""

import json
import subprocess

import numpy as np
import pytest
import torch
from conftest import cli_path

import ratekv
from ratekv.ops import PackedKVCache


def small_config(head_dim=64, n_layers=2, n_heads=4, n_kv=2, layout=ratekv.RopeLayout.neox):
    c = ratekv.ModelConfig()
    c.arch, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim = "llama", n_layers, n_heads, n_kv, head_dim
    c.d_model, c.d_ff, c.n_vocab, c.n_ctx_train, c.rope_theta, c.rms_eps = 256, 512, 100, 4096, 1e4, 1e-5
    c.rope_layout = layout
    return c


def test_plan_round_trip_and_bad_fields(tmp_path):
    plan = ratekv.uniform_plan(small_config(), 3, 2)
    assert plan.achieved["k_code"] == 3 and plan.achieved["v_code"] == 2
    p = tmp_path / "p.json"
    ratekv.save_plan(plan, p)
    back = ratekv.load_plan(p)
    assert json.loads(back.to_json()) == json.loads(plan.to_json())
    j = json.loads(plan.to_json())
    j["layers"][1]["heads"][0]["key"]["groups"][0]["bits"] = 9
    with pytest.raises(ratekv.RatekvError, match=r"layers\[1\]\.heads\[0\]\.key\.groups\[0\]\.bits"):
        ratekv.Plan.from_json(json.dumps(j), "edited.json")
    with pytest.raises(ratekv.RatekvError, match="nope.json"):
        ratekv.load_plan(tmp_path / "nope.json")


@pytest.mark.parametrize("method,args", [
    ("block-gtq", ["--kbits", "3.25", "--vbits", "2.25"]),
    ("ratequant", ["--bits", "2.5", "--quantizer", "tq-mse", "--budget-unit", "code"]),
    ("ratequant+block-gtq", ["--bits", "3", "--budget-unit", "code", "--seed", "7"]),
    ("uniform", ["--kbits", "4", "--vbits", "2", "--budget-unit", "code", "--quantizer", "kivi", "--group-size", "16"]),
])
def test_make_plan_equals_cli(smol_cli_stats, tmp_path, method, args):
    stats, _, _ = smol_cli_stats
    out = tmp_path / "cli.plan.json"
    subprocess.run([str(cli_path()), "plan", "--method", method, "--stats", str(stats), *args, "-o", str(out)],
                   check=True, capture_output=True)
    kw = {"--kbits": "k_bits", "--vbits": "v_bits", "--bits": "avg_bits", "--quantizer": "quantizer",
          "--budget-unit": "budget_unit", "--seed": "seed", "--group-size": "group_size"}
    opts = {kw[a]: v for a, v in zip(args[::2], args[1::2])}
    for k in ("k_bits", "v_bits", "avg_bits"):
        if k in opts:
            opts[k] = float(opts[k])
    for k in ("seed", "group_size"):
        if k in opts:
            opts[k] = int(opts[k])
    plan = ratekv.make_plan(stats, method, **opts)
    assert json.loads(plan.to_json()) == json.loads(out.read_text())


def test_missing_curves_named():
    st = ratekv._core.identity_stats(small_config())
    with pytest.raises(ratekv.RatekvError, match="curves|sensitiv"):
        ratekv.make_plan(st, "ratequant", avg_bits=3.0)


@pytest.mark.parametrize("d,bits", [(64, 2), (128, 3), (256, 1)])
def test_fake_quantize_distortion_matches_closed_form(d, bits):
    """E‖x − x̂‖² / ‖x‖² of TQ-MSE equals the Lloyd–Max unit-vector distortion D(d, b) (docs/design.md §2;
    the fp16 norm adds ≤ 2^-22 relative). 2000 Gaussian vectors per head: the mean's relative
    standard error is ≈ 1/sqrt(2000·d)·(a few) < 3 %; bound 8 %."""
    cfg = small_config(head_dim=d)
    plan = ratekv.uniform_plan(cfg, bits, bits)
    c = ratekv.codecs(plan, cfg)
    x = torch.randn(2000, 2, d, generator=torch.Generator().manual_seed(d))
    for side in ("key", "value"):
        xh = ratekv.fake_quantize(x, c, 1, side)
        assert xh.dtype == x.dtype and xh.shape == x.shape
        rel = (((x - xh) ** 2).sum(-1) / (x ** 2).sum(-1)).mean().item()
        D = ratekv._core.lloyd_max_distortion(d, bits)
        assert abs(rel / D - 1) < 0.08, (side, rel, D)
    with pytest.raises(ratekv.RatekvError, match="non-finite"):
        x[5, 1, 3] = float("nan")
        ratekv.fake_quantize(x, c, 0, "key")
    with pytest.raises(ratekv.RatekvError, match="shape"):
        ratekv.fake_quantize(torch.zeros(3, 5, d), c, 0, "key")


def test_ops_under_torch_compile_match_eager():
    cfg = small_config(head_dim=128, n_heads=6, n_kv=2)
    plan = ratekv.uniform_plan(cfg, 3, 3)
    g = torch.Generator().manual_seed(0)
    k = torch.randn(2, 70, 2, 128, generator=g)
    v = torch.randn(2, 70, 2, 128, generator=g)
    q = torch.randn(2, 6, 128, generator=g)
    k1 = torch.randn(2, 1, 2, 128, generator=g)

    def step(cache, q, k1, v1):
        cache.append(0, k1, v1)
        return cache.decode_attention(0, q * 1.5) + 1.0

    eager = PackedKVCache(plan, cfg, 2, 256)
    eager.append(0, k, v)
    ref = step(eager, q, k1, k1)
    comp = PackedKVCache(plan, cfg, 2, 256)
    comp.append(0, k, v)
    fn = torch.compile(step, backend="aot_eager", fullgraph=True)
    out = fn(comp, q, k1, k1)
    assert torch.equal(out, ref)
    assert comp.seq_lens[0].tolist() == [71, 71]
    torch.library.opcheck(torch.ops.ratekv.decode_attention.default, (comp.seq_lens[0], q, comp.handle, 0, 0.1))


def test_decode_attention_against_dense_softmax():
    """8-bit plan: decode attention from the codes vs softmax(q·Kᵀ)V over the original K/V in float64;
    the difference is the 8-bit reconstruction error (relative ≈ sqrt(D_8) ≈ 0.6 %): bound 3 % of |out|."""
    cfg = small_config(head_dim=64, n_heads=7, n_kv=1)
    plan = ratekv.uniform_plan(cfg, 8, 8)
    g = torch.Generator().manual_seed(2)
    k = torch.randn(1, 97, 1, 64, generator=g)
    v = torch.randn(1, 97, 1, 64, generator=g)
    q = torch.randn(1, 7, 64, generator=g)
    c = PackedKVCache(plan, cfg, 1, 128)
    c.append(1, k, v)
    out = c.decode_attention(1, q, 0.125)
    s = (q[0].double() @ k[0, :, 0].double().T) * 0.125
    ref = torch.softmax(s, -1) @ v[0, :, 0].double()
    err = (out[0].double() - ref).norm() / ref.norm()
    assert err < 0.03, err
    with pytest.raises(ratekv.RatekvError, match="capacity"):
        c.append(1, torch.zeros(1, 40, 1, 64), torch.zeros(1, 40, 1, 64))


def test_type_stub_lists_the_extension():
    """python/ratekv/_core.pyi (nanobind.stubgen output, committed) names every public member of the
    built extension: regenerate it with `python -m nanobind.stubgen -m ratekv._core -o python/ratekv/_core.pyi`."""
    import pathlib
    import re

    stub = (pathlib.Path(__file__).resolve().parents[1] / "ratekv" / "_core.pyi").read_text()
    declared = {a or b for a, b in re.findall(r"^(?:class|def) (\w+)|^(\w+):", stub, re.M)}
    public = {n for n in dir(ratekv._core) if not n.startswith("_")}
    assert public <= declared, public - declared
