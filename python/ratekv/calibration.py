"""Calibration statistics of any transformers model, in the file format of ``ratekv calibrate``.

:func:`calibrate` runs the model over calibration tokens and feeds each layer's
Q/K/V to the C++ accumulator (calib/accumulator.h — the same code the CLI
runs), optionally followed by the gradient sensitivity ∂L/∂K, ∂L/∂V by torch
autograd (RateQuant, docs/design.md §4; calib/sensitivity.h defines the means).
The result is a :class:`ratekv.KVStats`, saved as the safetensors file of
docs/calibration_stats.md, from which :func:`ratekv.make_plan` builds plans.

Capture: forward hooks on each attention module's ``q_proj``/``k_proj``/``v_proj``
(or ``q_norm``/``k_norm`` where the model normalizes Q/K before RoPE) give the
pre-RoPE Q/K and V; a wrapper around the model's attention function (installed
through transformers' AttentionInterface for the duration of the call) gives
the post-RoPE Q/K the attention reads. Channel order: transformers applies RoPE
to half-split pairs (i, i + d/2), so the file records ``rope_layout = "neox"``;
statistics of a GGUF ``llama`` model (interleaved pairs) differ by that channel
permutation, and plans made from one are refused on the other.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Iterable, List, Optional, Sequence, Union

import numpy as np
import torch

from . import _core
from .core import _I32, KVStats, RatekvError, _int_arg, model_config

_CALIB_ATTN = "ratekv_calibrate"


def _attention_modules(model: torch.nn.Module) -> List[torch.nn.Module]:
    mods = [m for m in model.modules()
            if hasattr(m, "layer_idx") and hasattr(m, "k_proj") and hasattr(m, "q_proj") and hasattr(m, "v_proj")]
    if not mods:
        raise RatekvError(f"calibrate: {type(model).__name__} has no attention modules with q_proj/k_proj/v_proj "
                          "and layer_idx (transformers decoder layout)")
    mods.sort(key=lambda m: m.layer_idx)
    return mods


def _vocab_size(model: torch.nn.Module, cfg: Any) -> int:
    """Rows of the input embedding (what an id indexes), else the config's vocab_size."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    n = getattr(emb, "num_embeddings", None)
    return int(n) if n is not None else int(cfg.n_vocab)


def _tokens(tokenizer: Any, texts: Union[str, Sequence[str], None], token_ids: Any, n_vocab: int) -> torch.Tensor:
    if token_ids is not None:
        if texts is not None:  # texts used to be ignored silently
            raise RatekvError("calibrate: give texts (with a tokenizer) or token_ids, not both")
        try:
            t = torch.as_tensor(token_ids)
        except (TypeError, ValueError, RuntimeError) as e:  # ragged lists, strings, objects
            raise RatekvError(f"calibrate: token_ids is a {type(token_ids).__name__} torch cannot read as a tensor "
                              f"({e}); expected a 1-D sequence of integer token ids") from None
        if t.numel() == 0:  # torch.as_tensor([]) is float32: said "wrong dtype" before
            raise RatekvError("calibrate: token_ids is empty, expected at least one token id")
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise RatekvError(f"calibrate: token_ids has dtype {t.dtype}, expected integer token ids")
        # A tokenizer's return_tensors="pt" batch of one, (1, N), is one sequence; any other 2-D or higher shape
        # used to be flattened silently, running the rows as one text across their boundaries.
        if t.dim() == 2 and t.shape[0] == 1:
            t = t[0]
        if t.dim() != 1:
            raise RatekvError(f"calibrate: token_ids has shape {tuple(t.shape)}, expected one sequence: 1-D (N) or "
                              "(1, N) (concatenate several texts' ids into one sequence)")
        ids = t.to(torch.long)
        if ids.numel() > 0:
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= n_vocab:
                at = int(((ids < 0) | (ids >= n_vocab)).nonzero()[0])
                raise RatekvError(f"calibrate: token_ids[{at}] = {int(ids[at])} (the ids span {lo}..{hi}): "
                                  f"expected ids in 0..{n_vocab - 1} (the model's vocabulary)")
    else:
        if tokenizer is None or texts is None:
            raise RatekvError("calibrate: give texts and a tokenizer, or token_ids")
        if not callable(tokenizer):
            hint = (" (ratekv.Tokenizer is the GGUF tokenizer: pass token_ids=ratekv.Tokenizer(path).encode(text))"
                    if isinstance(tokenizer, _core.Tokenizer) else "")
            raise RatekvError(f"calibrate: tokenizer is a {type(tokenizer).__name__}, expected a transformers "
                              f"tokenizer (called as tokenizer(text)){hint}")
        import collections.abc

        if isinstance(texts, str):
            texts = [texts]
        # bytes, a dict (its keys were calibrated on) and non-str items were passed on to the tokenizer.
        if isinstance(texts, (bytes, collections.abc.Mapping)) or not isinstance(texts, collections.abc.Iterable):
            raise RatekvError(f"calibrate: texts is a {type(texts).__name__}, expected a str or a sequence of str")
        texts = list(texts)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise RatekvError(f"calibrate: texts[{i}] is a {type(t).__name__}, expected a str")
        parts = []
        for t in texts:
            enc = tokenizer(t, add_special_tokens=True)["input_ids"]
            parts.append(torch.as_tensor(enc, dtype=torch.long).flatten())
        ids = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
    if ids.numel() == 0:
        raise RatekvError("calibrate: no calibration tokens")
    if token_ids is None and (int(ids.min()) < 0 or int(ids.max()) >= n_vocab):
        raise RatekvError(f"calibrate: the tokenizer gave ids {int(ids.min())}..{int(ids.max())}, outside the model's "
                          f"vocabulary 0..{n_vocab - 1} (a tokenizer of another model?)")
    return ids


