"""
ratekv C++ core (nanobind). Use the `ratekv` package, not this module directly.
"""

from collections.abc import Sequence
import enum
import os
from typing import Annotated

import numpy
from numpy.typing import NDArray


class RatekvError(ValueError):
    pass

class RopeLayout(enum.Enum):
    """Which channels form a RoPE block (model/model.h)."""

    interleaved = 0
    """block i = channels (2i, 2i+1): GGUF 'llama'"""

    neox = 1
    """
    block i = channels (i, i + d/2): HF transformers, GGUF 'qwen2'/'gemma3'
    """

class ModelConfig:
    """
    Hyper-parameters of a decoder the plans and statistics are checked against (include/ratekv/model/model.h).
    """

    def __init__(self) -> None: ...

    @property
    def arch(self) -> str: ...

    @arch.setter
    def arch(self, arg: str, /) -> None: ...

    @property
    def n_layers(self) -> int: ...

    @n_layers.setter
    def n_layers(self, arg: int, /) -> None: ...

    @property
    def n_heads(self) -> int: ...

    @n_heads.setter
    def n_heads(self, arg: int, /) -> None: ...

    @property
    def n_kv_heads(self) -> int: ...

    @n_kv_heads.setter
    def n_kv_heads(self, arg: int, /) -> None: ...

    @property
    def head_dim(self) -> int: ...

    @head_dim.setter
    def head_dim(self, arg: int, /) -> None: ...

    @property
    def d_model(self) -> int: ...

    @d_model.setter
    def d_model(self, arg: int, /) -> None: ...

    @property
    def d_ff(self) -> int: ...

    @d_ff.setter
    def d_ff(self, arg: int, /) -> None: ...

    @property
    def n_vocab(self) -> int: ...

    @n_vocab.setter
    def n_vocab(self, arg: int, /) -> None: ...

    @property
    def n_ctx_train(self) -> int: ...

    @n_ctx_train.setter
    def n_ctx_train(self, arg: int, /) -> None: ...

    @property
    def rope_theta(self) -> float: ...

    @rope_theta.setter
    def rope_theta(self, arg: float, /) -> None: ...

    @property
    def rms_eps(self) -> float: ...

    @rms_eps.setter
    def rms_eps(self, arg: float, /) -> None: ...

    @property
    def rope_layout(self) -> RopeLayout: ...

    @rope_layout.setter
    def rope_layout(self, arg: RopeLayout, /) -> None: ...

    @property
    def attn_scale(self) -> float: ...

    @attn_scale.setter
    def attn_scale(self, arg: float, /) -> None: ...

    @property
    def sliding_window(self) -> int: ...

    @sliding_window.setter
    def sliding_window(self, arg: int, /) -> None: ...

    @property
    def layer_sliding(self) -> list[int]: ...

    @layer_sliding.setter
    def layer_sliding(self, arg: Sequence[int], /) -> None: ...

    def validate(self, source: str = 'config') -> None:
        """Checks the fields; raises RatekvError naming `source` and the field."""

    def attention_scale(self) -> float: ...

    def kv_bytes_per_token_fp16(self) -> int: ...

    @staticmethod
    def from_gguf(path: str | os.PathLike) -> ModelConfig:
        """Reads and validates the config of a GGUF file (path: str or os.PathLike)."""

    def __repr__(self) -> str: ...

def rope_layout_for_arch(arch: str) -> RopeLayout:
    """
    The GGUF channel layout of an architecture (docs/design.md §1); raises for an unknown one.
    """

def rope_pairs(layout: RopeLayout, head_dim: int) -> list[list[int]]:
    """The two channels of every RoPE block: [(a_i, b_i)] for i < head_dim/2."""

def lloyd_max_distortion(dim: int, bits: int) -> float:
    """
    Unit-vector distortion E‖u − û‖² of TurboQuant-MSE at `bits` in dimension `dim` (docs/design.md §2).
    """

