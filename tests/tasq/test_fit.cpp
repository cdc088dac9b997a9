// k-means codebooks (Faiss) and the whole TaSQ / CQ fit on a tiny model:
// plan validity, what each ablation switches, files round trip, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <random>

#include "../support/tiny_model.h"
#include "ratekv/cache/fake_quant_cache.h"
#include "ratekv/cache/plan_codecs.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/tasq/fit.h"
#include "ratekv/tasq/grouping.h"
#include "ratekv/tasq/kmeans.h"

using namespace ratekv;
using namespace ratekv::tasq;

TEST(KMeans, LloydFixedPointDeterministicWeighted) {
  // 4 well-separated centers in 3-D, 50 points each with small noise.
  const float centers[4][3] = {{10, 0, 0}, {0, 10, 0}, {0, 0, 10}, {-10, -10, -10}};
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 0.1f);
  std::vector<float> x;
  for (int i = 0; i < 200; ++i)
    for (int k = 0; k < 3; ++k) x.push_back(centers[i % 4][k] + nd(rng));
  KMeansOptions o;
  o.n_centroids = 4;
  o.n_iter = 25;
  o.seed = 7;
  const auto c = kmeans_codebook(x.data(), 200, 3, {}, o);
  ASSERT_EQ(c.size(), 12u);
  // Lloyd's fixed point: every centroid is the mean of the points nearest to
  // it (random initialization may merge two clusters: a local optimum is
  // still a fixed point), and the SSE is below the one-centroid SSE.
  std::vector<double> sum(12, 0.0), cnt(4, 0.0);
  double sse = 0.0, sse1 = 0.0, mean[3] = {0, 0, 0};
  for (int i = 0; i < 200; ++i)
    for (int k = 0; k < 3; ++k) mean[k] += x[i * 3 + k] / 200.0;
  for (int i = 0; i < 200; ++i) {
    int arg = 0;
    double best = 1e30;
    for (int j = 0; j < 4; ++j) {
      double d = 0;
      for (int k = 0; k < 3; ++k) d += (x[i * 3 + k] - c[j * 3 + k]) * (x[i * 3 + k] - c[j * 3 + k]);
      if (d < best) best = d, arg = j;
    }
    sse += best;
    for (int k = 0; k < 3; ++k) sum[arg * 3 + k] += x[i * 3 + k], sse1 += (x[i * 3 + k] - mean[k]) * (x[i * 3 + k] - mean[k]);
    cnt[arg] += 1;
  }
  for (int j = 0; j < 4; ++j) {
    ASSERT_GT(cnt[j], 0);
    for (int k = 0; k < 3; ++k) EXPECT_NEAR(c[j * 3 + k], sum[j * 3 + k] / cnt[j], 1e-3);
  }
  EXPECT_LT(sse, 0.5 * sse1);
  EXPECT_EQ(kmeans_codebook(x.data(), 200, 3, {}, o), c);
  // Weighted: one cluster (two points) where the heavy point pulls the centroid.
  std::vector<float> two{0.0f, 1.0f};
  KMeansOptions one;
  one.n_centroids = 1;
  const auto wc = kmeans_codebook(two.data(), 2, 1, {3.0f, 1.0f}, one);
  EXPECT_NEAR(wc[0], 0.25f, 1e-6f);
  EXPECT_THROW(kmeans_codebook(x.data(), 3, 3, {}, o), Error);  // fewer points than centroids
  std::vector<float> nan_pts{0.0f, std::nanf("")};
  EXPECT_THROW(kmeans_codebook(nan_pts.data(), 2, 1, {}, one), Error);
  EXPECT_THROW(kmeans_codebook(two.data(), 2, 1, {-1.0f, 1.0f}, one), Error);
}

namespace {

std::vector<int32_t> tokens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> u(0, 36);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = u(rng);
  return t;
}

}  // namespace

