// The backward pass (model/backward.h): the taped forward against
// Model::forward, and ∂L/∂K_pre, ∂L/∂K_post, ∂L/∂V against central finite
// differences of the float64 loss — tiny random llama, gemma3 (QK-norm,
// GeGLU, pre/post norms, a sliding-window layer with its own RoPE base,
// attention scale, logit soft-cap) and qwen2 (Q/K/V biases, untied head,
// GQA 7) models, and two-layer slices of the real SmolLM2-135M, Gemma 3 270M
// and Qwen2.5-Coder-0.5B (-1.5B opt-in), skipped without the assets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>

#include "../support/llamacpp_fixtures.h"
#include "../support/tiny_model.h"
#include "ratekv/common/error.h"
#include "ratekv/io/gguf.h"
#include "ratekv/model/model.h"
#include "ratekv/model/backward.h"
#include "ratekv/model/tokenizer.h"

using namespace ratekv;
namespace fs = std::filesystem;

namespace {

std::vector<int32_t> random_tokens(int64_t n, int vocab, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int32_t> u(0, vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = u(g);
  return t;
}

// Logits of every position from Model::forward with an fp32 dense cache.
std::vector<float> reference_logits(Model& m, const std::vector<int32_t>& tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<float> out(n * m.config().n_vocab);
  DenseKVCache cache = m.make_dense_cache(n);
  m.forward(tokens, 0, cache, out.data(), true);
  return out;
}

// Mean cross-entropy of next-token prediction from (n, V) logits, in double.
double reference_loss(const std::vector<float>& logits, const std::vector<int32_t>& tokens, int V) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  double sum = 0;
  for (int64_t t = 0; t + 1 < n; ++t) {
    const float* r = logits.data() + t * V;
    double mx = -1e300, z = 0;
    for (int j = 0; j < V; ++j) mx = std::max(mx, double{r[j]});
    for (int j = 0; j < V; ++j) z += std::exp(r[j] - mx);
    sum += mx + std::log(z) - r[tokens[t + 1]];
  }
  return sum / double(n - 1);
}

const std::vector<double>& grad_of(const LayerKVGrad<double>& g, KVTensor t) {
  return t == KVTensor::KPre ? g.dk_pre : t == KVTensor::KPost ? g.dk_post : g.dv;
}

const char* tensor_name(KVTensor t) { return t == KVTensor::KPre ? "K_pre" : t == KVTensor::KPost ? "K_post" : "V"; }

// Central difference (L(x + h) − L(x − h)) / 2h of one cached element.
double central_difference(const ModelBackward<double>& bw, const std::vector<int32_t>& tokens, int layer,
                          KVTensor t, int64_t index, double h) {
  KVPerturbation p{layer, t, index, h};
  const double lp = bw.loss(tokens, nullptr, &p);
  p.delta = -h;
  const double lm = bw.loss(tokens, nullptr, &p);
  return (lp - lm) / (2 * h);
}

// Checks the given coordinates of every layer and tensor: relative error
// |fd − g| / |g| < rel_tol for coordinates with |g| ≥ 1e-3·max|g| of that
// tensor, and |fd − g| ≤ rel_tol · max|g| for all of them. Returns the number
// of coordinates checked; max_rel (optional) gets the largest relative error
// over the coordinates with |g| ≥ 1e-3·max|g|.
int check_against_fd(const ModelBackward<double>& bw, const std::vector<int32_t>& tokens,
                     const KVGradients<double>& grads, double h, double rel_tol, int coords_per_tensor,
                     uint32_t seed, double* max_rel = nullptr) {
  if (max_rel) *max_rel = 0;
  std::mt19937 rng(seed);
  int checked = 0;
  for (int l = 0; l < static_cast<int>(grads.layers.size()); ++l) {
    for (KVTensor t : {KVTensor::KPre, KVTensor::KPost, KVTensor::V}) {
      const std::vector<double>& g = grad_of(grads.layers[l], t);
      const int64_t size = static_cast<int64_t>(g.size());
      double gmax = 0;
      int64_t imax = 0;
      for (int64_t i = 0; i < size; ++i) {
        if (std::abs(g[i]) > gmax) gmax = std::abs(g[i]), imax = i;
      }
      if (grads.n == 2 && t != KVTensor::V) {
        // Query 0 sees key 0 only (softmax of one logit ≡ 1) and key 1 is read
        // by no predicting query: ∂L/∂K = 0 exactly; only rounding remains.
        EXPECT_LT(gmax, 1e-12) << "layer " << l << " " << tensor_name(t);
        continue;
      }
      EXPECT_GT(gmax, 0.0) << "layer " << l << " " << tensor_name(t);
      // The largest entry, then either every coordinate (small tensors) or a
      // sample among those with |g| ≥ 1e-2·max (so the relative error is meaningful).
      std::vector<int64_t> idx{imax};
      if (coords_per_tensor < 0 || size <= coords_per_tensor) {
        for (int64_t i = 0; i < size; ++i) idx.push_back(i);
      } else {
        std::vector<int64_t> big;
        for (int64_t i = 0; i < size; ++i) {
          if (std::abs(g[i]) >= 1e-2 * gmax) big.push_back(i);
        }
        std::shuffle(big.begin(), big.end(), rng);
        big.resize(std::min<size_t>(big.size(), coords_per_tensor));
        idx.insert(idx.end(), big.begin(), big.end());
      }
      for (int64_t i : idx) {
        const double fd = central_difference(bw, tokens, l, t, i, h);
        const double err = std::abs(fd - g[i]);
        EXPECT_LE(err, rel_tol * gmax) << "layer " << l << " " << tensor_name(t) << " index " << i << ": grad "
                                       << g[i] << " fd " << fd;
        if (std::abs(g[i]) >= 1e-3 * gmax) {
          if (max_rel) *max_rel = std::max(*max_rel, err / std::abs(g[i]));
          EXPECT_LT(err / std::abs(g[i]), rel_tol)
              << "layer " << l << " " << tensor_name(t) << " index " << i << ": grad " << g[i] << " fd " << fd;
        }
        ++checked;
      }
    }
  }
  return checked;
}

// 2 layers, 6 query / 2 KV heads (GQA 3), head_dim 8, d_model 24, d_ff 17,
// vocab 29, θ = 50, untied LM head; weights N(0, σ²) from `seed`.
Model tiny_gqa3_model(uint32_t seed) {
  return ratekv_test::tiny_model(seed, {.n_layers = 2,
                                        .n_heads = 6,
                                        .n_kv_heads = 2,
                                        .head_dim = 8,
                                        .d_model = 24,
                                        .d_ff = 17,
                                        .n_vocab = 29,
                                        .n_ctx = 64,
                                        .rope_theta = 50.0,
                                        .untied_output = true});
}

// A tiny gemma3-style model: 2 layers, layer 0 sliding (window 3, θ_swa 20),
// layer 1 global (θ 1e4), QK-norm, post-norms, GeGLU, embedding scale,
// attention scale 0.3, logit soft-cap 4, untied head. n_heads / n_kv_heads
// as given, head_dim 8.
Model tiny_gemma3_model(uint32_t seed, int n_heads, int n_kv_heads) {
  std::mt19937 g(seed);
  using ratekv_test::randn;
  ModelConfig c;
  c.arch = "gemma3";
  c.n_layers = 2;
  c.n_heads = n_heads;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = 8;
  c.d_model = 16;
  c.d_ff = 11;
  c.n_vocab = 31;
  c.n_ctx_train = 64;
  c.rope_theta = 1e4;
  c.rms_eps = 1e-6f;
  c.ffn_act = FfnActivation::GeluTanh;
  c.embd_scale = 4.0f;
  c.attn_scale = 0.3f;
  c.final_logit_softcap = 4.0f;
  c.qk_norm = true;
  c.post_norms = true;
  c.sliding_window = 3;
  c.layer_sliding = {1, 0};
  c.rope_theta_swa = 20.0;
  const size_t d = c.d_model, qd = size_t(n_heads) * 8, kvd = size_t(n_kv_heads) * 8;
  ModelWeights w;
  w.token_embd = randn(c.n_vocab * d, g, 0.3f);
  w.output = randn(c.n_vocab * d, g, 0.6f);
  w.output_norm = randn(d, g, 0.1f, 1.0f);
  for (int l = 0; l < 2; ++l) {
    LayerWeights L;
    L.attn_norm = randn(d, g, 0.1f, 1.0f);
    L.ffn_norm = randn(d, g, 0.1f, 1.0f);
    L.wqkv = randn((qd + 2 * kvd) * d, g, 0.4f);
    L.wo = randn(d * qd, g, 0.3f);
    L.w_gate_up = randn(2 * c.d_ff * d, g, 0.4f);
    L.w_down = randn(d * c.d_ff, g, 0.3f);
    L.attn_q_norm = randn(8, g, 0.2f, 1.0f);
    L.attn_k_norm = randn(8, g, 0.2f, 1.0f);
    L.attn_post_norm = randn(d, g, 0.2f, 1.0f);
    L.ffn_post_norm = randn(d, g, 0.2f, 1.0f);
    w.layers.push_back(std::move(L));
  }
  return Model::from_weights(c, std::move(w));
}

// A tiny qwen2 model: 2 layers, 7 query / 1 KV head (GQA 7), head_dim 8,
// Q/K/V biases (key bias mean 1.5: Qwen's bias-driven key outliers), untied
// head, NeoX RoPE θ 300.
Model tiny_qwen2_model(uint32_t seed) {
  std::mt19937 g(seed);
  using ratekv_test::randn;
  ratekv_test::TinyShape sh{.n_layers = 2, .n_heads = 7, .n_kv_heads = 1, .head_dim = 8, .d_model = 14,
                            .d_ff = 9, .n_vocab = 27, .n_ctx = 64, .rope_theta = 300.0, .untied_output = true};
  Model base = ratekv_test::tiny_model(seed, sh, RopeLayout::NeoX);
  ModelConfig c = base.config();
  ModelWeights w = base.weights();
  c.qkv_bias = true;
  const size_t qd = 7 * 8, kvd = 8;
  for (auto& L : w.layers) {
    L.bqkv = randn(qd, g, 0.5f);
    const auto bk = randn(kvd, g, 0.5f, 1.5f), bv = randn(kvd, g, 0.5f);
    L.bqkv.insert(L.bqkv.end(), bk.begin(), bk.end());
    L.bqkv.insert(L.bqkv.end(), bv.begin(), bv.end());
  }
  return Model::from_weights(c, std::move(w));
}

}  // namespace

