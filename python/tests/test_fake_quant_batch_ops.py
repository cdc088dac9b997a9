"""hf.FakeQuantCache with the plan's fp16 window under transformers' batch operations (beam search's
reorder_cache, batch_select_indices, batch_repeat_interleave): the kept original rows follow the
reconstructed ones, so reordering after some steps equals feeding the reordered inputs from the start;
crop with a window is refused (rows that left the window cannot be restored)."""
import pytest
import torch
from transformers import LlamaConfig

import ratekv
from ratekv import hf

HC = LlamaConfig(num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, hidden_size=128,
                 intermediate_size=256, vocab_size=100, max_position_embeddings=256)


def _cache():
    cfg = ratekv.model_config(HC)
    plan = ratekv.make_plan(ratekv._core.identity_stats(cfg), "uniform", k_bits=3, v_bits=3, budget_unit="code",
                            fp16_window=4)
    return hf.FakeQuantCache(plan, HC)


def _steps(g, B):
    # prompt of 6 tokens, then 5 single-token steps: rows leave the window of 4 after the reorder point
    return [torch.randn(B, 2, n, 32, generator=g) for n in (6, 1, 1, 1, 1, 1)]


def test_reorder_then_update_equals_reordered_inputs():
    g = torch.Generator().manual_seed(3)
    ks, vs = _steps(g, 3), _steps(g, 3)
    idx = torch.tensor([2, 0, 0])
    a = _cache()
    for t in range(3):
        a.update(ks[t], vs[t], 0)
    a.layers[0].reorder_cache(idx)
    for t in range(3, 6):
        ka, va = a.update(ks[t][idx], vs[t][idx], 0)
    b = _cache()
    for t in range(6):
        kb, vb = b.update(ks[t][idx], vs[t][idx], 0)
    assert torch.equal(ka, kb) and torch.equal(va, vb)


def test_select_and_repeat_follow_the_originals():
    g = torch.Generator().manual_seed(4)
    ks, vs = _steps(g, 2), _steps(g, 2)
    a = _cache()
    for t in range(2):
        a.update(ks[t], vs[t], 0)
    a.layers[0].batch_select_indices(torch.tensor([1]))
    a.layers[0].batch_repeat_interleave(2)
    sel = torch.tensor([1, 1])
    for t in range(2, 6):
        ka, va = a.update(ks[t][sel], vs[t][sel], 0)
    b = _cache()
    for t in range(6):
        kb, vb = b.update(ks[t][sel], vs[t][sel], 0)
    assert torch.equal(ka, kb) and torch.equal(va, vb)


def test_crop_with_a_window_is_refused():
    c = _cache()
    c.update(torch.randn(1, 2, 6, 32), torch.randn(1, 2, 6, 32), 0)
    with pytest.raises(ratekv.RatekvError, match="fp16_window"):
        c.layers[0].crop(-2)
