#!/usr/bin/env python3
"""Calibrate a transformers model, make a Block-GTQ plan, generate from the packed cache.

    python python/examples/generate_packed.py                       # SmolLM2-135M from ratekv's assets (GGUF)
    python python/examples/generate_packed.py --model PATH_OR_DIR    # any local Llama / Qwen2 checkpoint
    python python/examples/generate_packed.py --bits 2.25 --prompt "The capital of France is"

Steps (README "Python"): ratekv.calibrate() captures Q/K/V (and, with --sensitivity, ∂L/∂K,
∂L/∂V) on calibration text; ratekv.make_plan() runs the C++ Block-GTQ allocator; generate()
runs with ratekv.hf.PackedCache (keys/values stored as codes, decode attention from the codes),
then with DynamicCache for comparison. Needs `pip install .` (or PYTHONPATH=build/python),
torch, transformers ≥ 5, and gguf + accelerate to load a GGUF file.
"""

import argparse
import os
import pathlib
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

import ratekv
import ratekv.hf


def load(model_path: str):
    p = pathlib.Path(model_path)
    if p.suffix == ".gguf":
        kw = dict(gguf_file=p.name)
        src = str(p.parent)
    else:
        kw, src = {}, model_path
    tok = AutoTokenizer.from_pretrained(src, **kw)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, **kw).eval()
    return model, tok


def main() -> None:
    assets = pathlib.Path(os.environ.get("RATEKV_ASSETS", pathlib.Path.home() / ".cache/ratekv/assets"))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(assets / "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--calib", default=str(assets / "text/calib.txt"), help="calibration text file")
    ap.add_argument("--calib-tokens", type=int, default=1024)
    ap.add_argument("--bits", type=float, default=3.25, help="effective K and V bits per element (Block-GTQ)")
    ap.add_argument("--sensitivity", action="store_true", help="also measure ∂L/∂K, ∂L/∂V (RateQuant's weights)")
    ap.add_argument("--prompt", default="The three primary colors are")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--stats-out", default="", help="also write the statistics file here")
    a = ap.parse_args()

    model, tok = load(a.model)
    text = pathlib.Path(a.calib).read_text(encoding="utf-8", errors="replace")[: a.calib_tokens * 8]
    t0 = time.time()
    sens = dict(sensitivity=True, sens_seqs=2, sens_len=256) if a.sensitivity else {}
    stats = ratekv.calibrate(model, tok, text, n_tokens=a.calib_tokens, ctx=512, output=a.stats_out or None,
                             text_file=a.calib, **sens)
    print(f"calibrated on {stats.n_tokens} tokens in {time.time() - t0:.1f} s (rope_layout {stats.rope_layout})")
    plan = ratekv.make_plan(stats, "block-gtq", k_bits=a.bits, v_bits=a.bits)
    print(f"plan: {plan.method}, achieved {plan.achieved['total']:.3f} effective bits/element")

    inputs = tok(a.prompt, return_tensors="pt")
    gen = dict(max_new_tokens=a.new_tokens, do_sample=False)
    cache = ratekv.hf.PackedCache(plan, model.config)
    out = model.generate(**inputs, past_key_values=cache, **gen)
    dense = DynamicCache(config=model.config)
    ref = model.generate(**inputs, past_key_values=dense, **gen)
    n = inputs["input_ids"].shape[1]
    fp16 = cache.get_seq_length() * ratekv.model_config(model.config).kv_bytes_per_token_fp16()
    print("packed :", repr(tok.decode(out[0, n:], skip_special_tokens=True)))
    print("dynamic:", repr(tok.decode(ref[0, n:], skip_special_tokens=True)))
    print(f"packed cache {cache.nbytes} bytes for {cache.get_seq_length()} tokens; an fp16 cache: {fp16} bytes "
          "(the packed store allocates 64-token pages)")


if __name__ == "__main__":
    main()