TEST(TasqFit, TinyModelPlansAndAblations) {
  Model m = ratekv_test::tiny_model(5, RopeLayout::Interleaved, 8);
  const ModelConfig& cfg = m.config();
  const auto toks = tokens(200, 1);
  const FitCaptures cap = capture_for_fit(m, toks, 50, true);
  ASSERT_EQ(cap.n_tokens, 200);
  FitOptions o;
  o.group = 4;
  o.centroids = 16;
  o.value_group = 4;
  o.value_centroids = 8;
  o.kmeans_iters = 10;
  const FitResult r = fit_vq_plan(cap, o);
  const Plan& p = r.plan;
  EXPECT_NO_THROW(p.validate());
  // 2 groups × 4 bits / 8 channels = 1 bit + shared fp16 scale over 2 heads × 8.
  EXPECT_NEAR(p.achieved().k, 1.0 + 16.0 / 16.0, 1e-12);
  EXPECT_NEAR(p.achieved().k_code, 1.0, 1e-12);
  EXPECT_NEAR(p.achieved().v, 2 * 3.0 / 8.0, 1e-12);
  EXPECT_EQ(p.fit["kmeans"], "plain (unweighted)");
  for (const auto& e : r.diagnostics["key_groups"]) {
    EXPECT_LE(e["logdet_chosen"].get<double>(), e["logdet_contiguous_pairs"].get<double>() + 1e-9);
  }
  for (int l = 0; l < cfg.n_layers; ++l)
    for (int h = 0; h < cfg.n_kv_heads; ++h) {
      const auto& e = r.tensors.at(l, h, 0);
      EXPECT_TRUE(e.present);
      EXPECT_EQ(e.channel_scale.size(), 8u);
      EXPECT_EQ(p.layers[l][h].key.norm, NormStorage::SharedFP16);
      EXPECT_TRUE(r.tensors.at(l, h, 1).channel_scale.empty());  // values: CQ
    }
  // The codecs serve the fake-quant cache; the reconstruction error of the
  // fitted codebooks on the calibration keys is below the keys' energy.
  auto codecs = std::make_shared<const cache::PlanCodecs>(p, cfg, "fit", std::make_shared<VqTensors>(r.tensors));
  for (int l = 0; l < cfg.n_layers; ++l) {
    std::vector<float> out(cap.k_pre[l].size());
    codecs->fake_quant_layer(l, cache::KVSide::key, cap.k_pre[l].data(), 200, out.data());
    double err = 0, en = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      err += (out[i] - cap.k_pre[l][i]) * (out[i] - cap.k_pre[l][i]);
      en += cap.k_pre[l][i] * cap.k_pre[l][i];
    }
    EXPECT_LT(err, 0.5 * en) << "layer " << l;
  }
  // Same seed → same plan and codebooks; another seed → other codebooks.
  const FitResult r2 = fit_vq_plan(cap, o);
  EXPECT_EQ(r2.tensors.at(1, 1, 0).codebooks, r.tensors.at(1, 1, 0).codebooks);
  o.seed = 1;
  EXPECT_NE(fit_vq_plan(cap, o).tensors.at(1, 1, 0).codebooks, r.tensors.at(1, 1, 0).codebooks);
  o.seed = 0;

  // Ablations switch exactly their component.
  FitOptions nw = o;
  nw.weighting = false;
  const FitResult a = fit_vq_plan(cap, nw);
  EXPECT_TRUE(a.tensors.at(0, 0, 0).channel_scale.empty());
  EXPECT_EQ(a.plan.layers[0][0].key.norm, NormStorage::SharedFP16);
  FitOptions nn = o;
  nn.normalization = false;
  const FitResult b = fit_vq_plan(cap, nn);
  EXPECT_EQ(b.plan.layers[0][0].key.norm, NormStorage::None);
  EXPECT_NEAR(b.plan.achieved().k, 1.0, 1e-12);
  FitOptions ng = o;
  ng.grouping = false;
  const FitResult c = fit_vq_plan(cap, ng);
  EXPECT_EQ(c.plan.layers[2][1].key.groups[0].channels, (std::vector<int>{0, 1, 2, 3}));
  FitOptions cq = o;
  cq.method = "cq";
  cq.values = "fp16";
  const FitResult q = fit_vq_plan(cap, cq);
  EXPECT_EQ(q.plan.method, "cq");
  EXPECT_EQ(q.plan.layers[0][0].key.norm, NormStorage::None);
  EXPECT_TRUE(q.tensors.at(0, 0, 0).channel_scale.empty());
  EXPECT_EQ(q.plan.layers[0][0].value.kind, CodecKind::FP16);
  EXPECT_EQ(q.plan.layers[0][1].key.groups[1].channels, (std::vector<int>{4, 5, 6, 7}));

  // Files: plan + side file beside it, loaded by PlanCodecs through the plan path.
  const auto dir = std::filesystem::temp_directory_path() / "ratekv_tasq_fit_test";
  std::filesystem::create_directories(dir);
  Plan saved = p;
  saved.tensors_file = "tiny.tensors.safetensors";
  r.tensors.save((dir / "tiny.tensors.safetensors").string());
  saved.save((dir / "tiny.json").string());
  const Plan loaded = Plan::load((dir / "tiny.json").string());
  const cache::PlanCodecs from_file(loaded, cfg, "tiny.json");
  std::vector<float> x1(cap.k_pre[1].begin(), cap.k_pre[1].begin() + 37 * 16), y1(x1.size()), y2(x1.size());
  from_file.fake_quant_layer(1, cache::KVSide::key, x1.data(), 37, y1.data());
  codecs->fake_quant_layer(1, cache::KVSide::key, x1.data(), 37, y2.data());
  EXPECT_EQ(y1, y2);
  // A plan for another model is refused.
  Model other = ratekv_test::tiny_model(5, RopeLayout::Interleaved, 6);  // head_dim 6, plan has 8
  EXPECT_THROW(cache::PlanCodecs(loaded, other.config(), "tiny.json"), Error);
  std::filesystem::remove_all(dir);
}

