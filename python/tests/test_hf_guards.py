"""What ratekv.hf's caches refuse or must honour: sliding-window configs (refused: ratekv serves full causal
attention), the attention mask on every decode step, the plan's fp16 window and sink tokens in FakeQuantCache
(it must store what PackedCache stores), a cache reused without reset(), kivi plans (constructor)."""

import pytest
import torch

import ratekv
from ratekv import RatekvError

hf = pytest.importorskip("ratekv.hf")

from conftest import tiny_model  # noqa: E402
from test_hf_cache import teacher_forced  # noqa: E402


def _qwen2_config(**kw):
    from transformers import Qwen2Config

    base = dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=128,
                intermediate_size=256, vocab_size=100, max_position_embeddings=256)
    base.update(kw)
    return Qwen2Config(**base)


def test_sliding_window_config_is_refused():
    # The adversarial reproducer: with the window, transformers attends to the last 4 tokens only, the packed
    # cache to all of them — per-step logits diverged from DynamicCache even with an fp16 plan.
    qc = _qwen2_config(use_sliding_window=True, sliding_window=4, max_window_layers=0)
    with pytest.raises(RatekvError, match=r"use_sliding_window = True, sliding_window = 4.*layers 0, 1 of 2"):
        ratekv.model_config(qc)
    with pytest.raises(RatekvError, match="sliding_window = 4"):
        hf.PackedCache(ratekv.uniform_plan(ratekv.model_config(_qwen2_config()), 16, 16, quantizer="fp16"), qc)
    # max_window_layers = 1 of 2: only layer 1 slides, and the message names it alone.
    with pytest.raises(RatekvError, match=r"layers 1 of 2 use sliding_attention"):
        ratekv.model_config(_qwen2_config(use_sliding_window=True, sliding_window=4, max_window_layers=1))


def test_configs_without_an_active_window_still_work():
    # Qwen2.5's defaults: use_sliding_window=False (sliding_window then ignored); a window on no layer
    # (max_window_layers = n_layers) is full attention too.
    for qc in (_qwen2_config(), _qwen2_config(use_sliding_window=False, sliding_window=4),
               _qwen2_config(use_sliding_window=True, sliding_window=4, max_window_layers=2)):
        cfg = ratekv.model_config(qc)
        assert cfg.n_layers == 2 and cfg.n_kv_heads == 2 and cfg.head_dim == 32


def test_fp16_plan_matches_dynamic_cache_without_window():
    # The reproducer's comparison on the served config: an fp16 plan reproduces DynamicCache's greedy logits.
    from transformers import DynamicCache, Qwen2ForCausalLM

    qc = _qwen2_config()
    torch.manual_seed(0)
    m = Qwen2ForCausalLM(qc).eval()
    ids = torch.randint(0, 100, (1, 2))
    p = ratekv.uniform_plan(ratekv.model_config(m.config), 16, 16, quantizer="fp16")

    def gen(c):
        return m.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=c, max_new_tokens=10,
                          do_sample=False, output_scores=True, return_dict_in_generate=True, pad_token_id=0)

    a = gen(DynamicCache(config=m.config))
    b = gen(hf.PackedCache(p, m.config, max_cache_len=64))
    assert torch.equal(a.sequences, b.sequences)
    for sa, sb in zip(a.scores, b.scores):
        assert torch.allclose(sa, sb, atol=2e-3, rtol=0), (sa - sb).abs().max()


