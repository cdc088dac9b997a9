"""Plans, calibration statistics, fake quantization — thin wrappers of the C++ core.

Every function here calls the C++ library (``ratekv._core``); nothing is
re-implemented in Python. Arrays may be numpy arrays or torch tensors (CPU or
CUDA: they are moved to the CPU as float32 where the C++ code needs it).
Specs: include/ratekv/format/plan.h (plans), docs/calibration_stats.md
(statistics), include/ratekv/alloc/make_plan.h (allocators),
include/ratekv/cache/fake_quant_cache.h (fake quantization).
"""

from __future__ import annotations

import atexit
import math
import os
import weakref
from typing import Any, Optional, Union

import numpy as np

from . import _core
from ._core import (  # noqa: F401  (re-exported)
    CalibStats,
    KVStats,
    ModelConfig,
    Plan,
    PlanCodecs,
    RatekvError,
    RopeLayout,
    Tokenizer,
)

PathLike = Union[str, "os.PathLike[str]"]

#: HF transformers model types whose attention ratekv's HF cache serves.
HF_ARCHES = ("llama", "qwen2")

# Python objects holding nanobind instances (caches: their C++ stores, codecs, plans,
# configs) that something outside Python's reach may keep alive until the interpreter has
# shut down: torch's operator registry and torch.compile's code caches hold Python
# functions (and, through their closures and globals, whatever those reference) forever.
# nanobind then finds our instances alive after shutdown and reports them as leaked
# (docs: nanobind "Reference leaks", "Interactions with other tools"). At exit, before
# the interpreter tears down, each tracked object drops its C++ objects
# (``_release_native``), so nothing of ours outlives Python whoever still references
# the Python shell. Held weakly: tracking keeps nothing alive.
_native_holders: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _track_native(obj: Any) -> None:
    """Registers ``obj`` (with a ``_release_native()`` method) for release at exit."""
    _native_holders.add(obj)


@atexit.register
def _release_all_native() -> None:
    for obj in list(_native_holders):
        try:
            obj._release_native()
        except Exception:  # noqa: BLE001  (at exit: release what can be released)
            pass


_I32 = (-(1 << 31), (1 << 31) - 1)
_U64 = (0, (1 << 64) - 1)


def _unwrap_0d(value: Any) -> Any:
    """The Python scalar of a 0-d numpy array / torch tensor (its ``.item()``); anything else unchanged. Shared by
    _int_arg and _float_arg."""
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        return value.item()
    return value


def _int_arg(what: str, name: str, value: Any, lo: int, hi: int) -> int:
    """``value`` as a Python int in lo..hi, else RatekvError "<what>: <name> = <value>: expected an integer in
    lo..hi" — checked here so that the binding never answers with nanobind's generic TypeError (which names
    neither the argument nor the range)."""
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        value = _unwrap_0d(value)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise RatekvError(f"{what}: {name} = {value!r}: expected an integer in {_range_str(lo, hi)}")
    v = int(value)
    if not lo <= v <= hi:
        raise RatekvError(f"{what}: {name} = {v}: expected an integer in {_range_str(lo, hi)}")
    return v


def _str_arg(what: str, name: str, value: Any) -> str:
    """``value`` if it is a str, else RatekvError "<what>: <name> = <value>: expected a string" (None and other
    types used to reach the binding, whose TypeError names neither the argument nor what it expects)."""
    if not isinstance(value, str):
        raise RatekvError(f"{what}: {name} = {value!r}: expected a string")
    return value


def _float_arg(what: str, name: str, value: Any) -> float:
    """``value`` as a float if it is a real number (int, float, Fraction, Decimal; bool excluded; a 0-d numpy
    array / torch tensor is read), else RatekvError "<what>: <name> = <value>: expected a number"
    (``float(None)`` named no argument); one beyond the float range likewise. NaN / inf pass through (the
    library refuses them)."""
    import decimal
    import numbers

    value = _unwrap_0d(value)
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, decimal.Decimal)):
        raise RatekvError(f"{what}: {name} = {value!r}: expected a number")
    try:
        return float(value)
    except OverflowError:
        raise RatekvError(f"{what}: {name} = {value!r}: expected a number in the float range") from None


