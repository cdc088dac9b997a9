// The backward pass (model_backward.h): the taped forward against
// Model::forward, and ∂L/∂K_pre, ∂L/∂K_post, ∂L/∂V against central finite
// differences of the float64 loss (tiny random models, and the real
// SmolLM2-135M truncated to its first two layers, skipped without assets).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
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
