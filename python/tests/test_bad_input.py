"""Bad input to the Python package: each case raises ratekv.RatekvError (a ValueError) naming the
argument and what was expected, before any work — never an IndexError / ZeroDivisionError /
torch IndexError from deep inside, nanobind's generic TypeError, or a silent conversion.
Found by an adversarial pass (session 6); each assertion failed before its fix."""

import pytest
import torch
from conftest import tiny_model

import ratekv
from ratekv.ops import PackedKVCache


def small_config(head_dim=64, n_layers=3, n_heads=4, n_kv=2):
    c = ratekv.ModelConfig()
    c.arch, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim = "llama", n_layers, n_heads, n_kv, head_dim
    c.d_model, c.d_ff, c.n_vocab, c.n_ctx_train, c.rope_theta, c.rms_eps = 256, 512, 100, 4096, 1e4, 1e-5
    c.rope_layout = ratekv.RopeLayout.neox
    return c


@pytest.fixture
def cache():
    cfg = small_config()
    return PackedKVCache(ratekv.uniform_plan(cfg, 3, 3), cfg, 2, 64)


def kv(n=5, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(7)
    return (torch.randn(2, n, 2, 64, generator=g).to(dtype=dtype, device=device),
            torch.randn(2, n, 2, 64, generator=g).to(dtype=dtype, device=device))


@pytest.mark.parametrize("layer", [3, 99, -1, 2**40])
def test_layer_out_of_range_is_named(cache, layer):
    k, v = kv()
    with pytest.raises(ratekv.RatekvError, match=rf"PackedKVCache.append: layer = {layer}: expected an integer in 0..2"):
        cache.append(layer, k, v)
    with pytest.raises(ratekv.RatekvError, match=rf"decode_attention: layer = {layer}: expected an integer in 0..2"):
        cache.decode_attention(layer, torch.randn(2, 4, 64))
    assert all(int(s.sum()) == 0 for s in cache.seq_lens)  # -1 did not land in the last layer


def test_valid_layers_still_work(cache):
    k, v = kv(n=7)
    cache.append(2, k, v)
    out = cache.decode_attention(2, torch.randn(2, 4, 64))
    assert out.shape == (2, 4, 64) and torch.isfinite(out).all()
    assert cache.seq_lens[2].tolist() == [7, 7] and cache.seq_lens[0].tolist() == [0, 0]
    k16, v16 = kv(n=1, dtype=torch.bfloat16)
    cache.append(2, k16, v16)  # bf16 is accepted (computed in float32 on the CPU)
    assert cache.seq_lens[2].tolist() == [8, 8]


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.complex64, torch.bool, torch.float64])
def test_wrong_dtype_is_named(cache, dtype):
    k, v = kv()
    bad = torch.ones(2, 5, 2, 64, dtype=dtype)
    with pytest.raises(ratekv.RatekvError, match=r"append: k has dtype .*expected one of torch.float32"):
        cache.append(0, bad, v)
    with pytest.raises(ratekv.RatekvError, match=r"append: v has dtype"):
        cache.append(0, k, bad)
    with pytest.raises(ratekv.RatekvError, match=r"decode_attention: q has dtype"):
        cache.decode_attention(0, torch.ones(2, 4, 64, dtype=dtype))
    # The raw custom ops check too (they were the path that converted silently).
    with pytest.raises(ratekv.RatekvError, match=r"ratekv::append: k has dtype"):
        torch.ops.ratekv.append(cache.seq_lens[0], bad, v, cache.handle, 0)
    assert cache.seq_lens[0].tolist() == [0, 0]


def test_meta_tensors_are_refused(cache):
    k, v = kv(device="meta")
    with pytest.raises(ratekv.RatekvError, match=r"append: k is on device 'meta'"):
        cache.append(0, k, v)
    # Straight to the op: a meta tensor dispatches to the fake kernel, which used to return silently.
    with pytest.raises(ratekv.RatekvError, match=r"ratekv::append: k is on device 'meta'"):
        torch.ops.ratekv.append(torch.zeros(2, dtype=torch.int32, device="meta"), k, v, cache.handle, 0)
    with pytest.raises(ratekv.RatekvError, match=r"decode_attention: q is on device 'meta'"):
        cache.decode_attention(0, torch.randn(2, 4, 64, device="meta"))
    with pytest.raises(ratekv.RatekvError, match=r"device = 'meta': expected 'cpu' or a cuda device"):
        PackedKVCache(ratekv.uniform_plan(small_config(), 3, 3), small_config(), 1, 8, device="meta")


def test_cache_sizes_are_named():
    cfg = small_config()
    plan = ratekv.uniform_plan(cfg, 3, 3)
    with pytest.raises(ratekv.RatekvError, match=r"batch_size = 0: expected an integer in 1..2\^31-1"):
        PackedKVCache(plan, cfg, 0, 8)
    with pytest.raises(ratekv.RatekvError, match=r"max_tokens = -5: expected an integer in 1..2\^31-1"):
        PackedKVCache(plan, cfg, 1, -5)
    with pytest.raises(ratekv.RatekvError, match=r"max_tokens = 1.5"):
        PackedKVCache(plan, cfg, 1, 1.5)


