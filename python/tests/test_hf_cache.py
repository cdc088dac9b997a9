"""ratekv.hf.PackedCache on tiny random transformers models (Llama, Qwen2; head_dim 64/128/256;
GQA 1/2/3/7; prompts of 1, 33, 65, 97 tokens — inside one page, across pages of 64).

Each run is teacher-forced: the prompt, then 8 fixed tokens one at a time; the logits of
the prompt's last token and of every step are compared.

* 8-bit plan vs DynamicCache. Bound: a packed cache changes the logits through the K/V
  reconstruction error, whose relative RMS is sqrt(D_b) with D_b the TurboQuant-MSE unit-vector
  distortion at b bits (docs/design.md §2, computed exactly by lloyd_max_distortion); for small errors
  the logit change is linear in it, so Δ8 / Δ3 ≈ sqrt(D_8 / D_3) (0.034 at d = 64..256; measured
  0.031–0.054 on these models). The test requires Δ8 ≤ 3·sqrt(D_8/D_3)·Δ3: a cache whose 8-bit
  path kept fewer than 7 bits (ratio ≥ 0.13) or attended to anything but the stored tokens fails.
* K3V3 vs FakeQuantCache (ratekv's fake-quant reference: the plan's codecs as quantize → dequantize,
  dense SDPA) on the same codes: equal to fp32 rounding (docs/design.md §6); bound 2e-5 absolute on logits
  of magnitude ≈ 1 (measured ≤ 1.5e-6).
"""

import math

import pytest
import torch
from conftest import tiny_model
from transformers import DynamicCache

import ratekv
import ratekv.hf

CASES = [
    # arch, head_dim, n_heads, n_kv_heads, prompt, batch
    ("llama", 64, 4, 2, 97, 2),
    ("llama", 128, 6, 2, 65, 1),
    ("qwen2", 64, 7, 1, 97, 2),
    ("qwen2", 128, 4, 4, 33, 1),
    ("llama", 256, 2, 1, 97, 1),
    ("qwen2", 256, 4, 1, 1, 2),
]


def teacher_forced(model, cache, ids, nxt):
    outs = []
    with torch.no_grad():
        o = model(ids, past_key_values=cache, use_cache=True)
        outs.append(o.logits[:, -1])
        for t in range(nxt.shape[1]):
            o = model(nxt[:, t:t + 1], past_key_values=cache, use_cache=True)
            outs.append(o.logits[:, -1])
    return torch.stack(outs)


def inputs(batch, prompt, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 320, (batch, prompt), generator=g), torch.randint(0, 320, (batch, 8), generator=g)


@pytest.mark.parametrize("arch,hd,nh,nkv,prompt,batch", CASES)
def test_packed_matches_dense_and_fake_quant(arch, hd, nh, nkv, prompt, batch):
    m = tiny_model(arch, hd, nh, nkv)
    rc = ratekv.model_config(m.config)
    ids, nxt = inputs(batch, prompt)
    ref = teacher_forced(m, DynamicCache(config=m.config), ids, nxt)
    p8 = ratekv.uniform_plan(rc, 8, 8)
    c8 = ratekv.hf.PackedCache(p8, m.config)
    d8 = (teacher_forced(m, c8, ids, nxt) - ref).abs().max().item()
    p3 = ratekv.uniform_plan(rc, 3, 3)
    c3 = ratekv.hf.PackedCache(p3, m.config)
    packed3 = teacher_forced(m, c3, ids, nxt)
    d3 = (packed3 - ref).abs().max().item()
    ratio = math.sqrt(ratekv._core.lloyd_max_distortion(hd, 8) / ratekv._core.lloyd_max_distortion(hd, 3))
    assert d3 > 1e-3, "K3V3 changed nothing: the cache is not quantizing"
    assert d8 <= 3 * ratio * d3, (d8, d3, ratio)
    fq = teacher_forced(m, ratekv.hf.FakeQuantCache(p3, m.config), ids, nxt)
    assert (packed3 - fq).abs().max().item() <= 2e-5
    # The store really holds codes: K3V3 bytes ≈ (3 + 16/d) bits per element per allocated page slot.
    T = prompt + nxt.shape[1]
    assert c3.get_seq_length() == T
    fp16_bytes = batch * T * rc.kv_bytes_per_token_fp16()
    assert c3.nbytes < 0.5 * fp16_bytes or T < 64


def test_generate_packed_equals_fake_quant_greedy():
    m = tiny_model("llama", 64, 4, 2)
    rc = ratekv.model_config(m.config)
    ids, _ = inputs(2, 40, seed=3)
    plan = ratekv.uniform_plan(rc, 3, 3)
    kw = dict(max_new_tokens=12, do_sample=False, attention_mask=torch.ones_like(ids), pad_token_id=0)
    a = m.generate(ids, past_key_values=ratekv.hf.PackedCache(plan, m.config), **kw)
    b = m.generate(ids, past_key_values=ratekv.hf.FakeQuantCache(plan, m.config), **kw)
    assert torch.equal(a, b)
    assert a.shape == (2, 52)


