"""Arguments of the Python API that were accepted silently or refused with a message naming internals; each
error must name the Python argument and what was expected, before any expensive work."""

import numpy as np
import pytest
import torch

import ratekv
from ratekv import RatekvError

from conftest import tiny_model


@pytest.fixture(scope="module")
def llama():
    m = tiny_model("llama", 64, 4, 2)
    return m, ratekv.model_config(m.config)


@pytest.fixture(scope="module")
def curve_stats(llama):
    m, _ = llama
    g = torch.Generator().manual_seed(5)
    return ratekv.calibrate(m, token_ids=torch.randint(0, 320, (256,), generator=g), ctx=128, curves=["tq-mse"])


@pytest.mark.parametrize("unit,ok,bad,top", [("effective", 5.5, 7, "5.5"), ("code", 5, 6, "5")])
def test_ratequant_budget_above_the_fitted_widths_is_refused(curve_stats, unit, ok, bad, top):
    # Curves fitted at 1..5 bits: avg_bits 7 / 8 / 20 used to return the all-5-bit plan silently.
    p = ratekv.make_plan(curve_stats, "ratequant", avg_bits=ok, budget_unit=unit, sensitivity="activation")
    assert p.achieved["k_code"] == 5 and p.achieved["v_code"] == 5
    for b in (bad, 8, 20):
        with pytest.raises(RatekvError, match=rf"^make_plan: avg_bits = {b} \({unit} bits per element\): above what ratequant "
                                              rf"reaches .* at most {top} bits per element"):
            ratekv.make_plan(curve_stats, "ratequant", avg_bits=b, budget_unit=unit, sensitivity="activation")


def test_uniform_effective_budget_above_the_widest_code_is_refused(llama):
    _, cfg = llama
    # head_dim 64: 8 code bits + fp16 norm + extension norm store 8.5 bits per element.
    assert ratekv.uniform_plan(cfg, 9.4, 3, budget_unit="effective").achieved["k_code"] == 8
    with pytest.raises(RatekvError, match=r"^uniform_plan: k_bits = 64 \(effective bits per element\): above what tq-mse reaches: "
                                          r"its widest code, 8 bits \(b_max\), stores 8.5 bits per element at "
                                          r"head_dim 64; expected a budget below 9.5"):
        ratekv.uniform_plan(cfg, 64, 64, budget_unit="effective")


def test_uniform_code_width_outside_1_to_8_names_k_bits(llama):
    # Used to fail inside the message, naming "stored bytes: kind tq-mse group at 9 bits".
    _, cfg = llama
    with pytest.raises(RatekvError, match=r"^uniform_plan: k_bits = 9 \(code bits per element\): gives 9 code bits per "
                                          r"element, outside 1..8 .*expected a whole number of code bits in 1..8;"):
        ratekv.uniform_plan(cfg, 9, 3)
    with pytest.raises(RatekvError, match=r"^uniform_plan: v_bits = 0 \(code bits per element\).*outside 1..8"):
        ratekv.uniform_plan(cfg, 3, 0)


def test_fake_quantize_input_dtype_device_and_codecs_are_named(llama):
    _, cfg = llama
    plan = ratekv.uniform_plan(cfg, 3, 3)
    cod = ratekv.codecs(plan, cfg)
    x = torch.randn(5, 2, 64)
    ref = ratekv.fake_quantize(x, cod, 0)
    assert 0 < (ref - x).abs().max() < 1  # quantized, close
    # Used to be converted and quantized silently (complex: imaginary part dropped), e.g. bool -> 0/1 rows.
    for bad in (x.to(torch.int32), x > 0, x.to(torch.complex64)):
        with pytest.raises(RatekvError, match=rf"fake_quantize: x has dtype {bad.dtype}, expected a floating-point"):
            ratekv.fake_quantize(bad, cod, 0)
    with pytest.raises(RatekvError, match=r"fake_quantize: x is a ndarray of dtype int64, expected floating-point "
                                          r"values \(a numpy array, torch tensor or list of floats\)"):
        ratekv.fake_quantize(x.numpy().astype("int64"), cod, 0)
    with pytest.raises(RatekvError, match=r"x is on device 'meta', expected a cpu or cuda tensor"):  # NotImplementedError
        ratekv.fake_quantize(x.to("meta"), cod, 0)
    # A Plan / a list as codecs: AttributeError before.
    with pytest.raises(RatekvError, match=r"codecs is a Plan, expected a ratekv.PlanCodecs \(make them with "
                                          r"ratekv.codecs\(plan, config\)\)"):
        ratekv.fake_quantize(x, plan, 0)
    with pytest.raises(RatekvError, match=r"codecs is a list, expected a ratekv.PlanCodecs"):
        ratekv.fake_quantize(x, [cod], 0)
    # float64 and numpy float32 still work, giving the float32 result.
    assert torch.allclose(ratekv.fake_quantize(x.double(), cod, 0).float(), ref)
    assert abs(ratekv.fake_quantize(x.numpy(), cod, 0) - ref.numpy()).max() == 0


