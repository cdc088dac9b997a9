"""PackedKVCache(device="cuda") where CUDA cannot run: a named error before any allocation, whichever
way the extension was built (with nvcc but no usable GPU, or without the CUDA packed cache)."""
import pytest
import torch

import ratekv
from ratekv.ops import PackedKVCache


def _tiny():
    c = ratekv.ModelConfig()
    c.arch, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim = "llama", 1, 4, 2, 64
    c.d_model, c.d_ff, c.n_vocab, c.n_ctx_train, c.rope_theta, c.rms_eps = 256, 512, 100, 4096, 1e4, 1e-5
    c.rope_layout = ratekv.RopeLayout.neox
    return c, ratekv.uniform_plan(c, 3, 3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a usable GPU: python/tests/test_cuda.py covers CUDA")
def test_cuda_cache_without_a_usable_gpu_is_named():
    c, plan = _tiny()
    expected = "torch sees no usable CUDA device" if ratekv.has_cuda else "built without the CUDA packed cache"
    with pytest.raises(ratekv.RatekvError, match=expected):
        PackedKVCache(plan, c, 1, 64, device="cuda")