class Tokenizer:
    """The GGUF tokenizer of the C++ runtime (model/tokenizer.h)."""

    def __init__(self, gguf_path: str | os.PathLike) -> None:
        """Reads the tokenizer of a GGUF file (gguf_path: str or os.PathLike)."""

    @property
    def add_bos(self) -> bool:
        """the file's tokenizer.ggml.add_bos_token"""

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """
        Text → token ids, exactly as `ratekv calibrate -f` tokenizes (add_bos None: the file's flag). Raises RatekvError for text with a lone surrogate (no UTF-8 form).
        """

    def decode(self, ids: Sequence[int]) -> str:
        """
        Token ids → text. Bytes that are no whole UTF-8 character (a token holding part of one, as when decoding token by token) become U+FFFD, as transformers' decode gives them; decode_bytes returns the raw bytes, to join before decoding.
        """

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """Token ids → the bytes their pieces spell (UTF-8 only once whole characters are joined)."""

    @property
    def n_vocab(self) -> int: ...

class Plan:
    """
    A compression plan: the key and value codec of every (layer, KV head) (include/ratekv/format/plan.h, docs/plan_format.md).
    """

    @staticmethod
    def load(path: str) -> Plan:
        """
        Reads and validates a plan file; RatekvError names the file and JSON field.
        """

    def save(self, path: str) -> None: ...

    @staticmethod
    def from_json(text: str, name: str = 'plan') -> Plan: ...

    def to_json(self) -> str: ...

    def validate(self, name: str = 'plan') -> None: ...

    def validate_against(self, config: ModelConfig, name: str = 'plan') -> None:
        """
        Raises RatekvError listing every mismatch (arch, layers, KV heads, head_dim, RoPE layout).
        """

    @property
    def method(self) -> str: ...

    @property
    def arch(self) -> str: ...

    @property
    def n_layers(self) -> int: ...

    @property
    def n_kv_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def rope_layout(self) -> str: ...

    @property
    def fp16_window(self) -> int: ...

    @property
    def sink_tokens(self) -> int: ...

    @property
    def achieved(self) -> dict:
        """effective and code bits per element (metadata included in k, v, total)"""

    def codec_kinds(self) -> list[str]:
        """codec kind of every (layer, head, side), row-major"""

    def summary(self) -> str: ...

class PlanRequest:
    """What make_plan builds (include/ratekv/alloc/make_plan.h)."""

    def __init__(self) -> None: ...

    @property
    def method(self) -> str: ...

    @method.setter
    def method(self, arg: str, /) -> None: ...

    @property
    def k_bits(self) -> float: ...

    @k_bits.setter
    def k_bits(self, arg: float, /) -> None: ...

    @property
    def v_bits(self) -> float: ...

    @v_bits.setter
    def v_bits(self, arg: float, /) -> None: ...

    @property
    def avg_bits(self) -> float | None: ...

    @avg_bits.setter
    def avg_bits(self, arg: float | None, /) -> None: ...

    @property
    def budget_unit(self) -> str: ...

    @budget_unit.setter
    def budget_unit(self, arg: str, /) -> None: ...

    @property
    def b_min(self) -> int: ...

    @b_min.setter
    def b_min(self, arg: int, /) -> None: ...

    @property
    def b_max(self) -> int: ...

    @b_max.setter
    def b_max(self, arg: int, /) -> None: ...

    @property
    def seed(self) -> int: ...

    @seed.setter
    def seed(self, arg: int, /) -> None: ...

    @property
    def fp16_window(self) -> int: ...

    @fp16_window.setter
    def fp16_window(self, arg: int, /) -> None: ...

    @property
    def sink_tokens(self) -> int: ...

    @sink_tokens.setter
    def sink_tokens(self, arg: int, /) -> None: ...

    @property
    def quantizer(self) -> str: ...

    @quantizer.setter
    def quantizer(self, arg: str, /) -> None: ...

    @property
    def v_quantizer(self) -> str: ...

    @v_quantizer.setter
    def v_quantizer(self, arg: str, /) -> None: ...

    @property
    def curves_from(self) -> str: ...

    @curves_from.setter
    def curves_from(self, arg: str, /) -> None: ...

    @property
    def sensitivity(self) -> str: ...

    @sensitivity.setter
    def sensitivity(self, arg: str, /) -> None: ...

    @property
    def group_size(self) -> int: ...

    @group_size.setter
    def group_size(self, arg: int, /) -> None: ...

    @property
    def stats_file(self) -> str: ...

    @stats_file.setter
    def stats_file(self, arg: str, /) -> None: ...

def make_plan(stats: CalibStats, request: PlanRequest) -> Plan:
    """
    Builds and validates a plan with the C++ allocators (the library side of `ratekv plan`).
    """

