// The Qwen2 parts of the runtime on a tiny random model written as a GGUF
// image (tests/io/gguf_test_writer.h) and loaded through Model::load: the
// config read from `qwen2.*` keys, Q/K/V biases added after the projection
// and before RoPE, NeoX RoPE with the file's base, an untied LM head, GQA 7
// (as Qwen2.5-0.5B). Logits against a naive double-precision
// re-implementation written here from the Qwen2 description; errors for bias
// layouts ratekv does not apply. Runs without any asset.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "../io/gguf_test_writer.h"
#include "../support/tiny_model.h"
#include "ratekv/common/error.h"
#include "ratekv/io/gguf.h"
#include "ratekv/model/model.h"

using namespace ratekv;
using namespace ratekv::testing;
using ratekv_test::randn;

namespace {

constexpr int kL = 2, kH = 14, kHkv = 2, kHd = 8, kD = 12, kFf = 10, kV = 23;
constexpr double kTheta = 500.0;
constexpr float kEps = 1e-6f;

// Every tensor of the tiny model, with its GGUF name and ggml shape.
struct Tiny {
  std::vector<std::pair<std::string, std::vector<float>>> t;
  std::vector<std::vector<uint64_t>> ne;
  const std::vector<float>& get(const std::string& name) const {
    for (const auto& [n, v] : t)
      if (n == name) return v;
    throw std::runtime_error("no tensor " + name);
  }
};

Tiny tiny(uint32_t seed, float bias_sd) {
  std::mt19937 g(seed);
  Tiny m;
  auto add = [&](const std::string& n, std::vector<uint64_t> ne, float sd, float mean = 0.0f) {
    size_t count = 1;
    for (auto e : ne) count *= e;
    m.t.emplace_back(n, randn(count, g, sd, mean));
    m.ne.push_back(std::move(ne));
  };
  add("token_embd.weight", {kD, kV}, 1.0f);
  add("output.weight", {kD, kV}, 0.5f);
  add("output_norm.weight", {kD}, 0.1f, 1.0f);
  for (int l = 0; l < kL; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {kD}, 0.1f, 1.0f);
    add(p + "attn_q.weight", {kD, kH * kHd}, 0.4f);
    add(p + "attn_k.weight", {kD, kHkv * kHd}, 0.4f);
    add(p + "attn_v.weight", {kD, kHkv * kHd}, 0.4f);
    // Qwen2's key biases are large (bias-driven outlier channels): a mean of 1.5.
    add(p + "attn_q.bias", {kH * kHd}, bias_sd);
    add(p + "attn_k.bias", {kHkv * kHd}, bias_sd, 1.5f);
    add(p + "attn_v.bias", {kHkv * kHd}, bias_sd);
    add(p + "attn_output.weight", {kH * kHd, kD}, 0.2f);
    add(p + "ffn_norm.weight", {kD}, 0.1f, 1.0f);
    add(p + "ffn_gate.weight", {kD, kFf}, 0.3f);
    add(p + "ffn_up.weight", {kD, kFf}, 0.3f);
    add(p + "ffn_down.weight", {kFf, kD}, 0.3f);
  }
  return m;
}

// The GGUF image; `skip` names a tensor left out, `extra` one added (F32, 4 elements).
Bytes image(const Tiny& m, const std::string& skip = "", const std::string& extra = "") {
  GgufBuilder b;
  b.kv("general.architecture", v_str("qwen2"))
      .kv("qwen2.block_count", v_u32(kL))
      .kv("qwen2.context_length", v_u32(64))
      .kv("qwen2.embedding_length", v_u32(kD))
      .kv("qwen2.feed_forward_length", v_u32(kFf))
      .kv("qwen2.attention.head_count", v_u32(kH))
      .kv("qwen2.attention.head_count_kv", v_u32(kHkv))
      .kv("qwen2.attention.key_length", v_u32(kHd))  // d_model != n_heads·head_dim here
      .kv("qwen2.attention.value_length", v_u32(kHd))
      .kv("qwen2.rope.freq_base", v_f32(static_cast<float>(kTheta)))
      .kv("qwen2.attention.layer_norm_rms_epsilon", v_f32(kEps));
  for (size_t i = 0; i < m.t.size(); ++i) {
    if (m.t[i].first == skip) continue;
    b.tensor(TensorSpec(m.t[i].first, m.ne[i], 0, f32_bytes(m.t[i].second)));
  }
  if (!extra.empty()) b.tensor(TensorSpec(extra, {4}, 0, f32_bytes({1, 2, 3, 4})));
  return b.build();
}

using Vec = std::vector<double>;

Vec rmsnorm(const Vec& x, const std::vector<float>& w) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double r = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + kEps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * r * w[i];
  return y;
}

// W (ggml ne = {in, out}: row r holds in values) times x, plus bias b (may be null).
Vec affine(const std::vector<float>& W, const Vec& x, const std::vector<float>* b = nullptr) {
  const size_t out = W.size() / x.size();
  Vec y(out, 0.0);
  for (size_t r = 0; r < out; ++r) {
    for (size_t c = 0; c < x.size(); ++c) y[r] += double{W[r * x.size() + c]} * x[c];
    if (b) y[r] += (*b)[r];
  }
  return y;
}