@pytest.mark.parametrize("quantizer,bits", [("kivi", 3), ("quarot", 3), ("q8_0", 8), ("q4_0", 4)])
def test_packed_cache_refuses_unpacked_codecs_at_construction(llama, quantizer, bits):
    from ratekv import hf

    m, cfg = llama
    plan = ratekv.uniform_plan(cfg, bits, bits, quantizer=quantizer)
    # Used to construct and fail at the first forward, naming the C++ PackedKVCache.
    with pytest.raises(RatekvError, match=rf"PackedCache: plan: codec kind '{quantizer}' \(first at layer 0, head 0, "
                                          r"key\) has no packed storage.*ratekv.hf.FakeQuantCache"):
        hf.PackedCache(plan, m.config)
    hf.FakeQuantCache(plan, m.config)  # the reference serves it


@pytest.mark.parametrize("kw,msg", [
    (dict(text_file="/nope.txt"), r"text_file '/nope.txt' does not exist, expected the calibration text's file"),
    (dict(text_file="/"), r"text_file '/' is a directory"),
    (dict(model_sha256=None), r"model_sha256 = None: expected a str"),
    (dict(model_sha256='zz\n"{'), r"model_sha256 = 'zz\\n\"\{': expected 64 lowercase hex digits"),
    (dict(model_sha256="AB" * 32), r"model_sha256 = 'ABAB.*': expected 64 lowercase hex digits"),
    (dict(token_ids=[]), r"token_ids is empty, expected at least one token id"),
    (dict(ctx="32"), r"ctx = '32': expected an integer in 1..1024"),
    (dict(ctx=0), r"ctx = 0: expected an integer in 1..1024"),
    (dict(sensitivity=True, sens_seqs=1.5), r"sens_seqs = 1.5: expected an integer"),
    (dict(n_tokens=2.5), r"n_tokens = 2.5: expected an integer"),
    # texts beside token_ids were ignored; a batch of several rows was flattened into one text.
    (dict(texts="hello"), r"give texts \(with a tokenizer\) or token_ids, not both"),
    (dict(token_ids=torch.arange(64).reshape(2, 32)), r"token_ids has shape \(2, 32\), expected one sequence"),
    (dict(token_ids=[[1, 2], [3]]), r"token_ids is a list torch cannot read as a tensor"),
    # sens_seqs / sens_len / curve_bits were ignored without sensitivity / curves.
    (dict(sens_seqs=4), r"sens_seqs = 4 needs sensitivity=True"),
    (dict(sens_len=64), r"sens_len = 64 needs sensitivity=True"),
    (dict(sensitivity=True, sens_seqs=5000), r"sens_seqs = 5000: expected an integer in 1..4096"),
    (dict(sensitivity="yes"), r"sensitivity = 'yes': expected True or False"),
    (dict(curve_bits=[2, 3]), r"curve_bits = \[2, 3\] needs curves"),
    # Curve options were checked by the C++ accumulator after the whole first pass, naming CurveMeasureOptions.
    (dict(curves="tq-mse,tq-mse"), r'curves: "tq-mse" given twice'),
    (dict(curves=["tq-prod"]), r'curves "tq-prod": expected kivi, quarot, tq-mse or block-gtq'),
    (dict(curves=[], curve_bits=[2, 3]), r"curves is empty"),
    (dict(curves=5), r"curves is a int, expected a list of quantizer names"),
    (dict(curves=["kivi"], curve_bits=[2, 2, 3]), r"curve_bits: widths must be distinct"),
    (dict(curves=["kivi"], curve_bits=[0, 1]), r"curve_bits: widths must be in 1..8 \(got 0..1\)"),
    (dict(curves=["kivi"], curve_bits="23"), r"curve_bits = '23': expected a list of code widths"),
    # One token (a key covariance of 0) ran; output "" failed after the run, 5 was a bare TypeError.
    (dict(n_tokens=1), r"n_tokens = 1: expected an integer in 2..2\^31-1"),
    (dict(token_ids=[5]), r"1 calibration token; at least 2 are needed"),
    (dict(output=""), r"output = '': expected a new file's path"),
    (dict(output=5), r"output = 5: expected a new file's path"),
])
def test_calibrate_arguments_are_checked_before_the_run(llama, kw, msg):
    # text_file / model_sha256 used to fail only after the whole run (hashing the file, setting the field).
    m, _ = llama
    calls = []
    h = m.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        args = dict(token_ids=torch.arange(64) % 320, ctx=32)
        args.update(kw)
        with pytest.raises(RatekvError, match=rf"^calibrate: {msg}"):
            ratekv.calibrate(m, **args)
    finally:
        h.remove()
    assert not calls, "the model ran before the argument was refused"