// ---------------------------------------------------------------------------
// Tiny random models
// ---------------------------------------------------------------------------

TEST(Backward, TapedForwardLogitsEqualModelForwardTiny) {
  Model m = ratekv_test::tiny_model(3);
  const ModelBackward<float> bw(m);
  for (int64_t n : {2, 17, 64}) {
    const auto tokens = random_tokens(n, m.config().n_vocab, 100 + static_cast<uint32_t>(n));
    const std::vector<float> ref = reference_logits(m, tokens);
    std::vector<float> got(ref.size());
    const double loss = bw.loss(tokens, got.data());
    double maxdiff = 0, maxabs = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      maxdiff = std::max(maxdiff, double(std::abs(got[i] - ref[i])));
      maxabs = std::max(maxabs, double(std::abs(ref[i])));
    }
    EXPECT_GT(maxabs, 0.5) << "n " << n;
    EXPECT_LE(maxdiff, 2e-6 * maxabs) << "n " << n;
    EXPECT_NEAR(loss, reference_loss(ref, tokens, m.config().n_vocab), 1e-5) << "n " << n;
    // The double path computes the same function.
    const ModelBackward<double> bwd(m);
    std::vector<double> got64(ref.size());
    EXPECT_NEAR(bwd.loss(tokens, got64.data()), loss, 1e-5) << "n " << n;
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got64[i], ref[i], 1e-5 * maxabs) << "n " << n << " i " << i;
  }
}

