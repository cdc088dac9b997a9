#!/usr/bin/env python3
"""Independent numpy reference of the Llama forward pass on a GGUF model.

Reads and dequantizes the weights with the `gguf` PyPI package (not ratekv's
reader), undoes the GGUF converter's Q/K row permutation and applies RoPE the
Hugging Face way (rotate_half, NeoX pairs (i, i+d/2)), so it shares neither
the weight decoding nor the RoPE channel pairing with the C++ runtime.
Computation in float64.

Not part of CI (needs `pip install gguf numpy`). Usage:
  tools/ref/forward_numpy.py MODEL.gguf --tokens 1,2,3 [--out ref.json] [--top 20]
Writes JSON: {"tokens": [...], "positions": [{"pos": p, "top": [[id, logit], ...],
"logsumexp": x, "logits_at": {id: logit for a fixed id set}}], ...}.
"""
import argparse
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def field(r, key, default=None):
    f = r.fields.get(key)
    if f is None:
        return default
    return f.contents()


def load(path):
    r = GGUFReader(path)
    arch = field(r, "general.architecture")
    if arch != "llama":
        sys.exit(f"{path}: arch {arch!r}: this reference implements 'llama' only")
    cfg = dict(
        n_layers=int(field(r, f"{arch}.block_count")),
        n_heads=int(field(r, f"{arch}.attention.head_count")),
        n_kv=int(field(r, f"{arch}.attention.head_count_kv")),
        d=int(field(r, f"{arch}.embedding_length")),
        theta=float(field(r, f"{arch}.rope.freq_base", 10000.0)),
        eps=float(field(r, f"{arch}.attention.layer_norm_rms_epsilon")),
    )
    W = {}
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type)
        shape = tuple(int(x) for x in reversed(t.shape))  # numpy order: (out, in)
        W[t.name] = np.asarray(a, dtype=np.float64).reshape(shape)
    return cfg, W


def unpermute(w, n_head):
    # Inverse of convert_hf_to_gguf's permute: rows (head, pair i, 2) -> (head, 2, i).
    out, inp = w.shape
    return w.reshape(n_head, out // n_head // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope_hf(x, pos, theta):
    # x: (T, heads, hd); HF rotate_half convention.
    hd = x.shape[-1]
    inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.outer(pos, inv)  # (T, hd/2)
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    rot = np.concatenate([-x2, x1], axis=-1)
    return x * cos + rot * sin


def forward(cfg, W, tokens):
    T = len(tokens)
    H, Hkv, d = cfg["n_heads"], cfg["n_kv"], cfg["d"]
    hd = d // H
    pos = np.arange(T, dtype=np.float64)
    x = W["token_embd.weight"][tokens]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(cfg["n_layers"]):
        p = f"blk.{l}."
        h = rms(x, W[p + "attn_norm.weight"], cfg["eps"])
        q = h @ unpermute(W[p + "attn_q.weight"], H).T
        k = h @ unpermute(W[p + "attn_k.weight"], Hkv).T
        v = h @ W[p + "attn_v.weight"].T
        q = rope_hf(q.reshape(T, H, hd), pos, cfg["theta"])
        k = rope_hf(k.reshape(T, Hkv, hd), pos, cfg["theta"])
        v = v.reshape(T, Hkv, hd)
        rep = H // Hkv
        k = np.repeat(k, rep, axis=1)
        v = np.repeat(v, rep, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", s, v).reshape(T, H * hd)
        x = x + o @ W[p + "attn_output.weight"].T
        h = rms(x, W[p + "ffn_norm.weight"], cfg["eps"])
        g = h @ W[p + "ffn_gate.weight"].T
        u = h @ W[p + "ffn_up.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * u) @ W[p + "ffn_down.weight"].T
    x = rms(x, W["output_norm.weight"], cfg["eps"])
    head = W.get("output.weight", W["token_embd.weight"])
    return x @ head.T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--out")
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args()
    cfg, W = load(a.model)
    toks = [int(t) for t in a.tokens.split(",")]
    logits = forward(cfg, W, toks)
    fixed = [0, 1, 2, 100, 1000, 10000, 49151 if logits.shape[1] > 49151 else logits.shape[1] - 1]
    res = {"model": a.model.split("/")[-1], "tokens": toks, "positions": []}
    for t in range(len(toks)):
        row = logits[t]
        top = np.argsort(-row)[: a.top]
        m = row.max()
        res["positions"].append({
            "pos": t,
            "top": [[int(i), float(row[i])] for i in top],
            "logsumexp": float(m + np.log(np.exp(row - m).sum())),
            "logits_at": {str(i): float(row[i]) for i in fixed},
        })
    s = json.dumps(res, indent=1)
    if a.out:
        open(a.out, "w").write(s + "\n")
    else:
        print(s)


if __name__ == "__main__":
    main()