class _Capture:
    """Per-layer pre-/post-RoPE activations of one forward chunk (or gradient probes)."""

    def __init__(self, mods: List[torch.nn.Module], cfg: Any, grad: bool) -> None:
        self.cfg = cfg
        self.grad = grad
        self.pre: dict = {}
        self.post: dict = {}
        self.probes: dict = {}
        self.handles = []
        for m in mods:
            li = m.layer_idx
            qsrc = getattr(m, "q_norm", None) or m.q_proj
            ksrc = getattr(m, "k_norm", None) or m.k_proj
            self.handles.append(qsrc.register_forward_hook(self._hook(li, "q")))
            self.handles.append(ksrc.register_forward_hook(self._hook(li, "k")))
            self.handles.append(m.v_proj.register_forward_hook(self._hook(li, "v")))

    def _hook(self, li: int, what: str):
        def fn(mod, inp, out):
            if self.grad and what == "k":  # probe for ∂L/∂k_pre
                z = torch.zeros_like(out, requires_grad=True)
                self.probes[(li, "k_pre")] = z
                out = out + z
                self.pre[(li, what)] = out
                return out
            self.pre[(li, what)] = out.detach()
            return None

        return fn

    def close(self) -> None:
        for h in self.handles:
            h.remove()


_current: Optional[_Capture] = None


def _calib_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cap = _current
    if cap is not None:
        li = module.layer_idx
        if cap.grad:  # probes for ∂L/∂k_post, ∂L/∂v (the tensors attention reads)
            zk = torch.zeros_like(key, requires_grad=True)
            zv = torch.zeros_like(value, requires_grad=True)
            cap.probes[(li, "k_post")] = zk
            cap.probes[(li, "v")] = zv
            key = key + zk
            value = value + zv
        else:
            cap.post[(li, "q")] = query.detach()
            cap.post[(li, "k")] = key.detach()
            cap.post[(li, "v")] = value.detach()
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  **kwargs)


def _rows(x: torch.Tensor, n: int, heads: int, d: int, what: str, layer: int,
          heads_first: bool = False) -> torch.Tensor:
    """(1, n, heads·d), (1, n, heads, d) or, heads_first, (1, heads, n, d) → (n, heads, d)
    float32 CPU contiguous; non-finite values → RatekvError."""
    if heads_first:
        x = x.transpose(1, 2)
    x = x.reshape(n, heads, d).to(device="cpu", dtype=torch.float32).contiguous()
    if not torch.isfinite(x).all():
        raise RatekvError(f"calibrate: layer {layer}: {what} has non-finite values (NaN/Inf activations)")
    return x


