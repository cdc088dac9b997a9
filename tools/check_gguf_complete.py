#!/usr/bin/env python3
"""Checks that a GGUF file is complete and self-consistent, independently of ratekv's reader
(stdlib only): the header parses, every tensor's byte size follows from its ggml type and
shape, tensors are aligned, do not overlap, lie inside the file, and the last one ends at
the file's end (up to the alignment padding). Used once to vet GGUFs assembled from byte
ranges (tools/fetch_assets.sh, docs/assets.md) before their sha256 was pinned.

usage: check_gguf_complete.py FILE [FILE ...]

Prints per file: version, tensor count, architecture, tokenizer pre, the tensor types used
(count each), the end of the tensor data and the file size. Exit 1 on any inconsistency.
"""
import collections
import os
import struct
import sys

# ggml type id -> (name, elements per block, bytes per block) (ggml/src/ggml.c type_traits)
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 30: ("BF16", 1, 2),
}
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class Reader:
    def __init__(self, f, size):
        self.f, self.size = f, size

    def take(self, n):
        b = self.f.read(n)
        if len(b) != n:
            raise ValueError(f"truncated header at offset {self.f.tell()} (wanted {n} bytes)")
        return b

    def u32(self):
        return struct.unpack("<I", self.take(4))[0]

    def u64(self):
        return struct.unpack("<Q", self.take(8))[0]

    def string(self):
        n = self.u64()
        if n > self.size:
            raise ValueError(f"string length {n} exceeds the file size")
        return self.take(n).decode("utf-8", errors="replace")

    def value(self, t):
        if t in SCALAR:
            fmt = SCALAR[t]
            return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.u32(), self.u64()
            if n > self.size:
                raise ValueError(f"array length {n} exceeds the file size")
            return [self.value(et) for _ in range(n)]
        raise ValueError(f"unknown metadata value type {t}")


def check(path):
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        r = Reader(f, size)
        if r.take(4) != b"GGUF":
            raise ValueError("no GGUF magic")
        version = r.u32()
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} (expected 2 or 3)")
        n_tensors, n_kv = r.u64(), r.u64()
        meta = {}
        for _ in range(n_kv):
            k = r.string()
            meta[k] = r.value(r.u32())
        tensors = []
        for _ in range(n_tensors):
            name = r.string()
            nd = r.u32()
            ne = [r.u64() for _ in range(nd)]
            t, off = r.u32(), r.u64()
            tensors.append((name, ne, t, off))
        align = int(meta.get("general.alignment", 32))
        data0 = (f.tell() + align - 1) // align * align
    types = collections.Counter()
    spans = []
    for name, ne, t, off in tensors:
        if t not in GGML_TYPES:
            raise ValueError(f"tensor {name}: unknown ggml type {t}")
        tn, blk, bb = GGML_TYPES[t]
        n = 1
        for e in ne:
            n *= e
        if ne[0] % blk:
            raise ValueError(f"tensor {name}: ne0 = {ne[0]} is not a multiple of the {tn} block ({blk})")
        if off % align:
            raise ValueError(f"tensor {name}: offset {off} not aligned to {align}")
        nbytes = n // blk * bb
        spans.append((data0 + off, data0 + off + nbytes, name))
        types[tn] += 1
    spans.sort()
    for (a0, a1, an), (b0, _, bn) in zip(spans, spans[1:]):
        if b0 < a1:
            raise ValueError(f"tensors {an} and {bn} overlap")
    end = spans[-1][1] if spans else data0
    if end > size:
        raise ValueError(f"tensor data ends at {end}, beyond the file's {size} bytes (truncated)")
    if size - end >= align:
        raise ValueError(f"{size - end} bytes after the last tensor (>= alignment {align}): not one GGUF")
    print(f"{path}: GGUF v{version}, {n_tensors} tensors, {n_kv} metadata keys, "
          f"arch {meta.get('general.architecture')!r}, tokenizer pre {meta.get('tokenizer.ggml.pre')!r}, "
          f"types {dict(sorted(types.items()))}, data {data0}..{end}, file {size} bytes: complete")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    bad = 0
    for p in sys.argv[1:]:
        try:
            check(p)
        except (ValueError, OSError) as e:
            print(f"{p}: INCOMPLETE or inconsistent: {e}", file=sys.stderr)
            bad += 1
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
