#!/usr/bin/env python3
"""Writes tests/fixtures/smollm2/perplexity.json: llama.cpp `llama-perplexity` on the
evaluation text, for two context sizes and several KV-cache types (the baselines the
evaluation compares ratekv's KV compression against). Run by
tools/make_reference_fixtures.sh; stdlib only.

usage: perplexity_fixture.py BIN_DIR Q4_1_MODEL F32_MODEL MODEL_SHA256 EVAL_TXT EVAL_SHA256 OUT_JSON CACHE_DIR [gemma3|qwen2 [NAME]]

gemma3: the Q4_K_M model in place of Q4_1 (the "q4_1" weights key then names the quantized
file as shipped), one context: -c 512 --chunks 4 (its 262,144-entry LM head makes a window
~6x as costly as SmolLM2's), and BOS replaces the first token of every window (add_bos_token
is true). qwen2 (Qwen2.5-Coder, Q4_K_M; NAME = the GGUF's file name for the records): no BOS,
one context -c 512 --chunks 4 (151,936-row LM head, 0.5-1.5B parameters).

Each llama-perplexity run takes minutes on 2 busy cores, so every finished run is cached in
CACHE_DIR (keyed by model/eval hashes and arguments) and OUT_JSON is rewritten after each run:
an interrupted invocation resumes where it stopped. Set RATEKV_PPL_EXTRA=1 to also run the
extra variants (F32 and F16+flash-attention KV on the Q4_1 weights).

llama-perplexity convention (tools/perplexity/perplexity.cpp): the text is tokenized whole
(no BOS for this model), cut into n_chunk consecutive windows of n_ctx tokens; each window is
evaluated from an empty cache and only the predictions of tokens first+1 .. n_ctx-1 with
first = n_ctx/2 are scored, i.e. n_ctx/2 - 1 per window. PPL = exp(mean NLL) over all scored
tokens of all windows.
"""
import hashlib
import json
import os
import re
import subprocess
import sys

CONTEXTS = [(512, 8), (2048, 2)]
# (name, model key, cache type k/v, flash attention). Quantized V cache needs flash attention
# in llama.cpp, so the q8_0/q4_0 runs use -fa on.
VARIANTS = [
    ("kv_f16", "q4_1", "f16", "off"),
    ("kv_q8_0", "q4_1", "q8_0", "on"),
    ("kv_q4_0", "q4_1", "q4_0", "on"),
    ("f32_weights_kv_f32", "f32", "f32", "off"),
]
EXTRA_VARIANTS = [
    ("kv_f32", "q4_1", "f32", "off"),
    ("kv_f16_fa", "q4_1", "f16", "on"),
]
# One thread: on the shared, oversubscribed 2-core dev machine llama.cpp ran about 2x faster
# with -t 1 than with -t 2 (spinning barriers), and ggml splits matmuls by output rows, so the
# thread count does not change the numbers (checked: kv_f16 at n_ctx 512 gave the same PPL
# with -t 2). Override with RATEKV_PPL_THREADS.
THREADS = int(os.environ.get("RATEKV_PPL_THREADS", "1"))


