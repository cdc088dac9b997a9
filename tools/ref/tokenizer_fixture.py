#!/usr/bin/env python3
"""Writes tests/fixtures/<model>/tokenizer.json: token ids that llama.cpp's
`llama-tokenize` gives for a set of awkward texts. Run by
tools/make_reference_fixtures.sh; stdlib only.

usage: tokenizer_fixture.py LLAMA_TOKENIZE MODEL MODEL_SHA256 OUT_JSON [smollm2|gemma3|qwen2 [MODEL2 ...]]

The last argument picks the case set (default smollm2). gemma3: the model declares
tokenizer.ggml.add_bos_token=true, so every case is recorded as llama-tokenize gives it by
default (BOS first, add_bos=true), and the ids without BOS must be the same minus the BOS.
qwen2 (no BOS): the SmolLM2 set with Qwen's chat template, plus code, whitespace/newline
mixes (the qwen2 pre-tokenizer's \s*[\r\n]+ and \s+(?!\S) branches), single digits,
scripts with combining marks, upper-case contractions, Qwen's FIM and tool-call tokens.
Further MODEL2 arguments (models sharing the vocabulary, e.g. Qwen2.5-Coder-1.5B) are
tokenized too and must give identical ids; their sha256 go to "also_checked".

Every text is written byte-exactly to a file and tokenized with
    llama-tokenize -m MODEL -f FILE --ids --no-escape --log-disable [--no-bos] [--no-parse-special]
For each case the tool is run both with and without --no-bos and the two results
must agree for add_bos=false (SmolLM2 declares tokenizer.ggml.add_bos_token=false, so
llama.cpp never prepends BOS for it); the script fails otherwise.
"""
import json
import os
import subprocess
import sys
import tempfile

CHAT = "<|im_start|>user\nhi<|im_end|>"