TEST(Backward, FiniteDifferencesTinyGqa2EveryCoordinate) {
  Model m = ratekv_test::tiny_model(5);
  const ModelBackward<double> bw(m);
  for (int64_t n : {2, 5, 13}) {
    const auto tokens = random_tokens(n, m.config().n_vocab, 7 + static_cast<uint32_t>(n));
    const KVGradients<double> g = bw.gradients(tokens);
    ASSERT_EQ(g.layers.size(), 3u);
    EXPECT_EQ(g.n, n);
    const int checked = check_against_fd(bw, tokens, g, 1e-5, 1e-5, -1, 1);
    EXPECT_GE(checked, (n == 2 ? 1 : 3) * 3 * n * 12) << "n " << n;  // n = 2: V only (K ≡ 0)
  }
}

TEST(Backward, FiniteDifferencesTinyGqa3OddLengths) {
  Model m = tiny_gqa3_model(11);
  const ModelBackward<double> bw(m);
  for (int64_t n : {3, 9, 31}) {
    const auto tokens = random_tokens(n, m.config().n_vocab, 40 + static_cast<uint32_t>(n));
    const KVGradients<double> g = bw.gradients(tokens);
    check_against_fd(bw, tokens, g, 1e-5, 1e-5, n <= 9 ? -1 : 60, 2);
  }
}

