// Why the fake-quant and the packed cache give different perplexities on the
// same plan (bench/results/panel.md: 16.16 vs 16.59 on Gemma 3, 2.6 %; 0.25 % on
// SmolLM2) although their attention agrees to fp32 rounding on the same codes
// (PackedKVCache.RealModelActivationsEqualFakeQuant): the two paths compute
// K, V and attention with different fp32 rounding (~1e-7 relative), a code
// whose rotated coordinate lies that close to a Lloyd–Max threshold flips, the
// flip changes the next layer's input, and over 18–30 layers and hundreds of
// tokens the perplexity of one run moves by far more than the rounding.
//
// Shown end to end on the real models (uniform TQ-MSE K3V3, one window of 256
// tokens): on identical inputs and codes the packed attention differs from the
// fake path's by ~1e-6 relative (TeeCache); multiplying ONLY the fake path's
// attention outputs by 1 ± 1e-7 (a smaller change, signs hashed per element
// and seed) moves its perplexity by as much as the packed cache differs from
// it (measured: SmolLM2 fake 29.87, packed 27.98, perturbed 27.8–28.3; Gemma 3
// 38.31, 34.88, 34.4–41.8), while the same change of the unquantized fp32
// cache moves it by < 1e-6. So the fake/packed gap is the spread one run has
// under rounding-level changes, not a defect of either path; compare plans
// over seeds and windows (eval reports the spread), not one run of each cache.
// (Perturbing the stored K/V by 1e-7 instead moves less: a K/V element
// perturbation is smaller than the attention arithmetic's rounding.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "ratekv/cache/fake_quant_cache.h"
#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/io/gguf.h"
#include "ratekv/model/model.h"
#include "ratekv/model/perplexity.h"
#include "ratekv/model/tokenizer.h"

#include "../support/assets.h"

using namespace ratekv;

namespace {

// Sends every append to two caches and returns the first one's attention; records per layer
// the largest relative L2 difference between the two caches' attention outputs (same inputs,
// same codes: the difference is their arithmetic alone).
class TeeCache final : public KVCache {
 public:
  TeeCache(KVCache& a, KVCache& b) : a_(a), b_(b) {}
  const KVCacheShape& shape() const override { return a_.shape(); }
  void append(int layer, int64_t n, const int32_t* pos, const float* k_pre, const float* k_post,
              const float* v) override {
    a_.append(layer, n, pos, k_pre, k_post, v);
    b_.append(layer, n, pos, k_pre, k_post, v);
  }
  void attend(int layer, int64_t n, const int32_t* pos, const float* q, float* out, const AttnParams& p) override {
    const size_t m = static_cast<size_t>(n) * shape().n_heads * shape().head_dim;
    std::vector<float> ob(m);
    a_.attend(layer, n, pos, q, out, p);
    b_.attend(layer, n, pos, q, ob.data(), p);
    double e = 0, r = 0;
    for (size_t i = 0; i < m; ++i) {
      e += (double(out[i]) - ob[i]) * (double(out[i]) - ob[i]);
      r += double(out[i]) * out[i];
    }
    max_rel = std::max(max_rel, std::sqrt(e / r));
  }
  int64_t n_tokens() const override { return a_.n_tokens(); }
  void clear() override {
    a_.clear();
    b_.clear();
  }
  size_t bytes() const override { return a_.bytes(); }
  double max_rel = 0;

 private:
  KVCache &a_, &b_;
};

// Multiplies every attention output element of another cache by 1 + eps·σ (σ = ±1 hashed
// from seed, layer, position, index): a rounding-level change of the attention arithmetic.
class PerturbedAttention final : public KVCache {
 public:
  PerturbedAttention(KVCache& inner, double eps, uint64_t seed) : inner_(inner), eps_(eps), seed_(seed) {}
  const KVCacheShape& shape() const override { return inner_.shape(); }
  void append(int layer, int64_t n, const int32_t* pos, const float* k_pre, const float* k_post,
              const float* v) override {
    inner_.append(layer, n, pos, k_pre, k_post, v);
  }
  void attend(int layer, int64_t n, const int32_t* pos, const float* q, float* out, const AttnParams& p) override {
    inner_.attend(layer, n, pos, q, out, p);
    const int64_t row = int64_t{shape().n_heads} * shape().head_dim;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < row; ++i) {
        uint64_t z = seed_ * 0x9e3779b97f4a7c15ull + (static_cast<uint64_t>(layer) << 40) +
                     (static_cast<uint64_t>(pos[t]) << 20) + static_cast<uint64_t>(i);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        out[t * row + i] *= static_cast<float>(1.0 + eps_ * (((z ^ (z >> 31)) & 1) ? 1.0 : -1.0));
      }
  }
  int64_t n_tokens() const override { return inner_.n_tokens(); }
  void clear() override { inner_.clear(); }
  size_t bytes() const override { return inner_.bytes(); }

 private:
  KVCache& inner_;
  double eps_;
  uint64_t seed_;
};

