// Synthetic models (ratekv/model/synthetic.h): the counter-based generator
// against values computed independently (a Python SplitMix64, see below), the
// published parameter counts of the configurations, bf16-exactness, the
// amplitude's statistics, and a forward pass on a synthetic model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "ratekv/common/error.h"
#include "ratekv/model/synthetic.h"

namespace {

using namespace ratekv;

// Golden values from an independent Python implementation of the file
// comment's hash (mix = SplitMix64 finalizer; h = mix(seed + φ(1 + tensor));
// value = mix(h + φ(1 + index)), φ = 0x9e3779b97f4a7c15, arithmetic mod 2^64).
TEST(Synthetic, HashMatchesIndependentImplementation) {
  EXPECT_EQ(synthetic_hash(0, 1, 0), 0x46b73e79f0c37c00ull);
  EXPECT_EQ(synthetic_hash(42, 17, 123456789), 0xa287a0f15cad6201ull);
  EXPECT_EQ(synthetic_hash(7, 3, 5), 0xe5ec8f642ad313aaull);
  // value = (u − 128)·2^(e−7) with u the top byte; norm = (128 + u/4 − 32)/128.
  EXPECT_EQ(synthetic_value(0, 1, 0, SyntheticKind::linear, -5), -0.01416015625f);
  EXPECT_EQ(synthetic_value(42, 17, 123456789, SyntheticKind::linear, -5), 0.00830078125f);
  EXPECT_EQ(synthetic_value(7, 3, 5, SyntheticKind::norm, 0), 1.1953125f);
  EXPECT_EQ(synthetic_value(42, 17, 123456789, SyntheticKind::norm, 0), 1.0625f);
}

// Published parameter counts (model cards: Llama-3.1-8B 8,030,261,248;
// Qwen2.5-7B 7,615,616,512; Qwen2.5-3B 3,085,938,688), from the configs with
// biases, norms and (un)tied LM heads.
TEST(Synthetic, ConfigsHaveThePublishedParameterCounts) {
  auto params = [](const std::string& name) {
    const ModelConfig c = synthetic_config(name);
    const int64_t d = c.d_model, qd = int64_t{c.n_heads} * c.head_dim, kvd = int64_t{c.n_kv_heads} * c.head_dim;
    const int64_t layer = (qd + 2 * kvd) * d + d * qd + 3 * d * c.d_ff + 2 * d +
                          (c.qkv_bias ? qd + 2 * kvd : 0);
    return int64_t{c.n_vocab} * d * (synthetic_untied_output(name) ? 2 : 1) + d + c.n_layers * layer;
  };
  EXPECT_EQ(params("llama-3.1-8b"), 8030261248);
  EXPECT_EQ(params("qwen2.5-7b"), 7615616512);
  EXPECT_EQ(params("qwen2.5-3b"), 3085938688);
  EXPECT_EQ(synthetic_config("qwen2.5-7b").gqa_ratio(), 7);
  EXPECT_EQ(synthetic_config("qwen2.5-7b").rope_layout, RopeLayout::NeoX);
  EXPECT_EQ(synthetic_config("llama-3.1-8b").rope_layout, RopeLayout::Interleaved);
  EXPECT_EQ(synthetic_config("llama-3.1-8b", 2).n_layers, 2);
  EXPECT_THROW(synthetic_config("llama-3.1-8b", 33), Error);
  try {
    synthetic_config("llama-2-7b");
    FAIL() << "unknown name accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("qwen2.5-3b"), std::string::npos) << e.what();
  }
}

// Every value is a bf16 number (so the GPU's bf16 copy is exact), the
// amplitude gives std ≈ 2^e/√3 and mean ≈ 0, and the value at an index does
// not depend on how many values are drawn (counter-based).
TEST(Synthetic, ValuesAreBf16ExactWithTheStatedAmplitude) {
  ModelConfig c;
  c.arch = "llama";
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.d_model = 64;
  c.d_ff = 96;
  c.n_vocab = 50;
  c.n_ctx_train = 128;
  c.rope_theta = 10000;
  c.rms_eps = 1e-5f;
  const ModelWeights w = synthetic_weights(c, 5, true);
  auto bf16_exact = [](float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return (u & 0xffffu) == 0;
  };
  for (float x : w.layers[1].w_gate_up) ASSERT_TRUE(bf16_exact(x)) << x;
  for (float x : w.layers[0].attn_norm) ASSERT_TRUE(bf16_exact(x) && x >= 0.75f && x < 1.25f) << x;
  for (float x : w.output) ASSERT_TRUE(bf16_exact(x)) << x;
  // w_gate_up: fan-in 64 -> e = round(log2 sqrt(3/64)) = round(-2.2) = -2.
  EXPECT_EQ(synthetic_amp_exp(64), -2);
  EXPECT_EQ(synthetic_amp_exp(4096), -5);
  EXPECT_EQ(synthetic_amp_exp(14336), -6);
  double s = 0, s2 = 0, mx = 0;
  for (float x : w.layers[1].w_gate_up) {
    s += x;
    s2 += double{x} * x;
    mx = std::max(mx, std::fabs(double{x}));
  }
  const double n = static_cast<double>(w.layers[1].w_gate_up.size());  // 12288
  EXPECT_NEAR(s / n, 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(s2 / n), 0.25 / std::sqrt(3.0), 0.01);
  EXPECT_LE(mx, 0.25);
  // Counter-based: element i of the tensor is synthetic_value(seed, id, i).
  const uint32_t id = synthetic_tensor_id(1, SyntheticLayerTensor::w_down);
  for (size_t i : {size_t{0}, size_t{1}, size_t{777}, w.layers[1].w_down.size() - 1})
    EXPECT_EQ(w.layers[1].w_down[i], synthetic_value(5, id, i, SyntheticKind::linear, synthetic_amp_exp(96)));
  // Another seed, other weights.
  const ModelWeights w2 = synthetic_weights(c, 6, true);
  EXPECT_NE(w2.layers[0].wqkv, w.layers[0].wqkv);
  // Biases: (n_heads + 2 n_kv_heads) · head_dim, amplitude 2^-2.
  const std::vector<float> b = synthetic_qkv_bias(c, 5, 1);
  ASSERT_EQ(b.size(), size_t{(4 + 4) * 16});
  for (float x : b) ASSERT_TRUE(bf16_exact(x) && std::fabs(x) <= 0.25f);
  EXPECT_THROW(synthetic_qkv_bias(c, 5, 2), Error);
}

// A synthetic model runs through the CPU forward pass with finite logits of
// order one (the amplitudes keep the residual stream bounded).
TEST(Synthetic, ForwardPassIsFiniteAndNotDegenerate) {
  ModelConfig c = synthetic_config("llama-3.1-8b", 1);
  c.d_model = 256;  // a narrow variant (the full width needs GBs of fp32 weights)
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 64;
  c.d_ff = 512;
  c.n_vocab = 300;
  Model m = Model::from_weights(c, synthetic_weights(c, 1, true));
  DenseKVCache cache = m.make_dense_cache(16);
  std::vector<int32_t> toks = {1, 7, 299, 42, 5};
  std::vector<float> logits(c.n_vocab);
  m.forward(toks, 0, cache, logits.data(), false);
  double s2 = 0;
  for (float x : logits) {
    ASSERT_TRUE(std::isfinite(x));
    s2 += double{x} * x;
  }
  const double rms = std::sqrt(s2 / c.n_vocab);
  EXPECT_GT(rms, 0.1);
  EXPECT_LT(rms, 10.0);
}

}  // namespace