// Gemma 3 and Qwen2 switches: the taped forward (float and double) equals
// Model::forward — the independent path through the dense cache, whose
// sliding window, soft-cap, QK-norm and biases the synthetic model tests
// check against naive references.
TEST(Backward, TapedForwardEqualsModelForwardGemma3AndQwen2) {
  for (int which = 0; which < 3; ++which) {
    Model m = which == 0 ? tiny_gemma3_model(21, 2, 1) : which == 1 ? tiny_gemma3_model(22, 4, 2) : tiny_qwen2_model(23);
    for (int64_t n : {2, 9, 33}) {
      SCOPED_TRACE(testing::Message() << "model " << which << " n " << n);
      const auto tokens = random_tokens(n, m.config().n_vocab, 300 + static_cast<uint32_t>(n));
      const std::vector<float> ref = reference_logits(m, tokens);
      std::vector<float> got(ref.size());
      const double loss = ModelBackward<float>(m).loss(tokens, got.data());
      std::vector<double> got64(ref.size());
      const double loss64 = ModelBackward<double>(m).loss(tokens, got64.data());
      double d32 = 0, d64 = 0, maxabs = 0;
      for (size_t i = 0; i < ref.size(); ++i) {
        d32 = std::max(d32, double(std::abs(got[i] - ref[i])));
        d64 = std::max(d64, std::abs(got64[i] - ref[i]));
        maxabs = std::max(maxabs, double(std::abs(ref[i])));
      }
      EXPECT_GT(maxabs, 0.3);
      EXPECT_LE(d32, 2e-6 * maxabs);
      EXPECT_LE(d64, 2e-5 * maxabs);
      EXPECT_NEAR(loss, reference_loss(ref, tokens, m.config().n_vocab), 1e-5);
      EXPECT_NEAR(loss64, loss, 1e-5);
    }
  }
}

// Every coordinate of K_pre, K_post, V of both layers, at lengths that put
// keys outside layer 0's window of 3 (n = 7, 11) and one that does not (2).
TEST(Backward, FiniteDifferencesTinyGemma3EveryCoordinate) {
  for (auto [h, hkv] : {std::pair{2, 1}, std::pair{4, 2}}) {
    Model m = tiny_gemma3_model(31 + h, h, hkv);
    const ModelBackward<double> bw(m);
    for (int64_t n : {2, 7, 11}) {
      SCOPED_TRACE(testing::Message() << "heads " << h << "/" << hkv << " n " << n);
      const auto tokens = random_tokens(n, m.config().n_vocab, 50 + static_cast<uint32_t>(n));
      const KVGradients<double> g = bw.gradients(tokens);
      const int checked = check_against_fd(bw, tokens, g, 1e-5, 1e-5, -1, 4);
      EXPECT_GE(checked, (n == 2 ? 1 : 3) * 2 * int(n) * hkv * 8);
    }
  }
}

TEST(Backward, FiniteDifferencesTinyQwen2EveryCoordinate) {
  Model m = tiny_qwen2_model(41);
  const ModelBackward<double> bw(m);
  for (int64_t n : {2, 6, 13}) {
    SCOPED_TRACE(testing::Message() << "n " << n);
    const auto tokens = random_tokens(n, m.config().n_vocab, 60 + static_cast<uint32_t>(n));
    const KVGradients<double> g = bw.gradients(tokens);
    const int checked = check_against_fd(bw, tokens, g, 1e-5, 1e-5, -1, 5);
    EXPECT_GE(checked, (n == 2 ? 1 : 3) * 2 * int(n) * 8);
  }
}

// The sliding window leaves keys outside it without gradient from the
// queries that cannot see them: with window 3 and n = 11 in layer 0, the key
// at position 0 is read only by queries 0..2; a perturbation of it changes
// nothing else in that layer — so the gradient must not include pairs
// outside the window (the full-causal gradient differs).
TEST(Backward, SlidingWindowGradientDiffersFromFullCausal) {
  Model m = tiny_gemma3_model(51, 2, 1);
  ModelConfig c = m.config();
  c.layer_sliding = {0, 0};  // same weights, every layer global (layer 0 keeps θ_swa? no: θ 1e4)
  c.rope_theta_swa = m.config().rope_theta_swa;
  Model full = Model::from_weights(c, m.weights());
  const auto tokens = random_tokens(11, c.n_vocab, 9);
  const auto gw = ModelBackward<double>(m).gradients(tokens);
  const auto gf = ModelBackward<double>(full).gradients(tokens);
  double gap = 0, scale = 0;
  for (size_t i = 0; i < gw.layers[0].dk_post.size(); ++i) {
    gap = std::max(gap, std::abs(gw.layers[0].dk_post[i] - gf.layers[0].dk_post[i]));
    scale = std::max(scale, std::abs(gf.layers[0].dk_post[i]));
  }
  EXPECT_GT(gap, 1e-2 * scale);
}

