"""Hugging Face transformers (≥ 5) integration: a KV cache that stores codes.

``PackedCache(plan, model.config)`` is a transformers ``Cache`` whose layers keep
keys and values in ratekv's packed format (docs/packed_format.md), plus an
attention function registered in transformers' ``AttentionInterface`` under the
name ``"ratekv"`` that computes decode attention from the codes
(:mod:`ratekv.ops`) — the cache is never dequantized into a K/V tensor::

    cache = ratekv.hf.PackedCache(plan, model.config)
    out = model.generate(**inputs, past_key_values=cache, max_new_tokens=32)

Serving mode (docs/design.md §9.2): the prompt's forward pass (the
first update of an empty cache) attends to its own full-precision K/V through
PyTorch SDPA, and its K/V are packed at the same time; from then on every decode
step quantize-appends its token (before attending, so the token reads its own
codes, as the C++ packed cache does) and attends from codes only.

``FakeQuantCache(plan, model.config)`` is the reference of the same semantics:
it stores what the plan's codecs reconstruct (ratekv's fake-quant path) as
dense tensors and attends with SDPA; on the same codes it must agree with
``PackedCache`` to fp32 rounding on the CPU (docs/design.md §6). On CUDA the
kernels compute in fp16 / int8 and the prompt's prefill may pick the
neighbouring code near a Lloyd–Max midpoint (an equally good code), so the two
differ by more there (python/tests/test_cuda.py says how much).
"""

from __future__ import annotations

import threading
from typing import Any, Optional

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .core import (_I32, HF_ARCHES, Plan, PlanCodecs, RatekvError, _check_plan, _int_arg, _track_native, fake_quantize,
                   model_config)
from .ops import PackedKVCache

#: The name under which the attention function is registered.
ATTENTION_NAME = "ratekv"


class _Active(threading.local):
    layer: Optional["PackedLayer"] = None


_active = _Active()


class _TracedActive:
    layer: Optional["PackedLayer"] = None


# Under torch.compile the hand-over goes through a plain object: dynamo does not follow
# attribute writes of a threading.local, so the attention function traced right after
# update() would read the previous value (the prefill/SDPA branch) — a compile error at
# best. Dynamo specializes on the branch taken and replays the writes after the graph.
# A compiled forward therefore shares one slot among threads: compile-mode decode steps
# of PackedCaches must not run concurrently in several threads of one process.
_traced_active = _TracedActive()


def _slot() -> Any:
    return _traced_active if torch.compiler.is_compiling() else _active


def packed_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function ``"ratekv"``.

    query (B, n_heads, q_len, head_dim); returns (B, q_len, n_heads, head_dim), as
    transformers' SDPA function does. A decode step (q_len = 1) of a layer whose
    cache is a :class:`PackedCache` reads the codes (``torch.ops.ratekv.
    decode_attention``); every other call (the prompt's prefill in serving mode,
    other caches) is PyTorch SDPA over the given K/V. Raises RatekvError for a
    padded batch in a packed decode step (sequences must have equal lengths)."""
    slot = _slot()
    layer = slot.layer
    slot.layer = None
    if layer is None or layer.layer_idx != getattr(module, "layer_idx", None) or layer.mode != "decode":
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if query.shape[2] != 1:
        raise RatekvError(f"PackedCache: layer {layer.layer_idx}: decode attention takes one query per sequence, "
                          f"got {query.shape[2]}")
    # Every decode step is checked, not only the first: a later step's mask can hide tokens the first
    # one did not (a caller's own loop, a cache continued with another batch); one host read per step
    # (at the step's first layer, ``_mask_checked_at`` = the cached length it checked).
    if attention_mask is not None and (torch.compiler.is_compiling()
                                       or layer.owner._mask_checked_at != layer.length):
        ok = attention_mask.all() if attention_mask.dtype == torch.bool else (attention_mask == 0).all()
        msg = ("PackedCache: the attention mask hides cached tokens (a padded batch); PackedCache serves batches "
               "of equal-length prompts only")
        if torch.compiler.is_compiling():
            # No host read under torch.compile (it would break the graph inside the layer loop,
            # and dynamo then runs the whole decoder eagerly): an asynchronous device-side
            # assertion, checked on every step, that fails the step loudly.
            torch._assert_async(ok, msg)
        else:
            if not bool(ok):
                raise RatekvError(msg)
            layer.owner._mask_checked_at = layer.length
    scale = float(scaling) if scaling is not None else float(query.shape[-1]) ** -0.5
    out = layer.owner.store.decode_attention(layer.layer_idx, query[:, :, 0, :], scale)  # (B, H, d)
    return out.unsqueeze(1), None


def register() -> None:
    """Registers ``"ratekv"`` in transformers' AttentionInterface (and its mask
    interface, with SDPA's masks). Idempotent; :class:`PackedCache` calls it."""
    ALL_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, packed_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, sdpa_mask)


