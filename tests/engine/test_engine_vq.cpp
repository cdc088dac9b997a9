// The GPU engine with TaSQ / CQ plans (vq keys encoded on the GPU:
// cuda::vq_append; decode over the vq pages: cuda::vq_decode_attention;
// evaluation / chunked prefill over cuda::vq_dequantize) against the CPU
// runtime with the CPU packed cache of the same plan, on identical synthetic
// weights (tiny-llama: 2 layers, GQA 2, head_dim 64, interleaved RoPE; and a
// qwen2-shaped tiny model: biases, NeoX RoPE, GQA 4, 1 KV head), and fp16
// keys over TQ-MSE values (-ctk f16 -ctv tq3: keys in the vq pages too); and
// RateQuant-style plans with 5..8-bit groups (extension pages). GPU only:
// skipped without a device.
//
// The plans: TaSQ-style keys (groups of 8 channels of shuffled RoPE pairs,
// 2^6 centroids, shared fp16 scale, channel weights in [0.5, 2]) and values
// CQ (groups of 8, 2^6 centroids, no scale), fp16, or TQ-MSE 3-bit. The
// codebooks are calibration vectors of the model itself (pre-RoPE keys of a
// different prompt, weighted and scaled as the encoder does; values as they
// are), picked at random: a codebook that covers the data, as k-means'
// initialization would (the fit, tasq/fit.h, is not built on the GPU machine).
//
// Bound. No fixed bound holds for these coarse quantizers (6 index bits per
// 8 channels: 0.75 bits per key channel; measured on the H200, 2026-12-02:
// worst prefill row 0.09–0.31 rel L2, decode steps 0.07–0.12, greedy tokens
// agreeing). The GPU's K/V differ from the CPU's by the bf16 / fp16
// roundings of the forward pass (relative ε ≈ 1e-3 – 3e-3); an index flips
// where a group vector lies within ε of a Voronoi boundary of its codebook
// and then moves by a whole cell — with 64 codewords in 8 dimensions a cell
// is as wide as the vectors themselves, so a few % of flipped groups move K̂
// by ~0.1–0.2 relative (a 4-bit scalar code moves by one level, 0.3σ: hence
// test_engine.cpp's fixed 0.1 for K4V4). The reference is that noise measured
// in the same run: the CPU runtime with the same plan whose K/V are
// perturbed before the cache (each element times 1 + ε·N(0, 1), ε = 3e-3,
// test_engine.cpp's estimate of the GPU's K/V difference; three seeds, the
// largest) against the CPU runtime as is, over the same rows / steps. (Rounding
// K/V to bf16 instead was measured too small a reference on the qwen2 model:
// 0.014, against 0.07–0.34 at ε = 3e-3 (by seed) and the GPU's 0.26 — a
// deterministic rounding happened to flip almost no index there. Measured
// here on the CPU, three seeds: prefill references 0.15–0.46, decode
// 0.13–0.23.) The GPU passes if the median of its prefill rows is within 2x
// the largest of the noisy references' medians (+0.02, the fp16 bound's
// scale; medians, not worst rows: 2x a worst row reaches unrelated logits),
// its worst decode step within 2x the noisy worst step + 0.02, and no row or
// step exceeds 0.5 (the H200's worst so far 0.31; unrelated logits are ≈ 1.4;
// a bug — a wrong position, index or scale — moves the logits by O(1)); greedy
// tokens agree wherever the CPU's top-2 margin exceeds 0.5 (the NIAH
// comparison's packed allowance).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "../support/vq_codec.h"
#include "gpu_util.h"
#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/cache/plan_codecs.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/engine/engine.h"
#include "ratekv/eval/baseline_plans.h"
#include "ratekv/model/synthetic.h"