class PlanCodecs:
    """
    The quantizers of a plan built for a model (include/ratekv/cache/plan_codecs.h).
    """

    def __init__(self, plan: Plan, config: ModelConfig, name: str = 'plan') -> None:
        """
        Validates the plan and that it matches the model (RoPE layout included); RatekvError lists each mismatch.
        """

    @property
    def plan(self) -> Plan: ...

    @property
    def config(self) -> ModelConfig: ...

    def layer_is_vq(self, layer: int, side: int) -> bool: ...

def fake_quant_sequence(codecs: PlanCodecs, layer: int, side: int, x: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], out: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu')], k_pre: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)] | None = None, pos: Annotated[NDArray[numpy.int32], dict(order='C', device='cpu', writable=False)] | None = None, window: int = 0, sink: int = 0) -> None:
    """
    What FakeQuantKVCache stores for one side of one layer after one append of all T tokens: x, out (T, n_kv_heads, head_dim) float32 (cache/fake_quant_cache.h fake_quant_sequence).
    """

class CalibStats:
    """
    The allocators' view of calibration statistics (include/ratekv/format/calib_stats.h).
    """

    @property
    def arch(self) -> str: ...

    @property
    def rope_layout(self) -> str: ...

    @property
    def n_tokens(self) -> int: ...

    @property
    def sensitivities(self) -> list[str]: ...

    @property
    def curves(self) -> list[str]: ...

    def to_json(self) -> str: ...

    def validate(self, name: str = 'stats') -> None: ...

def load_alloc_stats(path: str) -> CalibStats:
    """
    Loads allocator statistics from a safetensors file of `ratekv calibrate` (or the JSON form).
    """

def identity_stats(config: ModelConfig) -> CalibStats:
    """
    Statistics that carry only the model's identity (equal block energies): enough for uniform plans, which read nothing else.
    """

class KVStats:
    """
    Calibration statistics as `ratekv calibrate` writes them (include/ratekv/calib/kv_stats.h, docs/calibration_stats.md).
    """

    @staticmethod
    def load(path: str) -> KVStats: ...

    def save(self, path: str) -> None: ...

    def validate(self, name: str = 'stats') -> None: ...

    def validate_against(self, config: ModelConfig, name: str = 'stats') -> None: ...

    def to_alloc_stats(self) -> CalibStats: ...

    @property
    def arch(self) -> str: ...

    @property
    def rope_layout(self) -> str: ...

    @property
    def n_layers(self) -> int: ...

    @property
    def n_kv_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def n_heads(self) -> int: ...

    @property
    def n_tokens(self) -> int: ...

    @property
    def ctx(self) -> int: ...

    @property
    def model_file(self) -> str: ...

    @model_file.setter
    def model_file(self, arg: str, /) -> None: ...

    @property
    def model_sha256(self) -> str: ...

    @model_sha256.setter
    def model_sha256(self, arg: str, /) -> None: ...

    @property
    def text_file(self) -> str: ...

    @text_file.setter
    def text_file(self, arg: str, /) -> None: ...

    @property
    def text_sha256(self) -> str: ...

    @text_sha256.setter
    def text_sha256(self, arg: str, /) -> None: ...

    def tensor(self, name: str) -> NDArray[numpy.float64]:
        """
        A statistic as a float64 numpy array (shapes in docs/calibration_stats.md).
        """

    @property
    def grad_n_sequences(self) -> int: ...

    @property
    def grad_seq_len(self) -> int: ...

    @property
    def grad_mean_loss(self) -> float: ...

    def set_gradient_sensitivity(self, n_sequences: int, seq_len: int, mean_loss: float, k_pre_sq: Annotated[NDArray[numpy.float64], dict(order='C', device='cpu', writable=False)], k_post_sq: Annotated[NDArray[numpy.float64], dict(order='C', device='cpu', writable=False)], v_sq: Annotated[NDArray[numpy.float64], dict(order='C', device='cpu', writable=False)]) -> None:
        """
        Stores E_t (∂L/∂k_pre)², E_t (∂L/∂k_post)², E_t (∂L/∂v)², each (n_layers, n_kv_heads, head_dim) float64 (calib/sensitivity.h).
        """

    def set_curves(self, quantizer: str, bits: Sequence[float], mse_k: Annotated[NDArray[numpy.float64], dict(order='C', device='cpu', writable=False)], mse_v: Annotated[NDArray[numpy.float64], dict(order='C', device='cpu', writable=False)]) -> None:
        """
        Stores one quantizer's measured distortion (mse_k, mse_v: (n_layers, n_kv_heads, len(bits)) float64, mean squared error per element) and its fit D = α β^(−b) by calib::fit_curves (calib/distortion_curves.h, docs/calibration_stats.md).
        """

    def curve(self, quantizer: str) -> dict:
        """A quantizer's measured distortion and fitted curves."""

    @property
    def curve_names(self) -> list[str]: ...

