#!/usr/bin/env python3
"""Writes tests/fixtures/smollm2/perplexity.json: llama.cpp `llama-perplexity` on the
evaluation text, for two context sizes and several KV-cache types (the baselines the
evaluation compares ratekv's KV compression against). Run by
tools/make_reference_fixtures.sh; stdlib only.

usage: perplexity_fixture.py BIN_DIR Q4_1_MODEL F32_MODEL MODEL_SHA256 EVAL_TXT EVAL_SHA256 OUT_JSON

llama-perplexity convention (tools/perplexity/perplexity.cpp): the text is tokenized whole
(no BOS for this model), cut into n_chunk consecutive windows of n_ctx tokens; each window is
evaluated from an empty cache and only the predictions of tokens first+1 .. n_ctx-1 with
first = n_ctx/2 are scored, i.e. n_ctx/2 - 1 per window. PPL = exp(mean NLL) over all scored
tokens of all windows.
"""
import json
import os
import re
import subprocess
import sys

CONTEXTS = [(512, 8), (2048, 2)]
# (name, model key, cache type k/v, flash attention)
VARIANTS = [
    ("kv_f16", "q4_1", "f16", "off"),
    ("kv_f32", "q4_1", "f32", "off"),
    ("kv_f16_fa", "q4_1", "f16", "on"),
    ("kv_q8_0", "q4_1", "q8_0", "on"),
    ("kv_q4_0", "q4_1", "q4_0", "on"),
    ("f32_weights_kv_f32", "f32", "f32", "off"),
]
THREADS = 2


def main():
    if len(sys.argv) != 8:
        sys.exit(__doc__)
    bin_dir, q41, f32, model_sha, eval_txt, eval_sha, out = sys.argv[1:]
    models = {"q4_1": q41, "f32": f32}
    tok = subprocess.run([os.path.join(bin_dir, "llama-tokenize"), "-m", q41, "-f", eval_txt, "--ids",
                          "--no-escape", "--log-disable"], capture_output=True, check=True)
    n_tokens = len(json.loads([l for l in tok.stdout.decode().splitlines() if l.startswith("[")][0]))
    runs = []
    for n_ctx, n_chunks in CONTEXTS:
        for name, model_key, kv, fa in VARIANTS:
            args = ["-m", models[model_key], "-f", eval_txt, "-c", str(n_ctx), "--chunks", str(n_chunks),
                    "-b", str(n_ctx), "-t", str(THREADS), "-tb", str(THREADS),
                    "-ctk", kv, "-ctv", kv, "-fa", fa]
            res = subprocess.run([os.path.join(bin_dir, "llama-perplexity")] + args,
                                 capture_output=True, check=False)
            log = res.stdout.decode(errors="replace") + res.stderr.decode(errors="replace")
            m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", log)
            if res.returncode != 0 or not m:
                sys.exit(f"perplexity_fixture.py: llama-perplexity {' '.join(args)} failed:\n{log[-3000:]}")
            running = [float(v) for _, v in re.findall(r"\[(\d+)\]([0-9.]+),", log)]
            model_file = "SmolLM2-135M-Instruct.Q4_1.gguf" if model_key == "q4_1" else \
                "SmolLM2-135M-Instruct.F32-from-Q4_1.gguf (llama_ref dequant)"
            cmd = ["llama-perplexity", "-m", model_file, "-f", "text/eval.txt"] + args[4:]
            runs.append({
                "name": name, "weights": model_key, "n_ctx": n_ctx, "n_chunks": n_chunks,
                "n_batch": n_ctx, "cache_type_k": kv, "cache_type_v": kv, "flash_attn": fa,
                "n_threads": THREADS,
                "scored_tokens": n_chunks * (n_ctx - n_ctx // 2 - 1),
                "ppl": float(m.group(1)), "ppl_stderr": float(m.group(2)),
                "running_ppl_per_chunk": running,
                "command": " ".join(cmd),
            })
            print(f"perplexity n_ctx={n_ctx} {name}: {m.group(1)}", file=sys.stderr)
    doc = {
        "model_sha256": model_sha,
        "eval_text": "text/eval.txt", "eval_text_sha256": eval_sha,
        "eval_text_tokens": n_tokens,
        "generator": "llama-perplexity (llama.cpp vendored in PyPI llama-cpp-python==0.3.36), CPU build",
        "convention": ("no BOS; windows of n_ctx consecutive tokens starting at 0, n_ctx, 2*n_ctx, ...; "
                       "each from an empty cache; tokens at positions n_ctx/2+1 .. n_ctx-1 scored "
                       "(n_ctx/2-1 per window); PPL = exp(mean NLL); ppl_stderr as printed by llama.cpp; "
                       "running_ppl_per_chunk[i] = PPL over windows 0..i; n_ubatch = llama.cpp default 512"),
        "runs": runs,
    }
    body = ",\n  ".join(json.dumps(r) for r in doc.pop("runs"))
    head = json.dumps(doc, indent=1)[:-2]
    with open(out, "w", encoding="utf-8") as f:
        f.write(head + ',\n "runs": [\n  ' + body + "\n ]\n}\n")


if __name__ == "__main__":
    main()
