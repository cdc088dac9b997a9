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
tensors run the kernels of src/cuda (packed_append / packed_prefill /
packed_decode_attention) over the GPU engine's page pool (:class:`ratekv.PagePool`,
engine/page_pool.h: the engine's free list, page tables and 64-bit page offsets)
whose pages are torch device tensors, with the engine's per-layer tables
(engine/cache_format.h), on torch's current stream;
they need an extension built with CUDA and the engine (``ratekv.has_cuda``),
else a clear RatekvError — there is no silent fallback. The GPU path serves
tq-mse / Block-GTQ / RateQuant plans with 1..4-bit groups (what the engine
serves); bf16 inputs are converted to fp16 at the kernel boundary.
"""

from __future__ import annotations

import itertools
import math
import threading
import weakref
from typing import Any, Optional

import torch

from . import _core
from .core import (_I32, ModelConfig, Plan, PlanCodecs, RatekvError, _check_config, _check_plan, _float_arg, _int_arg,
                   _track_native)

# handle -> store, held weakly: the store belongs to its PackedKVCache; this module's
# globals are reachable from torch's operator registry (the op functions below) for the
# life of the process, so a strong entry here would keep a store alive after its cache.
_registry: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()
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
    return RatekvError(f"{what}: this ratekv extension was built without the CUDA packed cache (it needs nvcc and "
                       "the GPU engine's library, RATEKV_CUDA=ON); use CPU tensors")


class _CpuStore:
    """B C++ PackedKVCache sequences (python/src/bind_cache.cpp)."""

    def __init__(self, codecs: PlanCodecs, batch: int, max_tokens: int) -> None:
        self.impl = _core.PackedBatch(codecs, batch, max_tokens)
        self.n_layers = codecs.config.n_layers
        self.batch = batch

    def check_lens(self, what: str, layer: int, seq_lens: torch.Tensor) -> None:
        """The lengths the op was given are the ones this store holds (the CPU store keeps its own: a
        mismatch would be ignored silently, and the caller's tensor would drift from the cache)."""
        if self.impl.unusable:
            raise RatekvError(f"{what}: the cache is unusable: {self.impl.unusable}; reset() it")
        held = self.impl.lengths(layer) if 0 <= layer < self.n_layers else None
        if held is not None and seq_lens.tolist() != held:
            raise RatekvError(f"{what}: seq_lens {seq_lens.tolist()} differ from the {held} tokens the cache holds "
                              f"for layer {layer} (pass the PackedKVCache's own seq_lens[layer])")

    def append(self, layer: int, seq_lens: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.check_lens("ratekv::append", layer, seq_lens)
        self.impl.append(layer, k.detach().float().contiguous(), v.detach().float().contiguous(), None)
        seq_lens.add_(k.shape[1])

    def attend(self, layer: int, seq_lens: torch.Tensor, q: torch.Tensor, scale: float) -> torch.Tensor:
        self.check_lens("ratekv::decode_attention", layer, seq_lens)
        qf = q.detach().float().contiguous().unsqueeze(1)
        out = torch.empty_like(qf)
        self.impl.attend(layer, qf, out, float(scale))
        return out.squeeze(1).to(q.dtype)

    def clear(self) -> None:
        self.impl.clear()

    @property
    def nbytes(self) -> int:
        return int(self.impl.bytes)


class _CudaStore:
    """The GPU engine's page pool (``_core.PagePool``, engine/page_pool.h) over torch device
    memory, the kernels of src/cuda over its pages.

    The pool has batch · ceil(max_tokens / 64) pages per layer; each of the B sequences
    reserves ceil(max_tokens / 64) of them (``add_sequence``: lowest ids first, so sequence b
    holds pages b·P … b·P + P − 1) and the pool writes their page-table rows. Per layer one
    uint8 tensor of ``pool.layer_bytes(l)`` bytes (the plan's page bytes for that layer,
    engine/cache_format.h) is bound to the pool; the page table (B, P) and the (B,) int32
    lengths are tensors too. Nothing is allocated after construction (torch's allocator, so
    CUDA graphs and torch.compile see every buffer) and every launch goes to torch's current
    stream, so steps can be captured in CUDA graphs. The kernels' max_seq_len bound is the
    capacity (a constant across steps, as a graph needs).

    Appends are checked on the host against the capacity (RatekvError before any launch); a
    replayed CUDA graph runs no Python, so its caller must stay inside max_tokens."""

    def __init__(self, codecs: PlanCodecs, batch: int, max_tokens: int, device: torch.device) -> None:
        import numpy as np

        self.tables = _core.CudaPackedLayers(codecs)
        self.batch = batch
        self.max_tokens = max_tokens
        self.pages_per_seq = -(-max_tokens // 64)
        self.pool = self.tables.make_pool(batch * self.pages_per_seq, self.pages_per_seq)
        self.pages = [torch.zeros(self.pool.layer_bytes(l), dtype=torch.uint8, device=device)
                      for l in range(self.tables.n_layers)]
        for l, t in enumerate(self.pages):
            self.pool.bind_layer(l, t.data_ptr(), t.numel())
        self.seqs = [self.pool.add_sequence(max_tokens) for _ in range(batch)]
        rows = np.empty((batch, self.pages_per_seq), dtype=np.int32)
        self.pool.page_table(self.seqs, rows)
        self.page_table = torch.from_numpy(rows).to(device)
        self.host_lens = [0] * self.tables.n_layers
        self.ws_bytes = int(self.tables.workspace_bytes(batch, max_tokens))
        self.workspace = torch.empty(self.ws_bytes, dtype=torch.uint8, device=device)
        self.device = device

    def _stream(self) -> int:
        return torch.cuda.current_stream(self.device).cuda_stream

    def append(self, layer: int, seq_lens: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        n = k.shape[1]
        if not 0 <= layer < len(self.host_lens):
            raise RatekvError(f"PackedKVCache.append: layer {layer} outside 0..{len(self.host_lens) - 1}")
        if self.host_lens[layer] + n > self.max_tokens:
            raise RatekvError(f"PackedKVCache.append: layer {layer}: {self.host_lens[layer]} cached + {n} new tokens "
                              f"exceed capacity max_tokens = {self.max_tokens}")
        f16 = k.dtype != torch.float32
        k = (k.to(torch.float16) if f16 else k).contiguous()
        v = (v.to(torch.float16) if f16 else v.float()).contiguous()
        self.tables.append(layer, self.pool, self.page_table.data_ptr(), seq_lens.data_ptr(), self.batch,
                           self.max_tokens, k.data_ptr(), v.data_ptr(), n, f16, self._stream())
        seq_lens.add_(n)
        self.host_lens[layer] += n

    def attend(self, layer: int, seq_lens: torch.Tensor, q: torch.Tensor, scale: float) -> torch.Tensor:
        f16 = q.dtype != torch.float32
        qc = (q.to(torch.float16) if f16 else q).contiguous()
        out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        self.tables.decode(layer, self.pool, self.page_table.data_ptr(), seq_lens.data_ptr(), self.batch,
                           self.max_tokens, qc.data_ptr(), f16, float(scale), out.data_ptr(),
                           self.workspace.data_ptr(), self.ws_bytes, self._stream())
        return out.to(q.dtype)

    def clear(self) -> None:
        # The lengths (reset by the owner) say what is stored; pages are overwritten bit-exactly.
        self.host_lens = [0] * len(self.host_lens)

    @property
    def nbytes(self) -> int:
        return sum(p.numel() for p in self.pages)


def _check_device(what: str, t: torch.Tensor, store: Any) -> None:
    want = "cuda" if isinstance(store, _CudaStore) else "cpu"
    if t.device.type != want:
        raise RatekvError(f"{what}: tensor on {t.device}, the cache lives on {want}")


def _check_store_lens(what: str, seq_lens: torch.Tensor, store: Any) -> None:
    """seq_lens holds one length per sequence of the store, on its device: the CUDA kernels read B entries
    from its data pointer (a shorter tensor was read past its end). Its values are checked against the
    cache on the CPU (_CpuStore.check_lens); on CUDA that would synchronize, so there they are the caller's
    contract (PackedKVCache passes its own)."""
    if seq_lens.numel() != store.batch:
        raise RatekvError(f"{what}: seq_lens has {seq_lens.numel()} entries, the cache holds {store.batch} "
                          "sequences")
    _check_device(what, seq_lens, store)


#: dtypes of K, V and Q the packed cache takes (CPU: computed in float32; CUDA: fp16 / bf16 go to the kernels
#: as fp16, float32 as float32).
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_tensor(what: str, name: str, t: Any) -> None:
    """RatekvError naming argument ``name`` unless ``t`` is a tensor of a FLOAT_DTYPES dtype on a real device:
    integer, bool, complex and float64 tensors were converted silently before, and meta tensors (no data)
    went to the fake kernel, which returns without doing anything."""
    if not isinstance(t, torch.Tensor):
        raise RatekvError(f"{what}: {name} is a {type(t).__name__}, expected a torch.Tensor")
    if t.dtype not in FLOAT_DTYPES:
        raise RatekvError(f"{what}: {name} has dtype {t.dtype}, expected one of "
                          f"{', '.join(str(d) for d in FLOAT_DTYPES)}")
    if t.device.type not in ("cpu", "cuda"):
        raise RatekvError(f"{what}: {name} is on device '{t.device}', expected a cpu or cuda tensor (the packed "
                          "cache stores data; meta tensors hold none)")


def _check_seq_lens(what: str, seq_lens: Any) -> None:
    if not isinstance(seq_lens, torch.Tensor) or seq_lens.dtype != torch.int32 or seq_lens.dim() != 1:
        desc = f"dtype {seq_lens.dtype}, shape {tuple(seq_lens.shape)}" if isinstance(seq_lens, torch.Tensor) \
            else type(seq_lens).__name__
        raise RatekvError(f"{what}: seq_lens ({desc}): expected a 1-D torch.int32 tensor")


def _check_fake_args(what: str, seq_lens: torch.Tensor, **tensors: torch.Tensor) -> None:
    # Also the fake kernels: torch.compile traces with FakeTensors, whose device is the real one (never meta), so
    # these checks fail at trace time exactly where the eager op fails.
    _check_seq_lens(what, seq_lens)
    for name, t in tensors.items():
        _check_tensor(what, name, t)


@torch.library.custom_op("ratekv::append", mutates_args=("seq_lens",))
def append(seq_lens: torch.Tensor, k: torch.Tensor, v: torch.Tensor, handle: int, layer: int) -> None:
    """Quantize-append (B, n, n_kv_heads, head_dim) keys/values into the packed cache; seq_lens += n."""
    _check_fake_args("ratekv::append", seq_lens, k=k, v=v)
    store = _lookup(handle)
    _check_device("ratekv::append", k, store)
    _check_device("ratekv::append", v, store)
    _check_store_lens("ratekv::append", seq_lens, store)
    store.append(layer, seq_lens, k, v)


@append.register_fake
def _append_fake(seq_lens: torch.Tensor, k: torch.Tensor, v: torch.Tensor, handle: int, layer: int) -> None:
    _check_fake_args("ratekv::append", seq_lens, k=k, v=v)
    return None


@torch.library.custom_op("ratekv::decode_attention", mutates_args=())
def decode_attention(seq_lens: torch.Tensor, q: torch.Tensor, handle: int, layer: int, scale: float) -> torch.Tensor:
    """Attention of q (B, n_heads, head_dim) over the packed cache of ``layer``; (B, n_heads, head_dim)."""
    _check_fake_args("ratekv::decode_attention", seq_lens, q=q)
    store = _lookup(handle)
    _check_device("ratekv::decode_attention", q, store)
    _check_store_lens("ratekv::decode_attention", seq_lens, store)
    return store.attend(layer, seq_lens, q, scale)


@decode_attention.register_fake
def _decode_attention_fake(seq_lens: torch.Tensor, q: torch.Tensor, handle: int, layer: int,
                           scale: float) -> torch.Tensor:
    _check_fake_args("ratekv::decode_attention", seq_lens, q=q)
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
    q8_0, q4_0 codecs), a plan of another model or RoPE layout, non-finite K/V/Q,
    ``batch_size`` / ``max_tokens`` outside 1..2^31-1, a device other than cpu / cuda,
    and (cpu) a ``batch_size`` whose sequences' layout tables alone exceed this machine's memory.
    An append checks every sequence before it writes any: a bad one leaves the batch as it was.
    """

    def __init__(self, plan: Plan, config: ModelConfig, batch_size: int, max_tokens: int,
                 device: Any = "cpu") -> None:
        _check_plan("PackedKVCache", plan)
        _check_config("PackedKVCache", config)
        self.device = torch.device(device)
        self.config = config
        self.plan = plan
        self.batch_size = _int_arg("PackedKVCache", "batch_size", batch_size, 1, _I32[1])
        max_tokens = _int_arg("PackedKVCache", "max_tokens", max_tokens, 1, _I32[1])
        if self.device.type not in ("cpu", "cuda"):
            raise RatekvError(f"PackedKVCache: device = '{self.device}': expected 'cpu' or a cuda device")
        self.codecs = PlanCodecs(plan, config, "plan")
        self.scale = float(config.attention_scale())  # a Python float: nothing for torch.compile to trace
        if self.device.type == "cpu":
            self._impl: Any = _CpuStore(self.codecs, self.batch_size, max_tokens)
        elif self.device.type == "cuda" and _core.has_cuda:
            if not torch.cuda.is_available():  # built with nvcc, but no usable GPU or driver here
                raise RatekvError(f"PackedKVCache(device='{self.device}'): this extension has the CUDA packed "
                                  "cache (ratekv.has_cuda) but torch sees no usable CUDA device "
                                  "(torch.cuda.is_available() is False); use device='cpu'")
            self._impl = _CudaStore(self.codecs, self.batch_size, max_tokens, self.device)
        else:
            raise _cuda_unavailable(f"PackedKVCache(device='{self.device}')")
        self.handle = _register(self._impl)
        self.seq_lens = [torch.zeros(self.batch_size, dtype=torch.int32, device=self.device)
                         for _ in range(config.n_layers)]
        _track_native(self)

    def __del__(self) -> None:
        h = getattr(self, "handle", None)
        if h is not None:
            _release(h)

    def _release_native(self) -> None:
        """At interpreter exit (ratekv.core): drops the C++ store, codecs, plan and config, so
        none outlives Python when something (torch's op registry, a torch.compile cache)
        still holds this object; the cache is unusable afterwards."""
        if getattr(self, "handle", None) is not None:
            _release(self.handle)
            self.handle = None
        self._impl = self.codecs = self.plan = self.config = None

    def _layer(self, what: str, layer: Any) -> int:
        # Before indexing seq_lens: a Python list would raise IndexError for 99 and wrap -1 to the last layer.
        return _int_arg(f"PackedKVCache.{what}", "layer", layer, 0, len(self.seq_lens) - 1)

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Stores n new tokens: k, v (B, n, n_kv_heads, head_dim), post-RoPE keys, float32 / float16 /
        bfloat16 on the cache's device. Raises RatekvError naming ``layer`` outside 0..n_layers-1 and
        ``k`` / ``v`` of another dtype or device (meta included)."""
        layer = self._layer("append", layer)
        _check_tensor("PackedKVCache.append", "k", k)
        _check_tensor("PackedKVCache.append", "v", v)
        torch.ops.ratekv.append(self.seq_lens[layer], k, v, self.handle, layer)

    def decode_attention(self, layer: int, q: torch.Tensor, scale: Optional[float] = None) -> torch.Tensor:
        """softmax(scale·q·K̂ᵀ)·V̂ over every stored token of ``layer``, from the codes.
        q: (B, n_heads, head_dim) post-RoPE; returns the same shape and dtype.
        ``scale`` defaults to the model's (1/sqrt(head_dim) unless the config says otherwise).
        Raises RatekvError as :meth:`append` for ``layer`` and ``q``."""
        layer = self._layer("decode_attention", layer)
        _check_tensor("PackedKVCache.decode_attention", "q", q)
        if scale is None:
            s = self.scale
        elif torch.compiler.is_compiling():
            s = scale  # traced (a SymFloat): the checks below would break torch.compile's graph
        else:
            s = _float_arg("PackedKVCache.decode_attention", "scale", scale)
            if not math.isfinite(s):
                raise RatekvError(f"PackedKVCache.decode_attention: scale = {scale!r}: expected a finite number")
        return torch.ops.ratekv.decode_attention(self.seq_lens[layer], q, self.handle, layer, s)

    def reset(self) -> None:
        """Drops every stored token (all layers and sequences)."""
        self._impl.clear()
        for s in self.seq_lens:
            s.zero_()

    @property
    def nbytes(self) -> int:
        """Bytes of K/V storage held (pages, fp16 sink/window rows, positions)."""
        return int(self._impl.nbytes)