# (name, text, parse_special)
CASES = [
    ("prose", "The quick brown fox jumps over the lazy dog. It was the best of times, "
              "it was the worst of times.", True),
    ("python_code", "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
                    "    return a  # O(n)\n\nprint(fib(10), [x**2 for x in range(3)])\n", True),
    ("digit_runs", "1234567890123 and 3.14159, 2024-11-29, 1,000,000 and 007", True),
    ("unicode_accents", "Café déjà vu, naïve façade, Zürich, Ångström, ñandú, œuvre", True),
    ("unicode_cjk", "日本語のテキストと中文文本，한국어 텍스트。", True),
    ("unicode_cyrillic", "Привет, мир! Съешь же ещё этих мягких французских булок.", True),
    ("emoji", "I love 🦙 and 🚀! Family: 👨\u200d👩\u200d👧\u200d👦, flags 🇫🇷🇯🇵, heart ❤️ 👍🏽", True),
    ("whitespace_tabs", "a  b   c    d\t\te\t \t f\n\n\n   g     ", True),
    ("crlf", "line one\r\nline two\r\n\r\nline four\r\n", True),
    ("leading_spaces", "   leading and trailing spaces   ", True),
    ("contractions", "don't I'M we've they'll she'd it's YOU'RE O'Neil's can't", True),
    ("special_parsed", CHAT, True),
    ("special_unparsed", CHAT, False),
    ("empty", "", True),
    ("single_newline", "\n", True),
    ("punctuation_runs", "Wait!!! Really??? ... --- ___ *** ((nested)) [[x]] {{y}} <tag/> a->b; c::d", True),
    ("rst_markup", "Use :func:`os.path.join` and ``str.split()``.\n\n.. note::\n\n   See :pep:`8`.\n", True),
    ("chat_template", "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                      "<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", True),
    ("repeated_chars", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa zzzz 0000000000", True),
    ("mixed_case_words", "HTTPServer XMLHttpRequest camelCase snake_case SCREAMING_CASE iPhone", True),
]


GEMMA_CHAT = "<start_of_turn>user\nhi<end_of_turn>"
GEMMA_CASES = [(n, t, p) for (n, t, p) in CASES if n not in ("special_parsed", "special_unparsed", "chat_template")] + [
    ("special_parsed", GEMMA_CHAT, True),
    ("special_unparsed", GEMMA_CHAT, False),
    ("chat_template", "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n", True),
    ("html_user_defined", "<table><tr><td>a</td></tr></table> <h1>T</h1>\n<li>x</li><br>", True),
    ("whitespace_runs_long", "x" + " " * 37 + "y\n\n\n\n\n\n\n\nz\t\t\t\t\t\t\tw" + " " * 3 + "\n", True),
    ("byte_fallback", "ctrl \x01\x07\x1b[0m hieroglyph \U00013000 \U0001D11E tag \U000E0041 pua \ue000", True),
    ("code_cpp", "template <typename T>\nstd::vector<T> f(const T& x) {\n\treturn {x, x * 2};  // 0x1F\n}\n", True),
    ("digits_and_numbers", "3.14159265358979 1e-9 -42 +7 1,234,567 0b1011 ١٢٣ 一二三", True),
]


QWEN_CHAT = "<|im_start|>user\nhi<|im_end|>"
QWEN_CASES = [(n, t, p) for (n, t, p) in CASES if n not in ("special_parsed", "special_unparsed", "chat_template")] + [
    ("special_parsed", QWEN_CHAT, True),
    ("special_unparsed", QWEN_CHAT, False),
    ("chat_template", "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
                      "<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", True),
    ("code_cpp", "template <typename T>\nstd::vector<T> f(const T& x) {\n\treturn {x, x * 2};  // 0x1F\n}\n", True),
    ("code_python_indent", "class A:\n    def f(self, x):\n        if x:\n            return {'k': [1, 2]}\n\n\n"
                           "        # done\n    pass\n", True),
    ("whitespace_newline_mix", "a \n\n  b\r\n\t\nc   \n  \n\n\td \r\n \r\ne\n\n\n   ", True),
    ("whitespace_runs_long", "x" + " " * 37 + "y\n\n\n\n\n\n\n\nz\t\t\t\t\t\t\tw" + " " * 3 + "\n", True),
    ("punct_then_newlines", "end.\n\nx;\r\n}\n\n\n)]}\n  ->\n", True),
    ("digits_and_numbers", "3.14159265358979 1e-9 -42 +7 1,234,567 0b1011 \u0661\u0662\u0663 \u4e00\u4e8c\u4e09 \u00bd \u2167", True),
    ("combining_marks", "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e, "
                        "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22, \u0645\u0631\u062d\u0628\u0627 "
                        "e\u0301t\u00e9 n\u0303", True),
    ("contractions_upper", "I'LL WE'VE SHE'D IT'S 'S 'T 'RE x'Ll y'vE 'x' ''s", True),
    ("fim_tokens", "<|fim_prefix|>def f(x):\n    <|fim_suffix|>\n    return y<|fim_middle|>", True),
    ("fim_tokens_unparsed", "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|><|endoftext|>", False),
    ("tool_call_user_defined", "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>", False),
    ("control_bytes", "ctrl \x01\x07\x1b[0m bell\x07 del\x7f nbsp\u00a0x \u2028y\u0085z", True),
]


def run(tool, model, path, no_bos, parse_special):
    cmd = [tool, "-m", model, "-f", path, "--ids", "--no-escape", "--log-disable"]
    if no_bos:
        cmd.append("--no-bos")
    if not parse_special:
        cmd.append("--no-parse-special")
    res = subprocess.run(cmd, capture_output=True, check=False)
    if res.returncode != 0:
        sys.exit(f"tokenizer_fixture.py: {' '.join(cmd)} failed:\n{res.stderr.decode(errors='replace')}")
    lines = [l for l in res.stdout.decode().splitlines() if l.startswith("[")]
    if len(lines) != 1:
        sys.exit(f"tokenizer_fixture.py: unexpected output of {' '.join(cmd)}:\n{res.stdout.decode()}")
    return json.loads(lines[0]), " ".join(os.path.basename(c) if c == tool else c for c in cmd)


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    tool, model, model_sha, out = sys.argv[1:5]
    which = sys.argv[5] if len(sys.argv) >= 6 else "smollm2"
    others = sys.argv[6:]
    if which not in ("smollm2", "gemma3", "qwen2"):
        sys.exit(f"tokenizer_fixture.py: unknown case set {which!r}")
    bos = which == "gemma3"
    case_set = {"smollm2": CASES, "gemma3": GEMMA_CASES, "qwen2": QWEN_CASES}[which]
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, text, parse_special in case_set:
            path = os.path.join(tmp, name + ".txt")
            with open(path, "wb") as f:
                f.write(text.encode("utf-8"))
            ids_default, _ = run(tool, model, path, False, parse_special)
            ids, _ = run(tool, model, path, True, parse_special)
            if bos:
                if ids_default[1:] != ids or not ids_default:
                    sys.exit(f"tokenizer_fixture.py: case {name}: ids with BOS are not BOS + ids without")
                ids = ids_default
            elif ids != ids_default:
                sys.exit(f"tokenizer_fixture.py: case {name}: ids with and without --no-bos differ; "
                         "this model was expected not to add BOS")
            for other in others:
                if run(tool, other, path, True, parse_special)[0] != ids:
                    sys.exit(f"tokenizer_fixture.py: case {name}: {other} tokenizes differently from {model}")
            cases.append({"name": name, "text": text, "add_bos": bos,
                          "parse_special": parse_special, "ids": ids})
    doc = {
        "model_sha256": model_sha,
        "generator": "llama-tokenize (llama.cpp vendored in PyPI llama-cpp-python==0.3.36)",
        "command": "llama-tokenize -m MODEL -f CASE_FILE --ids --no-escape --log-disable "
                   + ("" if bos else "--no-bos ") + "[--no-parse-special when parse_special is false]",
        "note": ("add_bos is true for every case: the model's tokenizer.ggml.add_bos_token is true; "
                 "with --no-bos llama-tokenize gives the same ids without the leading BOS (checked)." if bos else
                 "add_bos is false for every case: the model's tokenizer.ggml.add_bos_token is false, "
                 "and llama-tokenize gives identical ids with and without --no-bos (checked)."),
        "cases": cases,
    }
    if others:
        import hashlib
        doc["also_checked"] = [hashlib.sha256(open(o, "rb").read()).hexdigest() for o in others]
        doc["note"] += (" The models listed by sha256 in also_checked (same vocabulary and merges) gave identical "
                        "ids on every case.")
    # One case per line: readable diffs, compact id lists.
    body = ",\n  ".join(json.dumps(c, ensure_ascii=False) for c in doc.pop("cases"))
    head = json.dumps(doc, ensure_ascii=False, indent=1)[:-2]
    with open(out, "w", encoding="utf-8") as f:
        f.write(head + ',\n "cases": [\n  ' + body + "\n ]\n}\n")


if __name__ == "__main__":
    main()
