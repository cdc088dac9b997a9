// The Gemma 3 parts of the forward pass on a tiny random model, against a
// naive double-precision re-implementation written here from the Gemma 3
// description (embedding scale, QK-norm, NeoX RoPE with a per-layer base,
// sliding-window and global layers, explicit attention scale, post-norms,
// GeGLU with tanh-GELU, final logit soft-capping). Runs without any asset.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "../support/tiny_model.h"
#include "ratekv/common/error.h"
#include "ratekv/model/model.h"

using namespace ratekv;

namespace {

constexpr int kL = 2, kH = 2, kHkv = 1, kHd = 8, kD = 12, kFf = 10, kV = 23;

using ratekv_test::randn;

ModelConfig tiny_config() {
  ModelConfig c;
  c.arch = "gemma3";
  c.n_layers = kL;
  c.n_heads = kH;
  c.n_kv_heads = kHkv;
  c.head_dim = kHd;
  c.d_model = kD;
  c.d_ff = kFf;
  c.n_vocab = kV;
  c.n_ctx_train = 64;
  c.rope_theta = 10000.0;
  c.rms_eps = 1e-6f;
  c.ffn_act = FfnActivation::GeluTanh;
  c.embd_scale = std::sqrt(static_cast<float>(kD));
  c.attn_scale = 0.3f;
  c.final_logit_softcap = 5.0f;
  c.qk_norm = true;
  c.post_norms = true;
  c.sliding_window = 3;
  c.layer_sliding = {1, 0};  // layer 0 slides (window 3, θ 100), layer 1 is global (θ 1e4)
  c.rope_theta_swa = 100.0;
  return c;
}

ModelWeights tiny_weights(uint32_t seed) {
  std::mt19937 g(seed);
  ModelWeights w;
  const size_t d = kD, qd = kH * kHd, kvd = kHkv * kHd;
  w.token_embd = randn(kV * d, g, 0.5f);
  w.output_norm = randn(d, g, 0.1f, 1.0f);
  for (int l = 0; l < kL; ++l) {
    LayerWeights L;
    L.attn_norm = randn(d, g, 0.1f, 1.0f);
    L.ffn_norm = randn(d, g, 0.1f, 1.0f);
    L.wqkv = randn((qd + 2 * kvd) * d, g, 0.4f);
    L.wo = randn(d * qd, g, 0.3f);
    L.w_gate_up = randn(2 * kFf * d, g, 0.4f);
    L.w_down = randn(d * kFf, g, 0.3f);
    L.attn_q_norm = randn(kHd, g, 0.2f, 1.0f);
    L.attn_k_norm = randn(kHd, g, 0.2f, 1.0f);
    L.attn_post_norm = randn(d, g, 0.2f, 1.0f);
    L.ffn_post_norm = randn(d, g, 0.2f, 1.0f);
    w.layers.push_back(std::move(L));
  }
  return w;
}

using Vec = std::vector<double>;

Vec rmsnorm(const Vec& x, const std::vector<float>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double r = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * w[i];
  return y;
}

// rows [r0, r0 + n) of a row-major (·, in) matrix times x.
Vec matvec(const std::vector<float>& W, size_t r0, size_t n, const Vec& x) {
  Vec y(n, 0.0);
  for (size_t r = 0; r < n; ++r)
    for (size_t c = 0; c < x.size(); ++c) y[r] += double{W[(r0 + r) * x.size() + c]} * x[c];
  return y;
}

// NeoX pairs (i, i + hd/2), angle p · θ^(−2i/hd).
void rope_neox(double* x, int p, double theta) {
  const int half = kHd / 2;
  for (int i = 0; i < half; ++i) {
    const double a = p * std::pow(theta, -2.0 * i / kHd), c = std::cos(a), s = std::sin(a);
    const double x0 = x[i], x1 = x[i + half];
    x[i] = x0 * c - x1 * s;
    x[i + half] = x0 * s + x1 * c;
  }
}

double gelu_tanh(double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }

// Logits (n, V) of the whole sequence.
std::vector<double> reference_logits(const ModelConfig& c, const ModelWeights& w, const std::vector<int32_t>& toks) {
  const int n = static_cast<int>(toks.size());
  std::vector<Vec> x(n, Vec(kD));
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < kD; ++i) x[t][i] = w.token_embd[toks[t] * kD + i] * std::sqrt(double{kD});
  for (int l = 0; l < kL; ++l) {
    const LayerWeights& L = w.layers[l];
    const bool sliding = l == 0;
    const double theta = sliding ? 100.0 : 10000.0;
    std::vector<Vec> q(n), k(n), v(n);
    for (int t = 0; t < n; ++t) {
      const Vec h = rmsnorm(x[t], L.attn_norm, c.rms_eps);
      q[t] = matvec(L.wqkv, 0, kH * kHd, h);
      k[t] = matvec(L.wqkv, kH * kHd, kHd, h);
      v[t] = matvec(L.wqkv, kH * kHd + kHd, kHd, h);
      for (int hh = 0; hh < kH; ++hh) {
        Vec qh(q[t].begin() + hh * kHd, q[t].begin() + (hh + 1) * kHd);
        qh = rmsnorm(qh, L.attn_q_norm, c.rms_eps);
        rope_neox(qh.data(), t, theta);
        std::copy(qh.begin(), qh.end(), q[t].begin() + hh * kHd);
      }
      k[t] = rmsnorm(k[t], L.attn_k_norm, c.rms_eps);
      rope_neox(k[t].data(), t, theta);
    }
    for (int t = 0; t < n; ++t) {
      Vec att(kH * kHd, 0.0);
      for (int hh = 0; hh < kH; ++hh) {
        std::vector<double> s;
        std::vector<int> js;
        for (int j = 0; j <= t; ++j) {
          if (sliding && j <= t - 3) continue;  // keys at > t − window
          double dot = 0;
          for (int i = 0; i < kHd; ++i) dot += q[t][hh * kHd + i] * k[j][i];
          s.push_back(0.3 * dot);
          js.push_back(j);
        }
        double mx = -1e300, sum = 0;
        for (double e : s) mx = std::max(mx, e);
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (size_t m = 0; m < s.size(); ++m)
          for (int i = 0; i < kHd; ++i) att[hh * kHd + i] += s[m] / sum * v[js[m]][i];
      }
      Vec o = rmsnorm(matvec(L.wo, 0, kD, att), L.attn_post_norm, c.rms_eps);
      for (int i = 0; i < kD; ++i) x[t][i] += o[i];
      const Vec h = rmsnorm(x[t], L.ffn_norm, c.rms_eps);
      const Vec gte = matvec(L.w_gate_up, 0, kFf, h), up = matvec(L.w_gate_up, kFf, kFf, h);
      Vec a(kFf);
      for (int i = 0; i < kFf; ++i) a[i] = gelu_tanh(gte[i]) * up[i];
      const Vec f = rmsnorm(matvec(L.w_down, 0, kD, a), L.ffn_post_norm, c.rms_eps);
      for (int i = 0; i < kD; ++i) x[t][i] += f[i];
    }
  }
  std::vector<double> out;
  for (int t = 0; t < n; ++t) {
    const Vec h = rmsnorm(x[t], w.output_norm, c.rms_eps);
    const Vec lg = matvec(w.token_embd, 0, kV, h);
    for (double z : lg) out.push_back(5.0 * std::tanh(z / 5.0));
  }
  return out;
}

}  // namespace