def test_mask_is_checked_on_every_decode_step():
    # Before: only the first decode step's mask was checked; a later step's mask hiding a cached token was
    # ignored (the packed attention attends to every cached token).
    m = tiny_model("llama", 64, 4, 2)
    plan = ratekv.uniform_plan(ratekv.model_config(m.config), 4, 4)
    cache = hf.PackedCache(plan, m.config, max_cache_len=64)
    torch.manual_seed(1)
    ids = torch.randint(0, 320, (1, 6))
    with torch.no_grad():
        out = m(input_ids=ids, attention_mask=torch.ones(1, 6, dtype=torch.long), past_key_values=cache)
        nxt = out.logits[:, -1:].argmax(-1)
        # A 4-D all-visible mask reaches the attention function (a 2-D all-ones one is dropped as causal), so
        # the first decode step is checked and passes; the second step's mask hides token 2.
        out = m(input_ids=nxt, attention_mask=torch.ones(1, 1, 1, 7, dtype=torch.bool), past_key_values=cache)
        nxt = out.logits[:, -1:].argmax(-1)
        mask = torch.ones(1, 8, dtype=torch.long)
        mask[0, 2] = 0
        with pytest.raises(RatekvError, match="attention mask hides cached tokens"):
            m(input_ids=nxt, attention_mask=mask, past_key_values=cache)


@pytest.mark.parametrize("window,sink", [(0, 0), (4, 0), (0, 3), (4, 3)])
def test_fake_quant_cache_honours_window_and_sink(window, sink):
    # Before: FakeQuantCache quantized every row (no window, no sink) while PackedCache kept them fp16, so the
    # reference disagreed with the packed cache by the whole quantization error of those rows.
    m = tiny_model("qwen2", 64, 4, 2)
    rc = ratekv.model_config(m.config)
    stats = ratekv._core.identity_stats(rc)
    plan = ratekv.make_plan(stats, "uniform", k_bits=3, v_bits=3, budget_unit="code", fp16_window=window,
                            sink_tokens=sink)
    assert (plan.fp16_window, plan.sink_tokens) == (window, sink)
    g = torch.Generator().manual_seed(3)
    ids, nxt = torch.randint(0, 320, (2, 7), generator=g), torch.randint(0, 320, (2, 9), generator=g)
    packed = teacher_forced(m, hf.PackedCache(plan, m.config, max_cache_len=64), ids, nxt)
    fake = teacher_forced(m, hf.FakeQuantCache(plan, m.config), ids, nxt)
    assert (packed - fake).abs().max().item() <= 2e-5
    if window or sink:  # the window / sink changes the logits: the comparison above can see one ignored
        plain = teacher_forced(m, hf.PackedCache(ratekv.make_plan(stats, "uniform", k_bits=3, v_bits=3,
                                                                   budget_unit="code"), m.config), ids, nxt)
        assert (plain - packed).abs().max().item() > 1e-3


def test_reuse_without_reset_and_new_batch_after_reset():
    m = tiny_model("qwen2", 64, 4, 2)
    plan = ratekv.uniform_plan(ratekv.model_config(m.config), 4, 4)
    cache = hf.PackedCache(plan, m.config, max_cache_len=64)
    g = torch.Generator().manual_seed(4)

    def gen(ids):
        return m.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache, max_new_tokens=4,
                          do_sample=False, pad_token_id=0)

    ids1 = torch.randint(0, 320, (1, 3), generator=g)
    out1 = gen(ids1)
    # A second generate() on the filled cache: used to fail inside transformers on an empty tensor, or to say
    # "the attention mask hides cached tokens (a padded batch)".
    with pytest.raises(RatekvError, match=r"already holds 6 tokens per sequence .*call reset\(\) before a new prompt"):
        gen(ids1)
    with pytest.raises(RatekvError, match=r"already holds 6 tokens per sequence.*call reset\(\) before a new prompt"):
        m(torch.randint(0, 320, (1, 5), generator=g), past_key_values=cache)
    # Another batch size while tokens are held: named, with reset().
    with pytest.raises(RatekvError, match=r"batch size 2, the cache holds 1 sequences of 6 tokens; call reset\(\)"):
        m(torch.randint(0, 320, (2, 1), generator=g), past_key_values=cache)
    # After reset() another batch size works (it used to fail in the C++ append: the store kept batch 1), and
    # the batch-1 prompt again gives the first run's tokens.
    cache.reset()
    ids2 = torch.cat([ids1, torch.randint(0, 320, (1, 3), generator=g)])
    out2 = gen(ids2)
    assert out2.shape == (2, 7) and torch.equal(out2[0], out1[0])
    cache.reset()
    assert torch.equal(gen(ids1), out1)
