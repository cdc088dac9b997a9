"""ratekv.calibrate() against `ratekv calibrate`.

SmolLM2-135M (GGUF Q4_1) is loaded twice: by the C++ runtime (the CLI) and by transformers'
GGUF loader (dequantized to fp32; transformers un-permutes Q/K into its half-split order). On the
same token ids (ratekv's tokenizer: transformers' GGUF tokenizer splits digits differently) the
statistics must agree up to that channel permutation (GGUF channel 2i+j = HF channel j·d/2 + i)
and fp32 rounding: the two runtimes differ in summation order and RoPE angles (ratekv in double,
transformers in fp32), measured ≤ 4e-4 relative on the pre-RoPE key covariance and ≤ 2e-4 on the
squared gradients; bounds 2e-3 and 1e-3 (relative to max(|x|, 1e-3·max|x|))."""

import os
import subprocess

import numpy as np
import pytest
import torch
from conftest import cli_path, smollm2_path, tiny_model

import ratekv

PERMUTED = ("k_pre_mean", "q_pre_sq", "grad_sq_k_pre", "grad_sq_k_post")


def hf_to_gguf(d):
    """perm[c] = the HF channel holding GGUF channel c (llama)."""
    p = np.empty(d, dtype=np.int64)
    p[0::2] = np.arange(d // 2)
    p[1::2] = np.arange(d // 2) + d // 2
    return p


@pytest.fixture(scope="module")
def smol_hf():
    pytest.importorskip("gguf")
    from transformers import AutoModelForCausalLM

    g = smollm2_path()
    return AutoModelForCausalLM.from_pretrained(str(g.parent), gguf_file=g.name, dtype=torch.float32).eval()


def test_same_statistics_as_cli(smol_hf, smol_cli_stats, tmp_path):
    stats_path, text, ids = smol_cli_stats
    out = tmp_path / "py_stats.safetensors"
    st = ratekv.calibrate(smol_hf, token_ids=ids, n_tokens=160, ctx=80, sensitivity=True, sens_seqs=2, sens_len=48,
                          curves=["tq-mse", "block-gtq"], curve_bits=[1, 2, 3, 4], output=out, text_file=text)
    cli = ratekv.load_stats(stats_path)
    assert (st.rope_layout, cli.rope_layout) == ("neox", "interleaved")
    assert st.n_tokens == cli.n_tokens == 160 and st.ctx == 80 and st.grad_n_sequences == 2
    assert st.text_sha256 == cli.text_sha256
    assert st.grad_mean_loss == pytest.approx(cli.grad_mean_loss, rel=1e-4)
    perm = hf_to_gguf(64)
    bounds = {"k_pre_cov": 2e-3, "grad_sq_k_pre": 1e-3, "grad_sq_k_post": 1e-3, "grad_sq_v": 1e-3}
    for name in ("q_block_energy", "k_block_energy", "k_pre_mean", "k_pre_cov", "q_pre_sq", "v_sq",
                 "grad_sq_k_pre", "grad_sq_k_post", "grad_sq_v"):
        a, b = st.tensor(name), cli.tensor(name)
        if name in PERMUTED:
            a = a[..., perm]
        if name == "k_pre_cov":
            a = a[..., perm, :][..., perm]
        assert a.shape == b.shape, name
        rel = np.abs(a - b) / (np.abs(b) + 1e-3 * np.abs(b).max())
        assert rel.max() <= bounds.get(name, 1e-4), (name, rel.max())
    # Distortion curves. Values are not permuted by RoPE layouts, and Block-GTQ's key groups list
    # (a_i, b_i) of their blocks in block order — the same values in either layout: those MSEs agree
    # to fp32 rounding. TQ-MSE keys rotate the whole head in channel order, which differs between the
    # layouts: the same distortion in expectation only (160 tokens × 64 channels: within 15 %).
    for q in ("tq-mse", "block-gtq"):
        a, b = st.curve(q), cli.curve(q)
        assert a["bits"] == b["bits"] == [1, 2, 3, 4]
        np.testing.assert_allclose(a["mse_v"], b["mse_v"], rtol=1e-4)
        if q == "block-gtq":
            np.testing.assert_allclose(a["mse_k"], b["mse_k"], rtol=1e-3)
            assert a["beta_k"] == pytest.approx(b["beta_k"], rel=1e-4)
        else:
            ratio = a["mse_k"].mean(axis=(0, 1)) / b["mse_k"].mean(axis=(0, 1))
            assert np.all(np.abs(ratio - 1) < 0.15), ratio
        assert a["beta_v"] == pytest.approx(b["beta_v"], rel=1e-4)
    rq = ratekv.make_plan(st, "ratequant", avg_bits=3.0, budget_unit="code")
    assert rq.rope_layout == "neox" and rq.achieved["k_code"] + rq.achieved["v_code"] == pytest.approx(6.0)
    # The Python-written file is the CLI's format: `ratekv plan` reads it.
    back = ratekv.load_stats(out)
    assert np.array_equal(back.tensor("k_pre_cov"), st.tensor("k_pre_cov").astype(np.float32).astype(np.float64))
    plan_out = tmp_path / "p.json"
    subprocess.run([str(cli_path()), "plan", "--method", "block-gtq", "--stats", str(out), "--kbits", "3",
                    "--vbits", "3", "-o", str(plan_out)], check=True, capture_output=True)
    plan = ratekv.load_plan(plan_out)
    assert plan.rope_layout == "neox"
    ratekv.hf.PackedCache(plan, smol_hf.config)  # accepted on the HF model


def test_gguf_plan_refused_on_hf_model(smol_hf, smol_cli_stats):
    stats_path, _, _ = smol_cli_stats
    plan = ratekv.make_plan(stats_path, "block-gtq", k_bits=3, v_bits=3)
    assert plan.rope_layout == "interleaved"
    with pytest.raises(ratekv.RatekvError, match="rope_layout"):
        ratekv.hf.PackedCache(plan, smol_hf.config)
    cli = ratekv.load_stats(stats_path)
    with pytest.raises(ratekv.RatekvError, match="rope_layout"):
        cli.validate_against(ratekv.model_config(smol_hf.config))


def test_calibrate_bad_input(tmp_path):
    m = tiny_model("llama", 64, 4, 2)
    ids = torch.arange(50) % 300
    with pytest.raises(ratekv.RatekvError, match="no calibration tokens|texts"):
        ratekv.calibrate(m)
    with pytest.raises(ratekv.RatekvError, match="sensitivity reads 4 × 20"):
        ratekv.calibrate(m, token_ids=ids, sensitivity=True, sens_seqs=4, sens_len=20)
    with pytest.raises(ratekv.RatekvError, match="ctx"):
        ratekv.calibrate(m, token_ids=ids, ctx=5000)
    existing = tmp_path / "x.safetensors"
    existing.write_bytes(b"")
    with pytest.raises(ratekv.RatekvError, match="exists"):
        ratekv.calibrate(m, token_ids=ids, output=existing)
    with torch.no_grad():
        m.model.layers[0].self_attn.v_proj.weight[0, 0] = float("nan")
    with pytest.raises(ratekv.RatekvError, match="layer 0: v has non-finite"):
        ratekv.calibrate(m, token_ids=ids)
    assert m.config._attn_implementation == "sdpa"  # restored after the error


def test_curves_on_a_tiny_model_match_a_per_head_reference():
    """calibrate(curves=...) feeds the attention's post-RoPE K and V to the C++ DistortionAccumulator.
    Reference, independent of its capture and sums: K/V recomputed here from the model's weights
    (hidden states → input_layernorm → k_proj/v_proj → RoPE), each chunk quantized by
    ratekv.fake_quantize with the plan the curve stands for (uniform, code bits), and
    Σ‖x − x̂‖² / (N·head_dim) per (layer, KV head). Chunks of 40 + 40 + 17 tokens, GQA 4/2."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    m = tiny_model("llama", 64, 4, 2)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 320, (97,), generator=g)
    st = ratekv.calibrate(m, token_ids=ids, ctx=40, curves=["tq-mse", "kivi"], curve_bits=[2, 1, 3])
    rc = ratekv.model_config(m.config)
    L, Hk, d = rc.n_layers, rc.n_kv_heads, rc.head_dim
    sq = {(q, b): np.zeros((2, L, Hk)) for q in ("tq-mse", "kivi") for b in (1, 2, 3)}
    codecs = {(q, b): ratekv.codecs(ratekv.uniform_plan(rc, b, b, quantizer=q), rc)
              for q in ("tq-mse", "kivi") for b in (1, 2, 3)}
    with torch.no_grad():
        for s in range(0, 97, 40):
            chunk = ids[s:s + 40].unsqueeze(0)
            n = chunk.shape[1]
            pos = torch.arange(n).unsqueeze(0)
            hs = m(input_ids=chunk, position_ids=pos, output_hidden_states=True).hidden_states
            for li, layer in enumerate(m.model.layers):
                x = layer.input_layernorm(hs[li])
                att = layer.self_attn
                k = att.k_proj(x).view(1, n, Hk, d).transpose(1, 2)
                v = att.v_proj(x).view(1, n, Hk, d).transpose(1, 2)
                cos, sin = m.model.rotary_emb(x, pos)
                _, k = apply_rotary_pos_emb(k, k, cos, sin)
                for side, t in ((0, k), (1, v)):
                    rows = t[0].transpose(0, 1).contiguous().numpy()  # (n, Hk, d)
                    for (q, b), c in codecs.items():
                        xh = ratekv.fake_quantize(rows, c, li, "key" if side == 0 else "value")
                        sq[(q, b)][side, li] += ((rows.astype(np.float64) - xh) ** 2).sum(axis=(0, 2))
    for q in ("tq-mse", "kivi"):
        cur = st.curve(q)
        assert cur["bits"] == [1, 2, 3]
        for j, b in enumerate((1, 2, 3)):
            want = sq[(q, b)] / (97 * d)
            np.testing.assert_allclose(cur["mse_k"][..., j], want[0], rtol=2e-4, err_msg=f"{q} K b{b}")
            np.testing.assert_allclose(cur["mse_v"][..., j], want[1], rtol=2e-4, err_msg=f"{q} V b{b}")
        assert cur["beta_k"] > 1 and cur["beta_v"] > 1
    # The library's CurveMeasureOptions.bits / .quantizers, named as calibrate's arguments.
    with pytest.raises(ratekv.RatekvError, match=r"^calibrate: curve_bits: widths must be distinct"):
        ratekv.calibrate(m, token_ids=ids, ctx=40, curves=["tq-mse"], curve_bits=[2, 2, 3])
    with pytest.raises(ratekv.RatekvError, match=r'^calibrate: curves "tq-prod": expected kivi, quarot'):
        ratekv.calibrate(m, token_ids=ids, ctx=40, curves=["tq-prod"])


def test_calibrate_texts_with_hf_tokenizer_matches_token_ids():
    class Tok:  # stands for a transformers tokenizer: __call__ → {"input_ids": [...]}
        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": [1] + [ord(c) % 300 for c in text]}

    m = tiny_model("qwen2", 128, 4, 2)
    a = ratekv.calibrate(m, Tok(), ["hello world", "more text here"], ctx=7)
    ids = [1] + [ord(c) % 300 for c in "hello world"] + [1] + [ord(c) % 300 for c in "more text here"]
    b = ratekv.calibrate(m, token_ids=ids, ctx=7)
    assert a.n_tokens == len(ids)
    assert np.array_equal(a.tensor("k_pre_cov"), b.tensor("k_pre_cov"))
