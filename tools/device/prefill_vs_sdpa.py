#!/usr/bin/env python3
"""The torch side of issue 18: prefill against torch SDPA flash on ratekv's shapes (GPU machine).

Two measurements at the shapes of a synthetic configuration (hf_configs.MODELS; default
llama-3.1-8b: 32 query / 8 KV heads, head_dim 128, 32 layers, d_model 4096, ffn 14336), each for
every prompt length of --prompts, in one piece and, when --chunk > 0, in chunks of --chunk tokens
(0 or a multiple of 64, as ratekv's --chunk; --out in a directory that does not exist, or a directory,
is refused before torch is imported: exit 2):

attn  causal attention of ONE layer, torch SDPA flash, fp16, batch 1, GQA through enable_gqa=True
      (flash reads the 8 KV heads as they are: no repeat_interleave copy). Chunked = ratekv's
      chunked prefill: chunk [s, e) has e - s queries attending to keys 0 .. e-1 of a KV cache
      with the causal mask aligned lower-right (query i of the chunk sees keys ≤ s + i), through
      torch.nn.attention.bias.causal_lower_right. Flash is forced: sdpa_kernel(FLASH_ATTENTION)
      (raises where flash cannot run), can_use_flash_attention checked for the lower-right calls
      (which call the flash op themselves) and the aten ops of a profiled warm-up run must name
      flash only; otherwise the row is an error row. Before timing, the chunked computation is
      checked on a small awkward shape (96-token chunks of a 352-token prompt) against an fp32
      reference written here (repeat_interleave, explicit causal mask, softmax): max |diff| ≤ 2e-2.
      Rows: ms_per_layer (median of --reps after --warmup, CUDA events around all of one layer's
      calls, a 512 MB L2 flush before each rep), ms_all_layers = ms_per_layer × layers (computed,
      not measured), tflops (4·Hq·D·T(T+1)/2 over the time).
hf    end-to-end prefill of a random-weight transformers LlamaForCausalLM (bf16 weights, as ratekv's
      synthetic bf16 weights; attn_implementation="sdpa"; e2e_peers.hf_model), inference_mode,
      DynamicCache filled as it goes, logits of the last token only (logits_to_keep=1), then the
      argmax: time to first token (ttft_ms) and tok_s = prompt / ttft. One piece runs under
      sdpa_kernel(FLASH_ATTENTION) (transformers passes no mask there and enable_gqa=True).
      Chunked runs allow FLASH and EFFICIENT: after the first chunk transformers passes an explicit
      mask (query and key lengths differ), which flash does not take, and repeats K/V to 32 heads
      (repeat_kv) instead of enable_gqa. The backends the profiled warm-up run called are recorded
      (backends_seen), never assumed.
A failure (out of memory included) is an error row with the message, never another setup in its
place; the JSON is rewritten after every row, so a run stopped at its time limit keeps its rows.

Usage: prefill_vs_sdpa.py --out F [--model llama-3.1-8b] [--prompts 8192,32768] [--chunk 2048]
                          [--what attn,hf] [--reps 10] [--hf-reps 3] [--warmup 1]
Output: {"meta": {...}, "rows": [...]} (tools/device/prefill_vs_sdpa_table.py reads it).
The pure helpers (argument checks, chunk bounds, FLOP count, backend names) import without torch.
"""
import argparse
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_timing import l2_flush_buffer, median_ms  # noqa: E402  (torch-lazy)
from hf_configs import MODELS  # noqa: E402

WHATS = ("attn", "hf")
ATTN_KIND = "sdpa-flash-attn"
HF_KIND = "hf-sdpa-prefill"
# aten ops that name an SDPA backend (torch.profiler CPU op names without "aten::")
BACKEND_OPS = {
    "_scaled_dot_product_flash_attention": "flash", "_flash_attention_forward": "flash",
    "_scaled_dot_product_efficient_attention": "efficient", "_efficient_attention_forward": "efficient",
    "_scaled_dot_product_cudnn_attention": "cudnn", "_cudnn_attention_forward": "cudnn",
    "_scaled_dot_product_attention_math": "math",
    "_scaled_dot_product_fused_attention_overrideable": "overrideable",
}


# ---- pure helpers (no torch) -------------------------------------------------------------------