def test_hf_max_cache_len():
    m = tiny_model("llama", 64, 4, 2)
    plan = ratekv.uniform_plan(ratekv.model_config(m.config), 3, 3)
    for bad in (0, -3, 2**40):
        with pytest.raises(ratekv.RatekvError, match=rf"PackedCache: max_cache_len = {bad}: expected an integer in 1"):
            ratekv.hf.PackedCache(plan, m.config, max_cache_len=bad)
    assert ratekv.hf.PackedCache(plan, m.config).capacity == 1024  # None: max_position_embeddings
    assert ratekv.hf.PackedCache(plan, m.config, max_cache_len=97).capacity == 97


@pytest.mark.parametrize("field,value,msg", [
    ("num_attention_heads", 0, r"num_attention_heads = 0: expected an integer in 1"),
    ("num_key_value_heads", 0, r"num_key_value_heads = 0: expected an integer in 1"),
    ("num_key_value_heads", 3, r"num_attention_heads = 4 is not a multiple of num_key_value_heads = 3"),
    ("head_dim", -64, r"head_dim = -64: expected an integer in 1"),
    ("num_hidden_layers", 0, r"num_hidden_layers = 0"),
    ("vocab_size", 2**40, r"vocab_size = 1099511627776: expected an integer in 1..2\^31-1"),
])
def test_model_config_fields_are_named(field, value, msg):
    from transformers import LlamaConfig

    c = LlamaConfig(vocab_size=320, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024)
    assert ratekv.model_config(c).head_dim == 64
    setattr(c, field, value)
    with pytest.raises(ratekv.RatekvError, match=rf"LlamaConfig: {msg}"):
        ratekv.model_config(c)


def test_model_config_heads_without_head_dim():
    from transformers import LlamaConfig

    c = LlamaConfig(vocab_size=320, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    c.hidden_size, c.head_dim = 130, None  # after construction: transformers' own validator runs there
    with pytest.raises(ratekv.RatekvError, match=r"hidden_size = 130 is not a multiple of num_attention_heads = 4"):
        ratekv.model_config(c)


@pytest.mark.parametrize("kw,msg", [
    (dict(seed=-1), r"make_plan: seed = -1: expected an integer in 0..2\^64-1"),
    (dict(seed=2**64), r"make_plan: seed = 18446744073709551616"),
    (dict(b_min=2**40), r"make_plan: b_min = 1099511627776: expected an integer in -2147483648..2\^31-1"),
    (dict(group_size=2**31), r"make_plan: group_size = 2147483648"),
    (dict(fp16_window=-1), r"make_plan: fp16_window = -1: expected an integer in 0..2\^31-1"),
    (dict(sink_tokens="4"), r"make_plan: sink_tokens = '4': expected an integer"),
])
def test_make_plan_integer_arguments_are_named(kw, msg):
    st = ratekv._core.identity_stats(small_config())
    with pytest.raises(ratekv.RatekvError, match=msg):
        ratekv.make_plan(st, "uniform", **kw)
    assert "18446744073709551615" in ratekv.make_plan(st, "uniform", seed=2**64 - 1).to_json()  # all of uint64


def test_fake_quantize_layer_is_named():
    cfg = small_config()
    codecs = ratekv.codecs(ratekv.uniform_plan(cfg, 3, 3), cfg)
    x = torch.randn(9, 2, 64)
    with pytest.raises(ratekv.RatekvError, match=r"fake_quantize: layer = 3: expected an integer in 0..2"):
        ratekv.fake_quantize(x, codecs, 3)
    with pytest.raises(ratekv.RatekvError, match=r"fake_quantize: window = -1"):
        ratekv.fake_quantize(x, codecs, 0, window=-1)
    assert ratekv.fake_quantize(x, codecs, 2).shape == x.shape


def test_calibrate_token_ids_outside_the_vocabulary(tmp_path):
    m = tiny_model("llama", 64, 4, 2, vocab=320)
    ids = torch.arange(50) % 300
    bad = ids.clone()
    bad[17] = 320
    with pytest.raises(ratekv.RatekvError, match=r"token_ids\[17\] = 320 .*expected ids in 0..319"):
        ratekv.calibrate(m, token_ids=bad)
    bad[17] = -2
    with pytest.raises(ratekv.RatekvError, match=r"token_ids\[17\] = -2 .*expected ids in 0..319"):
        ratekv.calibrate(m, token_ids=bad)
    with pytest.raises(ratekv.RatekvError, match=r"token_ids has dtype torch.float32"):
        ratekv.calibrate(m, token_ids=ids.float())
    assert ratekv.calibrate(m, token_ids=ids, ctx=25).n_tokens == 50


def test_calibrate_output_checked_before_the_run(tmp_path):
    m = tiny_model("llama", 64, 4, 2)
    ids = torch.arange(50) % 300
    with pytest.raises(ratekv.RatekvError, match=r"directory '.*nowhere' does not exist"):
        ratekv.calibrate(m, token_ids=ids, output=tmp_path / "nowhere" / "x.safetensors")
    with pytest.raises(ratekv.RatekvError, match=r"cannot write in '/proc'"):
        ratekv.calibrate(m, token_ids=ids, output="/proc/ratekv_test.safetensors")


def test_bad_sequence_leaves_the_whole_batch_unwritten(cache):
    # Sequence 1's values overflow the fp16 norm. Before, sequence 0's tokens were stored anyway while
    # seq_lens stayed [0, 0]; after the next append sequence 0 attended over 8 tokens instead of 4.
    k, v = kv(n=4)
    bad_v = v * torch.tensor([1.0, 1e30]).view(2, 1, 1, 1)
    with pytest.raises(ratekv.RatekvError, match=r"sequence 1 of 2: .*norm .* beyond the fp16 norm"):
        cache.append(0, k, bad_v)
    assert cache.seq_lens[0].tolist() == [0, 0] and cache.nbytes == 0
    k2, v2 = kv(n=3)
    cache.append(0, k2, v2)
    q = torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(3))
    cfg = small_config()
    fresh = PackedKVCache(ratekv.uniform_plan(cfg, 3, 3), cfg, 2, 64)
    fresh.append(0, k2, v2)
    assert cache.seq_lens[0].tolist() == [3, 3] and cache.nbytes == fresh.nbytes
    assert torch.equal(cache.decode_attention(0, q), fresh.decode_attention(0, q))