def test_block_gtq_plan_from_calibration_runs():
    m = tiny_model("qwen2", 64, 4, 2, n_layers=3)
    g = torch.Generator().manual_seed(5)
    st = ratekv.calibrate(m, token_ids=torch.randint(0, 320, (300,), generator=g), ctx=100)
    assert st.rope_layout == "neox" and st.arch == "qwen2"
    plan = ratekv.make_plan(st, "block-gtq", k_bits=3.25, v_bits=3.25)
    assert plan.method == "block-gtq"
    ids, nxt = inputs(1, 70, seed=6)
    packed = teacher_forced(m, ratekv.hf.PackedCache(plan, m.config), ids, nxt)
    fq = teacher_forced(m, ratekv.hf.FakeQuantCache(plan, m.config), ids, nxt)
    assert (packed - fq).abs().max().item() <= 2e-5


def test_plan_of_another_model_or_layout_is_refused():
    m = tiny_model("llama", 64, 4, 2)
    other = tiny_model("llama", 64, 4, 2, n_layers=3)
    plan = ratekv.uniform_plan(ratekv.model_config(other.config), 3, 3)
    with pytest.raises(ratekv.RatekvError, match="n_layers"):
        ratekv.hf.PackedCache(plan, m.config)
    # The same shapes in GGUF 'llama' channel order (interleaved RoPE pairs).
    rc = ratekv.model_config(m.config)
    rc.rope_layout = ratekv.RopeLayout.interleaved
    gguf_plan = ratekv.uniform_plan(rc, 3, 3)
    with pytest.raises(ratekv.RatekvError, match="rope_layout"):
        ratekv.hf.PackedCache(gguf_plan, m.config)


def test_unserved_codec_and_architecture_are_refused():
    m = tiny_model("llama", 64, 4, 2)
    rc = ratekv.model_config(m.config)
    kivi = ratekv.uniform_plan(rc, 4, 4, quantizer="kivi")
    with pytest.raises(ratekv.RatekvError, match="kivi"):
        teacher_forced(m, ratekv.hf.PackedCache(kivi, m.config), *inputs(1, 5))

    class Cfg:
        model_type = "gpt2"

    with pytest.raises(ratekv.RatekvError, match="gpt2"):
        ratekv.hf.PackedCache(ratekv.uniform_plan(rc, 3, 3), Cfg())


def test_nan_keys_are_a_clear_error():
    m = tiny_model("llama", 64, 4, 2)
    plan = ratekv.uniform_plan(ratekv.model_config(m.config), 3, 3)
    with torch.no_grad():
        m.model.layers[1].self_attn.k_proj.weight[3, 7] = float("nan")
    with pytest.raises(ratekv.RatekvError, match="layer 1: key .* nan"):
        teacher_forced(m, ratekv.hf.PackedCache(plan, m.config), *inputs(1, 10))


def test_padded_batch_and_second_prompt_are_refused():
    m = tiny_model("llama", 64, 4, 2)
    plan = ratekv.uniform_plan(ratekv.model_config(m.config), 3, 3)
    ids, nxt = inputs(2, 12)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    cache = ratekv.hf.PackedCache(plan, m.config)
    with torch.no_grad():
        m(ids, attention_mask=mask, past_key_values=cache, use_cache=True)
        with pytest.raises(ratekv.RatekvError, match="padded"):
            m(nxt[:, :1], attention_mask=torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], 1),
              past_key_values=cache, use_cache=True)
    cache = ratekv.hf.PackedCache(plan, m.config)
    with torch.no_grad():
        m(ids, past_key_values=cache, use_cache=True)
        with pytest.raises(ratekv.RatekvError, match="one prompt"):
            m(nxt[:, :3], past_key_values=cache, use_cache=True)


def test_packed_cache_under_torch_compile():
    """model.forward under torch.compile (dynamo, dynamic shapes; the 'eager' backend runs the
    traced graph with the same kernels, so the logits must equal the eager PackedCache's). The
    decode steps must trace without a graph break: a break inside the decoder's layer loop makes
    dynamo run the whole decoder eagerly (the hand-over from update() to the attention function
    through a threading.local, and the padded-batch check's host read, each did that). The
    prefill breaks where it builds the C++ store (once per cache)."""
    from torch._dynamo.utils import counters

    m = tiny_model("llama", 64, 4, 2)
    plan = ratekv.uniform_plan(ratekv.model_config(m.config), 3, 3)
    ids, nxt = inputs(2, 37)
    ref = teacher_forced(m, ratekv.hf.PackedCache(plan, m.config), ids, nxt)
    torch._dynamo.reset()
    counters.clear()
    fwd = torch.compile(m.forward, dynamic=True, backend="eager")
    cache = ratekv.hf.PackedCache(plan, m.config)
    outs = []
    with torch.no_grad():
        outs.append(fwd(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1])
        counters.clear()
        for t in range(nxt.shape[1]):
            mask = torch.ones(2, ids.shape[1] + t + 1, dtype=torch.long)
            outs.append(fwd(input_ids=nxt[:, t:t + 1], attention_mask=mask, past_key_values=cache,
                            use_cache=True).logits[:, -1])
    torch.testing.assert_close(torch.stack(outs), ref, rtol=0, atol=1e-5)
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert cache.layers[0].length == 37 + 8
    torch._dynamo.reset()