TEST(Backward, StructureOfTheGradients) {
  Model m = tiny_gqa3_model(12);
  const ModelBackward<double> bw(m);
  const int64_t n = 11;
  const auto tokens = random_tokens(n, m.config().n_vocab, 77);
  const KVGradients<double> g = bw.gradients(tokens);
  const int Hkv = 2, hd = 8;
  for (const auto& L : g.layers) {
    ASSERT_EQ(L.dk_pre.size(), size_t(n * Hkv * hd));
    for (int64_t t = 0; t < n; ++t) {
      for (int h = 0; h < Hkv; ++h) {
        double npre = 0, npost = 0, nv = 0;
        for (int c = 0; c < hd; ++c) {
          const int64_t i = (t * Hkv + h) * hd + c;
          npre += L.dk_pre[i] * L.dk_pre[i];
          npost += L.dk_post[i] * L.dk_post[i];
          nv += L.dv[i] * L.dv[i];
        }
        // RoPE is orthogonal: equal norms pre/post (channels differ for t > 0).
        EXPECT_NEAR(npre, npost, 1e-12 * std::max(1.0, npost)) << "layer " << L.layer << " t " << t;
        if (t == n - 1) {  // nothing in the loss attends to the last token
          EXPECT_EQ(npost, 0.0);
          EXPECT_EQ(nv, 0.0);
        } else {
          EXPECT_GT(npost, 0.0);
          EXPECT_GT(nv, 0.0);
        }
      }
    }
    // At position 0 the rotation is the identity.
    for (int c = 0; c < Hkv * hd; ++c) EXPECT_EQ(L.dk_pre[c], L.dk_post[c]);
  }
}

TEST(Backward, FloatGradientsAgreeWithDouble) {
  Model m = tiny_gqa3_model(13);
  const int64_t n = 40;
  const auto tokens = random_tokens(n, m.config().n_vocab, 5);
  const KVGradients<double> g64 = ModelBackward<double>(m).gradients(tokens);
  const KVGradients<float> g32 = ModelBackward<float>(m).gradients(tokens);
  EXPECT_NEAR(g32.loss, g64.loss, 1e-5 * g64.loss);
  for (size_t l = 0; l < g64.layers.size(); ++l) {
    for (KVTensor t : {KVTensor::KPre, KVTensor::KPost, KVTensor::V}) {
      const auto& a = grad_of(g64.layers[l], t);
      const auto& b = t == KVTensor::KPre ? g32.layers[l].dk_pre
                      : t == KVTensor::KPost ? g32.layers[l].dk_post
                                             : g32.layers[l].dv;
      double gmax = 0, err = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        gmax = std::max(gmax, std::abs(a[i]));
        err = std::max(err, std::abs(a[i] - double{b[i]}));
      }
      EXPECT_LE(err, 1e-4 * gmax) << "layer " << l << " " << tensor_name(t);
    }
  }
}

TEST(Backward, BatchHelperMatchesSingleSequences) {
  Model m = ratekv_test::tiny_model(2);
  const std::vector<std::vector<int32_t>> seqs{random_tokens(9, 37, 1), random_tokens(2, 37, 2),
                                               random_tokens(30, 37, 3)};
  const ModelBackward<float> bw(m);
  size_t calls = 0;
  kv_gradients_batch(m, seqs, [&](size_t s, const KVGradients<float>& g) {
    EXPECT_EQ(s, calls++);
    const KVGradients<float> ref = bw.gradients(seqs[s]);
    EXPECT_EQ(g.loss, ref.loss);
    EXPECT_EQ(g.n, static_cast<int64_t>(seqs[s].size()));
    for (size_t l = 0; l < ref.layers.size(); ++l) {
      EXPECT_EQ(g.layers[l].dk_pre, ref.layers[l].dk_pre);
      EXPECT_EQ(g.layers[l].dv, ref.layers[l].dv);
    }
  });
  EXPECT_EQ(calls, 3u);
}