namespace {

using namespace ratekv;
using engine::CacheFormat;
using engine::Engine;
using engine::EngineOptions;
using engine::PrefillMode;
using engine_test::have_gpu;
using engine_test::rel_l2;

constexpr uint64_t kSeed = 20261202;
constexpr double kNoise = 3e-3;  // relative K/V noise of the CPU reference (file comment)
constexpr double kCap = 0.5;      // absolute cap on any row / step (file comment)

enum class Values { cq, fp16, tq3 };

// A dense cache that keeps what the model appends (pre-RoPE keys, values).
class CaptureCache : public DenseKVCache {
 public:
  explicit CaptureCache(const KVCacheShape& s) : DenseKVCache(s), k_pre(s.n_layers), v(s.n_layers) {}
  void append(int layer, int64_t n, const int32_t* pos, const float* kp, const float* k_post,
              const float* vv) override {
    const size_t row = static_cast<size_t>(shape().n_kv_heads) * shape().head_dim;
    k_pre[layer].insert(k_pre[layer].end(), kp, kp + n * row);
    v[layer].insert(v[layer].end(), vv, vv + n * row);
    DenseKVCache::append(layer, n, pos, kp, k_post, vv);
  }
  std::vector<std::vector<float>> k_pre, v;
};

// The CPU packed cache with K/V perturbed before they are stored: every
// element of k_pre, k and v times (1 + ε·N(0, 1)), seeded — the noise
// reference of the file comment.
class NoisyKVCache : public KVCache {
 public:
  NoisyKVCache(const KVCacheShape& s, std::shared_ptr<const cache::PlanCodecs> c, double eps, uint32_t seed)
      : inner_(s, std::move(c)), eps_(eps), rng_(seed) {}
  const KVCacheShape& shape() const override { return inner_.shape(); }
  void append(int layer, int64_t n, const int32_t* pos, const float* kp, const float* k, const float* v) override {
    const size_t m = static_cast<size_t>(n) * shape().n_kv_heads * shape().head_dim;
    std::vector<float> a(kp, kp + m), b(k, k + m), c(v, v + m);
    std::normal_distribution<double> nd(0.0, 1.0);
    for (size_t i = 0; i < m; ++i) {
      a[i] = static_cast<float>(a[i] * (1 + eps_ * nd(rng_)));
      b[i] = static_cast<float>(b[i] * (1 + eps_ * nd(rng_)));
      c[i] = static_cast<float>(c[i] * (1 + eps_ * nd(rng_)));
    }
    inner_.append(layer, n, pos, a.data(), b.data(), c.data());
  }
  void attend(int layer, int64_t n, const int32_t* pos, const float* q, float* out, const AttnParams& p) override {
    inner_.attend(layer, n, pos, q, out, p);
  }
  int64_t n_tokens() const override { return inner_.n_tokens(); }
  void clear() override { inner_.clear(); }
  size_t bytes() const override { return inner_.bytes(); }

 private:
  cache::PackedKVCache inner_;
  double eps_;
  std::mt19937 rng_;
};

std::vector<int32_t> random_tokens(int n, int V, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(g() % V);
  return t;
}

std::shared_ptr<const cache::PlanCodecs> tasq_plan(Model& model, Values vals, uint32_t seed) {
  const ModelConfig& c = model.config();
  const int d = c.head_dim, H = c.n_kv_heads, g = 8, bits = 6, K = 1 << bits;
  // Calibration: 160 tokens of another prompt.
  const int T = 160;
  CaptureCache cal(c.kv_shape(T));
  std::vector<float> lg(static_cast<size_t>(T) * c.n_vocab);
  model.forward(random_tokens(T, c.n_vocab, seed + 99), 0, cal, lg.data(), true);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> ud(0.5f, 2.0f);
  Plan p;
  p.method = "tasq";
  static_cast<PlanTarget&>(p.model) = cache::plan_target(c);
  p.tensors_file = "in-memory.safetensors";
  p.layers.assign(c.n_layers, std::vector<HeadPlan>(H));
  const auto pairs = rope_pairs(c.rope_layout, d);
  std::vector<int> id(d);
  std::iota(id.begin(), id.end(), 0);
  std::vector<std::vector<int>> perm(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    std::vector<int> order(d / 2);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int b : order) perm[l].insert(perm[l].end(), {pairs[b][0], pairs[b][1]});
    for (int h = 0; h < H; ++h) {
      p.layers[l][h].key = ratekv_test::vq_codec(d, g, bits, true, H, perm[l]);
      p.layers[l][h].value = vals == Values::cq     ? ratekv_test::vq_codec(d, g, bits, false, H, id)
                             : vals == Values::fp16 ? Codec::fp16()
                                                    : Codec::tq_mse(3, d, seed + 17 * h + 101 * l);
    }
  }
  VqTensors t = VqTensors::for_plan(p);
  const size_t row = static_cast<size_t>(H) * d;
  for (int l = 0; l < c.n_layers; ++l) {
    std::vector<std::vector<float>> a(H, std::vector<float>(d));
    for (auto& ah : a)
      for (float& x : ah) x = ud(rng);
    // The encoder's y = a·x / s_t, s_t = fp16(RMS over heads and channels of a·x).
    std::vector<float> s(T);
    for (int tk = 0; tk < T; ++tk) {
      double acc = 0;
      for (int h = 0; h < H; ++h)
        for (int ch = 0; ch < d; ++ch) {
          const double y = double(a[h][ch]) * cal.k_pre[l][tk * row + h * d + ch];
          acc += y * y;
        }
      s[tk] = round_fp16(static_cast<float>(std::sqrt(acc / (H * d))));
    }
    for (int h = 0; h < H; ++h) {
      auto& ke = t.at(l, h, 0);
      ke.present = true;
      ke.channel_scale = a[h];
      for (int gi = 0; gi < d / g; ++gi)
        for (int j = 0; j < K; ++j) {
          const int tk = static_cast<int>(rng() % T);
          for (int q = 0; q < g; ++q) {
            const int ch = perm[l][gi * g + q];
            ke.codebooks.push_back(a[h][ch] * cal.k_pre[l][tk * row + h * d + ch] / s[tk]);
          }
        }
      if (vals != Values::cq) continue;
      auto& ve = t.at(l, h, 1);
      ve.present = true;
      for (int gi = 0; gi < d / g; ++gi)
        for (int j = 0; j < K; ++j) {
          const int tk = static_cast<int>(rng() % T);
          for (int q = 0; q < g; ++q) ve.codebooks.push_back(cal.v[l][tk * row + h * d + gi * g + q]);
        }
    }
  }
  return std::make_shared<const cache::PlanCodecs>(p, c, "tasq-test", std::make_shared<const VqTensors>(std::move(t)));
}

