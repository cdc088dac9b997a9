// tests/support/tiny_model.h — small random Llama-family models for tests that
// need a real forward pass without the model file (header-only; include as
// "../support/tiny_model.h").
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "ratekv/model/model.h"

namespace ratekv_test {

/// n Gaussian floats N(mean, sd²) from g.
inline std::vector<float> randn(size_t n, std::mt19937& g, float sd, float mean = 0.0f) {
  std::normal_distribution<float> nd(mean, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(g);
  return v;
}

/// The shape of a tiny model; the defaults are tiny_model()'s: 3 layers,
/// 4 query / 2 KV heads (GQA 2), head_dim 6, d_model 20, d_ff 13, vocab 37,
/// context 64, θ = 100, LM head tied to the embeddings.
struct TinyShape {
  int n_layers = 3;
  int n_heads = 4;
  int n_kv_heads = 2;
  int head_dim = 6;  ///< even
  int d_model = 20;
  int d_ff = 13;
  int n_vocab = 37;
  int64_t n_ctx = 64;
  double rope_theta = 100.0;
  bool untied_output = false;  ///< a separate LM head (ModelWeights::output)
};

/// The config of a tiny model of shape `s`: arch "llama" (interleaved RoPE)
/// or "qwen2" (NeoX), rms_eps 1e-5.
inline ratekv::ModelConfig tiny_config(const TinyShape& s = {},
                                       ratekv::RopeLayout layout = ratekv::RopeLayout::Interleaved) {
  ratekv::ModelConfig c;
  c.arch = layout == ratekv::RopeLayout::NeoX ? "qwen2" : "llama";
  c.rope_layout = layout;
  c.n_layers = s.n_layers;
  c.n_heads = s.n_heads;
  c.n_kv_heads = s.n_kv_heads;
  c.head_dim = s.head_dim;
  c.d_model = s.d_model;
  c.d_ff = s.d_ff;
  c.n_vocab = s.n_vocab;
  c.n_ctx_train = s.n_ctx;
  c.rope_theta = s.rope_theta;
  c.rms_eps = 1e-5f;
  return c;
}

/// A model of shape `s` with weights N(0, σ²) from `seed`, drawn in the
/// order token_embd (σ 1), output (σ 0.5, if untied), output_norm (1 ± 0.1),
/// then per layer attn_norm, ffn_norm (1 ± 0.1), wqkv (σ 0.4), wo (σ 0.2),
/// w_gate_up, w_down (σ 0.3). The RoPE layout follows the arch, as
/// Model::from_weights derives it: layout NeoX gives a "qwen2" model without
/// Q/K/V biases (qkv_bias false).
inline ratekv::Model tiny_model(uint32_t seed, const TinyShape& s,
                                ratekv::RopeLayout layout = ratekv::RopeLayout::Interleaved) {
  std::mt19937 g(seed);
  ratekv::ModelWeights w;
  const size_t d = s.d_model, qd = static_cast<size_t>(s.n_heads) * s.head_dim,
               kvd = static_cast<size_t>(s.n_kv_heads) * s.head_dim, dff = s.d_ff;
  w.token_embd = randn(s.n_vocab * d, g, 1.0f);
  if (s.untied_output) w.output = randn(s.n_vocab * d, g, 0.5f);
  w.output_norm = randn(d, g, 0.1f, 1.0f);
  for (int l = 0; l < s.n_layers; ++l) {
    ratekv::LayerWeights L;
    L.attn_norm = randn(d, g, 0.1f, 1.0f);
    L.ffn_norm = randn(d, g, 0.1f, 1.0f);
    L.wqkv = randn((qd + 2 * kvd) * d, g, 0.4f);
    L.wo = randn(d * qd, g, 0.2f);
    L.w_gate_up = randn(2 * dff * d, g, 0.3f);
    L.w_down = randn(d * dff, g, 0.3f);
    w.layers.push_back(std::move(L));
  }
  return ratekv::Model::from_weights(tiny_config(s, layout), std::move(w));
}

/// The default tiny model (TinyShape{}) with weights from `seed`; head_dim may
/// be changed (even).
inline ratekv::Model tiny_model(uint32_t seed = 1, ratekv::RopeLayout layout = ratekv::RopeLayout::Interleaved,
                                int head_dim = 6) {
  TinyShape s;
  s.head_dim = head_dim;
  return tiny_model(seed, s, layout);
}

/// The evaluation tests' model (tests/eval): 2 layers, 4 query / 2 KV heads,
/// head_dim 32 (so q8_0 / KIVI groups apply), d_model 24, d_ff 19, vocab 41,
/// context 128, θ = 100, tied head; weights from seed 3 in tiny_model()'s
/// order, wo σ 0.1.
inline ratekv::Model eval_tiny_model() {
  ratekv::ModelConfig c;
  c.arch = "llama";
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 32;
  c.d_model = 24;
  c.d_ff = 19;
  c.n_vocab = 41;
  c.n_ctx_train = 128;
  c.rope_theta = 100.0;
  c.rms_eps = 1e-5f;
  std::mt19937 g(3);
  ratekv::ModelWeights w;
  const size_t d = 24, qd = 128, kvd = 64;
  w.token_embd = randn(41 * d, g, 1.0f);
  w.output_norm = randn(d, g, 0.1f, 1.0f);
  for (int l = 0; l < 2; ++l) {
    ratekv::LayerWeights L;
    L.attn_norm = randn(d, g, 0.1f, 1.0f);
    L.ffn_norm = randn(d, g, 0.1f, 1.0f);
    L.wqkv = randn((qd + 2 * kvd) * d, g, 0.4f);
    L.wo = randn(d * qd, g, 0.1f);
    L.w_gate_up = randn(2 * 19 * d, g, 0.3f);
    L.w_down = randn(d * 19, g, 0.3f);
    w.layers.push_back(std::move(L));
  }
  return ratekv::Model::from_weights(c, std::move(w));
}

}  // namespace ratekv_test