def _range_str(lo: int, hi: int) -> str:
    def f(x: int) -> str:
        for e in (31, 63, 64):
            if x == (1 << e) - 1:
                return f"2^{e}-1"
        return str(x)

    return f"{f(lo)}..{f(hi)}"


def _path_arg(what: str, name: str, path: Any) -> str:
    """``path`` as a str, or RatekvError naming the argument for what is not a non-empty str / os.PathLike (None or
    a number used to reach os.fspath's bare TypeError)."""
    if not isinstance(path, (str, os.PathLike)):
        raise RatekvError(f"{what}: {name} is a {type(path).__name__}, expected a file path (str or os.PathLike)")
    p = os.fspath(path)
    if not isinstance(p, str) or not p:
        raise RatekvError(f"{what}: {name} = {p!r}: expected a non-empty file path")
    return p


def load_plan(path: PathLike) -> Plan:
    """Reads and validates a plan file (JSON, docs/plan_format.md).

    Raises RatekvError naming the file and the JSON path of a bad field, or naming ``path`` when it is not a
    file path."""
    return Plan.load(_path_arg("load_plan", "path", path))


def save_plan(plan: Plan, path: PathLike, *, overwrite: bool = False) -> None:
    """Validates and writes a plan as JSON (docs/plan_format.md) at ``path``. An existing file is
    replaced only with ``overwrite=True`` (as the CLI's ``-o`` needs ``--force``). Raises RatekvError
    naming the path when it exists (without ``overwrite``) or cannot be written, and naming ``plan``
    when it is not a ratekv.Plan."""
    if not isinstance(plan, Plan):
        raise RatekvError(f"save_plan: plan is a {type(plan).__name__}, expected a ratekv.Plan")
    if not isinstance(overwrite, bool):
        raise RatekvError(f"save_plan: overwrite = {overwrite!r}: expected True or False")
    p = _path_arg("save_plan", "path", path)
    if not overwrite and os.path.lexists(p):
        raise RatekvError(f"save_plan: '{p}' exists (pass overwrite=True to replace it)")
    plan.save(p)