// The Gemma 3 configurations: the published parameter counts (Gemma 3 270M:
// 268,098,176 — as `ratekv inspect` counts the GGUF asset's tensors; Gemma 3
// 1B: 999,885,952, the model card's), the GGUF metadata's layer pattern
// (every 6th layer global), and synthetic_weights fills the QK-norm and
// post-norm weights with norm values (tensor ids 7..10).
TEST(Synthetic, Gemma3ConfigsAndNorms) {
  auto params = [](const std::string& name) {
    const ModelConfig c = synthetic_config(name);
    const int64_t d = c.d_model, qd = int64_t{c.n_heads} * c.head_dim, kvd = int64_t{c.n_kv_heads} * c.head_dim;
    const int64_t layer = (qd + 2 * kvd) * d + d * qd + 3 * d * c.d_ff + 4 * d + 2 * c.head_dim;
    return int64_t{c.n_vocab} * d + d + c.n_layers * layer;
  };
  EXPECT_EQ(params("gemma-3-270m"), 268098176);
  EXPECT_EQ(params("gemma-3-1b"), 999885952);
  const ModelConfig c = synthetic_config("gemma-3-270m", 7);
  EXPECT_EQ(c.n_layers, 7);
  EXPECT_EQ(c.layer_sliding, (std::vector<uint8_t>{1, 1, 1, 1, 1, 0, 1}));
  EXPECT_EQ(c.sliding_window, 512);
  EXPECT_EQ(c.layer_rope_theta(0), 10000.0);
  EXPECT_EQ(c.layer_rope_theta(5), 1000000.0);
  EXPECT_EQ(c.rope_layout, RopeLayout::NeoX);
  EXPECT_FALSE(synthetic_untied_output("gemma-3-1b"));
  ModelConfig small = c;
  small.n_layers = 1;
  small.layer_sliding = {1};
  small.n_vocab = 16;
  const ModelWeights w = synthetic_weights(small, 5, false);
  ASSERT_EQ(w.layers[0].attn_q_norm.size(), size_t(small.head_dim));
  ASSERT_EQ(w.layers[0].ffn_post_norm.size(), size_t(small.d_model));
  EXPECT_EQ(w.layers[0].attn_k_norm[3], synthetic_value(5, synthetic_tensor_id(0, SyntheticLayerTensor::attn_k_norm), 3,
                                                        SyntheticKind::norm, 0));
  EXPECT_NE(w.layers[0].attn_q_norm, w.layers[0].attn_k_norm);
  for (float x : w.layers[0].attn_post_norm) EXPECT_TRUE(x >= 0.75f && x <= 1.25f) << x;
  EXPECT_NO_THROW(Model::from_weights(small, w));
}