def int_list(text):
    """argparse type: '8192,32768' -> [8192, 32768]; every entry a whole number > 0, no repeats."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) <= 0:
            raise argparse.ArgumentTypeError(f"expected a comma list of whole numbers > 0, got {text!r}")
        if int(part) in out:
            raise argparse.ArgumentTypeError(f"{part} appears twice in {text!r}")
        out.append(int(part))
    return out


def what_list(text):
    """argparse type: a comma list of attn, hf."""
    out = [w.strip() for w in text.split(",")]
    bad = [w for w in out if w not in WHATS]
    if bad or not out:
        raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(WHATS)}, got {text!r}")
    return out


def chunk_bounds(T, chunk):
    """[(s, e), ...] covering 0 .. T-1: one piece [(0, T)] for chunk 0 (or chunk ≥ T), else pieces of
    `chunk` tokens, the last one shorter where chunk does not divide T."""
    if T <= 0 or chunk < 0:
        raise ValueError(f"chunk_bounds: T {T} must be > 0 and chunk {chunk} ≥ 0")
    if chunk == 0:
        return [(0, T)]
    return [(s, min(s + chunk, T)) for s in range(0, T, chunk)]


def causal_pairs(bounds):
    """(query, key) pairs a causal prefill in these pieces computes: Σ (e-s)·s + (e-s)(e-s+1)/2
    (= T(T+1)/2 for any chunking of 0 .. T-1)."""
    return sum((e - s) * s + (e - s) * (e - s + 1) // 2 for s, e in bounds)


def attention_flop(hq, d, bounds):
    """FLOPs of causal attention over these pieces: QK^T and PV, 2·d each per (query head, pair)."""
    return 4 * hq * d * causal_pairs(bounds)


def shapes(model):
    """Attention and layer shapes of MODELS[model]: hq, hkv, d, layers, d_model, ffn, vocab."""
    m = MODELS[model]
    return {"hq": m["num_attention_heads"], "hkv": m["num_key_value_heads"],
            "d": m["hidden_size"] // m["num_attention_heads"], "layers": m["num_hidden_layers"],
            "d_model": m["hidden_size"], "ffn": m["intermediate_size"], "vocab": m["vocab_size"]}


def backends_from_ops(names):
    """Sorted SDPA backend names ("flash", "efficient", "cudnn", "math", ...) that the op names
    (profiler keys such as "aten::_scaled_dot_product_flash_attention") show were called."""
    seen = set()
    for n in names:
        n = n.split("::")[-1]
        if n in BACKEND_OPS:
            seen.add(BACKEND_OPS[n])
    return sorted(seen)


def mode_name(chunk):
    """'one piece' or 'chunks of N'."""
    return "one piece" if chunk == 0 else f"chunks of {chunk}"


def error_text(e):
    """A row's error: the exception, out of memory named first, at most 400 characters."""
    oom = type(e).__name__ == "OutOfMemoryError" or "out of memory" in str(e).lower()
    return (("out of memory: " if oom else "") + repr(e))[:400]


def parse_args(argv=None):
    """The command line (module docstring); exits 2 with a message on bad input."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True,
                    help="JSON output file (rewritten after every row); its directory must exist")
    ap.add_argument("--model", default="llama-3.1-8b", choices=sorted(MODELS))
    ap.add_argument("--prompts", type=int_list, default=[8192, 32768], help="prompt lengths (comma list)")
    ap.add_argument("--chunk", type=int, default=2048,
                    help="also chunked prefill in chunks of N tokens, a multiple of 64 (0: one piece only)")
    ap.add_argument("--what", type=what_list, default=list(WHATS), help="attn, hf or both (comma list)")
    ap.add_argument("--reps", type=int, default=10, help="timed reps of the attention rows (median)")
    ap.add_argument("--hf-reps", type=int, default=3, help="timed reps of the HF rows (median)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs first (the first one profiled)")
    a = ap.parse_args(argv)
    if a.chunk < 0 or a.chunk % 64:
        ap.error(f"--chunk: expected 0 (one piece only) or a positive multiple of 64 tokens (ratekv's page, "
                 f"its --chunk rule), got {a.chunk}")
    out_dir = os.path.dirname(os.path.abspath(a.out))
    if os.path.isdir(a.out):
        ap.error(f"--out {a.out!r} is a directory (expected a JSON file to write)")
    if not os.path.isdir(out_dir):
        ap.error(f"--out {a.out!r}: directory {out_dir!r} does not exist")
    if a.reps < 1 or a.hf_reps < 1:
        ap.error(f"--reps / --hf-reps: expected ≥ 1, got {a.reps} / {a.hf_reps}")
    if a.warmup < 1:
        ap.error(f"--warmup: expected ≥ 1 (the first warm-up run is the profiled one), got {a.warmup}")
    return a


def cases(args):
    """(prompt, chunk) pairs in run order: each prompt in one piece, then chunked when the chunk
    is smaller than the prompt (a chunk ≥ the prompt is one piece again)."""
    out = []
    for T in args.prompts:
        out.append((T, 0))
        if 0 < args.chunk < T:
            out.append((T, args.chunk))
    return out


# ---- torch (imported in main) --------------------------------------------------------------------

def profiled_backends(torch, fn):
    """Runs fn once under the CPU profiler; the SDPA backends its aten ops name."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
        torch.cuda.synchronize()
    return backends_from_ops(e.key for e in prof.key_averages())