// NeoX pairs (i, i + hd/2), angle p · θ^(−2i/hd), on one head at x.
void rope_neox(double* x, int p) {
  const int half = kHd / 2;
  for (int i = 0; i < half; ++i) {
    const double a = p * std::pow(kTheta, -2.0 * i / kHd), c = std::cos(a), s = std::sin(a);
    const double x0 = x[i], x1 = x[i + half];
    x[i] = x0 * c - x1 * s;
    x[i + half] = x0 * s + x1 * c;
  }
}

// Logits (n, V) of the whole sequence, from the named tensors.
std::vector<double> reference_logits(const Tiny& m, const std::vector<int32_t>& toks) {
  const int n = static_cast<int>(toks.size());
  const auto& E = m.get("token_embd.weight");
  std::vector<Vec> x(n, Vec(kD));
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < kD; ++i) x[t][i] = E[toks[t] * kD + i];
  for (int l = 0; l < kL; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    std::vector<Vec> q(n), k(n), v(n);
    for (int t = 0; t < n; ++t) {
      const Vec h = rmsnorm(x[t], m.get(p + "attn_norm.weight"));
      q[t] = affine(m.get(p + "attn_q.weight"), h, &m.get(p + "attn_q.bias"));
      k[t] = affine(m.get(p + "attn_k.weight"), h, &m.get(p + "attn_k.bias"));
      v[t] = affine(m.get(p + "attn_v.weight"), h, &m.get(p + "attn_v.bias"));
      for (int hh = 0; hh < kH; ++hh) rope_neox(q[t].data() + hh * kHd, t);
      for (int hh = 0; hh < kHkv; ++hh) rope_neox(k[t].data() + hh * kHd, t);
    }
    for (int t = 0; t < n; ++t) {
      Vec att(kH * kHd, 0.0);
      for (int hh = 0; hh < kH; ++hh) {
        const int kv = hh / (kH / kHkv);
        Vec s(t + 1);
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          double dot = 0;
          for (int c = 0; c < kHd; ++c) dot += q[t][hh * kHd + c] * k[j][kv * kHd + c];
          s[j] = dot / std::sqrt(double{kHd});
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (double& e : s) z += (e = std::exp(e - mx));
        for (int j = 0; j <= t; ++j)
          for (int c = 0; c < kHd; ++c) att[hh * kHd + c] += s[j] / z * v[j][kv * kHd + c];
      }
      const Vec o = affine(m.get(p + "attn_output.weight"), att);
      for (int i = 0; i < kD; ++i) x[t][i] += o[i];
    }
    for (int t = 0; t < n; ++t) {
      const Vec h = rmsnorm(x[t], m.get(p + "ffn_norm.weight"));
      const Vec gt = affine(m.get(p + "ffn_gate.weight"), h), up = affine(m.get(p + "ffn_up.weight"), h);
      Vec a(kFf);
      for (int j = 0; j < kFf; ++j) a[j] = gt[j] / (1.0 + std::exp(-gt[j])) * up[j];
      const Vec dn = affine(m.get(p + "ffn_down.weight"), a);
      for (int i = 0; i < kD; ++i) x[t][i] += dn[i];
    }
  }
  std::vector<double> out;
  for (int t = 0; t < n; ++t) {
    const Vec lg = affine(m.get("output.weight"), rmsnorm(x[t], m.get("output_norm.weight")));
    out.insert(out.end(), lg.begin(), lg.end());
  }
  return out;
}

}  // namespace

TEST(Qwen2Synthetic, ConfigFromGgufKeys) {
  const Bytes img = image(tiny(1, 0.5f));
  const GgufFile f = GgufFile::parse(img, "tiny-qwen2.gguf");
  const ModelConfig c = ModelConfig::from_gguf(f);
  EXPECT_EQ(c.arch, "qwen2");
  EXPECT_EQ(c.rope_layout, RopeLayout::NeoX);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_EQ(c.gqa_ratio(), 7);
  EXPECT_EQ(c.head_dim, kHd);
  EXPECT_DOUBLE_EQ(c.rope_theta, kTheta);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.post_norms);
  EXPECT_TRUE(c.layer_sliding.empty());
  EXPECT_EQ(c.ffn_act, FfnActivation::SiLU);
  EXPECT_FLOAT_EQ(c.attention_scale(), 1.0f / std::sqrt(8.0f));
  const Model m = Model::load(f);
  ASSERT_EQ(m.weights().layers[1].bqkv.size(), size_t{(kH + 2 * kHkv) * kHd});
  // bqkv is Q, then K, then V, each in GGUF order.
  const Tiny t = tiny(1, 0.5f);
  EXPECT_EQ(m.weights().layers[1].bqkv[0], t.get("blk.1.attn_q.bias")[0]);
  EXPECT_EQ(m.weights().layers[1].bqkv[kH * kHd + 3], t.get("blk.1.attn_k.bias")[3]);
  EXPECT_EQ(m.weights().layers[1].bqkv[(kH + kHkv) * kHd + 5], t.get("blk.1.attn_v.bias")[5]);
  EXPECT_FALSE(m.weights().output.empty());  // untied LM head
}