// Uniform TQ-MSE K3V3 on the model's shape (one seed per (layer, head, side)).
Plan k3v3(const ModelConfig& cfg) {
  Plan p;
  p.method = "uniform";
  static_cast<PlanTarget&>(p.model) = cache::plan_target(cfg);
  p.layers.assign(cfg.n_layers, std::vector<HeadPlan>(cfg.n_kv_heads));
  for (int l = 0; l < cfg.n_layers; ++l)
    for (int h = 0; h < cfg.n_kv_heads; ++h) {
      p.layers[l][h].key = Codec::tq_mse(3, cfg.head_dim, 1000 + 2 * (l * cfg.n_kv_heads + h));
      p.layers[l][h].value = Codec::tq_mse(3, cfg.head_dim, 1001 + 2 * (l * cfg.n_kv_heads + h));
    }
  return p;
}

void run_model(const std::string& path, const char* name) {
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model asset missing: " << path;
  const std::string text_path = ratekv_test::assets_dir() + "/text/eval.txt";
  if (!std::filesystem::exists(text_path)) GTEST_SKIP() << "text asset missing: " << text_path;
  GgufFile f = GgufFile::open(path);
  Model model = Model::load(f);
  const Tokenizer tok = Tokenizer::from_gguf(f);
  std::ifstream in(text_path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  text.resize(std::min<size_t>(text.size(), 6000));
  const bool bos = f.has("tokenizer.ggml.add_bos_token") && f.get_bool("tokenizer.ggml.add_bos_token");
  std::vector<int32_t> ids = tok.encode(text, bos);
  const int64_t ctx = 256;
  ASSERT_GE(static_cast<int64_t>(ids.size()), 2 * ctx);
  ids.resize(2 * ctx);
  const ModelConfig& cfg = model.config();
  const auto codecs = std::make_shared<const cache::PlanCodecs>(k3v3(cfg), cfg, "k3v3");
  auto ppl = [&](KVCache& c) { return perplexity(model, c, ids, ctx, 1, bos, tok.bos_id()).ppl; };

  // The fake-quant path through a tee that also runs the packed cache on the same inputs: the
  // perplexity is the fake path's, and the tee records how far the packed attention is from it.
  cache::FakeQuantKVCache fake(cfg.kv_shape(ctx), codecs), f2(cfg.kv_shape(ctx), codecs);
  cache::PackedKVCache packed(cfg.kv_shape(ctx), codecs), k2(cfg.kv_shape(ctx), codecs);
  TeeCache tee(f2, k2);
  const double p_fake = ppl(tee), p_packed = ppl(packed);
  EXPECT_DOUBLE_EQ(ppl(fake), p_fake);  // the tee returns the fake path's attention unchanged
  DenseKVCache dense(cfg.kv_shape(ctx));
  const double p_dense = ppl(dense);
  PerturbedAttention pd(dense, 1e-7, 1);
  const double dense_spread = std::abs(ppl(pd) - p_dense) / p_dense;
  double spread = 0;
  for (uint64_t s = 1; s <= 3; ++s) {
    PerturbedAttention pf(fake, 1e-7, s);
    const double a = ppl(pf);
    spread = std::max(spread, std::abs(a - p_fake) / p_fake);
    std::printf("[ %s: fake path, attention × (1 ± 1e-7), seed %llu: %.5f ]\n", name,
                static_cast<unsigned long long>(s), a);
  }
  const double gap = std::abs(p_packed - p_fake) / p_fake;
  std::printf("[ %s K3V3, 1 window of %lld: fake %.5f, packed %.5f (gap %.3g); packed vs fake attention on the same "
              "codes: max rel %.3g; fake attention × (1 ± 1e-7): max change %.3g; fp32 cache the same: %.3g ]\n",
              name, static_cast<long long>(ctx), p_fake, p_packed, gap, tee.max_rel, spread, dense_spread);
  // The two paths agree on identical codes to fp32 rounding (more than 1e-7, less than 1e-5) ...
  EXPECT_LT(tee.max_rel, 1e-5);
  EXPECT_GT(tee.max_rel, 1e-8);
  // ... a change of that size in the fake path alone moves its perplexity by as much as the packed cache
  // differs from it (same order: within 10× either way), while the unquantized fp32 cache barely moves.
  // Where each lands depends on the CPU's BLAS kernels (the runs are chaotic in the rounding): SmolLM2
  // gave gap 0.063 / spread 0.069 where the numbers in the header were measured, but on an AVX-512
  // AMD EPYC fake 28.96, packed 25.55 (gap 0.118) against perturbed 28.28–29.01 (spread 0.047, three
  // seeds); Gemma 3 there: gap 0.033, spread 0.12. So the bound is the stated 10×, not 2×.
  EXPECT_LT(gap, 10 * spread);
  EXPECT_GT(gap, spread / 10);
  EXPECT_GT(spread, 100 * dense_spread);
  EXPECT_LT(dense_spread, 1e-5);
}

bool sanitizer_run() {
  const char* s = std::getenv("RATEKV_SANITIZE_RUN");
  return s && std::string(s) == "1";
}

}  // namespace

TEST(FakeVsPacked, GapIsTheRoundingSpreadOnSmolLM2) {
  if (sanitizer_run()) GTEST_SKIP() << "model-scale passes skipped in the sanitizer build";
  run_model(ratekv_test::smollm2_path(), "SmolLM2");
}

TEST(FakeVsPacked, GapIsTheRoundingSpreadOnGemma3) {
  if (sanitizer_run()) GTEST_SKIP() << "model-scale passes skipped in the sanitizer build";
  run_model(ratekv_test::gemma3_path(), "Gemma 3");
}
