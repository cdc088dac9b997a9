"""The packed KV cache as torch tensors and ``torch.library`` custom ops.

Ops (namespace ``ratekv``; each has a fake/meta implementation, so
``torch.compile`` traces through them without running them):

``torch.ops.ratekv.append(seq_lens, k, v, handle, layer) -> ()``
    Quantizes n new tokens per sequence into the packed pages of ``layer``
    (prefill: n = prompt length; decode: n = 1). ``k``, ``v``: (B, n, n_kv_heads,
    head_dim), post-RoPE keys. Mutates ``seq_lens`` (B,) int32 (+= n): the op's
    visible effect, which also orders it before the attention that reads it.
``torch.ops.ratekv.decode_attention(seq_lens, q, handle, layer, scale) -> Tensor``
    Decode attention of one query per sequence, ``q`` (B, n_heads, head_dim),
    over every cached token of ``layer``, computed from the codes (the cache is
    never expanded to a K/V tensor). Returns (B, n_heads, head_dim) in q's dtype.

``handle`` names a :class:`PackedKVCache`'s storage (custom ops take tensors
and scalars only). CPU tensors run the C++ packed cache
(include/ratekv/cache/packed_kv_cache.h, docs/design.md §6) with OpenMP. CUDA
tensors need the extension built with CUDA and the GPU engine's page pool
(``ratekv._core.has_cuda``); without them the CUDA kernels raise a clear error
— there is no silent fallback.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Dict, Optional

import torch

from . import _core
from .core import ModelConfig, Plan, PlanCodecs, RatekvError

_registry: Dict[int, Any] = {}
_next_handle = itertools.count(1)
_lock = threading.Lock()


def _register(obj: Any) -> int:
    with _lock:
        h = next(_next_handle)
        _registry[h] = obj
        return h


def _release(handle: int) -> None:
    with _lock:
        _registry.pop(handle, None)


def _lookup(handle: int) -> Any:
    try:
        return _registry[handle]
    except KeyError:
        raise RatekvError(f"ratekv op: cache handle {handle} is not live (the PackedKVCache was released)") from None


def _cuda_unavailable(what: str) -> RatekvError:
    if not _core.has_cuda:
        return RatekvError(f"{what}: this ratekv extension was built without CUDA (rebuild on a machine with nvcc "
                           "and torch CUDA, RATEKV_CUDA=ON); use CPU tensors")
    return RatekvError(f"{what}: the CUDA packed cache needs the GPU engine's page pool, not in this build")


@torch.library.custom_op("ratekv::append", mutates_args=("seq_lens",))
def append(seq_lens: torch.Tensor, k: torch.Tensor, v: torch.Tensor, handle: int, layer: int) -> None:
    """Quantize-append (B, n, n_kv_heads, head_dim) keys/values into the packed cache; seq_lens += n."""
    impl = _lookup(handle)
    if k.device.type == "cpu":
        impl.append(layer, k.detach().float().contiguous(), v.detach().float().contiguous(), None)
        seq_lens.add_(k.shape[1])
        return
    raise _cuda_unavailable("ratekv::append")


@append.register_fake
def _append_fake(seq_lens: torch.Tensor, k: torch.Tensor, v: torch.Tensor, handle: int, layer: int) -> None:
    return None


@torch.library.custom_op("ratekv::decode_attention", mutates_args=())
def decode_attention(seq_lens: torch.Tensor, q: torch.Tensor, handle: int, layer: int, scale: float) -> torch.Tensor:
    """Attention of q (B, n_heads, head_dim) over the packed cache of ``layer``; (B, n_heads, head_dim)."""
    impl = _lookup(handle)
    if q.device.type == "cpu":
        qf = q.detach().float().contiguous().unsqueeze(1)
        out = torch.empty_like(qf)
        impl.attend(layer, qf, out, float(scale))
        return out.squeeze(1).to(q.dtype)
    raise _cuda_unavailable("ratekv::decode_attention")


@decode_attention.register_fake
def _decode_attention_fake(seq_lens: torch.Tensor, q: torch.Tensor, handle: int, layer: int,
                           scale: float) -> torch.Tensor:
    return torch.empty_like(q)


class PackedKVCache:
    """A packed KV cache for a batch of B sequences of one model: codes in the packed
    format (docs/packed_format.md), attention computed from the codes.

    Args:
        plan: the compression plan (must match ``config``: arch, shapes, RoPE layout).
        config: the model (:func:`ratekv.model_config` for a Hugging Face config).
        batch_size: B.
        max_tokens: capacity per sequence (appending past it raises).
        device: ``"cpu"`` (C++ packed cache) or a CUDA device (needs the CUDA build).

    Per layer ``l``: :meth:`append` (n ≥ 1 tokens, all sequences at once), then
    :meth:`decode_attention` for one query per sequence. ``seq_lens[l]`` is a (B,)
    int32 tensor on ``device`` with the tokens stored per sequence.
    Raises RatekvError for a plan the packed cache cannot serve (kivi, quarot,
    q8_0, q4_0 codecs), a plan of another model or RoPE layout, non-finite K/V/Q.
    """

    def __init__(self, plan: Plan, config: ModelConfig, batch_size: int, max_tokens: int,
                 device: Any = "cpu") -> None:
        self.device = torch.device(device)
        self.config = config
        self.plan = plan
        self.codecs = PlanCodecs(plan, config, "plan")
        self.batch_size = int(batch_size)
        self.scale = float(config.attention_scale())  # a Python float: nothing for torch.compile to trace
        if self.device.type == "cpu":
            self._impl = _core.PackedBatch(self.codecs, self.batch_size, int(max_tokens))
        else:
            raise _cuda_unavailable("PackedKVCache(device='cuda')")
        self.handle = _register(self._impl)
        self.seq_lens = [torch.zeros(self.batch_size, dtype=torch.int32, device=self.device)
                         for _ in range(config.n_layers)]

    def __del__(self) -> None:
        h = getattr(self, "handle", None)
        if h is not None:
            _release(h)

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Stores n new tokens: k, v (B, n, n_kv_heads, head_dim), post-RoPE keys."""
        torch.ops.ratekv.append(self.seq_lens[layer], k, v, self.handle, layer)

    def decode_attention(self, layer: int, q: torch.Tensor, scale: Optional[float] = None) -> torch.Tensor:
        """softmax(scale·q·K̂ᵀ)·V̂ over every stored token of ``layer``, from the codes.
        q: (B, n_heads, head_dim) post-RoPE; returns the same shape and dtype.
        ``scale`` defaults to the model's (1/sqrt(head_dim) unless the config says otherwise)."""
        s = self.scale if scale is None else float(scale)
        return torch.ops.ratekv.decode_attention(self.seq_lens[layer], q, self.handle, layer, s)

    def reset(self) -> None:
        """Drops every stored token (all layers and sequences)."""
        self._impl.clear()
        for s in self.seq_lens:
            s.zero_()

    @property
    def nbytes(self) -> int:
        """Bytes of K/V storage held (pages, fp16 sink/window rows, positions)."""
        return int(self._impl.bytes)
