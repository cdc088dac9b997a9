#!/usr/bin/env python3
"""Writes a few tiny valid GGUF files (seed corpus for fuzz/fuzz_gguf.cpp).

Usage: make_gguf_seeds.py OUTDIR. Independent of the C++ reader: encodes the
GGUF v2/v3 layout with struct. Total output is a few KB.
"""
import os
import struct
import sys

def s(x: bytes) -> bytes:
    return struct.pack("<Q", len(x)) + x

def kv(key, vtype, payload):
    return s(key.encode()) + struct.pack("<I", vtype) + payload

def arr(etype, items):
    return struct.pack("<IQ", etype, len(items)) + b"".join(items)

def gguf(version, kvs, tensors, alignment=32):
    # tensors: list of (name, ne, ggml_type, data_bytes)
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)) + b"".join(kvs)
    offs, off = [], 0
    for name, ne, t, data in tensors:
        offs.append(off)
        off = (off + len(data) + alignment - 1) // alignment * alignment
    for (name, ne, t, data), o in zip(tensors, offs):
        out += s(name.encode()) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", t, o)
    if tensors:
        out += b"\0" * (-len(out) % alignment)
        base = len(out)
        for (name, ne, t, data), o in zip(tensors, offs):
            out += b"\0" * (base + o - len(out)) + data
    return out

def blocks(nbytes, seed):
    return bytes(((i * 37 + seed * 11) ^ (i >> 3)) & 0xFF for i in range(nbytes))

def f16(x):
    return struct.pack("<e", x)

def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    # Keep fp16 scales small so decoded values stay finite.
    q4_0 = (f16(0.5) + blocks(16, 1)) * 2
    q8_0 = f16(0.125) + blocks(32, 2)
    q4_1 = f16(0.25) + f16(-1.0) + blocks(16, 3)
    q5_0 = f16(0.5) + blocks(4, 4) + blocks(16, 5)
    q5_1 = f16(0.5) + f16(1.5) + blocks(4, 6) + blocks(16, 7)
    q4_k = f16(0.01) + f16(0.02) + blocks(12, 8) + blocks(128, 9)
    q5_k = f16(0.01) + f16(0.02) + blocks(12, 10) + blocks(32, 11) + blocks(128, 12)
    q6_k = blocks(128, 13) + blocks(64, 14) + blocks(16, 15) + f16(0.003)
    seeds = {
        "v3_llama_like.gguf": gguf(3, [
            kv("general.architecture", 8, s(b"llama")),
            kv("llama.block_count", 4, struct.pack("<I", 1)),
            kv("llama.rope.freq_base", 6, struct.pack("<f", 10000.0)),
            kv("tokenizer.ggml.tokens", 9, arr(8, [s(b"a"), s(b"\xff\xfe"), s(b"")])),
            kv("tokenizer.ggml.scores", 9, arr(6, [struct.pack("<f", v) for v in (0.0, -1.0, 2.5)])),
        ], [("w.f32", [3, 2], 0, struct.pack("<6f", 1, -2, 3.5, 0, 1e-3, 7)),
            ("w.q4_0", [32, 2], 2, q4_0)]),
        "v2_align64_kquants.gguf": gguf(2, [
            kv("general.alignment", 4, struct.pack("<I", 64)),
            kv("flag", 7, b"\x01"),
        ], [("k4", [256], 12, q4_k), ("k5", [256], 13, q5_k), ("k6", [256], 14, q6_k)], alignment=64),
        "v3_classic_quants.gguf": gguf(3, [
            kv("i64", 11, struct.pack("<q", -5)), kv("f64", 12, struct.pack("<d", 0.5)),
            kv("u8", 0, b"\x07"), kv("i16", 3, struct.pack("<h", -3)),
        ], [("q8", [32], 8, q8_0), ("q41", [32], 3, q4_1), ("q50", [32], 6, q5_0), ("q51", [32], 7, q5_1),
            ("f16", [4], 1, f16(1.0) + f16(-2.0) + f16(0.5) + f16(3.0)),
            ("bf16", [2], 30, struct.pack("<HH", 0x3F80, 0xC0A0))]),
        "v3_nested_meta_only.gguf": gguf(3, [
            kv("nested", 9, arr(9, [arr(0, [b"\x01", b"\x02"]), arr(5, [struct.pack("<i", -1)])])),
            kv("empty", 9, arr(10, [])),
        ], []),
    }
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)

if __name__ == "__main__":
    main()
