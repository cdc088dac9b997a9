#!/usr/bin/env python3
"""Writes tests/fixtures/chat_templates.json: each packaged model's tokenizer.chat_template
rendered by Jinja2 (the engine Hugging Face renders these templates with) for one user turn
with the generation prompt — the reference for ratekv's ChatML prompt (model/chat_template.h).
Run once by a person (needs jinja2 and the GGUFs); never in CI.

usage: chat_template_fixture.py OUT_JSON MODEL.gguf [MODEL.gguf ...]
"""
import hashlib
import importlib.util
import json
import os
import sys

import jinja2

USERS = ["What is 2+2?", "Write a Python function that reverses a list.\nKeep it short."]


def gguf_template(path):
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("cg", os.path.join(here, "..", "check_gguf_complete.py"))
    cg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cg)
    with open(path, "rb") as f:
        r = cg.Reader(f, os.path.getsize(path))
        r.take(4)
        r.u32()
        r.u64()
        n_kv = r.u64()
        for _ in range(n_kv):
            k = r.string()
            v = r.value(r.u32())
            if k == "tokenizer.chat_template":
                return v
    return None


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, models = sys.argv[1], sys.argv[2:]
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, **kw)
    entries = []
    for m in models:
        tpl = gguf_template(m)
        if tpl is None or "<|im_start|>" not in tpl:
            continue  # ChatML templates only
        t = env.from_string(tpl)
        cases = [{"user": u, "rendered": t.render(messages=[{"role": "user", "content": u}],
                                                  add_generation_prompt=True, tools=None)} for u in USERS]
        with open(m, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        entries.append({"model": os.path.basename(m), "model_sha256": sha, "cases": cases})
    doc = {"generator": "tools/ref/chat_template_fixture.py (jinja2 %s, trim_blocks, lstrip_blocks)" % jinja2.__version__,
           "note": "tokenizer.chat_template of each GGUF rendered for messages=[{role: user, content: USER}], "
                   "add_generation_prompt=True, no tools",
           "models": entries}
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