TEST(Backward, FloatGradientsAgreeWithDoubleGemma3AndQwen2) {
  for (int which = 0; which < 2; ++which) {
    Model m = which == 0 ? tiny_gemma3_model(61, 4, 2) : tiny_qwen2_model(62);
    const auto tokens = random_tokens(40, m.config().n_vocab, 8);
    const KVGradients<double> g64 = ModelBackward<double>(m).gradients(tokens);
    const KVGradients<float> g32 = ModelBackward<float>(m).gradients(tokens);
    EXPECT_NEAR(g32.loss, g64.loss, 1e-5 * g64.loss);
    for (size_t l = 0; l < g64.layers.size(); ++l) {
      double gmax = 0, err = 0;
      for (size_t i = 0; i < g64.layers[l].dk_pre.size(); ++i) {
        gmax = std::max(gmax, std::abs(g64.layers[l].dk_pre[i]));
        err = std::max(err, std::abs(g64.layers[l].dk_pre[i] - double{g32.layers[l].dk_pre[i]}));
        err = std::max(err, std::abs(g64.layers[l].dv[i] - double{g32.layers[l].dv[i]}));
      }
      EXPECT_LE(err, 1e-4 * gmax) << "model " << which << " layer " << l;
    }
  }
}

TEST(Backward, RejectsBadInput) {
  Model m = ratekv_test::tiny_model(1);
  const ModelBackward<float> bw(m);
  const std::vector<int32_t> one{3};
  EXPECT_THROW(bw.loss(one), Error);
  const std::vector<int32_t> bad{3, 37};
  EXPECT_THROW(bw.loss(bad), Error);
  const std::vector<int32_t> neg{-1, 2};
  EXPECT_THROW(bw.loss(neg), Error);
  const std::vector<int32_t> ok{1, 2, 3};
  KVPerturbation p{3, KVTensor::V, 0, 1e-3};
  EXPECT_THROW(bw.loss(ok, nullptr, &p), Error);  // layer out of range
  p = {0, KVTensor::V, 3 * 2 * 6, 1e-3};
  EXPECT_THROW(bw.loss(ok, nullptr, &p), Error);  // index out of range
  p = {0, KVTensor::V, 0, std::nan("")};
  EXPECT_THROW(bw.loss(ok, nullptr, &p), Error);
  const std::vector<int32_t> too_long(65, 1);  // context 64
  EXPECT_THROW(bw.loss(too_long), Error);
  EXPECT_THROW(bw.backward(ok, nullptr), Error);

}

// ---------------------------------------------------------------------------
// Real SmolLM2-135M (skipped without the model file)
// ---------------------------------------------------------------------------

namespace {

using testing_support::assets_dir;

std::string model_path() { return ratekv_test::smollm2_path(); }

class RealModelBackward : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(model_path())) return;
    const GgufFile f = GgufFile::open(model_path());
    model_ = std::make_unique<Model>(Model::load(f));
    const Tokenizer tok = Tokenizer::from_gguf(f);
    tokens_ = tok.encode(
        "The key and value cache of a transformer grows with the context, so it is quantized to a few bits.",
        /*add_bos=*/false);
  }
  static void TearDownTestSuite() { model_.reset(); }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "model not found at " << model_path() << " (run tools/fetch_assets.sh)";
  }
  static std::unique_ptr<Model> model_;
  static std::vector<int32_t> tokens_;
};
std::unique_ptr<Model> RealModelBackward::model_;
std::vector<int32_t> RealModelBackward::tokens_;

}  // namespace

TEST_F(RealModelBackward, TapedForwardLogitsEqualModelForward) {
  ASSERT_GE(tokens_.size(), 16u);
  std::vector<int32_t> tokens(tokens_.begin(), tokens_.begin() + 16);
  const std::vector<float> ref = reference_logits(*model_, tokens);
  std::vector<float> got(ref.size());
  const double loss = ModelBackward<float>(*model_).loss(tokens, got.data());
  double maxdiff = 0;
  for (size_t i = 0; i < ref.size(); ++i) maxdiff = std::max(maxdiff, double(std::abs(got[i] - ref[i])));
  EXPECT_LE(maxdiff, 1e-4);  // logits of magnitude ~10–30; fp32 rounding order only
  EXPECT_NEAR(loss, reference_loss(ref, tokens, model_->config().n_vocab), 1e-5);
  EXPECT_GT(loss, 0.5);
  EXPECT_LT(loss, 8.0);  // real text: far below ln(49152) = 10.8
}

