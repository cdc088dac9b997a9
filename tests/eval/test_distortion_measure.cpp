// measure_distortion_curves on a tiny random model against an independent
// per-head computation (captured K/V, PlanCodecs::fake_quant per head), and
// its argument errors.
#include <gtest/gtest.h>

#include <cmath>

#include "ratekv/alloc/make_plan.h"
#include "ratekv/cache/plan_codecs.h"
#include "ratekv/calib/calibrate.h"
#include "ratekv/common/error.h"
#include "ratekv/eval/distortion_measure.h"
#include "../support/tiny_model.h"

using namespace ratekv;

namespace {

const std::vector<int32_t> kTokens = {3, 36, 0, 17, 17, 5, 22, 9, 1, 30, 11, 2, 8, 33, 4, 19, 27};

}  // namespace

TEST(DistortionMeasure, MatchesPerHeadReference) {
  Model m = ratekv_test::tiny_model(3);
  const ModelConfig& cfg = m.config();
  const int64_t ctx = 9;  // chunks of 9 + 8 tokens
  const CalibStats st = calib::calibrate(m, kTokens, ctx).to_alloc_stats();
  eval::CurveMeasureOptions opt;
  opt.quantizers = {"tq-mse", "block-gtq", "kivi"};
  opt.bits = {3, 1, 2};  // unsorted on purpose
  opt.ctx = ctx;
  opt.group_size = 3;  // kivi: 3 channels (values) / 3 tokens (keys) per scale group
  opt.seed = 5;
  const auto curves = eval::measure_distortion_curves(m, kTokens, st, opt);
  ASSERT_EQ(curves.size(), 3u);

  // Reference: capture every chunk's post-RoPE K and V, then quantize each head's rows.
  const int L = cfg.n_layers, H = cfg.n_kv_heads, d = cfg.head_dim;
  std::vector<std::vector<std::vector<float>>> K(L), V(L);  // [layer][chunk] (T, H, d)
  ForwardHooks hooks;
  hooks.on_layer = [&](const LayerActivations& a) {
    K[a.layer].emplace_back(a.k_post, a.k_post + a.n * H * d);
    V[a.layer].emplace_back(a.v, a.v + a.n * H * d);
  };
  for (int64_t s = 0; s < (int64_t)kTokens.size(); s += ctx) {
    const int64_t n = std::min<int64_t>(ctx, (int64_t)kTokens.size() - s);
    DenseKVCache kv = m.make_dense_cache(n);
    m.forward(std::span<const int32_t>(kTokens).subspan(s, n), 0, kv, nullptr, false, &hooks);
  }
  const double N = (double)kTokens.size();
  for (const std::string q : {"tq-mse", "block-gtq", "kivi"}) {
    const calib::QuantizerCurves& c = curves.at(q);
    ASSERT_EQ(c.bits, (std::vector<double>{1, 2, 3}));
    for (int j = 0; j < 3; ++j) {
      alloc::PlanRequest rq;
      rq.budget_unit = "code";
      rq.k_bits = rq.v_bits = j + 1;
      rq.seed = 5;
      rq.group_size = 3;
      if (q == "block-gtq") {
        rq.method = "block-gtq";
        rq.b_min = 0;
        rq.b_max = 8;
      } else {
        rq.method = "uniform";
        rq.quantizer = q;
      }
      const cache::PlanCodecs codecs(alloc::make_plan(st, rq), cfg);
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h)
          for (int side = 0; side < 2; ++side) {
            double sq = 0;
            for (const auto& chunk : side == 0 ? K[l] : V[l]) {
              const int64_t T = (int64_t)chunk.size() / (H * d);
              std::vector<float> x(T * d), xh(T * d);
              for (int64_t t = 0; t < T; ++t)
                for (int i = 0; i < d; ++i) x[t * d + i] = chunk[(t * H + h) * d + i];
              codecs.fake_quant(l, h, side == 0 ? cache::KVSide::key : cache::KVSide::value, x.data(), T, xh.data());
              for (int64_t i = 0; i < T * d; ++i) sq += ((double)x[i] - xh[i]) * ((double)x[i] - xh[i]);
            }
            const double want = sq / (N * d);
            const double got = (side == 0 ? c.mse_k : c.mse_v)[(size_t)(l * H + h) * 3 + j];
            EXPECT_NEAR(got, want, 1e-12 * want) << q << " b" << j + 1 << " l" << l << " h" << h << " side " << side;
            if (j > 0) {
              EXPECT_LT(got, (side == 0 ? c.mse_k : c.mse_v)[(size_t)(l * H + h) * 3 + j - 1]) << q;
            }
          }
    }
    // The stored fit is the shared-β fit of the measurements.
    const quant::SharedBetaFit fk = quant::fit_rd_shared_beta(c.bits, c.mse_k, (size_t)L * H);
    EXPECT_DOUBLE_EQ(c.fit.beta_k, fk.beta);
    EXPECT_GT(c.fit.beta_k, 1.0);
  }
}

