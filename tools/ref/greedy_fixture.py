#!/usr/bin/env python3
"""Writes tests/fixtures/smollm2/greedy.json: greedy (argmax) continuations of 3 fixed
prompts by llama.cpp. Run by tools/make_reference_fixtures.sh; stdlib only.

usage: greedy_fixture.py LLAMA_REF F32_MODEL Q4_1_MODEL MODEL_SHA256 OUT_JSON [smollm2|gemma3|qwen2]

Reference: `llama_ref greedy` on the F32 copy of the model (fp32 compute on the dequantized
weights). The continuation on the Q4_1 GGUF run directly (Q8_1-quantized activations in
ggml's matmuls) is recorded beside it for information. Format: tests/fixtures/smollm2/README.md.
"""
import json
import os
import subprocess
import sys
import tempfile

N_NEW = 32
CHAT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
PROMPTS = [
    ("story", "Once upon a time, there was a little girl named Lily."),
    ("python_code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("chat_template", CHAT),
]

GEMMA_PROMPTS = [
    ("story", "Once upon a time, there was a little girl named Lily."),
    ("python_code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("chat_template", "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n"),
]


QWEN_PROMPTS = [
    ("story", "Once upon a time, there was a little girl named Lily."),
    ("python_code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("chat_template", "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
                      "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                      "<|im_start|>assistant\n"),
]


def greedy(tool, model, text, tmp, tag):
    path = os.path.join(tmp, tag + ".txt")
    with open(path, "wb") as f:
        f.write(text.encode("utf-8"))
    res = subprocess.run([tool, "greedy", model, path, str(N_NEW)], capture_output=True, check=False)
    if res.returncode != 0:
        sys.exit(f"greedy_fixture.py: llama_ref greedy failed: {res.stderr.decode(errors='replace')}")
    return json.loads(res.stdout.decode().strip().splitlines()[-1])


def main():
    if len(sys.argv) not in (6, 7):
        sys.exit(__doc__)
    tool, f32_model, q41_model, model_sha, out = sys.argv[1:6]
    which = sys.argv[6] if len(sys.argv) == 7 else "smollm2"
    if which not in ("smollm2", "gemma3", "qwen2"):
        sys.exit(f"greedy_fixture.py: unknown prompt set {which!r}")
    gemma = which == "gemma3"
    prompt_set = {"smollm2": PROMPTS, "gemma3": GEMMA_PROMPTS, "qwen2": QWEN_PROMPTS}[which]
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in prompt_set:
            r = greedy(tool, f32_model, text, tmp, name)
            q = greedy(tool, q41_model, text, tmp, name + "_q41")
            cases.append({
                "name": name, "prompt": text, "prompt_ids": r["prompt_ids"],
                "ids": r["ids"], "text": r["text"],
                "stopped_at_eog": r["stopped_at_eog"],
                "margins": r["margins"],
                "q4_1_direct_ids": q["ids"],
            })
    doc = {
        "model_sha256": model_sha,
        "reference": ("llama.cpp (PyPI llama-cpp-python==0.3.36 vendored tree), CPU, tools/ref/llama_ref.cpp "
                      "'greedy' on the F32 copy of the model (llama_model_quantize ALL_F32): prompt prefilled "
                      "in one batch, then one token per llama_decode, argmax with ties to the lowest id, stop "
                      "after an end-of-generation token; F32 K/V cache, flash attention off, 2 threads, "
                      + ("BOS first (add_bos_token true); 'q4_1_direct_ids' = the Q4_K_M file run directly"
                         if gemma else "no BOS; 'q4_1_direct_ids' = the Q4_K_M file run directly"
                         if which == "qwen2" else "no BOS")),
        "n_new": N_NEW,
        "cases": cases,
    }
    body = ",\n  ".join(json.dumps(c, ensure_ascii=False) for c in doc.pop("cases"))
    head = json.dumps(doc, ensure_ascii=False, indent=1)[:-2]
    with open(out, "w", encoding="utf-8") as f:
        f.write(head + ',\n "cases": [\n  ' + body + "\n ]\n}\n")


if __name__ == "__main__":
    main()