def chunked_attention(torch, q, k, v, bounds, keep=False):
    """Causal attention of q (1, Hq, T, D) over k, v (1, Hkv, T, D) in pieces `bounds`: piece [s, e)
    attends to keys 0 .. e-1, mask aligned lower-right; enable_gqa. keep: returns the (1, Hq, T, D)
    output (the check), else None (the timed calls)."""
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right
    outs = []
    for s, e in bounds:
        o = F.scaled_dot_product_attention(q[:, :, s:e], k[:, :, :e], v[:, :, :e],
                                           attn_mask=causal_lower_right(e - s, e), enable_gqa=True)
        if keep:
            outs.append(o)
    return torch.cat(outs, dim=2) if keep else None


def reference_attention(torch, q, k, v):
    """fp32 causal attention written out: K/V repeated to Hq heads, scores / sqrt(D), keys after the
    query masked to -inf, softmax, times V. q (1, Hq, T, D), k, v (1, Hkv, T, D)."""
    g = q.shape[1] // k.shape[1]
    q32, k32, v32 = q.float(), k.float().repeat_interleave(g, dim=1), v.float().repeat_interleave(g, dim=1)
    T = q.shape[2]
    s = q32 @ k32.transpose(-1, -2) / q.shape[-1] ** 0.5
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v32


