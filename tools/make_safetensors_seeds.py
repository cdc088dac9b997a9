#!/usr/bin/env python3
"""Writes a few tiny valid safetensors files (seed corpus for fuzz/fuzz_safetensors.cpp).

Usage: make_safetensors_seeds.py OUTDIR. Uses only struct/json (no safetensors package).
"""
import json
import os
import struct
import sys

def st(tensors, metadata=None):
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    js = json.dumps(header, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js)) + js + data

def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    seeds = {
        "mixed.safetensors": st([
            ("calib.scale", "F32", [2, 3], struct.pack("<6f", 1, -2, 0.5, 3, 4, 5)),
            ("half", "F16", [2], struct.pack("<2e", 1.0, -0.5)),
            ("codes", "U8", [5], bytes([0, 1, 2, 254, 255])),
            ("idx", "I64", [1], struct.pack("<q", -7)),
        ], {"ratekv.plan": json.dumps({"bits": [2, 4], "layers": 30})}),
        "scalar_empty.safetensors": st([
            ("s", "I32", [], struct.pack("<i", 42)),
            ("e", "BF16", [0, 3], b""),
        ]),
    }
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)

if __name__ == "__main__":
    main()