def test_op_seq_lens_must_be_the_caches(cache):
    k, v = kv(n=4)
    with pytest.raises(ratekv.RatekvError, match=r"ratekv::append: seq_lens has 5 entries, the cache holds 2"):
        torch.ops.ratekv.append(torch.zeros(5, dtype=torch.int32), k, v, cache.handle, 0)
    cache.append(0, k, v)
    q = torch.randn(2, 4, 64)
    with pytest.raises(ratekv.RatekvError, match=r"decode_attention: seq_lens \[4, 100\] differ from the \[4, 4\]"):
        torch.ops.ratekv.decode_attention(torch.tensor([4, 100], dtype=torch.int32), q, cache.handle, 0, 0.125)
    cache.seq_lens[0][0] = 1000  # the cache's own tensor, edited
    with pytest.raises(ratekv.RatekvError, match=r"seq_lens \[1000, 4\] differ from the \[4, 4\] tokens"):
        cache.decode_attention(0, q)


def test_batch_beyond_memory_is_refused_before_allocating():
    cfg = small_config()
    # Each sequence's layout tables (allocated up front; pages come with the tokens) are ~10 KB for this config:
    # 2^31 - 1 sequences need ~20 TB. Before, it allocated until the kernel killed the process.
    with pytest.raises(ratekv.RatekvError, match=r"batch_size 2147483647: the sequences' layout tables alone need "
                                                  r"~.* GB .* more than this machine's .* GB of memory"):
        PackedKVCache(ratekv.uniform_plan(cfg, 3, 3), cfg, 2**31 - 1, 4096)
    # A long capacity alone is no reason to refuse (CPU pages are allocated as tokens arrive): a Llama-3-8B-shaped
    # batch of 64 at 128K tokens needs ~1 MB of tables per sequence now.
    big = small_config(head_dim=128, n_layers=32, n_heads=32, n_kv=8)
    c = PackedKVCache(ratekv.uniform_plan(big, 3, 3), big, 64, 131072)
    assert c.nbytes == 0


def test_plan_and_scale_arguments_are_named():
    cfg = small_config()
    m = tiny_model("llama", 64, 4, 2)
    for make, what in ((lambda: PackedKVCache(None, cfg, 1, 8), "PackedKVCache"),
                       (lambda: ratekv.hf.PackedCache("plan.json", m.config), "PackedCache"),
                       (lambda: ratekv.hf.FakeQuantCache(None, m.config), "FakeQuantCache")):
        with pytest.raises(ratekv.RatekvError, match=rf"^{what}: plan is a (NoneType|str), expected a ratekv.Plan"):
            make()
    with pytest.raises(ratekv.RatekvError, match=r"^PackedKVCache: config is a NoneType, expected a ratekv.ModelConfig"):
        PackedKVCache(ratekv.uniform_plan(cfg, 3, 3), None, 1, 8)
    c = PackedKVCache(ratekv.uniform_plan(cfg, 3, 3), cfg, 2, 8)
    k, v = kv(n=2)
    c.append(0, k, v)
    for bad, msg in (("x", "expected a number"), (float("nan"), "expected a finite number")):
        with pytest.raises(ratekv.RatekvError, match=rf"decode_attention: scale = .*: {msg}"):
            c.decode_attention(0, torch.randn(2, 4, 64), scale=bad)
