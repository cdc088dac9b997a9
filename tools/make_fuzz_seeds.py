#!/usr/bin/env python3
"""Writes tiny valid inputs (seed corpora) for the fuzz targets of the user-file
readers that have no seed script of their own:

  make_fuzz_seeds.py fuzz_plan OUTDIR         plan JSON (+ tensor side file), fuzz/fuzz_plan.cpp
  make_fuzz_seeds.py fuzz_calib_stats OUTDIR  calibration statistics, safetensors and JSON forms
  make_fuzz_seeds.py fuzz_npy OUTDIR          2-D float32 .npy files (format 1.0, 2.0, 3.0)

Independent of the C++ readers: every format is encoded here with struct/json
from its specification (include/ratekv/format/plan.h, docs/plan_format.md,
docs/calibration_stats.md, include/ratekv/format/calib_stats.h,
include/ratekv/io/npy.h). Each seed is a few hundred bytes to a few KB.
"""
import hashlib
import json
import os
import struct
import sys

# fuzz/fuzz_plan.cpp splits its input at this marker: the plan JSON before it,
# the tensor side file (safetensors) after it.
SIDE_MARKER = b"\0RATEKV-SIDE\0"


def safetensors(tensors, metadata):
    """tensors: [(name, dtype, shape, raw bytes)]; metadata: {str: str}."""
    header, data = {"__metadata__": metadata}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    js = json.dumps(header, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js)) + js + data


def f32(values):
    return struct.pack(f"<{len(values)}f", *values)


def f16(values):
    return struct.pack(f"<{len(values)}e", *values)


# ---------------------------------------------------------------------------
# Plans
# ---------------------------------------------------------------------------

def model(arch, n_layers, n_kv_heads, head_dim, layout):
    return {"arch": arch, "n_layers": n_layers, "n_kv_heads": n_kv_heads, "head_dim": head_dim,
            "rope_layout": layout}


def plan(method, mdl, layers, **extra):
    p = {"format": "ratekv-plan", "version": 1, "method": method,
         "model": dict(mdl, file="tiny.gguf", sha256=""), "stats": "", "tensors": None, "seed": 7,
         "fp16_window": 0, "sink_tokens": 0, "budget": {"unit": "effective", "k": 3.0, "v": 3.0},
         "layers": [{"heads": heads} for heads in layers]}
    p.update(extra)
    return json.dumps(p, indent=1).encode()


def vq_layout_digest(layers):
    """SHA-256 of the vq codecs' layout, as vq_layout_digest in src/format/vq_tensors.cpp."""
    norm_code = {"none": 0, "fp16": 1, "shared-fp16": 2}
    s = ""
    for l, heads in enumerate(layers):
        for h, head in enumerate(heads):
            for side, key in enumerate(("key", "value")):
                c = head[key]
                if c["kind"] != "vq":
                    continue
                s += f"{l}.{h}.{side} g{c['group_size']} n{norm_code[c['norm']]} s{c.get('scale_heads', 0)}:"
                for g in c["groups"]:
                    s += f"{g['bits']}{','.join(str(x) for x in g['channels'])};"
                s += "\n"
    return hashlib.sha256(s.encode()).hexdigest()