def test_calibrate_needs_a_transformers_model():
    with pytest.raises(RatekvError, match=r"calibrate: model is a Linear without .config; expected a transformers "
                                          r"causal LM"):
        ratekv.calibrate(torch.nn.Linear(2, 2), token_ids=[1, 2, 3])


def test_messages_name_the_library_not_its_internals(llama, tmp_path):
    _, cfg = llama
    # Plan.from_json: nlohmann's "[json.exception.parse_error.101] ..." as a RuntimeError before.
    with pytest.raises(RatekvError, match=r"^plan: text is not valid JSON \(it ends early, after 1 bytes\); "
                                          r"expected the JSON object `ratekv plan` writes"):
        ratekv.Plan.from_json("{")
    with pytest.raises(RatekvError, match=r"^plan: text is not valid JSON \(syntax error at byte 2 of 3\)"):
        ratekv.Plan.from_json("{x}")
    # a number beyond double's range: nlohmann's out_of_range.406 escaped as a RuntimeError before
    with pytest.raises(RatekvError, match=r"^plan: text is not valid JSON \(a number beyond the range of a double\)"):
        ratekv.Plan.from_json('{"seed": 1E400}')
    good = ratekv.uniform_plan(cfg, 3, 3)
    assert ratekv.Plan.from_json(good.to_json()).to_json() == good.to_json()
    # load_stats / make_plan on a plan's JSON: "safetensors header length 7595430040395844219 exceeds ..." before.
    plan_path = tmp_path / "plan.json"
    good.save(str(plan_path))
    with pytest.raises(RatekvError, match=rf"^load_stats: '{plan_path}' is not a safetensors statistics file "
                                          r"\(.*\) — it is JSON \(a plan\? load_plan reads plans\)"):
        ratekv.load_stats(plan_path)
    # make_plan reads JSON statistics too (as `ratekv plan --stats` does): a plan's JSON is named by its format.
    with pytest.raises(RatekvError, match=r'^plan.json: format = "ratekv-plan": expected "ratekv-calib-stats"$'):
        ratekv.make_plan(plan_path)
    txt = tmp_path / "notes.txt"
    txt.write_text("just some text, long enough to hold a length field\n")
    with pytest.raises(RatekvError, match=r"is not a safetensors statistics file \(docs/calibration_stats.md: an "
                                          r"8-byte header length, then a JSON header\)$"):
        ratekv.load_stats(txt)
    # ModelConfig().validate() named the GGUF key without its arch: "'.block_count' must be positive".
    with pytest.raises(RatekvError, match=r"^config: n_layers must be positive \(got 0\)$"):
        ratekv.ModelConfig().validate()
    c = ratekv.model_config(llama[0].config)
    c.n_kv_heads = 3
    with pytest.raises(RatekvError, match=r"^x: n_kv_heads \('llama.attention.head_count_kv'\) = 3 must be positive "
                                          r"and divide n_heads \('llama.attention.head_count'\) = 4$"):
        c.validate("x")