int argmax(const float* x, int n) { return static_cast<int>(std::max_element(x, x + n) - x); }
double top2_margin(const float* x, int n) {
  float a = -INFINITY, b = -INFINITY;
  for (int i = 0; i < n; ++i) {
    if (x[i] > a) b = a, a = x[i];
    else if (x[i] > b) b = x[i];
  }
  return a - b;
}

// GPU evaluation prefill (every row's logits; one piece, or chunks of
// `chunk`) + greedy decode steps vs the CPU runtime with its packed cache,
// judged against the CPU's own noise (NoisyKVCache, file comment).
void compare(Model& cpu, const ModelConfig& c, std::shared_ptr<const cache::PlanCodecs> codecs, const char* name,
             int n, int chunk) {
  const int V = c.n_vocab, n_dec = 8;
  EngineOptions o;
  o.max_prefill_tokens = chunk > 0 ? chunk : 128;
  o.prefill_score_bytes = size_t{1} << 20;
  o.pool_bytes = size_t{64} << 20;
  o.max_batch = 2;
  auto eng = Engine::create_synthetic(c, true, kSeed, CacheFormat::packed(codecs), o);
  const std::vector<int32_t> prompt = random_tokens(n, V, 11);
  std::vector<float> g_pre(size_t(n) * V);
  const int s = eng->add_sequence(n + n_dec);
  if (chunk > 0)
    eng->prefill_chunked(s, prompt, chunk, PrefillMode::evaluation, g_pre);
  else
    eng->prefill(s, prompt, PrefillMode::evaluation, g_pre);
  cache::PackedKVCache kv(c.kv_shape(n + n_dec), codecs);
  std::vector<std::unique_ptr<NoisyKVCache>> noisy;
  for (uint32_t seed : {1u, 2u, 3u})
    noisy.push_back(std::make_unique<NoisyKVCache>(c.kv_shape(n + n_dec), codecs, kNoise, seed));
  std::vector<float> c_pre(size_t(n) * V), r_pre(size_t(n) * V);
  cpu.forward(prompt, 0, kv, c_pre.data(), true);
  auto median = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  std::vector<double> rows(n);
  for (int i = 0; i < n; ++i) rows[i] = rel_l2(g_pre, c_pre, size_t(i) * V, V);
  const double worst = *std::max_element(rows.begin(), rows.end()), med = median(rows);
  double floor_med = 0, floor_worst = 0;
  for (auto& r : noisy) {
    cpu.forward(prompt, 0, *r, r_pre.data(), true);
    std::vector<double> nr(n);
    for (int i = 0; i < n; ++i) nr[i] = rel_l2(r_pre, c_pre, size_t(i) * V, V);
    floor_med = std::max(floor_med, median(nr));
    floor_worst = std::max(floor_worst, *std::max_element(nr.begin(), nr.end()));
  }
  std::printf("  %s prefill (evaluation, chunk %d, %d tokens): rows rel L2 median %.3e worst %.3e (CPU K/V-noise "
              "reference: median %.3e worst %.3e)\n",
              name, chunk, n, med, worst, floor_med, floor_worst);
  EXPECT_LT(med, 2 * floor_med + 0.02) << name;
  EXPECT_LT(worst, kCap) << name;
  int32_t tok = argmax(g_pre.data() + size_t(n - 1) * V, V);
  int agree = 0, decided = 0;
  std::vector<float> c_log(V), g_log(V), r_log(V);
  std::copy(c_pre.end() - V, c_pre.end(), c_log.begin());
  double worst_dec = 0, floor_dec = 0;
  for (int k = 0; k < n_dec; ++k) {
    if (top2_margin(c_log.data(), V) > 0.5) {
      ++decided;
      agree += argmax(c_log.data(), V) == tok;
    }
    int32_t next = 0;
    eng->decode(std::span<const int>(&s, 1), std::span<const int32_t>(&tok, 1), 1, std::span<int32_t>(&next, 1), g_log);
    cpu.forward(std::span<const int32_t>(&tok, 1), n + k, kv, c_log.data(), false);
    worst_dec = std::max(worst_dec, rel_l2(g_log, c_log, 0, V));
    for (auto& r : noisy) {
      cpu.forward(std::span<const int32_t>(&tok, 1), n + k, *r, r_log.data(), false);
      floor_dec = std::max(floor_dec, rel_l2(r_log, c_log, 0, V));
    }
    EXPECT_EQ(next, argmax(g_log.data(), V));
    tok = next;
  }
  std::printf("  %s decode: worst step rel L2 %.3e (CPU K/V-noise reference %.3e); greedy %d of %d decided steps agree\n",
              name, worst_dec, floor_dec, agree, decided);
  EXPECT_LT(worst_dec, std::min(2 * floor_dec + 0.02, kCap)) << name;
  EXPECT_EQ(agree, decided) << name;
}