TEST(Qwen2Synthetic, LogitsMatchNaiveReference) {
  for (float bias_sd : {0.0f, 0.7f}) {
    const Tiny t = tiny(7, bias_sd);
    const Bytes img = image(t);
    Model m = Model::load(GgufFile::parse(img, "tiny-qwen2.gguf"));
    // 13 tokens in two chunks (prefill 9, then 4 one at a time): positions and
    // biases must be right in both paths.
    const std::vector<int32_t> toks{3, 17, 0, 22, 5, 5, 9, 14, 1, 8, 20, 2, 11};
    const std::vector<double> ref = reference_logits(t, toks);
    auto cache = m.make_dense_cache(16);
    std::vector<float> lg(9 * kV), one(kV);
    m.forward(std::span(toks).first(9), 0, cache, lg.data(), true);
    double worst = 0;
    for (int i = 0; i < 9 * kV; ++i) worst = std::max(worst, std::fabs(lg[i] - ref[i]));
    for (int t2 = 9; t2 < 13; ++t2) {
      m.forward(std::span(toks).subspan(t2, 1), t2, cache, one.data(), false);
      for (int i = 0; i < kV; ++i) worst = std::max(worst, std::fabs(one[i] - ref[t2 * kV + i]));
    }
    EXPECT_LT(worst, 2e-4) << "bias sd " << bias_sd;
  }
}

// The biases matter: the same weights without them (or with the key bias
// added after RoPE instead of before) give other logits, so the comparison
// above would catch a bias dropped or applied in the wrong place.
TEST(Qwen2Synthetic, KeyBiasEntersBeforeRope) {
  const Tiny t = tiny(9, 0.7f);
  const Bytes img = image(t);
  const GgufFile f = GgufFile::parse(img, "tiny-qwen2.gguf");
  const Model base = Model::load(f);
  const std::vector<int32_t> toks{4, 1, 19, 7, 7, 12};
  auto logits_of = [&](Model& mm) {
    auto cache = mm.make_dense_cache(8);
    std::vector<float> lg(toks.size() * kV);
    mm.forward(toks, 0, cache, lg.data(), true);
    return lg;
  };
  Model with = Model::load(f);
  const auto a = logits_of(with);
  // Hook: the pre-RoPE key equals W_k·x + b_k, so it rotates with the key.
  ForwardHooks hooks;
  double max_k_bias_gap = 0;
  hooks.on_layer = [&](const LayerActivations& act) {
    if (act.layer != 0) return;
    // token 0 at position 0: k_post == k_pre (no rotation), both include the bias.
    for (int c = 0; c < kHkv * kHd; ++c) max_k_bias_gap = std::max<double>(max_k_bias_gap, std::fabs(act.k_post[c] - act.k_pre[c]));
  };
  {
    auto cache = with.make_dense_cache(8);
    with.forward(toks, 0, cache, nullptr, false, &hooks);
  }
  EXPECT_LT(max_k_bias_gap, 1e-6);
  // Without biases: different logits.
  ModelConfig c = base.config();
  ModelWeights w = base.weights();
  c.qkv_bias = false;
  for (auto& L : w.layers) L.bqkv.clear();
  Model none = Model::from_weights(c, std::move(w));
  const auto b = logits_of(none);
  double gap = 0;
  for (size_t i = 0; i < a.size(); ++i) gap = std::max<double>(gap, std::fabs(a[i] - b[i]));
  EXPECT_GT(gap, 0.05);
}

TEST(Qwen2Synthetic, BadBiasLayoutsAreErrors) {
  const Tiny t = tiny(1, 0.5f);
  auto expect_error = [](const Bytes& img, const std::string& part) {
    try {
      const GgufFile f = GgufFile::parse(img, "bad.gguf");
      (void)Model::load(f);
      ADD_FAILURE() << "expected Error containing " << part;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("bad.gguf"), std::string::npos) << e.what();
    }
  };
  expect_error(image(t, "blk.0.attn_k.bias"), "2 of the 3 tensors");
  expect_error(image(t, "blk.1.attn_v.bias"), "blk.1.attn_v.bias");  // layer 1 lacks one
  expect_error(image(t, "", "output.bias"), "'output.bias'");
  expect_error(image(t, "", "blk.0.attn_output.bias"), "'blk.0.attn_output.bias'");
  // from_weights checks the bias size against the config.
  Model m = Model::load(GgufFile::parse(image(t), "ok.gguf"));
  ModelWeights w = m.weights();
  w.layers[0].bqkv.pop_back();
  EXPECT_THROW(Model::from_weights(m.config(), std::move(w)), Error);
}