// The real model truncated to its first two layers (+ final norm and LM
// head over 8192 of its vocabulary rows), 12 tokens, float64: sampled coordinates of K_pre, K_post, V of both
// layers against central differences.
TEST_F(RealModelBackward, FiniteDifferencesTwoLayerSliceFloat64) {
  // ~75 float64 passes over a 4.7M-weight LM head: 8–35 s in Release on 2 busy cores, minutes under ASan.
  if (const char* s = std::getenv("RATEKV_SANITIZE_RUN"); s && std::string(s) == "1") {
    GTEST_SKIP() << "RATEKV_SANITIZE_RUN=1: float64 finite differences on the real model take minutes under ASan";
  }
  // Vocabulary cut to 8192 real rows (the 12 tokens' own rows first, then
  // ids 0, 1, … not used), tied as in the file: the LM head dominates the
  // cost of the ~75 float64 loss evaluations.
  const ModelWeights& src = model_->weights();
  ASSERT_TRUE(src.output.empty()) << "SmolLM2 ties its LM head to the embeddings";
  ModelConfig c = model_->config();
  c.n_layers = 2;
  c.n_vocab = 8192;
  const int64_t d = c.d_model;
  std::vector<int32_t> rows, tokens;
  for (size_t i = 0; i < 12; ++i) {
    const auto it = std::find(rows.begin(), rows.end(), tokens_[i]);
    tokens.push_back(static_cast<int32_t>(it - rows.begin()));
    if (it == rows.end()) rows.push_back(tokens_[i]);
  }
  for (int32_t id = 0; static_cast<int>(rows.size()) < c.n_vocab; ++id) {
    if (std::find(rows.begin(), rows.end(), id) == rows.end()) rows.push_back(id);
  }
  ModelWeights w;
  for (int32_t r : rows) {
    w.token_embd.insert(w.token_embd.end(), src.token_embd.begin() + r * d, src.token_embd.begin() + (r + 1) * d);
  }
  w.output_norm = src.output_norm;
  w.layers.assign(src.layers.begin(), src.layers.begin() + 2);
  const Model slice = Model::from_weights(c, std::move(w));
  const ModelBackward<double> bw(slice);
  const KVGradients<double> g = bw.gradients(tokens);
  double max_rel = 0;
  const int checked = check_against_fd(bw, tokens, g, 1e-4, 1e-4, 5, 3, &max_rel);
  EXPECT_EQ(checked, 2 * 3 * 6);
  std::printf("real 2-layer slice: %d coordinates, max relative error %.2e\n", checked, max_rel);
}

// ---------------------------------------------------------------------------
// Two-block slices of the real Gemma 3 270M and Qwen2.5-Coder models
// (skipped without the files; the 1.5B also needs RATEKV_TEST_QWEN15=1)
// ---------------------------------------------------------------------------

namespace {

// Blocks `blocks` of the GGUF at `path` as a 2-layer model (the config's
// per-layer fields follow the blocks), its vocabulary cut to 8192 real rows of
// token_embd and output (the prompt's own ids first) so the ~75 float64 loss
// evaluations stay cheap; `tweak` may change the config further. tokens gets
// the first 12 ids of `text` (BOS as the model adds it), renumbered.
Model real_slice(const std::string& path, const std::vector<int>& blocks, const std::string& text,
                 std::vector<int32_t>& tokens, const std::function<void(ModelConfig&)>& tweak = {}) {
  const GgufFile f = GgufFile::open(path);
  const ModelConfig full = ModelConfig::from_gguf(f);
  const std::vector<int32_t> ids = Tokenizer::from_gguf(f).encode(text, /*add_bos=*/true);
  EXPECT_GE(ids.size(), 12u);
  ModelWeights src = ModelWeights::load_blocks(f, full, blocks);
  ModelConfig c = full;
  c.n_layers = static_cast<int>(blocks.size());
  if (!full.layer_sliding.empty()) {
    c.layer_sliding.clear();
    for (int b : blocks) c.layer_sliding.push_back(full.layer_sliding[b]);
  }
  c.n_vocab = 8192;
  if (tweak) tweak(c);
  const int64_t d = c.d_model;
  std::vector<int32_t> rows;
  tokens.clear();
  for (size_t i = 0; i < 12; ++i) {
    const auto it = std::find(rows.begin(), rows.end(), ids[i]);
    tokens.push_back(static_cast<int32_t>(it - rows.begin()));
    if (it == rows.end()) rows.push_back(ids[i]);
  }
  for (int32_t id = 0; static_cast<int>(rows.size()) < c.n_vocab; ++id) {
    if (std::find(rows.begin(), rows.end(), id) == rows.end()) rows.push_back(id);
  }
  ModelWeights w;
  for (int32_t r : rows) {
    w.token_embd.insert(w.token_embd.end(), src.token_embd.begin() + r * d, src.token_embd.begin() + (r + 1) * d);
    if (!src.output.empty())
      w.output.insert(w.output.end(), src.output.begin() + r * d, src.output.begin() + (r + 1) * d);
  }
  w.output_norm = src.output_norm;
  w.layers = std::move(src.layers);
  return Model::from_weights(c, std::move(w));
}

constexpr const char* kSliceText =
    "The key and value cache of a transformer grows with the context, so it is quantized to a few bits.";

bool sanitize_run() {
  const char* s = std::getenv("RATEKV_SANITIZE_RUN");
  return s && std::string(s) == "1";
}

}  // namespace