TEST(TasqFit, BadOptionsAreErrors) {
  Model m = ratekv_test::tiny_model(5, RopeLayout::Interleaved, 8);
  const auto toks = tokens(40, 2);
  const FitCaptures cap = capture_for_fit(m, toks, 20, false);
  FitOptions o;
  o.group = 4;
  o.centroids = 16;
  o.values = "fp16";
  EXPECT_NO_THROW(fit_vq_plan(cap, o));
  FitOptions x = o;
  x.centroids = 12;  // not a power of two
  EXPECT_THROW(fit_vq_plan(cap, x), Error);
  x = o;
  x.centroids = 64;  // more centroids than tokens
  EXPECT_THROW(fit_vq_plan(cap, x), Error);
  x = o;
  x.group = 3;
  EXPECT_THROW(fit_vq_plan(cap, x), Error);
  x = o;
  x.values = "cq";  // values were not captured
  EXPECT_THROW(fit_vq_plan(cap, x), Error);
  x = o;
  x.values = "cq";
  x.value_group = 0;  // d % 0 was evaluated before the >= 1 test: SIGFPE instead of an Error
  EXPECT_THROW(fit_vq_plan(cap, x), Error);
  x = o;
  x.method = "nsnq";
  EXPECT_THROW(fit_vq_plan(cap, x), Error);
  EXPECT_THROW(capture_for_fit(m, {}, 20, false), Error);
  EXPECT_THROW(capture_for_fit(m, toks, 0, false), Error);
}