TEST(Gemma3Synthetic, ForwardMatchesNaiveReference) {
  const ModelConfig c = tiny_config();
  const ModelWeights w = tiny_weights(7);
  Model m = Model::from_weights(c, w);
  EXPECT_EQ(m.config().rope_layout, RopeLayout::NeoX);
  const std::vector<int32_t> toks = {3, 17, 0, 22, 9, 9, 14, 1, 5, 11, 20};  // 11 tokens > window 3
  const auto want = reference_logits(c, w, toks);
  const int64_t n = static_cast<int64_t>(toks.size());

  // Prefill in one chunk, every position's logits.
  auto cache = m.make_dense_cache(n);
  std::vector<float> got(n * kV);
  m.forward(toks, 0, cache, got.data(), true);
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(got[i] - want[i]));
    max_abs = std::max(max_abs, std::fabs(want[i]));
  }
  EXPECT_LE(max_diff, 2e-4) << "prefill";
  EXPECT_LE(max_abs, 5.0);  // soft-capped
  EXPECT_GT(max_abs, 0.5);  // and not degenerate

  // Token-by-token decode through the cache gives the same logits.
  auto c2 = m.make_dense_cache(n);
  std::vector<float> one(kV);
  double dec_diff = 0;
  for (int64_t t = 0; t < n; ++t) {
    m.forward(std::span<const int32_t>(&toks[t], 1), t, c2, one.data(), false);
    for (int v = 0; v < kV; ++v) dec_diff = std::max(dec_diff, std::fabs(one[v] - want[t * kV + v]));
  }
  EXPECT_LE(dec_diff, 2e-4) << "decode";
}

// The window matters exactly where it should: with one RoPE base for all
// layers, making layer 0 global leaves positions 0..2 (which see <= 3 keys)
// bit-identical and changes later positions.
TEST(Gemma3Synthetic, SlidingWindowChangesLateLogitsOnly) {
  ModelConfig c = tiny_config();
  c.rope_theta_swa = c.rope_theta;
  const ModelWeights w = tiny_weights(7);
  Model slide = Model::from_weights(c, w);
  c.layer_sliding = {0, 0};
  Model global = Model::from_weights(c, w);
  const std::vector<int32_t> toks = {3, 17, 0, 22, 9, 9, 14};
  const int64_t n = static_cast<int64_t>(toks.size());
  std::vector<float> a(n * kV), b(n * kV);
  auto ca = slide.make_dense_cache(n), cb = global.make_dense_cache(n);
  slide.forward(toks, 0, ca, a.data(), true);
  global.forward(toks, 0, cb, b.data(), true);
  for (int64_t i = 0; i < 3 * kV; ++i) ASSERT_EQ(a[i], b[i]) << "position " << i / kV;
  double late = 0;
  for (int64_t i = 3 * kV; i < n * kV; ++i) late = std::max(late, double{std::fabs(a[i] - b[i])});
  EXPECT_GT(late, 1e-3);
}

TEST(Gemma3Synthetic, FromWeightsChecksGemmaTensors) {
  const ModelConfig c = tiny_config();
  ModelWeights w = tiny_weights(3);
  w.layers[1].attn_k_norm.clear();
  EXPECT_THROW(Model::from_weights(c, w), Error);
  ModelConfig bad = tiny_config();
  bad.layer_sliding = {1};  // not one per layer
  EXPECT_THROW(Model::from_weights(bad, tiny_weights(3)), Error);
  bad = tiny_config();
  bad.sliding_window = 0;  // sliding layers without a window
  EXPECT_THROW(Model::from_weights(bad, tiny_weights(3)), Error);
  bad = tiny_config();
  bad.final_logit_softcap = -1.0f;
  EXPECT_THROW(Model::from_weights(bad, tiny_weights(3)), Error);
}