def test_calibrate_curves_as_one_string_and_a_batch_of_one(llama):
    # curves="tq-mse" used to be iterated as "t", "q", ...; a (1, N) tensor is the tokenizer's batch of one.
    m, _ = llama
    ids = (torch.arange(96) * 7) % 320
    a = ratekv.calibrate(m, token_ids=ids.unsqueeze(0), ctx=48, curves="kivi, tq-mse", curve_bits=[1, 2])
    b = ratekv.calibrate(m, token_ids=ids, ctx=48, curves=["kivi", "tq-mse"], curve_bits=[1, 2])
    for q in ("kivi", "tq-mse"):
        ca, cb = a.curve(q), b.curve(q)
        assert ca["bits"] == [1, 2]
        assert (ca["mse_k"] == cb["mse_k"]).all() and (ca["mse_k"] > 0).all()


def test_model_config_refuses_shapes_beyond_the_statistics_files(llama):
    from transformers import LlamaConfig

    # num_hidden_layers = 10**8 was accepted, and uniform_plan then raised MemoryError allocating its statistics.
    with pytest.raises(RatekvError, match=r"^LlamaConfig: num_hidden_layers = 100000000: expected an integer in "
                                          r"1..4096"):
        ratekv.model_config(LlamaConfig(num_hidden_layers=10**8))
    with pytest.raises(RatekvError, match=r"^LlamaConfig: head_dim = 8192: expected an integer in 1..4096"):
        ratekv.model_config(LlamaConfig(head_dim=8192))
    # The C++ check behind it, for a config built by hand.
    _, cfg = llama
    big = ratekv.ModelConfig()
    for f in ("arch", "n_heads", "n_kv_heads", "head_dim", "d_model", "d_ff", "n_vocab", "n_ctx_train",
              "rope_theta", "rms_eps", "rope_layout"):
        setattr(big, f, getattr(cfg, f))
    big.n_layers = 5000
    with pytest.raises(RatekvError, match=r"implausibly large model \(n_layers \('llama.block_count'\) = 5000"):
        ratekv.uniform_plan(big)


def test_save_plan_refuses_an_existing_file(llama, tmp_path):
    _, cfg = llama
    p = ratekv.uniform_plan(cfg, 2, 2)
    path = tmp_path / "p.plan.json"
    ratekv.save_plan(p, path)
    first = path.read_text()
    with pytest.raises(RatekvError, match=rf"^save_plan: '{path}' exists \(pass overwrite=True to replace it\)"):
        ratekv.save_plan(ratekv.uniform_plan(cfg, 3, 3), path)
    assert path.read_text() == first
    ratekv.save_plan(ratekv.uniform_plan(cfg, 3, 3), path, overwrite=True)
    assert ratekv.load_plan(path).achieved["k_code"] == 3
    with pytest.raises(RatekvError, match=r"^save_plan: plan is a dict, expected a ratekv.Plan"):
        ratekv.save_plan({}, tmp_path / "q.json")


def test_fake_quantize_reads_a_list(llama):
    _, cfg = llama
    c = ratekv.codecs(ratekv.uniform_plan(cfg, 3, 3), cfg)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, cfg.n_kv_heads, cfg.head_dim, generator=g)
    # x.shape of a list was a bare AttributeError.
    out = ratekv.fake_quantize(x.tolist(), c, 1, "value")
    ref = ratekv.fake_quantize(x.numpy(), c, 1, "value")
    assert (out == ref).all() and abs(out - x.numpy()).max() > 0 and out.dtype == np.float32
    # A float64 / float16 array comes back in its own dtype (it came back float32), the values those of float32 x.
    for dt in (np.float64, np.float16):
        o = ratekv.fake_quantize(x.numpy().astype(dt), c, 1, "value")
        assert o.dtype == dt
    assert (ratekv.fake_quantize(x.numpy().astype(np.float64), c, 1, "value") == ref.astype(np.float64)).all()