def check_chunked(torch, sh):
    """max |chunked flash - fp32 reference| on a 352-token prompt in 96-token chunks (not multiples of
    64; the last chunk 64) and in one piece, at the model's heads; raises when above 2e-2."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    g = torch.Generator(device="cuda").manual_seed(18)
    T = 352
    q = torch.randn(1, sh["hq"], T, sh["d"], device="cuda", dtype=torch.float16, generator=g)
    k = torch.randn(1, sh["hkv"], T, sh["d"], device="cuda", dtype=torch.float16, generator=g)
    v = torch.randn(1, sh["hkv"], T, sh["d"], device="cuda", dtype=torch.float16, generator=g)
    ref = reference_attention(torch, q, k, v)
    worst = 0.0
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        for chunk in (96, 0):
            out = chunked_attention(torch, q, k, v, chunk_bounds(T, chunk), keep=True)
            worst = max(worst, (out.float() - ref).abs().max().item())
    if not worst <= 2e-2:
        raise RuntimeError(f"chunked flash attention differs from the fp32 reference by {worst:.3g} (> 2e-2)")
    return worst


def run_attn(torch, args, sh, rows, dump):
    """The attention rows (module docstring: attn)."""
    from torch.backends.cuda import SDPAParams, can_use_flash_attention
    from torch.nn.attention import SDPBackend, sdpa_kernel
    flush = l2_flush_buffer("cuda")
    try:
        check = {"max_abs_diff": check_chunked(torch, sh)}
    except Exception as e:  # every attention row then carries the failure
        check = {"error": error_text(e)}
    for T, chunk in cases(args):
        bounds = chunk_bounds(T, chunk)
        row = {"kind": ATTN_KIND, "model": args.model, "prompt": T, "chunk": chunk, "mode": mode_name(chunk),
               "dtype": "fp16", "gqa": "enable_gqa=True", "layers": sh["layers"],
               "backend": "flash (sdpa_kernel(FLASH_ATTENTION); lower-right causal_lower_right for chunks)",
               "reference_check": check, "reps": args.reps}
        try:
            if "error" in check:
                raise RuntimeError("reference check failed: " + check["error"])
            g = torch.Generator(device="cuda").manual_seed(T + chunk)
            q = torch.randn(1, sh["hq"], T, sh["d"], device="cuda", dtype=torch.float16, generator=g)
            k = torch.randn(1, sh["hkv"], T, sh["d"], device="cuda", dtype=torch.float16, generator=g)
            v = torch.randn(1, sh["hkv"], T, sh["d"], device="cuda", dtype=torch.float16, generator=g)
            s, e = bounds[-1]  # the lower-right calls bypass sdpa_kernel: flash must be able to run them
            if e - s != e and not can_use_flash_attention(
                    SDPAParams(q[:, :, s:e], k[:, :, :e], v[:, :, :e], None, 0.0, False, True), True):
                raise RuntimeError("can_use_flash_attention is False for a lower-right chunk")
            fn = lambda: chunked_attention(torch, q, k, v, bounds)  # noqa: E731
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                row["backends_seen"] = profiled_backends(torch, fn)
                if row["backends_seen"] != ["flash"]:
                    raise RuntimeError(f"backend check: the aten ops name {row['backends_seen']}, not flash only")
                for _ in range(args.warmup - 1):
                    fn()
                torch.cuda.synchronize()
                row["ms_per_layer"] = median_ms(fn, args.reps, flush)
            row["ms_all_layers"] = row["ms_per_layer"] * sh["layers"]
            row["tflops"] = attention_flop(sh["hq"], sh["d"], bounds) / (row["ms_per_layer"] * 1e-3) / 1e12
            print(f"{ATTN_KIND} {args.model} T={T} {mode_name(chunk)}: {row['ms_per_layer']:.3f} ms/layer "
                  f"({row['tflops']:.0f} TFLOP/s)", flush=True)
            del q, k, v
        except Exception as e:  # recorded, never replaced by another backend
            row["error"] = error_text(e)
            print(f"{ATTN_KIND} {args.model} T={T} {mode_name(chunk)}: ERROR {row['error']}", flush=True)
        torch.cuda.empty_cache()
        rows.append(row)
        dump()


def run_hf(torch, args, sh, rows, dump):
    """The end-to-end rows (module docstring: hf)."""
    import gc

    import transformers
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import e2e_peers  # the same random-weight model as the decode comparison (issue 17)
    try:
        cfg, model = e2e_peers.hf_model(args.model)
    except Exception as e:
        for T, chunk in cases(args):
            rows.append({"kind": HF_KIND, "model": args.model, "prompt": T, "chunk": chunk, "mode": mode_name(chunk),
                         "error": "model: " + error_text(e)})
        dump()
        return
    for T, chunk in cases(args):
        bounds = chunk_bounds(T, chunk)
        allowed = [SDPBackend.FLASH_ATTENTION] if chunk == 0 else [SDPBackend.FLASH_ATTENTION,
                                                                   SDPBackend.EFFICIENT_ATTENTION]
        row = {"kind": HF_KIND, "model": args.model, "prompt": T, "chunk": chunk, "mode": mode_name(chunk),
               "dtype": "bf16", "attn_implementation": "sdpa", "transformers": transformers.__version__,
               "backends_allowed": ["flash"] if chunk == 0 else ["flash", "efficient"],
               "gqa": "enable_gqa=True" if chunk == 0 else "enable_gqa=True without a mask (first chunk), "
                                                           "repeat_kv with one (later chunks)",
               "reps": args.hf_reps}
        try:
            ids = torch.randint(0, cfg.vocab_size, (1, T), device="cuda",
                                generator=torch.Generator(device="cuda").manual_seed(T))

            def prefill():
                cache = transformers.DynamicCache()
                for s, e in bounds:
                    out = model(input_ids=ids[:, s:e], past_key_values=cache, use_cache=True,
                                cache_position=torch.arange(s, e, device="cuda"), logits_to_keep=1)
                return out.logits[:, -1].argmax(-1)
            torch.cuda.reset_peak_memory_stats()
            with torch.inference_mode(), sdpa_kernel(allowed):
                row["backends_seen"] = profiled_backends(torch, prefill)
                for _ in range(args.warmup - 1):
                    prefill()
                torch.cuda.synchronize()
                row["ttft_ms"] = median_ms(prefill, args.hf_reps)
            row["tok_s"] = T * 1e3 / row["ttft_ms"]
            row["peak_mem_gb"] = torch.cuda.max_memory_allocated() / 1e9
            print(f"{HF_KIND} {args.model} T={T} {mode_name(chunk)}: {row['ttft_ms']:.1f} ms, {row['tok_s']:.0f} tok/s "
                  f"(backends {row['backends_seen']})", flush=True)
        except Exception as e:
            row["error"] = error_text(e)
            print(f"{HF_KIND} {args.model} T={T} {mode_name(chunk)}: ERROR {row['error']}", flush=True)
        gc.collect()
        torch.cuda.empty_cache()
        rows.append(row)
        dump()


def main(argv=None):
    args = parse_args(argv)
    try:
        import torch
    except ImportError as e:
        sys.exit(f"prefill_vs_sdpa: needs torch with CUDA (the GPU machine's): {e}")
    if not torch.cuda.is_available():
        sys.exit("prefill_vs_sdpa: no CUDA device (this measurement runs on the GPU machine only)")
    sh = shapes(args.model)
    meta = {"model": args.model, "shapes": sh, "prompts": args.prompts, "chunk": args.chunk,
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name(0),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": " ".join(["prefill_vs_sdpa.py"] + (sys.argv[1:] if argv is None else list(argv)))}
    rows = []

    def dump():
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    dump()
    if "attn" in args.what:
        run_attn(torch, args, sh, rows, dump)
    if "hf" in args.what:
        run_hf(torch, args, sh, rows, dump)
    dump()


if __name__ == "__main__":
    main()