class KVStatsAccumulator:
    """
    Running sums of every statistic of calib/kv_stats.h (calib/accumulator.h).
    """

    def __init__(self, config: ModelConfig) -> None: ...

    def add(self, config: ModelConfig, layer: int, pos: Annotated[NDArray[numpy.int32], dict(order='C', device='cpu', writable=False)], q_pre: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], q_post: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], k_pre: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], k_post: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], v: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)]) -> None:
        """
        Adds one layer's activations of one chunk: q (n, n_heads, head_dim), k, v (n, n_kv_heads, head_dim) float32, pos (n,) int32 (model.h LayerActivations).
        """

    @property
    def n_tokens(self) -> int: ...

    def finish(self, ctx: int) -> KVStats:
        """Means over everything added (raises if a layer missed a chunk)."""

def validate_curve_options(quantizers: Sequence[str], bits: Sequence[int]) -> None:
    """
    eval::validate_curve_options: raises RatekvError naming CurveMeasureOptions.quantizers/bits for no, unknown or repeated quantizers, or widths that are not ≥ 2 distinct values in 1..8 (what DistortionAccumulator checks, before any activation is captured).
    """

class DistortionAccumulator:
    """
    RateQuant distortion curves measured on captured K/V (include/ratekv/eval/distortion_measure.h): the accumulator `ratekv calibrate --curves` feeds from the C++ runtime.
    """

    def __init__(self, config: ModelConfig, stats: KVStats, quantizers: Sequence[str], bits: Sequence[int], group_size: int = 32, seed: int = 0) -> None:
        """
        The codecs of every (quantizer, width) plan, made from `stats` (model identity, Block-GTQ block energies). Raises RatekvError naming CurveMeasureOptions.quantizers/bits for unknown or repeated quantizers, widths outside 1..8 or fewer than two distinct widths, or stats of another model.
        """

    def add(self, config: ModelConfig, layer: int, k_post: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], v: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)]) -> None:
        """
        Adds one chunk of `layer` (positions 0.. within the chunk): k_post (post-RoPE keys), v, each (T, n_kv_heads, head_dim) float32 C-contiguous. Raises RatekvError for a wrong shape, a layer out of range or a non-finite element.
        """

    def tokens(self, layer: int) -> int:
        """Tokens added to `layer` so far."""

    def finish_into(self, stats: KVStats) -> None:
        """
        Stores the measured mse and fitted curves of every quantizer in `stats` (replacing curves of the same name). Raises RatekvError when nothing was added, layers received different token counts, or a measured distortion is zero.
        """

class PackedBatch:
    """
    A batch of CPU packed KV caches (include/ratekv/cache/packed_kv_cache.h): codes in the packed format, attention from the codes, never the whole cache expanded.
    """

    def __init__(self, codecs: PlanCodecs, batch: int, n_ctx: int) -> None:
        """
        Raises RatekvError when a codec kind is not served (kivi, quarot, q8_0, q4_0), naming it, and when the batch's layout tables alone would not fit in this machine's memory.
        """

    @property
    def batch(self) -> int: ...

    def length(self, b: int, layer: int) -> int: ...

    def lengths(self, layer: int) -> list[int]:
        """tokens stored per sequence at `layer`"""

    @property
    def unusable(self) -> str:
        """
        why the batch refuses use until clear() (an append failed after writing some sequences); '' when usable
        """

    def append(self, layer: int, k: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], v: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], k_pre: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)] | None = None) -> None:
        """
        Quantizes and stores n new tokens per sequence: k, v (B, n, n_kv_heads, head_dim) float32.
        """

    def attend(self, layer: int, q: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], out: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu')], scale: float) -> None:
        """
        Causal attention of the last n tokens' queries (B, n, n_heads, head_dim) from the codes into out.
        """

    def clear(self) -> None: ...

    @property
    def bytes(self) -> int:
        """bytes held: pages + sink/window rows + positions"""

    @property
    def page_bytes(self) -> int:
        """bytes of the allocated code pages"""