def main():
    if len(sys.argv) not in (9, 10, 11):
        sys.exit(__doc__)
    bin_dir, q41, f32, model_sha, eval_txt, eval_sha, out, cache_dir = sys.argv[1:9]
    which = sys.argv[9] if len(sys.argv) >= 10 else "smollm2"
    if which not in ("smollm2", "gemma3", "qwen2"):
        sys.exit(f"perplexity_fixture.py: unknown model family {which!r}")
    gemma = which == "gemma3"
    qwen_name = sys.argv[10] if len(sys.argv) == 11 else os.path.basename(q41)
    contexts = [(512, 4)] if which != "smollm2" else CONTEXTS
    os.makedirs(cache_dir, exist_ok=True)
    models = {"q4_1": q41, "f32": f32}
    tok = subprocess.run([os.path.join(bin_dir, "llama-tokenize"), "-m", q41, "-f", eval_txt, "--ids",
                          "--no-escape", "--log-disable"], capture_output=True, check=True)
    n_tokens = len(json.loads([l for l in tok.stdout.decode().splitlines() if l.startswith("[")][0]))
    variants = VARIANTS + (EXTRA_VARIANTS if os.environ.get("RATEKV_PPL_EXTRA") == "1" else [])
    runs = []
    for n_ctx, n_chunks in contexts:
        for name, model_key, kv, fa in variants:
            args = ["-m", models[model_key], "-f", eval_txt, "-c", str(n_ctx), "--chunks", str(n_chunks),
                    "-b", str(n_ctx), "-t", str(THREADS), "-tb", str(THREADS),
                    "-ctk", kv, "-ctv", kv, "-fa", fa]
            key = hashlib.sha256(json.dumps([model_sha, eval_sha, model_key] + args[2:]).encode()).hexdigest()
            cached = os.path.join(cache_dir, key[:32] + ".json")
            if os.path.exists(cached):
                with open(cached) as f:
                    runs.append(json.load(f))
                write(out, model_sha, eval_sha, n_tokens, runs, gemma)
                continue
            res = subprocess.run([os.path.join(bin_dir, "llama-perplexity")] + args,
                                 capture_output=True, check=False)
            log = res.stdout.decode(errors="replace") + res.stderr.decode(errors="replace")
            m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", log)
            if res.returncode != 0 or not m:
                sys.exit(f"perplexity_fixture.py: llama-perplexity {' '.join(args)} failed:\n{log[-3000:]}")
            running = [float(v) for _, v in re.findall(r"\[(\d+)\]([0-9.]+),", log)]
            if which == "qwen2":
                model_file = qwen_name if model_key == "q4_1" else os.path.basename(f32) + " (llama_ref dequant)"
            elif gemma:
                model_file = "gemma-3-270m-q4_k_m.gguf" if model_key == "q4_1" else \
                    "gemma-3-270m.F32-from-Q4_K_M.gguf (llama_ref dequant)"
            else:
                model_file = "SmolLM2-135M-Instruct.Q4_1.gguf" if model_key == "q4_1" else \
                    "SmolLM2-135M-Instruct.F32-from-Q4_1.gguf (llama_ref dequant)"
            cmd = ["llama-perplexity", "-m", model_file, "-f", "text/eval.txt"] + args[4:]
            runs.append(run := {
                "name": name, "weights": ("q4_k_m" if which != "smollm2" and model_key == "q4_1" else model_key), "n_ctx": n_ctx, "n_chunks": n_chunks,
                "n_batch": n_ctx, "cache_type_k": kv, "cache_type_v": kv, "flash_attn": fa,
                "n_threads": THREADS,
                "scored_tokens": n_chunks * (n_ctx - n_ctx // 2 - 1),
                "ppl": float(m.group(1)), "ppl_stderr": float(m.group(2)),
                "running_ppl_per_chunk": running,
                "command": " ".join(cmd),
            })
            with open(cached, "w") as f:
                json.dump(run, f)
            write(out, model_sha, eval_sha, n_tokens, runs, gemma)
            print(f"perplexity n_ctx={n_ctx} {name}: {m.group(1)}", file=sys.stderr)


def write(out, model_sha, eval_sha, n_tokens, runs, gemma=False):
    doc = {
        "model_sha256": model_sha,
        "eval_text": "text/eval.txt", "eval_text_sha256": eval_sha,
        "eval_text_tokens": n_tokens,
        "generator": "llama-perplexity (llama.cpp vendored in PyPI llama-cpp-python==0.3.36), CPU build",
        "convention": (("BOS (add_bos_token true): the text is tokenized with BOS first and the first token of "
                        "every window is replaced by BOS; " if gemma else "no BOS; ") + "windows of n_ctx consecutive tokens starting at 0, n_ctx, 2*n_ctx, ...; "
                       "each from an empty cache; tokens at positions n_ctx/2+1 .. n_ctx-1 scored "
                       "(n_ctx/2-1 per window); PPL = exp(mean NLL); ppl_stderr as printed by llama.cpp; "
                       "running_ppl_per_chunk[i] = PPL over windows 0..i; n_ubatch = llama.cpp default 512"),
        "runs": list(runs),
    }
    body = ",\n  ".join(json.dumps(r) for r in doc.pop("runs"))
    head = json.dumps(doc, indent=1)[:-2]
    with open(out, "w", encoding="utf-8") as f:
        f.write(head + ',\n "runs": [\n  ' + body + "\n ]\n}\n")


if __name__ == "__main__":
    main()
