"""No nanobind instance of ratekv outlives the interpreter (nanobind reports it as "leaked" at exit).

torch keeps Python functions alive for the life of the process — custom ops in its operator
registry, torch.compile's code caches — and with them whatever their closures hold. A ratekv
cache held that way used to keep its C++ store, codecs, plan and config alive past shutdown,
and nanobind printed "leaked instance ... ratekv._core.PackedBatch" etc. at exit (seen on the
H200 after python/tests/test_cuda.py). ratekv.core now releases every cache's C++ objects at
exit. Each case runs a child interpreter that uses the ops and the HF caches, lets torch's
registry hold them, and exits; its stderr must name no leak. The control case turns the release
off and must see the leak, so the check can fail (and nanobind's leak warnings are on)."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import ratekv

SCRIPT = textwrap.dedent('''
    import atexit, sys, torch
    import ratekv, ratekv.hf
    from ratekv.ops import PackedKVCache
    from transformers import LlamaConfig, LlamaForCausalLM

    DEV = sys.argv[1]

    def run():
        hc = LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=256)
        rc = ratekv.model_config(hc)
        plan = ratekv.uniform_plan(rc, 3, 3)
        c = PackedKVCache(plan, rc, 1, 128, device=DEV)
        k = torch.randn(1, 5, 1, 64, device=DEV)
        c.append(0, k, k)
        torch.manual_seed(0)
        m = LlamaForCausalLM(hc).eval().to(DEV)
        ids = torch.randint(0, 64, (1, 9), device=DEV)
        pc = ratekv.hf.PackedCache(plan, m.config)
        m.generate(ids, past_key_values=pc, max_new_tokens=3, do_sample=False,
                   attention_mask=torch.ones_like(ids), pad_token_id=0)
        fq = ratekv.hf.FakeQuantCache(plan, m.config)
        m.generate(ids, past_key_values=fq, max_new_tokens=2, do_sample=False,
                   attention_mask=torch.ones_like(ids), pad_token_id=0)

        # torch's operator registry holds these functions, hence the caches, until after exit.
        @torch.library.custom_op("exitleak::attend", mutates_args=())
        def attend(q: torch.Tensor) -> torch.Tensor:
            return c.decode_attention(0, q) + 0 * (pc.nbytes + len(fq.layers))
        return attend(torch.randn(1, 2, 64, device=DEV))

    print(run().shape)
    if len(sys.argv) > 2 and sys.argv[2] == "control":
        atexit.unregister(ratekv.core._release_all_native)
''')


def run_child(device, *extra):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, "-c", SCRIPT, device, *extra], capture_output=True, text=True, env=env,
                          timeout=300)


def devices():
    d = ["cpu"]
    if torch.cuda.is_available() and ratekv._core.has_cuda:
        d.append("cuda")
    return d


@pytest.mark.parametrize("device", devices())
def test_no_leaked_instances_at_exit(device):
    r = run_child(device)
    assert r.returncode == 0, r.stderr[-3000:]
    leaks = [line for line in r.stderr.splitlines() if "leaked" in line]
    assert not leaks, "\n".join(leaks[:20])


def test_control_without_release_leaks():
    r = run_child("cpu", "control")
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'leaked instance' in r.stderr and "ratekv._core." in r.stderr, r.stderr[-2000:]
