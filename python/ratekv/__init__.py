"""ratekv — rate–distortion-optimal KV-cache compression, from Python.

A thin face over the C++ core (no second implementation of any method):

* plans and calibration statistics: :func:`load_plan`, :func:`load_stats`,
  :func:`make_plan` (uniform, Block-GTQ, RateQuant, composed — the C++
  allocators), :func:`uniform_plan`;
* :func:`fake_quantize` — quantize → dequantize K/V with a plan;
* :class:`PackedKVCache` and the ``torch.ops.ratekv.*`` custom ops — the packed
  cache (prefill, append, decode attention from the codes); on CUDA tensors over
  the GPU engine's page pool, :class:`PagePool`;
* :func:`calibrate` — statistics of any transformers model (Q/K/V by hooks,
  ∂L/∂K, ∂L/∂V by autograd), the same file as ``ratekv calibrate``;
* :mod:`ratekv.hf` — ``PackedCache`` for ``model.generate``.

Torch and transformers are imported only by the modules that need them.
"""

from ._core import PagePool, has_cuda  # noqa: F401
from .core import (  # noqa: F401
    HF_ARCHES,
    CalibStats,
    KVStats,
    ModelConfig,
    Plan,
    PlanCodecs,
    RatekvError,
    RopeLayout,
    Tokenizer,
    codecs,
    fake_quantize,
    load_plan,
    load_stats,
    make_plan,
    model_config,
    save_plan,
    uniform_plan,
)

__version__ = "0.1.0"

# The public API, for help(), dir() and `from ratekv import *` (PackedKVCache, calibrate, hf and ops
# load lazily: torch / transformers only when used).
__all__ = [
    "CalibStats", "HF_ARCHES", "KVStats", "ModelConfig", "PackedKVCache", "PagePool", "Plan", "PlanCodecs",
    "RatekvError", "RopeLayout", "Tokenizer", "calibrate", "codecs", "fake_quantize", "has_cuda", "hf",
    "load_plan", "load_stats", "make_plan", "model_config", "ops", "save_plan", "uniform_plan",
]


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))


def __getattr__(name: str):  # lazy: torch / transformers only when used
    if name == "PackedKVCache":
        from .ops import PackedKVCache

        return PackedKVCache
    if name == "calibrate":
        from .calibration import calibrate

        return calibrate
    if name in ("hf", "ops"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'ratekv' has no attribute '{name}'")