@pytest.mark.parametrize("fields,msg", [
    (dict(rope_theta="abc"), r"rope_theta = 'abc': expected a finite positive number"),
    (dict(rope_theta=0), r"rope_theta = 0: expected a finite positive number"),
    (dict(rope_parameters={"rope_theta": "y"}), r"rope_theta = 'y': expected a finite positive number"),
    (dict(rope_parameters=[1]), r"rope_parameters is a list, expected a dict"),
    (dict(rms_norm_eps="x"), r"rms_norm_eps = 'x': expected a finite positive number"),
    (dict(rms_norm_eps=float("nan")), r"rms_norm_eps = nan: expected a finite positive number"),
    (dict(partial_rotary_factor="x"), r"partial_rotary_factor = 'x': expected a finite positive number"),
    (dict(layer_types=3), r"layer_types = 3: expected a list of attention kinds"),
    # A given 0 was replaced by the default (`x or default`): 2048 positions, 4·hidden_size.
    (dict(max_position_embeddings=0), r"max_position_embeddings = 0: expected an integer in 1"),
    (dict(intermediate_size=0), r"intermediate_size = 0: expected an integer in 1"),
])
def test_model_config_fields_are_checked_not_defaulted(fields, msg):
    from types import SimpleNamespace

    base = dict(model_type="llama", num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                hidden_size=128, head_dim=64, intermediate_size=256, vocab_size=320, max_position_embeddings=1024,
                rope_theta=10000.0, rms_norm_eps=1e-6)
    base.update(fields)
    with pytest.raises(RatekvError, match=r"^SimpleNamespace: " + msg):
        ratekv.model_config(SimpleNamespace(**base))
    # Left out (None), the defaults still apply.
    del base["intermediate_size"], base["max_position_embeddings"]
    base.update(rope_theta=None, rms_norm_eps=None, rope_parameters=None, layer_types=None,
                partial_rotary_factor=None)
    cfg = ratekv.model_config(SimpleNamespace(**base))
    assert (cfg.d_ff, cfg.n_ctx_train, cfg.rope_theta) == (512, 2048, 10000.0)
    assert cfg.rms_eps == pytest.approx(1e-6, rel=1e-6)  # a float in C++


def test_wrong_types_name_the_argument(llama, tmp_path):
    _, cfg = llama
    plan = ratekv.uniform_plan(cfg, 3, 3)
    # Each was nanobind's "incompatible function arguments" or os.fspath's bare TypeError.
    cases = [
        (lambda: ratekv.uniform_plan(None), r"^uniform_plan: config is a NoneType, expected a ratekv.ModelConfig"),
        (lambda: ratekv.codecs(None, cfg), r"^codecs: plan is a NoneType, expected a ratekv.Plan"),
        (lambda: ratekv.codecs(plan, None), r"^codecs: config is a NoneType, expected a ratekv.ModelConfig"),
        (lambda: ratekv.codecs(plan, cfg, 5), r"^codecs: name = 5: expected a str"),
        (lambda: ratekv.save_plan(plan, None), r"^save_plan: path is a NoneType, expected a file path"),
        (lambda: ratekv.save_plan(plan, ""), r"^save_plan: path = '': expected a non-empty file path"),
        (lambda: ratekv.load_plan(None), r"^load_plan: path is a NoneType, expected a file path"),
        (lambda: ratekv.load_stats(3), r"^load_stats: path is a int, expected a file path"),
    ]
    for call, msg in cases:
        with pytest.raises(RatekvError, match=msg):
            call()
    c = ratekv.codecs(plan, cfg)
    x = torch.randn(5, cfg.n_kv_heads, cfg.head_dim, generator=torch.Generator().manual_seed(1))
    with pytest.raises(RatekvError, match=r"^fake_quantize: positions has dtype <U3, expected integer"):
        ratekv.fake_quantize(x, c, 0, positions=["abc"] * 5)
    with pytest.raises(RatekvError, match=r"^fake_quantize: positions span 1099511627776..1099511627776, expected "
                                          r"0..2\^31-1"):
        ratekv.fake_quantize(x, c, 0, positions=[2**40] * 5)