def _measure_curves(model, cfg, stats, ids, ctx, quantizers, bits, cap, dev) -> None:
    """RateQuant distortion curves of a transformers model (docs/calibration_stats.md, "Distortion
    curves"): per chunk of `ctx` tokens, each layer's post-RoPE K and V (as the attention function
    reads them) go to the C++ DistortionAccumulator (eval/distortion_measure.h) — the code
    `ratekv calibrate --curves` runs on the C++ runtime's activations: every (quantizer, width)
    plan's fake-quant codec (no window, no sink), D = Σ‖x − x̂‖² / (N·head_dim) per (layer,
    KV head, side), fitted D = α β^(−b) by calib::fit_curves. A second pass over the tokens:
    Block-GTQ's plans need the block energies of the finished statistics."""
    L, Hk, d = cfg.n_layers, cfg.n_kv_heads, cfg.head_dim
    acc = _core.DistortionAccumulator(cfg, stats, list(quantizers), list(bits))
    N = int(ids.numel())
    with torch.no_grad():
        for start in range(0, N, ctx):
            m = min(ctx, N - start)
            cap.post.clear()
            model(input_ids=ids[start:start + m].to(dev).unsqueeze(0),
                  position_ids=torch.arange(m, device=dev).unsqueeze(0), use_cache=False, logits_to_keep=1)
            for li in range(L):
                acc.add(cfg, li, _rows(cap.post[(li, "k")], m, Hk, d, "k (post-RoPE)", li, True),
                        _rows(cap.post[(li, "v")], m, Hk, d, "v", li, True))
    acc.finish_into(stats)


def _curve_args(curves: Any, curve_bits: Any) -> tuple:
    """calibrate's ``curves`` / ``curve_bits`` as lists, checked before the model runs (they were checked by the
    C++ accumulator only after the whole first pass, and a string ``curves`` was iterated character by
    character): curves None → ([], []); a string is split at commas (as ``--curves``). The C++ checks
    (eval::validate_curve_options) name CurveMeasureOptions.quantizers / .bits; here they name the arguments."""
    if curves is None:
        if curve_bits is not None:
            raise RatekvError(f"calibrate: curve_bits = {curve_bits!r} needs curves (no distortion curves are "
                              "measured without them)")
        return [], []
    if isinstance(curves, str):
        curves = [c.strip() for c in curves.split(",")]
    try:
        curves = list(curves)
    except TypeError:
        raise RatekvError(f"calibrate: curves is a {type(curves).__name__}, expected a list of quantizer names "
                          "(kivi, quarot, tq-mse, block-gtq) or one comma-separated string") from None
    if not curves:
        raise RatekvError("calibrate: curves is empty: give quantizer names (kivi, quarot, tq-mse, block-gtq) or "
                          "None")
    for c in curves:
        if not isinstance(c, str):
            raise RatekvError(f"calibrate: curves holds {c!r}, expected quantizer names (str)")
    if curve_bits is None:
        curve_bits = [1, 2, 3, 4, 5]
    if isinstance(curve_bits, (str, bytes)) or not hasattr(curve_bits, "__iter__"):
        raise RatekvError(f"calibrate: curve_bits = {curve_bits!r}: expected a list of code widths (integers)")
    bits = [_int_arg("calibrate", f"curve_bits[{i}]", b, _I32[0], _I32[1]) for i, b in enumerate(curve_bits)]
    try:
        _core.validate_curve_options(curves, bits)
    except RatekvError as e:
        msg = str(e).replace("CurveMeasureOptions.quantizers", "curves").replace("CurveMeasureOptions.bits",
                                                                                   "curve_bits")
        raise RatekvError(f"calibrate: {msg}") from None
    return curves, bits