TEST(TasqFit, FisherWeightsAreTheChainRuleWeights) {
  // TaSQ with query-guided channel weights a_c = sqrt(w_c) ≠ 1 (w normalized to
  // unit mean per head, a rounded to fp16) and the shared per-token fp16 scale
  // s_t ≠ 1: the k-means runs in the VQ space z_t = a ⊙ x_t / s_t with
  // per-token weights F_t = s_t² Σ_{i∈G} g_{t,i}² / a_i² (docs/design.md
  // §5.4, chain rule through z = a·x/s). Two well-separated clusters (signs) and
  // K = 2: each centroid is the F-weighted mean of its cluster's z, rounded to
  // fp16. Token amplitudes (hence s_t), per-token offsets and gradients that
  // favour different channels per token make the s² and 1/a² factors move the
  // means: dropping either is checked to give other centroids.
  Model m = ratekv_test::tiny_model(5, RopeLayout::Interleaved, 8);
  const ModelConfig& cfg = m.config();
  const int H = cfg.n_kv_heads, d = 8, g = 4;
  FitCaptures cap;
  cap.cfg = cfg;
  const int64_t N = 24, row = int64_t{H} * d;
  cap.n_tokens = N;
  cap.ctx = N;
  cap.query_weights.assign(cfg.n_layers * row, 1.0);
  for (int l = 0; l < cfg.n_layers; ++l)
    for (int64_t i = 0; i < row; ++i)  // the low two channels of each group weigh ~16× the high two
      cap.query_weights[l * row + i] = ((i % 4) < 2 ? 4.0 : 0.25) * (1.0 + 0.1 * ((i * 5 + l) % 7));
  cap.k_pre.assign(cfg.n_layers, std::vector<float>(N * row));
  cap.k_grad_sq.assign(cfg.n_layers, std::vector<float>(N * row));
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 0.6f);
  for (int l = 0; l < cfg.n_layers; ++l)
    for (int64_t t = 0; t < N; ++t) {
      const float amp = 1.0f + static_cast<float>((t * 5) % 8);  // s_t varies ~8×
      for (int64_t i = 0; i < row; ++i) {
        cap.k_pre[l][t * row + i] = amp * (t % 2 ? 3.0f : -3.0f) + nd(rng);  // offsets not scaled by amp
        // Gradients on the low channels of each group for some tokens, on the high ones for others.
        const bool low = (i % 4) < 2;
        cap.k_grad_sq[l][t * row + i] = 0.05f + ((t / 2) % 3 == 0 ? (low ? 6.0f : 0.1f) : (low ? 0.1f : 3.0f));
      }
    }
  FitOptions o;
  o.method = "tasq";
  o.group = g;
  o.centroids = 2;
  o.grouping = false;  // contiguous RoPE pairs: with the interleaved layout, channels {0..3}, {4..7}
  o.values = "fp16";
  o.fisher = true;
  o.kmeans_iters = 50;
  const FitResult r = fit_vq_plan(cap, o);
  EXPECT_EQ(r.plan.fit["kmeans"].get<std::string>().rfind("fisher", 0), 0u);
  ASSERT_EQ(r.plan.layers[0][0].key.norm, NormStorage::SharedFP16);
  int compared = 0, s2_matters = 0, inv_a2_matters = 0;
  for (int l = 0; l < cfg.n_layers; ++l) {
    // Reference a (unit-mean weights per head, sqrt, fp16) and s_t (fp16 RMS of a ⊙ x over the layer).
    std::vector<double> a(row);
    for (int h = 0; h < H; ++h) {
      double mean = 0;
      for (int c = 0; c < d; ++c) mean += cap.query_weights[l * row + h * d + c] / d;
      for (int c = 0; c < d; ++c)
        a[h * d + c] = round_fp16(static_cast<float>(std::sqrt(cap.query_weights[l * row + h * d + c] / mean)));
    }
    std::vector<double> sc(N);
    for (int64_t t = 0; t < N; ++t) {
      double acc = 0;
      for (int64_t i = 0; i < row; ++i) acc += std::pow(a[i] * cap.k_pre[l][t * row + i], 2);
      sc[t] = round_fp16(static_cast<float>(std::sqrt(acc / row)));
    }
    for (int h = 0; h < H; ++h) {
      EXPECT_EQ(r.tensors.at(l, h, 0).channel_scale.size(), static_cast<size_t>(d));
      for (int c = 0; c < d; ++c) EXPECT_EQ(r.tensors.at(l, h, 0).channel_scale[c], static_cast<float>(a[h * d + c]));
      for (int gi = 0; gi < d / g; ++gi) {
        ASSERT_EQ(r.plan.layers[l][h].key.groups[gi].channels, (std::vector<int>{gi * g, gi * g + 1, gi * g + 2, gi * g + 3}));
        const auto& cb = r.tensors.at(l, h, 0).codebooks;  // (2 groups, 2 centroids, 4)
        for (int sign = 0; sign < 2; ++sign) {
          // F-weighted mean of z over the cluster, with the full chain-rule weight and with one factor dropped.
          std::vector<double> num(g, 0.0), num_no_s2(g, 0.0), num_no_a2(g, 0.0);
          double den = 0, den_no_s2 = 0, den_no_a2 = 0;
          for (int64_t t = sign; t < N; t += 2) {
            double ga = 0, gsum = 0;
            for (int i = 0; i < g; ++i) {
              const int64_t o_ = t * row + h * d + gi * g + i;
              ga += cap.k_grad_sq[l][o_] / (a[h * d + gi * g + i] * a[h * d + gi * g + i]);
              gsum += cap.k_grad_sq[l][o_];
            }
            const double f = sc[t] * sc[t] * ga, f_no_s2 = ga, f_no_a2 = sc[t] * sc[t] * gsum;
            for (int i = 0; i < g; ++i) {
              const int64_t o_ = t * row + h * d + gi * g + i;
              const double z = static_cast<float>(a[h * d + gi * g + i] * cap.k_pre[l][o_] * (1.0f / static_cast<float>(sc[t])));
              num[i] += f * z;
              num_no_s2[i] += f_no_s2 * z;
              num_no_a2[i] += f_no_a2 * z;
            }
            den += f;
            den_no_s2 += f_no_s2;
            den_no_a2 += f_no_a2;
          }
          const int j = (cb[(gi * 2 + 0) * g] > 0) == (sign == 1) ? 0 : 1;  // the centroid on this cluster's side
          for (int i = 0; i < g; ++i) {
            const double want = num[i] / den, got = cb[(gi * 2 + j) * g + i];
            const double tol = 1e-3 * std::abs(want) + 1e-4;  // fp16 rounding of the centroid: ≤ 2^-11 relative
            EXPECT_NEAR(got, want, tol) << "layer " << l << " head " << h << " group " << gi << " sign " << sign;
            EXPECT_EQ(got, round_fp16(static_cast<float>(got)));  // stored as fp16 numbers
            s2_matters += std::abs(num_no_s2[i] / den_no_s2 - want) > 10 * tol;
            inv_a2_matters += std::abs(num_no_a2[i] / den_no_a2 - want) > 10 * tol;
            ++compared;
          }
        }
      }
    }
  }
  EXPECT_EQ(compared, cfg.n_layers * H * (d / g) * 2 * g);
  EXPECT_GT(s2_matters, compared / 8) << "the test must fail without the s_t² factor";
  EXPECT_GT(inv_a2_matters, compared / 8) << "the test must fail without the 1/a_i² factor";
  // Without gradients → Error.
  cap.k_grad_sq.clear();
  EXPECT_THROW(fit_vq_plan(cap, o), Error);
}

