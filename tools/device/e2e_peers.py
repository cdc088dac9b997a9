#!/usr/bin/env python3
"""Peers of `ratekv bench --device cuda` on the GPU machine (issue 17).

sdpa: torch SDPA flash fp16 decode attention (one layer, one query token per
      sequence) at the (B, T) shapes of the bench rows, timed as
      Engine::time_attention is (CUDA events around one call, a 512 MB L2 flush
      before each, median of --reps): the attn_vs_sdpa of the fp16 rows.
hf:   HF transformers decode steps on the same configuration (random bf16
      weights; cache filled with random K/V at --depth): eager with
      DynamicCache, and StaticCache + torch.compile(mode="reduce-overhead");
      median step of --steps after warm-up. Failures are recorded as rows with
      "error", never replaced by another setup.

Usage: e2e_peers.py sdpa --hq 32 --hkv 8 --d 128 --shapes 1:32768,4:131072 --out F
       e2e_peers.py hf --model llama-3.1-8b --batch 1,4 --depth 131072 --out F
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its siblings, from any working directory
from cuda_timing import l2_flush_buffer, median_ms  # noqa: E402
from hf_configs import MODELS  # noqa: E402  (the synthetic configurations as HF config fields)

dev = torch.device("cuda")


def run_sdpa(args):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    flush = l2_flush_buffer(dev)
    rows = []
    for s in args.shapes.split(","):
        B, T = (int(x) for x in s.split(":"))
        row = {"kind": "sdpa-flash-fp16", "B": B, "T": T, "hq": args.hq, "hkv": args.hkv, "d": args.d}
        try:
            g = torch.Generator(device=dev).manual_seed(B * 1000003 + T)
            q = torch.randn(B, args.hq, 1, args.d, device=dev, dtype=torch.float16, generator=g)
            k = torch.randn(B, args.hkv, T, args.d, device=dev, dtype=torch.float16, generator=g)
            v = torch.randn(B, args.hkv, T, args.d, device=dev, dtype=torch.float16, generator=g)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                torch.cuda.synchronize()
                row["ms"] = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), args.reps, flush)
            print(f"sdpa-flash-fp16 B={B} T={T}: {row['ms']:.4f} ms", flush=True)
            del q, k, v
        except Exception as e:  # recorded, never replaced by another backend
            row["error"] = repr(e)
            print(f"sdpa-flash-fp16 B={B} T={T}: ERROR {e!r}", flush=True)
        torch.cuda.empty_cache()
        rows.append(row)
    return rows


def hf_model(name):
    import transformers
    m = dict(MODELS[name])
    arch = m.pop("arch")
    cls_cfg = transformers.LlamaConfig if arch == "llama" else transformers.Qwen2Config
    cls_lm = transformers.LlamaForCausalLM if arch == "llama" else transformers.Qwen2ForCausalLM
    cfg = cls_cfg(**m, torch_dtype="bfloat16")
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(dev):
        model = cls_lm(cfg)
    torch.set_default_dtype(torch.float32)
    model.eval()
    return cfg, model


def fill_cache(cache, cfg, B, T, static):
    hd = cfg.hidden_size // cfg.num_attention_heads
    for layer in range(cfg.num_hidden_layers):
        k = torch.randn(B, cfg.num_key_value_heads, T, hd, device=dev, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        kw = {"cache_position": torch.arange(T, device=dev)} if static else None
        cache.update(k, v, layer, kw)
        del k, v


def run_hf(args):
    import transformers
    cfg, model = hf_model(args.model)
    rows = []
    for B in (int(b) for b in args.batch.split(",")):
        T = args.depth
        for setup in args.setups.split(","):
            row = {"kind": "hf-" + setup, "model": args.model, "B": B, "depth": T,
                   "transformers": transformers.__version__, "torch": torch.__version__}
            t_start = time.time()
            try:
                tok = torch.randint(0, cfg.vocab_size, (B, 1), device=dev)
                if setup == "eager-dynamic":
                    cache = transformers.DynamicCache()
                    fill_cache(cache, cfg, B, T, False)
                    pos = T

                    def step():
                        nonlocal pos
                        with torch.no_grad():
                            model(input_ids=tok, past_key_values=cache, use_cache=True,
                                  cache_position=torch.tensor([pos], device=dev))
                        pos += 1
                    fwd = step
                else:  # static-compiled
                    L = T + args.steps + 8
                    try:
                        cache = transformers.StaticCache(config=cfg, max_batch_size=B, max_cache_len=L, device=dev,
                                                         dtype=torch.bfloat16)
                    except TypeError:
                        cache = transformers.StaticCache(config=cfg, max_cache_len=L)
                    fill_cache(cache, cfg, B, T, True)
                    compiled = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
                    cp = torch.tensor([T], device=dev)

                    def fwd():
                        with torch.no_grad():
                            compiled(input_ids=tok, past_key_values=cache, use_cache=True, cache_position=cp)
                for _ in range(args.warmup):
                    fwd()
                torch.cuda.synchronize()
                row["step_ms"] = median_ms(fwd, args.steps)
                row["decode_tok_s"] = B * 1e3 / row["step_ms"]
                row["peak_mem_gb"] = torch.cuda.max_memory_allocated() / 1e9
                print(f"hf-{setup} {args.model} B={B} depth={T}: {row['step_ms']:.2f} ms/step "
                      f"({time.time() - t_start:.0f} s incl. setup)", flush=True)
            except Exception as e:
                row["error"] = repr(e)[:400]
                print(f"hf-{setup} {args.model} B={B} depth={T}: ERROR {e!r}"[:400], flush=True)
            cache = None
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            rows.append(row)
            dump(args.out, rows)  # a timeout still leaves the rows measured so far
    return rows


def dump(path, rows):
    json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "rows": rows},
              open(path, "w"), indent=2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["sdpa", "hf"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--hq", type=int, default=32)
    ap.add_argument("--hkv", type=int, default=8)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--shapes", default="1:131072")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--batch", default="1,4")
    ap.add_argument("--depth", type=int, default=131072)
    ap.add_argument("--setups", default="eager-dynamic,static-compiled")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    rows = run_sdpa(args) if args.what == "sdpa" else run_hf(args)
    dump(args.out, rows)


if __name__ == "__main__":
    main()