class PagePool:
    """
    Pages of a paged KV cache (engine/page_pool.h): the same number of pages in every layer, a free list (lowest id first, or highest with pages_descending), sequences reserving ceil(max_tokens / 64) pages up front, page-table rows (int32, stride max_seq_pages) and 64-bit page offsets. The memory is the caller's: bind_layer(l, tensor.data_ptr(), tensor.numel()) for a uint8 tensor of layer_bytes(l) bytes.
    """

    def __init__(self, page_bytes: Sequence[int], label: str, pages: int, max_seq_pages: int, pages_descending: bool = False, owner: str = 'page pool') -> None:
        """
        page_bytes: bytes of one page per layer; pages: pages per layer; max_seq_pages: page-table row stride. Raises RatekvError for empty/zero page sizes or sizes out of range.
        """

    @property
    def label(self) -> str: ...

    @property
    def n_layers(self) -> int: ...

    @property
    def pages(self) -> int: ...

    @property
    def max_seq_pages(self) -> int: ...

    @property
    def free_pages(self) -> int: ...

    @property
    def free_tokens(self) -> int: ...

    @property
    def n_sequences(self) -> int: ...

    @property
    def bound(self) -> bool: ...

    def page_bytes(self, layer: int) -> int: ...

    def layer_bytes(self, layer: int) -> int:
        """pages · page_bytes(layer)"""

    def total_bytes(self) -> int: ...

    def page_offset(self, layer: int, page: int) -> int:
        """Byte offset of a page in its layer's memory (64-bit)."""

    def bind_layer(self, layer: int, base: int, nbytes: int) -> None:
        """
        Binds a layer's memory (an address, e.g. tensor.data_ptr()); the caller keeps it alive. Raises when nbytes < layer_bytes(layer).
        """

    def layer_base(self, layer: int) -> int: ...

    def add_sequence(self, max_tokens: int) -> int:
        """
        Reserves ceil(max_tokens / 64) pages; returns the sequence id. Raises RatekvError, reserving nothing, when they are not free (naming the request and what is free) or exceed max_seq_pages.
        """

    def remove_sequence(self, seq: int) -> None: ...

    def has_sequence(self, seq: int) -> bool: ...

    def sequence_ids(self) -> list[int]: ...

    def seq_pages(self, seq: int) -> list[int]: ...

    def capacity(self, seq: int) -> int: ...

    def length(self, seq: int) -> int: ...

    def set_length(self, seq: int, tokens: int) -> None: ...

    def check_room(self, seq: int, extra: int) -> None: ...

    def page_table(self, seqs: Sequence[int], rows: Annotated[NDArray[numpy.int32], dict(order='C', device='cpu')]) -> None:
        """
        Writes the page-table rows of `seqs` into rows (len(seqs), max_seq_pages) int32: page ids, then zeros.
        """

class CudaPackedLayers:
    """
    The CUDA kernels' tables of every layer of a plan (engine/cache_format.h): tq-mse / Block-GTQ / RateQuant plans with 1..4-bit groups, no window/sink. Present only in an extension built with CUDA and the GPU engine (has_cuda).
    """

    def __init__(self, codecs: PlanCodecs) -> None:
        """Raises RatekvError naming the plan field the GPU path cannot serve."""

    @property
    def n_layers(self) -> int: ...

    @property
    def label(self) -> str: ...

    def page_bytes(self, layer: int) -> int: ...

    def make_pool(self, pages: int, max_seq_pages: int) -> PagePool:
        """
        The engine's page pool (ratekv.PagePool) for this plan's pages; bind each layer's memory to it.
        """

    def workspace_bytes(self, batch: int, max_seq_len: int) -> int: ...

    def append(self, layer: int, pool: PagePool, page_table: int, seq_lens: int, batch: int, max_seq_len: int, k: int, v: int, n: int, f16: bool, stream: int) -> None: ...

    def decode(self, layer: int, pool: PagePool, page_table: int, seq_lens: int, batch: int, max_seq_len: int, q: int, f16: bool, scale: float, out: int, workspace: int, workspace_bytes: int, stream: int) -> None: ...

has_cuda: bool = False

has_cuda: bool = False