def plan_seeds():
    seeds = {}
    # Block-GTQ keys (one 3-bit block, one dropped) and TQ-MSE values, d = 4, with the
    # stored "achieved" the codecs give (include/ratekv/format/stored_bytes.h: a group's channels are
    # padded to a 16-channel tile): K (16·3 + 16)/4 = 16 (code 1.5), V (16·2 + 16)/4 = 12 (code 2).
    gtq = [[{"key": {"kind": "tq-mse-grouped", "norm": "fp16", "group_size": 0,
                     "groups": [{"bits": 3, "blocks": [0], "seed": 11}, {"bits": 0, "blocks": [1]}]},
             "value": {"kind": "tq-mse", "norm": "fp16", "group_size": 0,
                       "groups": [{"bits": 2, "channels": [0, 1, 2, 3], "seed": 12}]}}]]
    seeds["block_gtq.plan"] = plan("block-gtq", model("llama", 1, 1, 4, "interleaved"), gtq,
                                   achieved={"k": 16.0, "v": 12.0, "total": 14.0, "k_code": 1.5, "v_code": 2.0})
    # Baseline kinds at d = 32 over two layers: KIVI keys / q4_0 values, fp16 / q8_0, quarot / fp16.
    all32 = list(range(32))
    base = [[{"key": {"kind": "kivi", "norm": "none", "group_size": 32, "groups": [{"bits": 2, "channels": all32}]},
              "value": {"kind": "q4_0", "norm": "none", "group_size": 32, "groups": [{"bits": 4, "channels": all32}]}}],
            [{"key": {"kind": "fp16", "norm": "none", "group_size": 0, "groups": []},
              "value": {"kind": "q8_0", "norm": "none", "group_size": 32, "groups": [{"bits": 8, "channels": all32}]}}]]
    seeds["baselines.plan"] = plan("uniform", model("gemma3", 2, 1, 32, "neox"), base, fp16_window=16, sink_tokens=4)
    quarot = [[{"key": {"kind": "quarot", "norm": "none", "group_size": 16,
                        "groups": [{"bits": 3, "channels": all32, "seed": 5}]},
                "value": {"kind": "fp16", "norm": "none", "group_size": 0, "groups": []}}]]
    seeds["quarot.plan"] = plan("uniform", model("qwen2", 1, 1, 32, "neox"), quarot)
    # A TaSQ-style vq plan with its side file: d = 4, 2 KV heads; keys g = 2, 4 centroids (2 bits),
    # shared fp16 scale; values CQ g = 2, 2 centroids (1 bit).
    def vq_heads():
        return {"key": {"kind": "vq", "norm": "shared-fp16", "scale_heads": 2, "group_size": 2,
                        "groups": [{"bits": 2, "channels": [0, 2]}, {"bits": 2, "channels": [1, 3]}]},
                "value": {"kind": "vq", "norm": "none", "group_size": 2,
                          "groups": [{"bits": 1, "channels": [0, 1]}, {"bits": 1, "channels": [2, 3]}]}}
    vq = [[vq_heads(), vq_heads()]]
    tensors = []
    for h in range(2):
        # F16: the side file stores codebooks and channel scales as fp16 (include/ratekv/format/vq_tensors.h).
        tensors.append((f"l0.h{h}.key.codebooks", "F16", [16], f16([0.25 * i - 2 for i in range(16)])))
        tensors.append((f"l0.h{h}.key.channel_scale", "F16", [4], f16([1.0, 0.5, 2.0, 1.5])))
        tensors.append((f"l0.h{h}.value.codebooks", "F16", [8], f16([-1, 1, 0.5, -0.5, 2, -2, 0, 0.125])))
    mdl = model("llama", 1, 2, 4, "interleaved")
    meta = {"format": "ratekv-vq-tensors", "version": 1, "model": mdl}
    for name, digest in (("tasq_digest.plan", True), ("tasq_nodigest.plan", False)):
        m = dict(meta, layout_sha256=vq_layout_digest(vq)) if digest else meta
        side = safetensors(tensors, {"format": "ratekv-vq-tensors", "ratekv": json.dumps(m)})
        seeds[name] = plan("tasq", mdl, vq, tensors="tasq.tensors.safetensors",
                           fit={"method": "tasq", "ctx": 512}) + SIDE_MARKER + side
    return seeds


# ---------------------------------------------------------------------------
# Calibration statistics
# ---------------------------------------------------------------------------

