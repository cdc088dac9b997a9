#!/usr/bin/env python3
"""Writes tests/fixtures/smollm2/logits.json (+ one raw float32 file): llama.cpp's logits at
every position of 3 fixed prompts. Run by tools/make_reference_fixtures.sh; needs numpy.

usage: logits_fixture.py LLAMA_REF F32_MODEL Q4_1_MODEL MODEL_SHA256 OUT_DIR [smollm2|gemma3|qwen2]

gemma3 (Q4_K_M weights): Gemma prompts, BOS first (the model adds it), and no full-logits
file (262,144 logits per position would make it ~10 MB): top-K and the fixed ids only.
qwen2 (Q4_K_M weights, Qwen2.5-Coder): ChatML prompts, no BOS, no full-logits file
(151,936 logits per position).

The reference is `llama_ref logits` on F32_MODEL, the F32 copy of the Q4_1 GGUF written by
`llama_ref dequant` (so the weights are the dequantized Q4_1/Q8_0 values and all compute is
fp32). For information the same prompts are also run on Q4_1_MODEL directly, where ggml
quantizes activations to Q8_1 inside the matmuls; the max |difference| is recorded.
Format: tests/fixtures/smollm2/README.md.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

TOP_K = 32
N_FIXED = 256
# (name, text, store_full_logits)
PROMPTS = [
    ("short_prose", "The capital of France is Paris. The capital", True),
    ("python_code", "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n", False),
    ("chat", "<|im_start|>user\nWhat is 12 + 7?<|im_end|>\n<|im_start|>assistant\n", False),
]

GEMMA_PROMPTS = [
    ("short_prose", "The capital of France is Paris. The capital", False),
    ("python_code", "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n", False),
    ("chat", "<start_of_turn>user\nWhat is 12 + 7?<end_of_turn>\n<start_of_turn>model\n", False),
]


QWEN_PROMPTS = [
    ("short_prose", "The capital of France is Paris. The capital", False),
    ("python_code", "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n", False),
    ("chat", "<|im_start|>user\nWhat is 12 + 7?<|im_end|>\n<|im_start|>assistant\n", False),
]


def run_logits(tool, model, text, tmp, tag):
    prompt = os.path.join(tmp, tag + ".txt")
    out = os.path.join(tmp, tag + ".bin")
    with open(prompt, "wb") as f:
        f.write(text.encode("utf-8"))
    res = subprocess.run([tool, "logits", model, prompt, out], capture_output=True, check=False)
    if res.returncode != 0:
        sys.exit(f"logits_fixture.py: llama_ref logits failed: {res.stderr.decode(errors='replace')}")
    meta = json.loads(res.stdout.decode().strip().splitlines()[-1])
    logits = np.fromfile(out, dtype="<f4").reshape(len(meta["ids"]), meta["n_vocab"])
    return meta["ids"], logits


def main():
    if len(sys.argv) not in (6, 7):
        sys.exit(__doc__)
    tool, f32_model, q41_model, model_sha, out_dir = sys.argv[1:6]
    which = sys.argv[6] if len(sys.argv) == 7 else "smollm2"
    if which not in ("smollm2", "gemma3", "qwen2"):
        sys.exit(f"logits_fixture.py: unknown prompt set {which!r}")
    gemma = which == "gemma3"
    prompt_set = {"smollm2": PROMPTS, "gemma3": GEMMA_PROMPTS, "qwen2": QWEN_PROMPTS}[which]
    prompts = []
    n_vocab = None
    fixed_ids = None
    with tempfile.TemporaryDirectory() as tmp:
        for name, text, full in prompt_set:
            ids, logits = run_logits(tool, f32_model, text, tmp, name)
            ids_q, logits_q = run_logits(tool, q41_model, text, tmp, name + "_q41")
            if ids != ids_q:
                sys.exit("logits_fixture.py: the two models tokenize differently")
            if not 8 <= len(ids) <= 26 or (full and len(ids) > 10):
                sys.exit(f"logits_fixture.py: prompt {name} has {len(ids)} tokens, outside the planned range")
            if n_vocab is None:
                n_vocab = logits.shape[1]
                stride = n_vocab // N_FIXED
                fixed_ids = [i * stride for i in range(N_FIXED)]
            positions = []
            for row in logits:
                # top-K by logit, ties by lower id (stable sort of -logit)
                order = np.argsort(-row, kind="stable")[:TOP_K]
                positions.append({
                    "top": [[int(i), float(row[i])] for i in order],
                    "fixed": [float(row[i]) for i in fixed_ids],
                })
            entry = {
                "name": name, "text": text, "ids": ids, "n_positions": len(ids),
                "full_logits_file": None,
                "max_abs_diff_q4_1_direct": float(np.abs(logits - logits_q).max()),
                "top1_equal_q4_1_direct": int((logits.argmax(1) == logits_q.argmax(1)).sum()),
                "positions": positions,
            }
            if full:
                fname = f"logits_{name}.f32"
                logits.astype("<f4").tofile(os.path.join(out_dir, fname))
                entry["full_logits_file"] = fname
            prompts.append(entry)
    doc = {
        "model_sha256": model_sha,
        "reference": ("llama.cpp (PyPI llama-cpp-python==0.3.36 vendored tree), CPU, tools/ref/llama_ref.cpp "
                      "'logits' on the F32 copy of the model made by llama_model_quantize(ALL_F32, pure, "
                      "allow_requantize): fp32 weights equal to the dequantized Q4_1/Q8_0 values, fp32 "
                      "activations, F32 K/V cache, flash attention off, 2 threads, whole prompt in one batch "
                      "at positions 0..n-1, " + ("BOS first (the model's add_bos_token is true); weights "
                      "Q4_K_M (Q5_0/Q4_K/Q6_K/Q8_0); 'q4_1_direct' fields = the Q4_K_M file run directly"
                      if gemma else
                      "no BOS (the model's add_bos_token is false); weights Q4_K_M (Qwen2.5-Coder: Q4_K/Q6_K, "
                      "plus Q5_0/Q8_0 in the 0.5B); 'q4_1_direct' fields = the Q4_K_M file run directly"
                      if which == "qwen2" else "no BOS (the model's add_bos_token is false)")),
        "n_vocab": n_vocab,
        "top_k": TOP_K,
        "fixed_ids": fixed_ids,
        "prompts": prompts,
    }
    # compact: one position per line
    lines = ["{"]
    for k in ("model_sha256", "reference", "n_vocab", "top_k", "fixed_ids"):
        lines.append(f" {json.dumps(k)}: {json.dumps(doc[k])},")
    lines.append(' "prompts": [')
    for pi, p in enumerate(prompts):
        lines.append("  {")
        for k in ("name", "text", "ids", "n_positions", "full_logits_file", "max_abs_diff_q4_1_direct",
                  "top1_equal_q4_1_direct"):
            lines.append(f"   {json.dumps(k)}: {json.dumps(p[k], ensure_ascii=False)},")
        lines.append('   "positions": [')
        lines.append(",\n".join("    " + json.dumps(pos) for pos in p["positions"]))
        lines.append("   ]")
        lines.append("  }" + ("," if pi + 1 < len(prompts) else ""))
    lines.append(" ]")
    lines.append("}")
    with open(os.path.join(out_dir, "logits.json"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