def _check_safetensors(what: str, path: str) -> None:
    """RatekvError "<what>: '<path>' is not a safetensors statistics file" unless the file starts like one (an
    8-byte little-endian header length within the file, then a JSON object): a plan's JSON or a text used to
    be reported as a safetensors header length of some 10^18 bytes. Missing files are left to the reader."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return
    n = int.from_bytes(head[:8], "little") if len(head) >= 8 else -1
    if not (0 < n <= size - 8 and head[8:9] == b"{"):
        hint = " — it is JSON (a plan? load_plan reads plans)" if head.lstrip()[:1] in (b"{", b"[") else ""
        raise RatekvError(f"{what}: '{path}' is not a safetensors statistics file (docs/calibration_stats.md: an "
                          f"8-byte header length, then a JSON header){hint}")


def load_stats(path: PathLike) -> KVStats:
    """Reads a statistics file written by ``ratekv calibrate`` or :func:`ratekv.calibrate`
    (safetensors, docs/calibration_stats.md). Raises RatekvError naming the tensor or field,
    or saying the file is not a safetensors statistics file."""
    p = _path_arg("load_stats", "path", path)
    _check_safetensors("load_stats", p)
    return KVStats.load(p)


# The largest n_layers, n_heads, n_kv_heads and head_dim a statistics file holds (KVStats::validate; the C++
# ModelConfig::validate bounds n_layers the same): a bigger config was accepted and allocated its per-layer
# statistics before anything refused it (MemoryError for num_hidden_layers = 10**8).
_MAX_SHAPE = 4096


def model_config(hf_config: Any) -> ModelConfig:
    """The ratekv model identity of a Hugging Face ``PretrainedConfig``.

    Hugging Face transformers applies RoPE with ``rotate_half`` for every
    architecture, so its Q/K channels are in the half-split (NeoX) order: the
    returned config has ``rope_layout = neox`` whatever the GGUF layout of the
    same architecture is (GGUF ``llama`` pairs channels (2i, 2i+1): a plan or a
    statistics file made from the GGUF is refused on the HF model, and the other
    way round). ``arch`` is ``hf_config.model_type``.

    Raises RatekvError when a field is missing, not a positive integer (naming the
    Hugging Face field: num_hidden_layers, num_attention_heads, num_key_value_heads,
    hidden_size, head_dim, intermediate_size, vocab_size, max_position_embeddings) or
    larger than 4096 (num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim), when
    rope_theta, rms_norm_eps or partial_rotary_factor is given and not a finite positive number (a field
    left out, None, takes its default: intermediate_size 4·hidden_size, max_position_embeddings 2048,
    rope_theta 10000, rms_norm_eps 1e-6), when rope_parameters is not a dict or layer_types not a list of str,
    when the heads do not divide (num_attention_heads by num_key_value_heads, or
    hidden_size by num_attention_heads without head_dim), when the model uses partial rotary embeddings
    (``partial_rotary_factor`` < 1), which the plans cannot describe, or when any layer has an active
    sliding window (``use_sliding_window`` / ``sliding_window`` / ``layer_types``, naming the layers):
    ratekv serves full causal attention only.
    """
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config

    def need(name: str, *alts: str) -> Any:
        for n in (name,) + alts:
            v = getattr(text, n, None)
            if v is not None:
                return v
        raise RatekvError(f"{type(hf_config).__name__}: no '{name}' (needed to describe the KV cache)")

    src = type(hf_config).__name__

    def positive(name: str, v: Any, hi: int = _I32[1]) -> int:
        # Checked here, naming the Hugging Face field: a 0 would divide by zero below, a negative or a huge
        # value would reach the binding as nanobind's unnamed TypeError.
        return _int_arg(src, name, v, 1, hi)

    cfg = ModelConfig()
    cfg.arch = str(getattr(text, "model_type", "") or "unknown")
    cfg.n_layers = positive("num_hidden_layers", need("num_hidden_layers"), _MAX_SHAPE)
    cfg.n_heads = positive("num_attention_heads", need("num_attention_heads"), _MAX_SHAPE)
    kv = getattr(text, "num_key_value_heads", None)
    cfg.n_kv_heads = positive("num_key_value_heads", kv if kv is not None else cfg.n_heads, _MAX_SHAPE)
    if cfg.n_heads % cfg.n_kv_heads != 0:
        raise RatekvError(f"{src}: num_attention_heads = {cfg.n_heads} is not a multiple of num_key_value_heads = "
                          f"{cfg.n_kv_heads}")
    cfg.d_model = positive("hidden_size", need("hidden_size"))
    hd = getattr(text, "head_dim", None)
    if hd is None and cfg.d_model % cfg.n_heads != 0:
        raise RatekvError(f"{src}: hidden_size = {cfg.d_model} is not a multiple of num_attention_heads = "
                          f"{cfg.n_heads} (and no head_dim is given)")
    cfg.head_dim = positive("head_dim", hd if hd is not None else cfg.d_model // cfg.n_heads, _MAX_SHAPE)
    def given(name: str, default: Any) -> Any:
        # A field left out (None) takes its default; a given 0 is refused below (`x or default` made
        # max_position_embeddings = 0 into 2048 and rope_theta = 0 into 10000).
        v = getattr(text, name, None)
        return default if v is None else v

    def positive_float(name: str, v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not (
                math.isfinite(float(v)) and float(v) > 0):
            raise RatekvError(f"{src}: {name} = {v!r}: expected a finite positive number")
        return float(v)

    cfg.d_ff = positive("intermediate_size", given("intermediate_size", 4 * cfg.d_model))
    cfg.n_vocab = positive("vocab_size", need("vocab_size"))
    cfg.n_ctx_train = positive("max_position_embeddings", given("max_position_embeddings", 2048))
    rp = getattr(text, "rope_parameters", None)
    if rp is not None and not isinstance(rp, dict):
        raise RatekvError(f"{src}: rope_parameters is a {type(rp).__name__}, expected a dict")
    rp = rp or {}
    if isinstance(rp.get("full_attention"), dict):
        rp = rp["full_attention"]
    theta = rp.get("rope_theta")
    cfg.rope_theta = positive_float("rope_theta", given("rope_theta", 10000.0) if theta is None else theta)
    prf = rp.get("partial_rotary_factor")
    prf = positive_float("partial_rotary_factor", given("partial_rotary_factor", 1.0) if prf is None else prf)
    if prf != 1.0:
        raise RatekvError(f"{cfg.arch}: partial_rotary_factor = {prf}: ratekv plans describe full-head RoPE only")
    cfg.rms_eps = positive_float("rms_norm_eps", given("rms_norm_eps", 1e-6))
    _refuse_sliding_window(text, src, cfg.n_layers)
    cfg.rope_layout = RopeLayout.neox
    cfg.validate(f"{type(hf_config).__name__}")
    return cfg


def _refuse_sliding_window(text: Any, src: str, n_layers: int) -> None:
    """RatekvError when a transformers config has an active sliding window on any layer: ratekv's HF
    caches (and the ModelConfig made here, which has no window) serve full causal attention only, and
    serving a windowed layer from them would silently attend to tokens the model masks out.

    Sliding layers: ``layer_types`` entries other than "full_attention" when the config has
    ``layer_types`` (transformers ≥ 5 derives it, e.g. Qwen2's from use_sliding_window /
    sliding_window / max_window_layers); otherwise every layer when ``sliding_window`` is set and
    ``use_sliding_window`` is not False (Mistral's semantics)."""
    window = getattr(text, "sliding_window", None)
    use = getattr(text, "use_sliding_window", None)
    types = getattr(text, "layer_types", None)
    if types is not None and (isinstance(types, str) or not isinstance(types, (list, tuple))
                              or not all(isinstance(t, str) for t in types)):
        raise RatekvError(f"{src}: layer_types = {types!r}: expected a list of attention kinds (str) per layer")
    if types is not None:
        sliding = [i for i, t in enumerate(types) if t != "full_attention"]
        kinds = sorted({str(types[i]) for i in sliding})
    else:
        sliding = list(range(n_layers)) if window is not None and use is not False else []
        kinds = ["sliding_attention"]
    if not sliding:
        return
    layers = ", ".join(str(i) for i in sliding[:8]) + (", …" if len(sliding) > 8 else "")
    mwl = getattr(text, "max_window_layers", None)
    raise RatekvError(
        f"{src}: use_sliding_window = {use}, sliding_window = {window}"
        + (f", max_window_layers = {mwl}" if mwl is not None else "")
        + f": layers {layers} of {n_layers} use {'/'.join(kinds)} (layer_types); ratekv serves full causal "
        "attention only (its caches would attend to tokens the window masks out); use a config without an "
        "active window (use_sliding_window=False or sliding_window=None)")


def uniform_plan(
    config: ModelConfig,
    k_bits: float = 3,
    v_bits: float = 3,
    quantizer: str = "tq-mse",
    budget_unit: str = "code",
    seed: Optional[int] = None,
    group_size: Optional[int] = None,
) -> Plan:
    """A uniform plan (every head, K at ``k_bits``, V at ``v_bits``) from the model's
    shapes alone, built by the C++ allocator (method ``uniform`` of make_plan.h).

    ``budget_unit`` "code": the widths are code bits (integers; TQ-MSE adds one fp16
    norm per head per token); "effective": the widest code whose code + metadata bits
    fit the budget. ``seed`` (default 0) seeds the rotations of tq-mse and quarot codecs;
    given for another quantizer it is refused (as :func:`make_plan` does); ``group_size``
    (default 32, a divisor of head_dim) is the scale group of kivi and quarot, refused for
    the others. Raises RatekvError for an impossible budget, naming the argument, or naming
    ``config`` when it is not a ratekv.ModelConfig."""
    _check_config("uniform_plan", config)
    try:
        return make_plan(
            _core.identity_stats(config), "uniform", k_bits=k_bits, v_bits=v_bits, quantizer=quantizer,
            budget_unit=budget_unit, seed=seed, group_size=group_size,
        )
    except RatekvError as e:
        msg = str(e)
        if msg.startswith("make_plan: "):
            raise RatekvError("uniform_plan: " + msg[len("make_plan: "):]) from None
        raise


class _DefaultBits(float):
    """make_plan's default k_bits / v_bits, 3.0: its own object, so that make_plan can tell a budget left at its
    default from one given (even as 3.0) when it refuses k_bits / v_bits beside avg_bits."""


_DEFAULT_BITS = _DefaultBits(3.0)


def make_plan(
    stats: Union[KVStats, CalibStats, PathLike],
    method: str = "block-gtq",
    *,
    k_bits: float = _DEFAULT_BITS,
    v_bits: float = _DEFAULT_BITS,
    avg_bits: Optional[float] = None,
    budget_unit: str = "effective",
    b_min: int = -1,
    b_max: int = -1,
    seed: Optional[int] = None,
    quantizer: str = "tq-mse",
    v_quantizer: str = "",
    curves_from: str = "",
    sensitivity: str = "grad",
    group_size: Optional[int] = None,
    fp16_window: int = 0,
    sink_tokens: int = 0,
) -> Plan:
    """Builds a plan with the C++ allocators (the library side of ``ratekv plan``).

    ``method``: ``uniform`` | ``block-gtq`` | ``ratequant`` | ``ratequant+block-gtq``
    (include/ratekv/alloc/make_plan.h gives what the budgets mean for each).
    ``stats``: a KVStats (from :func:`calibrate` / :func:`load_stats`), allocator
    CalibStats, or a statistics file path: the safetensors file of ``ratekv calibrate``
    or the JSON form (format "ratekv-calib-stats"), read by the same library call as
    ``ratekv plan --stats``; anything else is a TypeError naming ``stats``. RateQuant
    needs sensitivities and distortion curves in the statistics. ``seed`` (default 0:
    the rotations of tq-mse, block-gtq and quarot codecs) and ``group_size`` (default
    32: the scale group of kivi and quarot codecs), given for a request whose codecs do
    not use them, are refused naming the argument (as ``ratekv plan`` refuses --seed /
    --group-size). Raises RatekvError naming what is missing or out of range; integer
    arguments outside their C++ types (b_min, b_max, group_size: int32; seed:
    0..2^64-1; fp16_window, sink_tokens: 0..2^31-1), bit budgets that are not numbers and names that are not
    strings (None included) are refused here, naming the argument.

    Budgets: ``k_bits`` / ``v_bits`` (default 3.0 each) or ``avg_bits``, the average budget of keys and values
    (ratequant methods: default (k_bits + v_bits) / 2; uniform: the better K⌈b⌉V⌊b⌋ / K⌊b⌋V⌈b⌉ split,
    docs/design.md §4.4; block-gtq refuses it). Given together, avg_bits would decide alone: k_bits or v_bits
    beside avg_bits is a RatekvError naming them (as ``ratekv plan`` refuses --kbits / --vbits with --bits)."""
    stats_file = ""
    if isinstance(stats, (str, os.PathLike)):
        stats_file = os.path.basename(os.fspath(stats))
        st = _core.load_alloc_stats(os.fspath(stats))  # safetensors or JSON, as `ratekv plan --stats`
    elif isinstance(stats, KVStats):
        st = stats.to_alloc_stats()
    elif isinstance(stats, CalibStats):
        st = stats
    else:
        raise TypeError(f"make_plan: stats is {type(stats).__name__}; expected a KVStats, a CalibStats or the path "
                        "of a statistics file (the .safetensors of `ratekv calibrate`, or JSON statistics)")
    rq = _core.PlanRequest()
    rq.method = _str_arg("make_plan", "method", method)
    rq.k_bits = _float_arg("make_plan", "k_bits", k_bits)
    rq.v_bits = _float_arg("make_plan", "v_bits", v_bits)
    rq.avg_bits = None if avg_bits is None else _float_arg("make_plan", "avg_bits", avg_bits)
    per_side = [n for n, v in (("k_bits", k_bits), ("v_bits", v_bits)) if v is not _DEFAULT_BITS]
    if avg_bits is not None and per_side:  # avg_bits used to win silently
        raise RatekvError(f"make_plan: {', '.join(per_side)}: {'conflict' if len(per_side) > 1 else 'conflicts'} "
                          "with avg_bits (the average budget of keys and values); give avg_bits alone, or k_bits "
                          "and v_bits")
    rq.budget_unit = _str_arg("make_plan", "budget_unit", budget_unit)
    rq.b_min = _int_arg("make_plan", "b_min", b_min, *_I32)
    rq.b_max = _int_arg("make_plan", "b_max", b_max, *_I32)
    rq.seed = 0 if seed is None else _int_arg("make_plan", "seed", seed, *_U64)
    rq.quantizer = _str_arg("make_plan", "quantizer", quantizer)
    rq.v_quantizer = _str_arg("make_plan", "v_quantizer", v_quantizer)
    rq.curves_from = _str_arg("make_plan", "curves_from", curves_from)
    rq.sensitivity = _str_arg("make_plan", "sensitivity", sensitivity)
    rq.group_size = 32 if group_size is None else _int_arg("make_plan", "group_size", group_size, *_I32)
    _refuse_unused_codec_args(method, quantizer, v_quantizer, seed is not None, group_size is not None)
    rq.fp16_window = _int_arg("make_plan", "fp16_window", fp16_window, 0, _I32[1])
    rq.sink_tokens = _int_arg("make_plan", "sink_tokens", sink_tokens, 0, _I32[1])
    rq.stats_file = stats_file
    try:
        return _core.make_plan(st, rq)
    except RatekvError as e:
        # The allocator names its own fields ("PlanRequest.group_size 32: …"); they are this function's arguments.
        msg = str(e)
        if msg.startswith("PlanRequest."):
            field, _, rest = msg[len("PlanRequest."):].partition(" ")
            raise RatekvError(f"make_plan: {field} = {rest}") from None
        raise


def _refuse_unused_codec_args(method: Any, quantizer: Any, v_quantizer: Any, seed_given: bool,
                              group_size_given: bool) -> None:
    """RatekvError naming ``seed`` / ``group_size`` when given for a request whose codecs do not use them (they
    used to be ignored silently): the same rule and wording as ``ratekv plan``'s --seed / --group-size refusal
    (src/cli/cmd_plan.cpp refuse_ignored_flags). The codecs are ``quantizer`` and ``v_quantizer`` (or
    ``quantizer``); block-gtq and ratequant+block-gtq use tq-mse (make_plan refuses others)."""
    kq = quantizer
    vq = v_quantizer or quantizer
    gtq = method in ("block-gtq", "ratequant+block-gtq")
    codecs = "" if gtq else f" with quantizer {kq}" + (f" v_quantizer {v_quantizer}" if v_quantizer else "")
    if seed_given and not {kq, vq} & {"tq-mse", "quarot"}:
        raise RatekvError(f"make_plan: seed: not used by method {method}{codecs}: it seeds the rotations of tq-mse, "
                          "block-gtq and quarot codecs")
    if group_size_given and not {kq, vq} & {"kivi", "quarot"}:
        raise RatekvError(f"make_plan: group_size: not used by method {method}{codecs}: it is the scale group of "
                          "kivi and quarot codecs")


def _check_config(what: str, config: Any) -> None:
    if not isinstance(config, ModelConfig):
        raise RatekvError(f"{what}: config is a {type(config).__name__}, expected a ratekv.ModelConfig "
                          "(ratekv.model_config(hf_config) makes one)")


def _check_plan(what: str, plan: Any) -> None:
    """RatekvError naming ``plan`` unless it is a ratekv.Plan (nanobind's TypeError named PlanCodecs.__init__)."""
    if not isinstance(plan, Plan):
        raise RatekvError(f"{what}: plan is a {type(plan).__name__}, expected a ratekv.Plan (ratekv.load_plan, "
                          "make_plan or uniform_plan make one)")


def codecs(plan: Plan, config: ModelConfig, name: str = "plan") -> PlanCodecs:
    """The quantizers of ``plan`` for a model. Raises RatekvError listing every mismatch
    between plan and model (arch, layers, KV heads, head_dim, RoPE layout), or naming ``plan``,
    ``config`` or ``name`` when it is not a ratekv.Plan, a ratekv.ModelConfig or a str."""
    _check_plan("codecs", plan)
    _check_config("codecs", config)
    if not isinstance(name, str):
        raise RatekvError(f"codecs: name = {name!r}: expected a str (the plan's name in messages)")
    return PlanCodecs(plan, config, name)


def _to_f32_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor
        x = x.detach().to("cpu").float().contiguous().numpy()
    return np.ascontiguousarray(np.asarray(x, dtype=np.float32))


def _check_float_array(what: str, name: str, x: Any) -> None:
    """RatekvError naming ``name`` unless ``x`` is a real floating-point torch tensor with data (cpu / cuda) or
    something numpy reads as a floating-point array: integer, bool and complex input used to be converted
    (complex: its imaginary part dropped) and quantized silently, a meta tensor failed with NotImplementedError."""
    if hasattr(x, "detach"):
        if not x.dtype.is_floating_point:
            raise RatekvError(f"{what}: {name} has dtype {x.dtype}, expected a floating-point tensor (float32, "
                              "float16, bfloat16 or float64)")
        if x.device.type not in ("cpu", "cuda"):
            raise RatekvError(f"{what}: {name} is on device '{x.device}', expected a cpu or cuda tensor (meta "
                              "tensors hold no data)")
        return
    try:
        dtype = str(np.asarray(x).dtype)
    except Exception:  # noqa: BLE001  (ragged lists and the like: named below)
        dtype = "object"
    if np.dtype(dtype).kind != "f":
        raise RatekvError(f"{what}: {name} is a {type(x).__name__} of dtype {dtype}, expected floating-point values "
                          "(a numpy array, torch tensor or list of floats)")


def fake_quantize(
    x: Any,
    codecs: PlanCodecs,
    layer: int,
    side: str = "key",
    *,
    k_pre: Any = None,
    positions: Any = None,
    window: int = 0,
    sink: int = 0,
) -> Any:
    """Quantize → dequantize the K (``side="key"``) or V cache of one layer with the plan:
    what ratekv's fake-quant cache stores after one append of all T tokens
    (cache/fake_quant_cache.h ``fake_quant_sequence``).

    ``x``: (T, n_kv_heads, head_dim) post-RoPE keys or values, or
    (B, n_kv_heads, T, head_dim) (Hugging Face layout, 4-D; each batch row on its
    own). Returns the same type (numpy array, or torch tensor of x's dtype and
    device; a numpy array of x's dtype, float32 for a list) and shape. vq key layers need ``k_pre`` (pre-RoPE keys, x's layout)
    and ``positions``. ``window``/``sink``: fp16 rows at the end / start.
    Raises RatekvError for a wrong shape or non-finite input, for ``layer``
    outside 0..n_layers-1 or a negative ``window`` / ``sink``, for ``codecs`` that
    are not a PlanCodecs (a Plan: :func:`codecs` makes them), and for ``x`` /
    ``k_pre`` that are not floating point (integer, bool, complex) or are meta
    tensors (each naming the argument)."""
    if not isinstance(codecs, PlanCodecs):
        hint = (" (make them with ratekv.codecs(plan, config))" if isinstance(codecs, Plan) else "")
        raise RatekvError(f"fake_quantize: codecs is a {type(codecs).__name__}, expected a ratekv.PlanCodecs{hint}")
    _check_float_array("fake_quantize", "x", x)
    if k_pre is not None:
        _check_float_array("fake_quantize", "k_pre", k_pre)
    if side not in ("key", "value"):
        raise RatekvError(f"fake_quantize: side '{side}': expected 'key' or 'value'")
    s = 0 if side == "key" else 1
    layer = _int_arg("fake_quantize", "layer", layer, 0, codecs.config.n_layers - 1)
    window = _int_arg("fake_quantize", "window", window, 0, _I32[1])
    sink = _int_arg("fake_quantize", "sink", sink, 0, _I32[1])
    is_torch = hasattr(x, "detach")
    if is_torch:
        import torch
    xs = _to_f32_numpy(x)  # (a list is read by numpy; x.shape of a list was a bare AttributeError)
    four_d = xs.ndim == 4
    kp = None if k_pre is None else _to_f32_numpy(k_pre)
    if kp is not None and kp.shape != xs.shape:  # a 3-D k_pre beside a 4-D x reached numpy's transpose
        raise RatekvError(f"fake_quantize: k_pre has shape {tuple(kp.shape)}, expected x's shape {tuple(xs.shape)}")
    pos = None
    if positions is not None:
        try:
            p64 = np.asarray(positions.cpu() if hasattr(positions, "cpu") else positions)
        except Exception:  # noqa: BLE001  (ragged lists and the like: named below)
            p64 = np.asarray([], dtype=object)
        if p64.dtype.kind not in "iu":  # "abc" was numpy's ValueError, 2**40 an OverflowError
            raise RatekvError(f"fake_quantize: positions has dtype {p64.dtype}, expected integer token positions")
        if p64.size and (int(p64.min()) < 0 or int(p64.max()) > _I32[1]):
            raise RatekvError(f"fake_quantize: positions span {int(p64.min())}..{int(p64.max())}, expected "
                              "0..2^31-1")
        pos = np.ascontiguousarray(p64, dtype=np.int32)
    if four_d:
        rows = np.ascontiguousarray(xs.transpose(0, 2, 1, 3))  # (B, T, H, d)
        kps = None if kp is None else np.ascontiguousarray(kp.transpose(0, 2, 1, 3))
        out = np.empty_like(rows)
        for b in range(rows.shape[0]):
            _core.fake_quant_sequence(codecs, layer, s, rows[b], out[b], None if kps is None else kps[b], pos,
                                      window, sink)
        out = np.ascontiguousarray(out.transpose(0, 2, 1, 3))
    else:
        out = np.empty_like(xs)
        _core.fake_quant_sequence(codecs, layer, s, xs, out, kp, pos, window, sink)
    if is_torch:
        return torch.from_numpy(out).to(device=x.device, dtype=x.dtype)
    if isinstance(x, np.ndarray) and x.dtype != out.dtype:  # float64 / float16 came back as float32
        return out.astype(x.dtype)
    return out