TEST(TasqFit, FisherGroupWithZeroGradientsIsFittedUnweighted) {
  // Gemma 3's layer 12 has key channels no query reads (q-norm zeroes them): their
  // gradients are exactly 0 on every token. Such a group is fitted unweighted (the
  // same codebook as the plain fit), the other groups stay Fisher-weighted, and the
  // plan counts it; a non-finite gradient stays an error.
  Model m = ratekv_test::tiny_model(5, RopeLayout::Interleaved, 8);
  FitCaptures cap = capture_for_fit(m, tokens(41, 4), 20, false, true);
  const int64_t row = 16;  // 2 KV heads × 8
  const int g = 4, K = 8;
  for (int64_t t = 0; t < cap.n_tokens; ++t)
    for (int c = 0; c < g; ++c) cap.k_grad_sq[1][t * row + 8 + c] = 0.0f;  // layer 1, head 1, channels 0..3
  FitOptions o;
  o.group = g;
  o.centroids = K;
  o.grouping = false;  // contiguous RoPE pairs: channels {0..3}, {4..7}
  o.values = "fp16";
  o.fisher = true;
  const FitResult f = fit_vq_plan(cap, o);
  EXPECT_EQ(f.plan.fit["fisher_zero_groups"].get<int>(), 1);
  o.fisher = false;
  const FitResult p = fit_vq_plan(cap, o);
  const auto& fcb = f.tensors.at(1, 1, 0).codebooks;
  const auto& pcb = p.tensors.at(1, 1, 0).codebooks;  // (2 groups, K, g)
  ASSERT_EQ(fcb.size(), static_cast<size_t>(2 * K * g));
  EXPECT_EQ(std::vector<float>(fcb.begin(), fcb.begin() + K * g), std::vector<float>(pcb.begin(), pcb.begin() + K * g));
  EXPECT_NE(std::vector<float>(fcb.begin() + K * g, fcb.end()), std::vector<float>(pcb.begin() + K * g, pcb.end()));
  EXPECT_NE(f.tensors.at(1, 0, 0).codebooks, p.tensors.at(1, 0, 0).codebooks);
  o.fisher = true;
  cap.k_grad_sq[2][5 * row + 3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(fit_vq_plan(cap, o), Error);
}

TEST(TasqFit, FisherCaptureRunsTheBackwardPass) {
  Model m = ratekv_test::tiny_model(5, RopeLayout::Interleaved, 8);
  const auto toks = tokens(41, 4);  // windows of 20, 20 and 1 (no loss: zero gradient)
  const FitCaptures cap = capture_for_fit(m, toks, 20, false, true);
  ASSERT_EQ(cap.k_grad_sq.size(), 3u);
  const int64_t row = 16;
  double inner = 0;
  for (int64_t i = 0; i < 19 * row; ++i) inner += cap.k_grad_sq[0][i];
  EXPECT_GT(inner, 0.0);
  for (int64_t i = 19 * row; i < 20 * row; ++i) EXPECT_EQ(cap.k_grad_sq[0][i], 0.0f);  // last token of a window
  for (int64_t i = 40 * row; i < 41 * row; ++i) EXPECT_EQ(cap.k_grad_sq[2][i], 0.0f);  // one-token window
  FitOptions o;
  o.group = 4;
  o.centroids = 16;
  o.values = "fp16";
  o.fisher = true;
  const FitResult f = fit_vq_plan(cap, o);
  o.fisher = false;
  const FitResult p = fit_vq_plan(cap, o);
  EXPECT_NE(f.tensors.at(0, 0, 0).codebooks, p.tensors.at(0, 0, 0).codebooks);
}