struct Tiny {
  ModelConfig cfg;
  Model model;
  explicit Tiny(ModelConfig c) : cfg(c), model(Model::from_weights(c, synthetic_weights(c, kSeed, true))) {}
};
Tiny& tiny_llama() {
  static Tiny t(synthetic_config("tiny-llama"));
  return t;
}
Tiny& tiny_qwen() {  // biases, NeoX RoPE, GQA 4 over one KV head
  static Tiny t([] {
    ModelConfig c = synthetic_config("tiny-llama");
    c.arch = "qwen2";
    c.rope_layout = RopeLayout::NeoX;
    c.qkv_bias = true;
    c.n_kv_heads = 1;
    c.rope_theta = 1e6;
    return c;
  }());
  return t;
}

}  // namespace

TEST(EngineVq, TasqPlansMatchTheCpuRuntime) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  for (Tiny* m : {&tiny_llama(), &tiny_qwen()})
    for (const Values v : {Values::cq, Values::fp16, Values::tq3}) {
      const std::string name = std::string(m->cfg.arch) +
                               (v == Values::cq ? " TaSQ K6 + CQ V" : v == Values::fp16 ? " TaSQ K6 + fp16 V" : " TaSQ K6 + TQ3 V");
      auto codecs = tasq_plan(m->model, v, 7 + static_cast<uint32_t>(v));
      ASSERT_TRUE(CacheFormat::packed(codecs).has_vq());
      compare(m->model, m->cfg, codecs, name.c_str(), 97, 0);
      compare(m->model, m->cfg, codecs, name.c_str(), 97, 64);  // chunked: earlier chunks dequantized (RoPE at their positions)
    }
  // fp16 keys (post-RoPE rows in the vq pages) over TQ-MSE 3-bit values (-ctk f16 -ctv tq3).
  Tiny& m = tiny_llama();
  auto f16k = std::make_shared<const cache::PlanCodecs>(eval::cache_type_plan("f16", "tq3", m.cfg, 7), m.cfg);
  compare(m.model, m.cfg, f16k, "llama fp16 K + TQ3 V", 97, 0);
  compare(m.model, m.cfg, f16k, "llama fp16 K + TQ3 V", 97, 64);
}

