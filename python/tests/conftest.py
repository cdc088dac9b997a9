"""Shared fixtures of the Python tests (pytest; run by tools/run_tests.sh).

The package under test is found on sys.path: `pip install .` or a CMake build with
-DRATEKV_PYTHON=ON plus PYTHONPATH=<build>/python. Assets (the SmolLM2 GGUF)
come from RATEKV_ASSETS (tools/fetch_assets.sh); tests needing them skip
without it. RATEKV_CLI names the `ratekv` binary (default build/bin/ratekv)."""

import os
import pathlib

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]


def assets_dir():
    a = os.environ.get("RATEKV_ASSETS", os.path.expanduser("~/.cache/ratekv/assets"))
    return pathlib.Path(a)


def smollm2_path():
    p = assets_dir() / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not p.is_file():
        pytest.skip(f"{p} missing (tools/fetch_assets.sh)")
    return p


def cli_path():
    p = pathlib.Path(os.environ.get("RATEKV_CLI", ROOT / "build" / "bin" / "ratekv"))
    if not p.is_file():
        pytest.skip(f"ratekv CLI not built at {p} (set RATEKV_CLI)")
    return p


def rel(a, b):
    """max|a − b| / max|b| over all elements (either tensor on any device; compared in fp32 on the CPU)."""
    a, b = a.float().cpu(), b.float().cpu()
    return ((a - b).abs().max() / b.abs().max()).item()


def tiny_model(arch: str, head_dim: int, n_heads: int, n_kv_heads: int, n_layers: int = 2, seed: int = 0,
               vocab: int = 320):
    """A random-weight transformers model of `arch` ('llama' | 'qwen2') in fp32, SDPA attention."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    kw = dict(vocab_size=vocab, hidden_size=n_heads * head_dim // 2, intermediate_size=256,
              num_hidden_layers=n_layers, num_attention_heads=n_heads, num_key_value_heads=n_kv_heads,
              head_dim=head_dim, max_position_embeddings=1024, attn_implementation="sdpa")
    if arch == "llama":
        m = LlamaForCausalLM(LlamaConfig(**kw))
    elif arch == "qwen2":
        m = Qwen2ForCausalLM(Qwen2Config(**kw))
    else:
        raise ValueError(arch)
    # Random init is small (std 0.02): scale the attention projections so scores
    # are O(1) and attention is far from uniform (a test on near-constant
    # attention could not see a wrong key).
    with torch.no_grad():
        for layer in m.model.layers:
            for p in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                p.weight.mul_(4.0)
                if p.bias is not None:
                    p.bias.normal_(0, 0.5)
    return m.eval()


@pytest.fixture(scope="session")
def smol_cli_stats(tmp_path_factory):
    """`ratekv calibrate` on SmolLM2 (GGUF) over the first 160 tokens of a fixed text, chunks of 80,
    gradient sensitivity over 2 × 48 tokens, TQ-MSE and Block-GTQ distortion curves at 1..4 bits.
    Returns (stats path, text path, token ids as the CLI used them)."""
    import subprocess

    import ratekv

    gguf = smollm2_path()
    cli = cli_path()
    d = tmp_path_factory.mktemp("smol")
    text = d / "calib.txt"
    text.write_text(
        "The packed cache stores keys and values as codes. Attention is computed from those codes, "
        "never from a dequantized copy of the whole cache. Rate-distortion theory says how many bits each "
        "head deserves: sensitive heads get more, robust heads fewer, and the average stays on budget. "
        "A plan records the widths, the rotation seeds and the channel groups of every layer and head; "
        "calibration statistics record what the allocators read. Keys are rotated by RoPE in pairs of "
        "channels, and the order of those pairs differs between file formats.\n" * 2)
    out = d / "cli_stats.safetensors"
    subprocess.run([str(cli), "calibrate", "-m", str(gguf), "-f", str(text), "--tokens", "160", "--ctx", "80",
                    "--sensitivity", "--sens-seqs", "2", "--sens-len", "48", "--curves", "tq-mse,block-gtq",
                    "--curve-bits", "1,2,3,4", "-o", str(out)], check=True, capture_output=True)
    ids = ratekv.Tokenizer(str(gguf)).encode(text.read_text())
    return out, text, ids