def _check_output(path: str) -> None:
    """RatekvError naming ``output`` unless a new file can be written at ``path``: it must not exist and its
    directory must exist and accept a file (probed by creating and removing one, so a read-only file system
    or a missing permission shows before the run, not after it)."""
    import tempfile

    if os.path.lexists(path):
        raise RatekvError(f"calibrate: output '{path}' exists")
    d = os.path.dirname(path) or "."
    if not os.path.isdir(d):
        raise RatekvError(f"calibrate: output '{path}': directory '{d}' does not exist")
    try:
        fd, probe = tempfile.mkstemp(prefix=".ratekv-probe-", dir=d)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise RatekvError(f"calibrate: output '{path}': cannot write in '{d}' ({e.strerror})") from None


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for blk in iter(lambda: f.read(1 << 20), b""):
            h.update(blk)
    return h.hexdigest()


def calibrate(
    model: torch.nn.Module,
    tokenizer: Any = None,
    texts: Union[str, Sequence[str], None] = None,
    *,
    token_ids: Any = None,
    n_tokens: Optional[int] = None,
    ctx: int = 512,
    sensitivity: bool = False,
    sens_seqs: Optional[int] = None,
    sens_len: Optional[int] = None,
    curves: Union[str, Sequence[str], None] = None,
    curve_bits: Optional[Sequence[int]] = None,
    output: Union[str, "os.PathLike[str]", None] = None,
    model_file: str = "",
    model_sha256: str = "",
    text_file: Union[str, "os.PathLike[str]", None] = None,
) -> KVStats:
    """Calibration statistics of a transformers causal LM (docs/calibration_stats.md).

    Args:
        model: a transformers decoder (attention modules with ``q_proj``/``k_proj``/
            ``v_proj``; Llama, Qwen2, Mistral, …), any dtype and device; statistics are
            accumulated in double from float32 copies.
        tokenizer, texts: texts are tokenized with ``tokenizer(text)`` and
            concatenated; or give ``token_ids`` (1-D) directly.
        n_tokens: calibration tokens N ≥ 2 (default: all); the first N are run in
            consecutive chunks of ``ctx``, each from an empty cache at positions 0.. (as
            ``ratekv calibrate --tokens N --ctx C``).
        sensitivity: also E_t (∂L/∂k)², E_t (∂L/∂v)² over ``sens_seqs`` (default 16) sequences of
            ``sens_len`` (default 512) tokens from the start of the tokens (``--sensitivity``); L is
            each sequence's mean next-token cross-entropy, the K/V the attention reads
            are the variables (autograd through zero-valued probes added to them).
            ``sens_seqs`` / ``sens_len`` without ``sensitivity=True`` are refused.
        curves: also measure RateQuant's distortion curves of these quantizers (kivi, quarot,
            tq-mse, block-gtq; a list, or one string, comma-separated as ``--curves`` takes them)
            at ``curve_bits`` (default 1..5; refused without ``curves``) on the same chunks and fit
            D = α β^(−b) (needed by ``make_plan(..., "ratequant")``), see :func:`_measure_curves`.
        output: write the statistics file there (safetensors; must not exist).
        model_file, model_sha256, text_file: identity recorded in the file
            (``text_file``: a path — its name and SHA-256 are stored).

    Returns the :class:`ratekv.KVStats` (``rope_layout`` "neox", arch = model_type).
    Raises RatekvError for no tokens, both ``texts`` and ``token_ids``, ``token_ids`` that are
    not one sequence (1-D or (1, N)) or outside the model's vocabulary
    (0..rows of the input embedding − 1; checked before the model runs), unknown or repeated
    ``curves``, ``curve_bits`` that are not ≥ 2 distinct widths in 1..8, ctx or
    sens_len outside the model's positions, a non-integer ctx / n_tokens / sens_seqs /
    sens_len, a ``text_file`` that is not a file, a ``model_file`` / ``model_sha256`` that
    is not a str, a ``model`` without ``.config`` (all checked before the run),
    too few tokens for the sensitivity sequences, non-finite activations, or an
    ``output`` that exists or whose directory is missing or not writable (checked
    before the run).
    """
    global _current
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    # Everything that can be checked without running the model is checked first, naming the argument.
    if not isinstance(model, torch.nn.Module) or getattr(model, "config", None) is None:
        raise RatekvError(f"calibrate: model is a {type(model).__name__} without .config; expected a transformers "
                          "causal LM (a PreTrainedModel such as LlamaForCausalLM, with .config)")
    cfg = model_config(model.config)
    for name, v in (("model_file", model_file), ("model_sha256", model_sha256)):
        if not isinstance(v, str):
            raise RatekvError(f"calibrate: {name} = {v!r}: expected a str (\"\" when unknown)")
    if model_sha256 and (len(model_sha256) != 64 or any(c not in "0123456789abcdef" for c in model_sha256)):
        raise RatekvError(f"calibrate: model_sha256 = {model_sha256!r}: expected 64 lowercase hex digits (the "
                          "SHA-256 of model_file) or \"\" when unknown")
    text_sha = ""
    if text_file is not None:
        if not isinstance(text_file, (str, os.PathLike)) or isinstance(os.fspath(text_file), bytes):
            raise RatekvError(f"calibrate: text_file = {text_file!r}: expected a path (str or os.PathLike of str)")
        tf = os.fspath(text_file)
        if not os.path.isfile(tf):
            raise RatekvError(f"calibrate: text_file '{tf}' " + ("is a directory" if os.path.isdir(tf) else
                              "does not exist") + ", expected the calibration text's file (its name and SHA-256 "
                              "are recorded)")
        text_sha = _sha256(tf)
    ctx = _int_arg("calibrate", "ctx", ctx, 1, cfg.n_ctx_train)
    if n_tokens is not None:  # ≥ 2: the key covariance of one token is 0 (as `ratekv calibrate --tokens`)
        n_tokens = _int_arg("calibrate", "n_tokens", n_tokens, 2, _I32[1])
    if not isinstance(sensitivity, bool):
        raise RatekvError(f"calibrate: sensitivity = {sensitivity!r}: expected True or False")
    if sensitivity:
        sens_seqs = _int_arg("calibrate", "sens_seqs", 16 if sens_seqs is None else sens_seqs, 1, 4096)
        sens_len = _int_arg("calibrate", "sens_len", 512 if sens_len is None else sens_len, 2, cfg.n_ctx_train)
    else:  # as `ratekv calibrate` refuses --sens-seqs / --sens-len without --sensitivity (ignored silently before)
        for name, v in (("sens_seqs", sens_seqs), ("sens_len", sens_len)):
            if v is not None:
                raise RatekvError(f"calibrate: {name} = {v!r} needs sensitivity=True (no gradient sensitivity is "
                                  "measured without it)")
    curves, curve_bits = _curve_args(curves, curve_bits)
    for q in curves:  # the curves' kivi / quarot plans use make_plan's default scale group of 32
        if q in ("kivi", "quarot") and cfg.head_dim % 32:
            raise RatekvError(f"calibrate: curves: {q} quantizes in scale groups of 32 channels, which must divide "
                              f"head_dim; this model's head_dim is {cfg.head_dim}")
    ids = _tokens(tokenizer, texts, token_ids, _vocab_size(model, cfg))
    N = int(n_tokens) if n_tokens is not None else int(ids.numel())
    if N > ids.numel():
        raise RatekvError(f"calibrate: n_tokens = {N}: the text has {ids.numel()} tokens")
    if N < 2:
        raise RatekvError(f"calibrate: {N} calibration token; at least 2 are needed (the key covariance of one token "
                          "is 0)")
    if sensitivity:
        if sens_seqs < 1 or sens_len < 2 or sens_len > cfg.n_ctx_train:
            raise RatekvError(f"calibrate: sensitivity needs sens_seqs ≥ 1 and 2 ≤ sens_len ≤ {cfg.n_ctx_train} "
                              f"(got {sens_seqs} × {sens_len})")
        if sens_seqs * sens_len > ids.numel():
            raise RatekvError(f"calibrate: sensitivity reads {sens_seqs} × {sens_len} tokens, the text has "
                              f"{ids.numel()}")
    if output is not None:  # "" failed only after the run, 5 was os.fspath's bare TypeError
        if not isinstance(output, (str, os.PathLike)) or not os.fspath(output):
            raise RatekvError(f"calibrate: output = {output!r}: expected a new file's path (str or os.PathLike)")
        _check_output(os.fspath(output))

    mods = _attention_modules(model)
    if len(mods) != cfg.n_layers:
        raise RatekvError(f"calibrate: found {len(mods)} attention modules, config says {cfg.n_layers} layers")
    dev = next(model.parameters()).device
    H, Hk, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    acc = _core.KVStatsAccumulator(cfg)

    ALL_ATTENTION_FUNCTIONS.register(_CALIB_ATTN, _calib_attention)
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    ALL_MASK_ATTENTION_FUNCTIONS.register(_CALIB_ATTN, sdpa_mask)
    prev_attn = model.config._attn_implementation
    was_training = model.training
    model.eval()
    model.config._attn_implementation = _CALIB_ATTN
    cap = _Capture(mods, cfg, grad=False)
    _current = cap
    try:
        with torch.no_grad():
            for start in range(0, N, ctx):
                m = min(ctx, N - start)
                chunk = ids[start:start + m].to(dev).unsqueeze(0)
                pos = torch.arange(m, device=dev).unsqueeze(0)
                cap.pre.clear()
                cap.post.clear()
                model(input_ids=chunk, position_ids=pos, use_cache=False, logits_to_keep=1)
                pos32 = np.arange(m, dtype=np.int32)
                for li in range(cfg.n_layers):
                    acc.add(cfg, li, pos32,
                            _rows(cap.pre[(li, "q")], m, H, d, "q (pre-RoPE)", li),
                            _rows(cap.post[(li, "q")], m, H, d, "q (post-RoPE)", li, True),
                            _rows(cap.pre[(li, "k")], m, Hk, d, "k (pre-RoPE)", li),
                            _rows(cap.post[(li, "k")], m, Hk, d, "k (post-RoPE)", li, True),
                            _rows(cap.post[(li, "v")], m, Hk, d, "v", li, True))
        stats = acc.finish(ctx)
        if curves:
            _measure_curves(model, cfg, stats, ids[:N], ctx, curves, curve_bits, cap, dev)

        if sensitivity:
            cap.close()
            cap = _Capture(mods, cfg, grad=True)
            _current = cap
            L = cfg.n_layers
            sums = {k: torch.zeros(L, Hk, d, dtype=torch.float64) for k in ("k_pre", "k_post", "v")}
            loss_sum = 0.0
            req = [p.requires_grad for p in model.parameters()]
            for p in model.parameters():
                p.requires_grad_(False)
            try:
                for s in range(sens_seqs):
                    seq = ids[s * sens_len:(s + 1) * sens_len].to(dev).unsqueeze(0)
                    cap.probes.clear()
                    pos = torch.arange(sens_len, device=dev).unsqueeze(0)
                    out = model(input_ids=seq, position_ids=pos, labels=seq, use_cache=False)
                    loss = out.loss
                    if not torch.isfinite(loss):
                        raise RatekvError(f"calibrate: sensitivity sequence {s}: loss is {loss.item()}")
                    keys = [(li, w) for li in range(L) for w in ("k_pre", "k_post", "v")]
                    grads = torch.autograd.grad(loss, [cap.probes[k] for k in keys])
                    for (li, w), g in zip(keys, grads):
                        g = _rows(g, sens_len, Hk, d, f"∂L/∂{w}", li, w != "k_pre").double()
                        sums[w][li] += (g * g).sum(0)
                    loss_sum += float(loss.detach())
            finally:
                for p, r in zip(model.parameters(), req):
                    p.requires_grad_(r)
            T = float(sens_seqs * sens_len)
            stats.set_gradient_sensitivity(
                sens_seqs, sens_len, loss_sum / sens_seqs,
                (sums["k_pre"] / T).numpy().ravel(), (sums["k_post"] / T).numpy().ravel(),
                (sums["v"] / T).numpy().ravel())
    finally:
        cap.close()
        _current = None
        model.config._attn_implementation = prev_attn
        model.train(was_training)

    stats.model_file = model_file or str(getattr(model.config, "_name_or_path", "") or "")
    stats.model_sha256 = model_sha256
    if text_file is not None:
        stats.text_file = os.path.basename(os.fspath(text_file))
        stats.text_sha256 = text_sha
    if output is not None:
        stats.save(os.fspath(output))
    return stats
