// tests/support/tiny_model.h — small random Llama-family models for tests that
// need a real forward pass without the model file (header-only; include as
// "../support/tiny_model.h").
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "ratekv/model.h"

namespace ratekv_test {

/// n Gaussian floats N(mean, sd²) from g.
inline std::vector<float> randn(size_t n, std::mt19937& g, float sd, float mean = 0.0f) {
  std::normal_distribution<float> nd(mean, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(g);
  return v;
}

/// 3 layers, 4 query / 2 KV heads (GQA 2), head_dim 6, d_model 20, d_ff 13,
/// vocab 37, context 64, θ = 100; weights N(0, σ²) from `seed`. The RoPE
/// layout follows the arch ("llama" interleaved, "qwen2" NeoX), as
/// Model::from_weights derives it. head_dim may be changed (even).
inline ratekv::Model tiny_model(uint32_t seed = 1, ratekv::RopeLayout layout = ratekv::RopeLayout::Interleaved,
                                int head_dim = 6) {
  ratekv::ModelConfig c;
  c.arch = layout == ratekv::RopeLayout::NeoX ? "qwen2" : "llama";
  c.n_layers = 3;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = head_dim;
  c.d_model = 20;
  c.d_ff = 13;
  c.n_vocab = 37;
  c.n_ctx_train = 64;
  c.rope_theta = 100.0;
  c.rms_eps = 1e-5f;
  std::mt19937 g(seed);
  ratekv::ModelWeights w;
  const size_t d = 20, qd = 4 * static_cast<size_t>(head_dim), kvd = 2 * static_cast<size_t>(head_dim);
  w.token_embd = randn(37 * d, g, 1.0f);
  w.output_norm = randn(d, g, 0.1f, 1.0f);
  for (int l = 0; l < 3; ++l) {
    ratekv::LayerWeights L;
    L.attn_norm = randn(d, g, 0.1f, 1.0f);
    L.ffn_norm = randn(d, g, 0.1f, 1.0f);
    L.wqkv = randn((qd + 2 * kvd) * d, g, 0.4f);
    L.wo = randn(d * qd, g, 0.2f);
    L.w_gate_up = randn(2 * 13 * d, g, 0.3f);
    L.w_down = randn(d * 13, g, 0.3f);
    w.layers.push_back(std::move(L));
  }
  return ratekv::Model::from_weights(c, std::move(w));
}

}  // namespace ratekv_test