// RateQuant-style plans with 5..8-bit groups (issue 18 item 4a): per head and
// side widths 2..8, the high bits of the wide groups in the extension pages
// (cuda::packed_write_wide / packed_dequantize_wide, the generic decode
// kernel), against the CPU runtime with the CPU packed cache as above.
TEST(EngineWide, WidePlansMatchTheCpuRuntime) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  for (Tiny* m : {&tiny_llama(), &tiny_qwen()}) {
    const ModelConfig& c = m->cfg;
    Plan p;
    p.method = "ratequant";
    static_cast<PlanTarget&>(p.model) = cache::plan_target(c);
    p.layers.assign(c.n_layers, std::vector<HeadPlan>(c.n_kv_heads));
    const int widths[] = {6, 5, 3, 8, 8, 2, 5, 4, 7, 6, 4, 5};
    int w = 0;
    for (int l = 0; l < c.n_layers; ++l)
      for (int h = 0; h < c.n_kv_heads; ++h, w += 2) {
        p.layers[l][h].key = Codec::tq_mse(widths[w % 12], c.head_dim, 40 + w);
        p.layers[l][h].value = Codec::tq_mse(widths[(w + 1) % 12], c.head_dim, 41 + w);
      }
    auto codecs = std::make_shared<const cache::PlanCodecs>(p, c);
    ASSERT_NE(CacheFormat::packed(codecs).ext_layout(0), nullptr);
    const std::string name = c.arch + " RateQuant 2..8 bits";
    compare(m->model, c, codecs, name.c_str(), 97, 0);
    compare(m->model, c, codecs, name.c_str(), 97, 64);
  }
}

// Sequences of unequal lengths (5, 37, and 70 + 300 synthetic tokens written
// by fill_synthetic) decoded together and each alone: the same tokens, logits
// within test_engine.cpp's 5e-3 (the batch changes split counts and GEMM
// shapes, i.e. summation orders).
TEST(EngineVq, SequenceInBatchEqualsAlone) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  Tiny& m = tiny_llama();
  const ModelConfig& c = m.cfg;
  auto codecs = tasq_plan(m.model, Values::cq, 3);
  EngineOptions o;
  o.max_batch = 3;
  o.max_prefill_tokens = 128;
  o.prefill_score_bytes = size_t{1} << 20;
  o.pool_bytes = size_t{64} << 20;
  auto eng = Engine::create_synthetic(c, true, kSeed, CacheFormat::packed(codecs), o);
  const int V = c.n_vocab, steps = 4;
  const std::vector<int> lens = {5, 37, 70};
  auto make = [&](int i) {
    const int s = eng->add_sequence(lens[i] + 300 + steps);
    eng->prefill(s, random_tokens(lens[i], V, 100 + i), i == 1 ? PrefillMode::serving : PrefillMode::evaluation, {});
    if (i == 2) eng->fill_synthetic(s, 300, 5);
    return s;
  };
  const std::vector<int> batch = {make(0), make(1), make(2)};
  const std::vector<int32_t> start = {11, 22, 33};
  std::vector<int32_t> out_b(steps * 3);
  std::vector<float> log_b(3 * size_t(V));
  eng->decode(batch, start, steps, out_b, log_b);
  for (int i = 0; i < 3; ++i) {
    const int s = make(i);
    std::vector<int32_t> out(steps);
    std::vector<float> lg(V);
    eng->decode(std::span<const int>(&s, 1), std::span<const int32_t>(&start[i], 1), steps, out, lg);
    for (int k = 0; k < steps; ++k) EXPECT_EQ(out[k], out_b[k * 3 + i]) << "seq " << i << " step " << k;
    const std::vector<float> in_batch(log_b.begin() + size_t(i) * V, log_b.begin() + size_t(i + 1) * V);
    const double e = rel_l2(in_batch, lg, 0, V);
    std::printf("  TaSQ batch vs alone, sequence of %d tokens: rel L2 %.3e\n", int(eng->seq_length(s)), e);
    EXPECT_LT(e, 5e-3);
  }
}

// Host part (runs without a GPU): the test plans above are valid TaSQ plans
// the engine serves, their pages are the CPU packed cache's, and the CPU
// runtime runs them (what the GPU tests compare with).
TEST(EngineVq, TestPlansAreServed) {
  for (Tiny* m : {&tiny_llama(), &tiny_qwen()})
    for (const Values v : {Values::cq, Values::fp16, Values::tq3}) {
      auto codecs = tasq_plan(m->model, v, 7 + static_cast<uint32_t>(v));
      EXPECT_EQ(CacheFormat::unsupported_reason(*codecs), "");
      const CacheFormat f = CacheFormat::packed(codecs);
      cache::PackedKVCache kv(m->cfg.kv_shape(70), codecs);
      std::vector<float> lg(size_t(70) * m->cfg.n_vocab);
      m->model.forward(random_tokens(70, m->cfg.n_vocab, 1), 0, kv, lg.data(), true);
      for (int l = 0; l < m->cfg.n_layers; ++l) {
        ASSERT_NE(f.vq(l), nullptr);
        EXPECT_EQ(f.page_bytes(l), kv.layout(l).page_bytes() + kv.vq_layout(l)->page_bytes());
      }
      for (float x : lg) ASSERT_TRUE(std::isfinite(x));
    }
}
