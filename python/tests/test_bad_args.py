"""Arguments of the Python API that were accepted silently or refused with a message naming internals; each
error must name the Python argument and what was expected, before any expensive work."""

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
        with pytest.raises(RatekvError, match=rf"avg_bits {b} \({unit} bits per element\): above what ratequant "
                                              rf"reaches .* at most {top} bits per element"):
            ratekv.make_plan(curve_stats, "ratequant", avg_bits=b, budget_unit=unit, sensitivity="activation")


def test_uniform_effective_budget_above_the_widest_code_is_refused(llama):
    _, cfg = llama
    # head_dim 64: 8 code bits + fp16 norm + extension norm store 8.5 bits per element.
    assert ratekv.uniform_plan(cfg, 9.4, 3, budget_unit="effective").achieved["k_code"] == 8
    with pytest.raises(RatekvError, match=r"k_bits 64 \(effective bits per element\): above what tq-mse reaches: "
                                          r"its widest code, 8 bits \(b_max\), stores 8.5 bits per element at "
                                          r"head_dim 64; expected a budget below 9.5"):
        ratekv.uniform_plan(cfg, 64, 64, budget_unit="effective")


def test_uniform_code_width_outside_1_to_8_names_k_bits(llama):
    # Used to fail inside the message, naming "stored bytes: kind tq-mse group at 9 bits".
    _, cfg = llama
    with pytest.raises(RatekvError, match=r"k_bits 9 \(code bits per element\): gives 9 code bits per element, "
                                          r"outside 1..8 .*expected a whole number of code bits in 1..8;"):
        ratekv.uniform_plan(cfg, 9, 3)
    with pytest.raises(RatekvError, match=r"v_bits 0 \(code bits per element\).*outside 1..8"):
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
    with pytest.raises(RatekvError, match=r"fake_quantize: x is a ndarray of dtype int64, expected a floating"):
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