TEST(DistortionMeasure, ArgumentErrors) {
  Model m = ratekv_test::tiny_model(3);
  const CalibStats st = calib::calibrate(m, kTokens, 9).to_alloc_stats();
  eval::CurveMeasureOptions opt;
  opt.ctx = 9;
  opt.group_size = 3;
  opt.quantizers = {"tq-prod"};
  EXPECT_THROW(eval::measure_distortion_curves(m, kTokens, st, opt), Error);
  opt.quantizers = {"tq-mse", "tq-mse"};
  EXPECT_THROW(eval::measure_distortion_curves(m, kTokens, st, opt), Error);
  opt.quantizers = {"tq-mse"};
  opt.bits = {2};
  EXPECT_THROW(eval::measure_distortion_curves(m, kTokens, st, opt), Error);
  opt.bits = {2, 2, 3};
  EXPECT_THROW(eval::measure_distortion_curves(m, kTokens, st, opt), Error);
  opt.bits = {0, 2};
  EXPECT_THROW(eval::measure_distortion_curves(m, kTokens, st, opt), Error);
  opt.bits = {1, 9};
  EXPECT_THROW(eval::measure_distortion_curves(m, kTokens, st, opt), Error);
  opt.bits = {1, 2};
  EXPECT_THROW(eval::measure_distortion_curves(m, {}, st, opt), Error);
}

// The accumulator on K/V given one token at a time (the Python package feeds it
// from transformers' hooks) equals the runtime's chunks of 9: TQ-MSE and
// Block-GTQ quantize each token on its own, so the split must not matter.
TEST(DistortionAccumulator, TokenByTokenEqualsRuntimeChunks) {
  Model m = ratekv_test::tiny_model(3);
  const ModelConfig& cfg = m.config();
  const CalibStats st = calib::calibrate(m, kTokens, 9).to_alloc_stats();
  eval::CurveMeasureOptions opt;
  opt.quantizers = {"tq-mse", "block-gtq"};
  opt.bits = {1, 2, 4};
  opt.ctx = 9;
  opt.seed = 2;
  const auto want = eval::measure_distortion_curves(m, kTokens, st, opt);

  eval::DistortionAccumulator acc(cfg, st, opt);
  const int64_t row = int64_t{cfg.n_kv_heads} * cfg.head_dim;
  ForwardHooks hooks;
  hooks.on_layer = [&](const LayerActivations& a) {
    for (int64_t t = 0; t < a.n; ++t) acc.add(a.layer, a.k_post + t * row, a.v + t * row, 1);
  };
  for (int64_t s = 0; s < (int64_t)kTokens.size(); s += 9) {
    const int64_t n = std::min<int64_t>(9, (int64_t)kTokens.size() - s);
    DenseKVCache kv = m.make_dense_cache(n);
    m.forward(std::span<const int32_t>(kTokens).subspan(s, n), 0, kv, nullptr, false, &hooks);
  }
  EXPECT_EQ(acc.tokens(0), (int64_t)kTokens.size());
  const auto got = acc.finish();
  for (const std::string q : {"tq-mse", "block-gtq"}) {
    const auto &a = got.at(q), &b = want.at(q);
    ASSERT_EQ(a.mse_k.size(), b.mse_k.size());
    for (size_t i = 0; i < a.mse_k.size(); ++i) {
      EXPECT_NEAR(a.mse_k[i], b.mse_k[i], 1e-12 * b.mse_k[i]) << q << " " << i;
      EXPECT_NEAR(a.mse_v[i], b.mse_v[i], 1e-12 * b.mse_v[i]) << q << " " << i;
    }
    EXPECT_NEAR(a.fit.beta_k, b.fit.beta_k, 1e-9 * b.fit.beta_k);
  }
}

TEST(DistortionAccumulator, BadInputNamed) {
  Model m = ratekv_test::tiny_model(3);
  const ModelConfig& cfg = m.config();
  const CalibStats st = calib::calibrate(m, kTokens, 9).to_alloc_stats();
  eval::CurveMeasureOptions opt;
  opt.quantizers = {"tq-mse"};
  opt.bits = {1, 2};
  eval::DistortionAccumulator acc(cfg, st, opt);
  const size_t n = static_cast<size_t>(cfg.n_kv_heads) * cfg.head_dim;
  std::vector<float> k(n), v(n);
  for (size_t i = 0; i < n; ++i) {
    k[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
    v[i] = 0.125f * static_cast<float>(i % 5) + 0.1f;
  }
  auto msg = [&](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg([&] { acc.finish(); }).find("no activations"), std::string::npos);
  EXPECT_NE(msg([&] { acc.add(cfg.n_layers, k.data(), v.data(), 1); }).find("outside"), std::string::npos);
  EXPECT_NE(msg([&] { acc.add(0, k.data(), v.data(), 0); }).find("chunk of 0"), std::string::npos);
  v[3] = std::nanf("");
  EXPECT_NE(msg([&] { acc.add(1, k.data(), v.data(), 1); }).find("layer 1: value element 3"), std::string::npos);
  v[3] = 0.5f;
  acc.add(0, k.data(), v.data(), 1);  // layer 1 has none: finish names it
  EXPECT_NE(msg([&] { acc.finish(); }).find("layer 1 received 0 tokens"), std::string::npos);
  CalibStats other = st;
  other.model.n_layers += 1;
  EXPECT_THROW(eval::DistortionAccumulator(cfg, other, opt), Error);
}
