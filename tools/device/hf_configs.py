"""HF transformers config fields of ratekv's synthetic configurations (src/model/synthetic.cpp),
shared by the device peers (e2e_peers.py, prefill_vs_sdpa.py). Pure Python: importable without torch.

MODELS[name]: "arch" ("llama" or "qwen2": which transformers classes) plus the keyword arguments of
that config class. The attention shape is num_attention_heads query heads, num_key_value_heads KV
heads, head_dim = hidden_size / num_attention_heads, in num_hidden_layers layers.
"""

MODELS = {
    "llama-3.1-8b": dict(arch="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0,
                         rms_norm_eps=1e-5, max_position_embeddings=131072, tie_word_embeddings=False),
    "qwen2.5-7b": dict(arch="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, rope_theta=1e6,
                       rms_norm_eps=1e-6, max_position_embeddings=32768, tie_word_embeddings=False),
}
