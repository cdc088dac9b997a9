#!/usr/bin/env python3
"""Writes tests/fixtures/smollm2/tokenizer_stress.json: llama.cpp's token ids
for a seeded random byte string that mixes ASCII, many Unicode blocks
(including letters/numbers new in Unicode 15), whitespace of every kind,
contractions, digits, control bytes the vocabulary lacks, invalid UTF-8,
encoded surrogates and special-token texts. The text is stored as hex because
it is not valid UTF-8. Run once (not in CI); stdlib only.

usage: tokenizer_stress_fixture.py LLAMA_TOKENIZE MODEL OUT_JSON [MODEL2 ...]

MODEL2 ...: models sharing MODEL's vocabulary; each must give identical ids (checked).
"""
import json
import os
import random
import subprocess
import sys
import tempfile

N_ITEMS = 6000
SEED = 20261129

ASCII = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 '\"!?.,;:-_()[]{}<>/\\|@#$%^&*+=~`\t\n\r")
ASCII += [" "] * 20
RANGES = [(0x80, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F),
          (0x1100, 0x11FF), (0x2000, 0x206F), (0x2070, 0x218F), (0x2190, 0x2BFF), (0x3000, 0x30FF),
          (0x4E00, 0x4FFF), (0xAC00, 0xAD00), (0xFF00, 0xFFEF), (0x1F300, 0x1FAFF), (0x11F00, 0x11F5F),
          (0x1E030, 0x1E08F), (0x31350, 0x323AF), (0xE0000, 0xE007F), (0x0, 0x1F)]
INVALID = [b"\x80", b"\xff", b"\xfe", b"\xc0", b"\xe2\x82", b"\xf0\x9f", b"\xc3", b"\xc0\xaf", b"\xed\xa0\x80"]
SPECIAL = ["'s", "'re", "'ll", "'D", "'ve", " 12", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "\r\n", "\u0085\u0085"]


def make_text():
    rng = random.Random(SEED)
    out = bytearray()
    for _ in range(N_ITEMS):
        r = rng.random()
        if r < 0.6:
            out += rng.choice(ASCII).encode()
        elif r < 0.96:
            a, b = rng.choice(RANGES)
            cp = rng.randint(a, b)
            if not 0xD800 <= cp <= 0xDFFF:
                out += chr(cp).encode()
        elif r < 0.98:
            out += rng.choice(INVALID)
        else:
            out += rng.choice(SPECIAL).encode()
    return bytes(out)


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    tool, model, out = sys.argv[1:4]
    others = sys.argv[4:]
    text = make_text()

    def tokenize(m):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "stress.txt")
            with open(path, "wb") as f:
                f.write(text)
            cmd = [tool, "-m", m, "-f", path, "--ids", "--no-escape", "--log-disable", "--no-bos"]
            res = subprocess.run(cmd, capture_output=True, check=False)
        if res.returncode != 0:
            sys.exit(f"tokenizer_stress_fixture.py: {' '.join(cmd)} failed:\n{res.stderr.decode(errors='replace')}")
        lines = [l for l in res.stdout.decode().splitlines() if l.startswith("[")]
        if len(lines) != 1:
            sys.exit("tokenizer_stress_fixture.py: unexpected llama-tokenize output")
        return json.loads(lines[0])

    ids = tokenize(model)
    for other in others:
        if tokenize(other) != ids:
            sys.exit(f"tokenizer_stress_fixture.py: {other} tokenizes the stress text differently from {model}")
    doc = {
        "generator": "tools/ref/tokenizer_stress_fixture.py (seed %d, %d items)" % (SEED, N_ITEMS),
        "command": "llama-tokenize -m MODEL -f stress.txt --ids --no-escape --log-disable --no-bos",
        "note": "text_hex is the exact input bytes (not valid UTF-8); parse_special is on (llama-tokenize default); "
                "add_bos=false",
        "text_hex": text.hex(),
        "add_bos": False,
        "parse_special": True,
        "ids": ids,
    }
    if others:
        import hashlib
        doc["also_checked"] = [hashlib.sha256(open(o, "rb").read()).hexdigest() for o in others]
    with open(out, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out}: {len(text)} bytes -> {len(ids)} ids")


if __name__ == "__main__":
    main()