def test_tokenizer_decodes_partial_characters_and_refuses_lone_surrogates():
    from conftest import smollm2_path

    t = ratekv.Tokenizer(smollm2_path())  # a pathlib.Path, as load_plan takes (it was a nanobind TypeError)
    assert ratekv.ModelConfig.from_gguf(smollm2_path()).n_layers == 30
    ids = t.encode("a😀", add_bos=False)
    assert t.decode(ids) == "a😀"
    assert b"".join(t.decode_bytes([i]) for i in ids) == "a😀".encode()
    # Token by token (streaming), the emoji's pieces are no whole characters: U+FFFD, not UnicodeDecodeError.
    pieces = [t.decode([i]) for i in ids]
    assert len(pieces) >= 3, ids  # byte-level BPE: the emoji's 4 bytes span several tokens
    assert pieces[0] == "a" and all("\ufffd" in p for p in pieces[1:]), pieces
    with pytest.raises(ratekv.RatekvError, match=r"Tokenizer.encode: text is not encodable as UTF-8"):
        t.encode("a\udcff")


def test_calibrate_tokenizer_texts_and_text_file_types_are_named():
    from conftest import smollm2_path

    m = tiny_model("llama", 64, 4, 2)
    tok = ratekv.Tokenizer(str(smollm2_path()))
    with pytest.raises(RatekvError, match=r"calibrate: tokenizer is a Tokenizer, expected a transformers tokenizer .*"
                                          r"token_ids=ratekv.Tokenizer\(path\).encode\(text\)"):
        ratekv.calibrate(m, tok, "some text")
    hf_tok = lambda t, add_special_tokens=True: {"input_ids": [1, 2, 3] * 30}  # noqa: E731 (any callable)
    for texts, msg in ((b"bytes", r"texts is a bytes"), ({"a": "x"}, r"texts is a dict"),
                       (["ok", 3], r"texts\[1\] is a int, expected a str")):
        with pytest.raises(RatekvError, match=rf"calibrate: {msg}"):
            ratekv.calibrate(m, hf_tok, texts, ctx=32)
    for bad in (b"/etc/hostname", 3):
        with pytest.raises(RatekvError, match=r"calibrate: text_file = .*: expected a path"):
            ratekv.calibrate(m, token_ids=torch.arange(64), ctx=32, text_file=bad)
    with pytest.raises(RatekvError, match=r"fake_quantize: k_pre has shape \(5, 2, 64\), expected x's shape"):
        ratekv.fake_quantize(torch.randn(1, 2, 5, 64), ratekv.codecs(ratekv.uniform_plan(
            ratekv.model_config(m.config), 3, 3), ratekv.model_config(m.config)), 0, "key", k_pre=torch.randn(5, 2, 64))


def test_fp16_rows_beyond_fp16_are_refused_not_inf():
    # Rows stored as fp16 (the fp16 window / sink, an fp16 codec) turned 1e6 into inf silently; the TQ-MSE rows
    # refused the same input (its norm overflows fp16).
    from test_core import small_config

    cfg = small_config(head_dim=64, n_heads=4, n_kv=2)
    x = torch.randn(3, 2, 64)
    x[1, 1, 5] = 1e6
    tq = ratekv.codecs(ratekv.uniform_plan(cfg, 3, 3), cfg)
    with pytest.raises(RatekvError, match=r"fake_quant_sequence: layer 0: row 1, KV head 1, channel 5 is 1000000, "
                                          r"beyond fp16 .* stored as fp16 \(sink / fp16 window\)"):
        ratekv.fake_quantize(x, tq, 0, "key", window=3)
    fp16 = ratekv.codecs(ratekv.uniform_plan(cfg, 16, 16, quantizer="fp16"), cfg)
    with pytest.raises(RatekvError, match=r"layer 0 head 1 value: token 1, channel 5 is 1000000, beyond fp16"):
        ratekv.fake_quantize(x, fp16, 0, "value")
    ok = ratekv.fake_quantize(x.clamp(-6e4, 6e4), fp16, 0, "value")  # within fp16: rounded, finite
    assert torch.isfinite(torch.as_tensor(ok)).all()