def calib_stats_seeds():
    L, H, Hkv, d = 2, 2, 1, 4
    B = d // 2
    mdl = dict(model("llama", L, Hkv, d, "interleaved"), file="tiny.gguf", sha256="00")

    def ramp(n, scale=1.0, offset=0.5):
        return [offset + scale * i for i in range(n)]

    cov = []
    for _ in range(L * Hkv):  # a positive definite 4×4 covariance
        cov += [2.0 if i == j else 0.25 for i in range(d) for j in range(d)]
    base = [("q_block_energy", [L, Hkv, B], ramp(L * Hkv * B)),
            ("k_block_energy", [L, Hkv, B], ramp(L * Hkv * B, 0.5)),
            ("k_pre_mean", [L, Hkv, d], [(-1) ** i * 0.1 * i for i in range(L * Hkv * d)]),
            ("k_pre_cov", [L, Hkv, d, d], cov),
            ("q_pre_sq", [L, H, d], ramp(L * H * d, 0.25)),
            ("v_sq", [L, Hkv, d], ramp(L * Hkv * d, 0.125))]
    grad = [(n, [L, Hkv, d], ramp(L * Hkv * d, 0.01, 0.02)) for n in ("grad_sq_k_pre", "grad_sq_k_post", "grad_sq_v")]
    bits = [1, 2, 3]
    curves = [("curves.tq-mse.mse_k", [L, Hkv, 3], [0.4, 0.12, 0.035] * (L * Hkv)),
              ("curves.tq-mse.mse_v", [L, Hkv, 3], [0.3, 0.09, 0.03] * (L * Hkv)),
              ("curves.tq-mse.alpha_k", [L, Hkv], [1.4] * (L * Hkv)),
              ("curves.tq-mse.alpha_v", [L, Hkv], [1.1] * (L * Hkv))]
    meta = {"format": "ratekv-calib-stats", "version": 1, "model": dict(mdl, n_heads=H),
            "text": {"file": "calib.txt", "sha256": "11"}, "n_tokens": 64, "ctx": 32}

    def st(entries, m):
        return safetensors([(n, "F32", shape, f32(v)) for n, shape, v in entries],
                           {"format": "ratekv-calib-stats", "ratekv": json.dumps(m)})

    seeds = {
        "energies.safetensors": st(base, meta),
        "sensitivity_curves.safetensors": st(
            base + grad + curves,
            dict(meta, sensitivity={"n_sequences": 2, "seq_len": 32, "mean_loss": 3.5},
                 curves={"tq-mse": {"bits": bits, "beta_k": 3.4, "beta_v": 3.3}})),
    }
    nested = lambda flat, inner: [[flat[(l * Hkv + h) * inner:(l * Hkv + h + 1) * inner] for h in range(Hkv)]
                                  for l in range(L)]
    per_head = lambda flat: [flat[l * Hkv:(l + 1) * Hkv] for l in range(L)]
    js = {"format": "ratekv-calib-stats", "version": 1, "model": mdl, "source": "calib.txt", "n_tokens": 64,
          "q_block_energy": nested(ramp(L * Hkv * B), B), "k_block_energy": nested(ramp(L * Hkv * B, 0.5), B),
          "sensitivity": {"grad": {"k": per_head([0.5, 2.0]), "v": per_head([1.5, 0.25])},
                          "activation": {"k": per_head([3.0, 1.0]), "v": per_head([0.75, 0.5])}},
          "curves": {"kivi": {"bits": [2, 3, 4], "beta_k": 4.5, "beta_v": 5.0, "alpha_k": per_head([2.0, 1.0]),
                              "alpha_v": per_head([0.5, 0.25])}}}
    seeds["stats.json"] = json.dumps(js, indent=1).encode()
    seeds["energies_only.json"] = json.dumps({k: js[k] for k in ("format", "version", "model", "q_block_energy",
                                                                 "k_block_energy")}).encode()
    return seeds


# ---------------------------------------------------------------------------
# .npy
# ---------------------------------------------------------------------------

def npy(rows, cols, values, version=(1, 0), header_extra=""):
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }%s" % (rows, cols, header_extra)
    size_fmt = "<H" if version == (1, 0) else "<I"
    pre = 6 + 2 + struct.calcsize(size_fmt)
    hdr += " " * (-(pre + len(hdr) + 1) % 64) + "\n"
    return b"\x93NUMPY" + bytes(version) + struct.pack(size_fmt, len(hdr)) + hdr.encode() + f32(values)


def npy_seeds():
    return {
        "v1_3x4.npy": npy(3, 4, [0.5 * i - 2 for i in range(12)]),
        "v2_1x5.npy": npy(1, 5, [1e-30, -0.0, 3.4e38, -1.5, 7.0], version=(2, 0)),
        "v3_2x1.npy": npy(2, 1, [1.0, -1.0], version=(3, 0)),
    }


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    target, out = sys.argv[1], sys.argv[2]
    makers = {"fuzz_plan": plan_seeds, "fuzz_calib_stats": calib_stats_seeds, "fuzz_npy": npy_seeds}
    if target not in makers:
        sys.exit(f"make_fuzz_seeds.py: unknown target '{target}' (expected {', '.join(makers)})")
    os.makedirs(out, exist_ok=True)
    for name, data in makers[target]().items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