// Gemma 3 blocks 4 (sliding, θ 1e4) and 5 (global, θ 1e6): QK-norm, GeGLU,
// pre/post norms, embedding scale, two RoPE bases. Two configuration changes
// so that every Gemma switch is exercised on 12 tokens: the sliding window is
// cut from 512 to 5 (keys leave it), and a final soft-cap of 30 is switched
// on (Gemma 2's value; the 270M file has none).
TEST(RealSliceBackward, FiniteDifferencesGemma3SlidingAndGlobalBlocks) {
  if (sanitize_run()) GTEST_SKIP() << "RATEKV_SANITIZE_RUN=1: float64 finite differences on real weights";
  const std::string path = ratekv_test::gemma3_path();
  if (!fs::exists(path)) GTEST_SKIP() << "Gemma 3 GGUF not found at " << path << " (run tools/fetch_assets.sh)";
  std::vector<int32_t> tokens;
  const Model slice = real_slice(path, {4, 5}, kSliceText, tokens, [](ModelConfig& c) {
    c.sliding_window = 5;
    c.final_logit_softcap = 30.0f;
  });
  ASSERT_TRUE(slice.config().is_sliding(0));
  ASSERT_FALSE(slice.config().is_sliding(1));
  ASSERT_TRUE(slice.config().qk_norm && slice.config().post_norms);
  const ModelBackward<double> bw(slice);
  const KVGradients<double> g = bw.gradients(tokens);
  double max_rel = 0;
  const int checked = check_against_fd(bw, tokens, g, 1e-4, 1e-4, 5, 3, &max_rel);
  EXPECT_EQ(checked, 2 * 3 * 6);
  std::printf("Gemma 3 blocks 4-5 slice: %d coordinates, max relative error %.2e\n", checked, max_rel);
}

// Qwen2.5-Coder blocks 0 and 1: Q/K/V biases, NeoX RoPE θ 1e6, untied head, GQA 7 (0.5B) or 6 (1.5B, head_dim 128).
TEST(RealSliceBackward, FiniteDifferencesQwen25Blocks) {
  if (sanitize_run()) GTEST_SKIP() << "RATEKV_SANITIZE_RUN=1: float64 finite differences on real weights";
  std::vector<std::string> paths;
  if (fs::exists(ratekv_test::qwen05_path())) paths.push_back(ratekv_test::qwen05_path());
  const char* opt = std::getenv("RATEKV_TEST_QWEN15");
  if (opt && std::string(opt) == "1" && fs::exists(ratekv_test::qwen15_path())) paths.push_back(ratekv_test::qwen15_path());
  if (paths.empty()) GTEST_SKIP() << "Qwen2.5-Coder GGUF not found at " << ratekv_test::qwen05_path();
  for (const std::string& path : paths) {
    SCOPED_TRACE(path);
    std::vector<int32_t> tokens;
    const Model slice = real_slice(path, {0, 1}, kSliceText, tokens);
    ASSERT_TRUE(slice.config().qkv_bias);
    ASSERT_FALSE(slice.weights().output.empty());
    const ModelBackward<double> bw(slice);
    const KVGradients<double> g = bw.gradients(tokens);
    double max_rel = 0;
    const int checked = check_against_fd(bw, tokens, g, 1e-4, 1e-4, 5, 3, &max_rel);
    EXPECT_EQ(checked, 2 * 3 * 6);
    std::printf("%s blocks 0-1 slice: %d coordinates, max relative error %.2e\n",
                fs::path(path).filename().c_str(), checked, max_rel);
  }
}