#: Codec kinds the packed store holds (cache/packed_kv_cache.h; vq is refused separately: pre-RoPE keys).
_PACKED_KINDS = ("tq-mse", "tq-mse-grouped", "fp16")


class PackedLayer(CacheLayerMixin):
    """One layer of a :class:`PackedCache`: its K/V live in the packed store; the
    update returns the given (new) K/V, which only a prefill's SDPA reads."""

    is_compileable = False
    is_sliding = False
    is_croppable = False

    def __init__(self, owner: "PackedCache", layer_idx: int) -> None:
        super().__init__()
        self.owner = owner
        self.layer_idx = layer_idx
        self.length = 0
        self.mode: Optional[str] = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """key_states, value_states: (B, n_kv_heads, n, head_dim), keys post-RoPE."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.owner._ensure_store(key_states)
        n = key_states.shape[-2]
        if self.length > 0 and n != 1:
            raise RatekvError(f"PackedCache: layer {self.layer_idx}: {n} new tokens, the cache already holds "
                              f"{self.length} tokens per sequence; it takes one prompt (prefill) and then one token "
                              "per step: call reset() before a new prompt")
        self.owner.store.append(self.layer_idx, key_states.transpose(1, 2), value_states.transpose(1, 2))
        self.mode = "prefill" if self.length == 0 else "decode"
        self.length += n
        _slot().layer = self
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        if query_length == 0 and self.length > 0:
            # generate() on a cache that already holds the prompt (a second call without reset()) hands the model
            # no new token: transformers then fails on an empty tensor, naming neither the cache nor reset().
            self.owner._refuse_reuse()
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.length = 0
        self.mode = None
        if self.owner.store is not None:
            self.owner.store.reset()

    def _unsupported(self, what: str) -> None:
        raise RatekvError(f"PackedCache: {what} is not supported (the packed cache appends only)")

    def crop(self, tokens_to_remove: int) -> None:
        self._unsupported("crop (assisted decoding)")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._unsupported("reorder_cache (beam search)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._unsupported("batch_repeat_interleave (num_return_sequences / beams)")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._unsupported("batch_select_indices")


class PackedCache(Cache):
    """A transformers ``Cache`` that stores K/V as ratekv codes and attends from them.

    Args:
        plan: a ratekv :class:`~ratekv.Plan` for this model — made from statistics of
            the HF model (:func:`ratekv.calibrate`) or :func:`ratekv.uniform_plan` of
            :func:`ratekv.model_config`. Its RoPE layout must be ``neox`` (HF's half-split
            Q/K order); a plan made from a GGUF ``llama`` file (interleaved pairs) is
            refused, as is one for other shapes, and one with codecs the packed store
            does not hold (kivi, quarot, q8_0, q4_0, vq: use :class:`FakeQuantCache`).
        config: ``model.config`` (Llama or Qwen2 models). The constructor sets
            ``config._attn_implementation = "ratekv"`` (registered in transformers'
            AttentionInterface): SDPA for every call but a packed decode step.
        max_cache_len: tokens per sequence the store accepts (default, None: the model's
            ``max_position_embeddings``); RatekvError unless None or an integer in 1..2^31-1.

    Serving mode: the first forward (the prompt) attends to its own full-precision
    K/V with SDPA while they are packed; each later step appends one token per
    sequence (quantized before its own attention) and attends from the codes.
    Batches must hold equal-length (unpadded) prompts; beam search, cropping
    and chunked prefill onto a non-empty cache raise RatekvError.
    Memory: :attr:`nbytes` is what the store holds (codes, norms, positions).
    """

    def __init__(self, plan: Plan, config: Any, max_cache_len: Optional[int] = None) -> None:
        arch = getattr(config.get_text_config() if hasattr(config, "get_text_config") else config, "model_type", "")
        if arch not in HF_ARCHES:
            raise RatekvError(f"PackedCache: model_type '{arch}' is not served (expected one of {', '.join(HF_ARCHES)})")
        _check_plan("PackedCache", plan)
        self.rk_config = model_config(config)
        self.plan = plan
        PlanCodecs(plan, self.rk_config, "plan")  # refuse a plan of another model or layout now, not mid-generate
        kinds = plan.codec_kinds()
        for kind in sorted(set(kinds)):
            if kind == "vq":
                raise RatekvError("PackedCache: vq (TaSQ / CQ) plans quantize pre-RoPE keys, which transformers' "
                                  "cache interface does not hand over; use a scalar (tq-mse, Block-GTQ, RateQuant) plan")
            if kind not in _PACKED_KINDS:
                # Checked here: the packed store is built at the first forward, which failed naming a C++ class.
                i = kinds.index(kind)
                side = "key" if i % 2 == 0 else "value"
                raise RatekvError(
                    f"PackedCache: plan: codec kind '{kind}' (first at layer {i // 2 // plan.n_kv_heads}, head "
                    f"{i // 2 % plan.n_kv_heads}, {side}) has no packed storage; PackedCache serves "
                    f"{', '.join(_PACKED_KINDS)} plans (tq-mse, Block-GTQ, RateQuant, fp16) — evaluate a {kind} plan "
                    "with ratekv.hf.FakeQuantCache")
        # None is the default; 0 used to fall back to it silently (``or``), and a negative or huge value
        # reached the binding as nanobind's unnamed TypeError.
        self.capacity = (self.rk_config.n_ctx_train if max_cache_len is None
                         else _int_arg("PackedCache", "max_cache_len", max_cache_len, 1, _I32[1]))
        self.store: Optional[PackedKVCache] = None
        self._mask_checked_at = -1
        register()
        config._attn_implementation = ATTENTION_NAME
        super().__init__(layers=[PackedLayer(self, i) for i in range(self.rk_config.n_layers)])
        _track_native(self)

    def _release_native(self) -> None:
        """At interpreter exit (ratekv.core): drops the store, plan and config (C++ objects)."""
        if self.store is not None:
            self.store._release_native()
        self.store = self.plan = self.rk_config = None

    def _held(self) -> int:
        return max((layer.length for layer in self.layers), default=0)

    def _refuse_reuse(self) -> None:
        raise RatekvError(f"PackedCache: the cache already holds {self._held()} tokens per sequence and the forward "
                          "brings no new one (a second generate() on the same cache?); call reset() before a new "
                          "prompt")

    def _ensure_store(self, key_states: torch.Tensor) -> None:
        """Makes the store on the first update; after reset() (nothing held) a new batch size gets a new store
        (one of the same size is kept: its buffers may be captured in a CUDA graph)."""
        b = key_states.shape[0]
        if self.store is not None and self.store.batch_size != b:
            held = self._held()
            if held > 0:
                raise RatekvError(f"PackedCache: batch size {b}, the cache holds {self.store.batch_size} sequences "
                                  f"of {held} tokens; call reset() before another batch")
            self.store._release_native()
            self.store = None
        if self.store is None:
            self.store = PackedKVCache(self.plan, self.rk_config, b, self.capacity, device=key_states.device)

    @property
    def nbytes(self) -> int:
        """Bytes the packed store holds (0 before the first forward)."""
        return 0 if self.store is None else self.store.nbytes

    def reset(self) -> None:
        for layer in self.layers:
            layer.reset()
        self._mask_checked_at = -1


class FakeQuantLayer(DynamicLayer):
    """One layer of :class:`FakeQuantCache`: dense tensors of reconstructed K/V.

    With the plan's ``fp16_window`` W and ``sink_tokens`` S (cache/fake_quant_cache.h's token regions),
    after each update of a layer holding T tokens: rows [0, S) are the inputs rounded to fp16, rows
    [max(S, T − W), T) too (the window), the rest fake-quantized — what the packed cache stores. A row
    that leaves the window is quantized from its original value, kept meanwhile (the last W rows)."""

    def __init__(self, owner: "FakeQuantCache", layer_idx: int) -> None:
        super().__init__()
        self.owner = owner
        self.layer_idx = layer_idx
        self.raw_keys: Optional[torch.Tensor] = None
        self.raw_values: Optional[torch.Tensor] = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        t_old = self.get_seq_length()
        if t_old == 0 or self.raw_keys is None:
            self.raw_keys, self.raw_values = key_states[..., :0, :], value_states[..., :0, :]
        W, S = self.owner.window, self.owner.sink
        # Rows [a, T) are (re)computed from their original values: the window's rows before this update
        # (a row leaving it is quantized now) and the new ones; rows before a are final.
        a = max(0, t_old - W)
        rk = torch.cat([self.raw_keys, key_states], dim=-2)
        rv = torch.cat([self.raw_values, value_states], dim=-2)
        sink = max(0, S - a)
        kq = fake_quantize(rk, self.owner.codecs, self.layer_idx, "key", window=W, sink=sink)
        vq = fake_quantize(rv, self.owner.codecs, self.layer_idx, "value", window=W, sink=sink)
        # (an empty layer's keys are a 1-D placeholder: DynamicLayer.lazy_initialization)
        self.keys = kq if t_old == 0 else torch.cat([self.keys[..., :a, :], kq], dim=-2)
        self.values = vq if t_old == 0 else torch.cat([self.values[..., :a, :], vq], dim=-2)
        keep = min(W, self.keys.shape[-2])
        self.raw_keys, self.raw_values = rk[..., rk.shape[-2] - keep:, :], rv[..., rv.shape[-2] - keep:, :]
        if t_old == 0:  # serving mode: the prompt attends to its own full-precision K/V
            return key_states, value_states
        return self.keys, self.values

    # The kept originals (raw_keys / raw_values) follow every batch operation of the reconstructed
    # rows; a crop cannot be followed exactly with a window (rows that left it were quantized from
    # values no longer kept), so it is refused then.
    def crop(self, tokens_to_remove: int) -> None:
        if self.owner.window > 0 and self.get_seq_length() > 0:
            raise RatekvError("FakeQuantCache.crop: the plan keeps an fp16 window (fp16_window = "
                              f"{self.owner.window}); rows that left it were quantized from values no longer "
                              "kept, so a crop cannot restore them (assisted decoding / cropping is refused)")
        super().crop(tokens_to_remove)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        if self.raw_keys is not None and self.raw_keys.numel():
            self.raw_keys = self.raw_keys.index_select(0, beam_idx.to(self.raw_keys.device))
            self.raw_values = self.raw_values.index_select(0, beam_idx.to(self.raw_values.device))

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        if self.raw_keys is not None:
            self.raw_keys = self.raw_keys.repeat_interleave(repeats, dim=0)
            self.raw_values = self.raw_values.repeat_interleave(repeats, dim=0)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        if self.raw_keys is not None:
            self.raw_keys = self.raw_keys[indices, ...]
            self.raw_values = self.raw_values[indices, ...]


class FakeQuantCache(Cache):
    """Reference for :class:`PackedCache`: the same serving-mode semantics with the
    plan's codecs applied as quantize → dequantize (ratekv's fake-quant path,
    cache/fake_quant_cache.h) and dense SDPA attention, honouring the plan's
    ``fp16_window`` and ``sink_tokens`` as the packed cache does. For evaluation and
    tests; it stores full tensors (no memory saving)."""

    def __init__(self, plan: Plan, config: Any) -> None:
        _check_plan("FakeQuantCache", plan)
        self.rk_config = model_config(config)
        self.codecs = PlanCodecs(plan, self.rk_config, "plan")
        self.window, self.sink = int(plan.fp16_window), int(plan.sink_tokens)
        super().__init__(layers=[FakeQuantLayer(self, i) for i in range(self.rk_config.n_layers)])
        _track_native(self)

    def _release_native(self) -> None:
        """At interpreter exit (ratekv.core): drops the codecs and config (C++ objects)."""
        self.codecs = self.rk_config = None
