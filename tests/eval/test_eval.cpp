// Evaluation metrics: logit MAE / attention KL closed forms, baseline plans,
// and a small end-to-end evaluate_plans run (perplexity itself is tested in
// tests/model with ratekv/model/perplexity.h).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ratekv/cache/fake_quant_cache.h"
#include "ratekv/cache/plan_codecs.h"
#include "ratekv/common/error.h"
#include "ratekv/eval/baseline_plans.h"
#include "ratekv/eval/logit_error.h"
#include "ratekv/eval/plan_eval.h"

#include "../support/tiny_model.h"

using namespace ratekv;
using namespace ratekv::eval;

namespace {

using ratekv_test::randn;

Model tiny_model() { return ratekv_test::eval_tiny_model(); }

std::vector<int32_t> tokens(size_t n) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 7 + 3) % 41);
  return t;
}

}  // namespace

TEST(LogitError, ExactKeysGiveZero) {
  std::mt19937 g(1);
  const auto q = randn(9 * 4 * 8, g, 1.0f), k = randn(9 * 2 * 8, g, 1.0f);
  const LogitErrorSums s = logit_error(q.data(), k.data(), k.data(), 9, 4, 2, 8, 0.35f);
  EXPECT_EQ(s.abs_sum, 0.0);
  EXPECT_EQ(s.kl_sum, 0.0);
  EXPECT_EQ(s.pairs, 4 * 9 * 10 / 2);  // heads × causal pairs
  EXPECT_EQ(s.rows, 4 * 9);
}

// n = 2, one head, d = 2, scale 1. q0 = (1, 0), q1 = (0, 2); k0 = (1, 1), k1 = (2, 0).
// k̂0 = k0 + (0, 0.5): q0·δ = 0, q1·δ = 1 → pairs (0,0), (1,0), (1,1) errors 0, 1, 0: MAE = 1/3.
// Row 0 sees one key: KL 0. Row 1: logits (2, 0) vs (3, 0):
//   KL = p0 ln(p0/p̂0) + p1 ln(p1/p̂1), p = softmax(2, 0), p̂ = softmax(3, 0); mean over 2 rows.
TEST(LogitError, HandComputedTwoTokens) {
  const std::vector<float> q = {1, 0, 0, 2}, k = {1, 1, 2, 0}, kh = {1, 1.5f, 2, 0};
  const LogitErrorSums s = logit_error(q.data(), k.data(), kh.data(), 2, 1, 1, 2, 1.0f);
  EXPECT_EQ(s.pairs, 3);
  EXPECT_NEAR(s.mae(), 1.0 / 3.0, 1e-7);
  const double e2 = std::exp(2.0), e3 = std::exp(3.0);
  const double p0 = e2 / (e2 + 1), p1 = 1 / (e2 + 1), h0 = e3 / (e3 + 1), h1 = 1 / (e3 + 1);
  const double kl = p0 * std::log(p0 / h0) + p1 * std::log(p1 / h1);  // ≈ 0.04086
  EXPECT_NEAR(s.kl(), kl / 2, 1e-6);
  EXPECT_NEAR(kl, 0.04086, 1e-4);
  // Scale 0.5 halves the logits: (1, 0) vs (1.5, 0).
  const LogitErrorSums h = logit_error(q.data(), k.data(), kh.data(), 2, 1, 1, 2, 0.5f);
  const double e1 = std::exp(1.0), e15 = std::exp(1.5);
  const double a0 = e1 / (e1 + 1), a1 = 1 / (e1 + 1), b0 = e15 / (e15 + 1), b1 = 1 / (e15 + 1);
  EXPECT_NEAR(h.kl(), (a0 * std::log(a0 / b0) + a1 * std::log(a1 / b1)) / 2, 1e-6);
  EXPECT_NEAR(h.mae(), 1.0 / 3.0, 1e-7);  // MAE is unscaled
}

// GQA: two query heads read one KV head; query stride 2 keeps rows 0 and 2.
TEST(LogitError, GqaAndQueryStride) {
  // n = 3, H = 2, Hkv = 1, d = 1. q rows: t0 (1, 2), t1 (3, 4), t2 (5, 6); k = (1, 1, 1); k̂ = (2, 1, 0).
  const std::vector<float> q = {1, 2, 3, 4, 5, 6}, k = {1, 1, 1}, kh = {2, 1, 0};
  // All rows: errors |q·(k − k̂)| = |q|·|δ_j| with δ = (−1, 0, 1).
  // head 0: t0: 1; t1: 3, 0; t2: 5, 0, 5 → 14 over 6 pairs; head 1: 2; 4, 0; 6, 0, 6 → 18. MAE = 32/12.
  const LogitErrorSums all = logit_error(q.data(), k.data(), kh.data(), 3, 2, 1, 1, 1.0f);
  EXPECT_EQ(all.pairs, 12);
  EXPECT_NEAR(all.mae(), 32.0 / 12.0, 1e-6);
  // Stride 2: rows 0 and 2: head 0: 1 + 10, head 1: 2 + 12 → 25 over 8 pairs.
  const LogitErrorSums st = logit_error(q.data(), k.data(), kh.data(), 3, 2, 1, 1, 1.0f, 2);
  EXPECT_EQ(st.pairs, 8);
  EXPECT_EQ(st.rows, 4);
  EXPECT_NEAR(st.mae(), 25.0 / 8.0, 1e-6);
  EXPECT_THROW(logit_error(q.data(), k.data(), kh.data(), 3, 2, 1, 1, 0.0f), Error);
}

TEST(LogitNmse, PositionBuckets) {
  EXPECT_EQ(position_bucket(0), 0);
  EXPECT_EQ(position_bucket(63), 0);
  EXPECT_EQ(position_bucket(64), 1);
  EXPECT_EQ(position_bucket(127), 1);
  EXPECT_EQ(position_bucket(128), 2);
  EXPECT_EQ(position_bucket(511), 3);
  EXPECT_EQ(position_bucket(512), 4);
  EXPECT_EQ(position_bucket(2047), 5);
  EXPECT_EQ(position_bucket(2048), 6);
  for (int b = 0; b < 12; ++b) {
    EXPECT_EQ(position_bucket(position_bucket_begin(b)), b);
    EXPECT_EQ(position_bucket(position_bucket_begin(b + 1) - 1), b);
  }
  EXPECT_EQ(position_bucket_begin(3), 256);
  EXPECT_THROW(position_bucket(-1), Error);
  EXPECT_THROW(position_bucket_begin(-1), Error);
}

// Scaled keys k̂ = (1 + α)k scale every logit by 1 + α: NMSE = α² in every
// bucket, whatever q and k (random, GQA, n = 131 crosses into bucket 2).
TEST(LogitNmse, ScaledKeysGiveAlphaSquaredEverywhere) {
  std::mt19937 g(5);
  const int64_t n = 131;
  const auto q = randn(n * 4 * 8, g, 1.0f), k = randn(n * 2 * 8, g, 1.0f);
  const double alpha = 0.125;  // (1 + α)·k is exact in float
  std::vector<float> kh(k.size());
  for (size_t i = 0; i < k.size(); ++i) kh[i] = static_cast<float>((1 + alpha) * k[i]);
  const LogitErrorSums s = logit_error(q.data(), k.data(), kh.data(), n, 4, 2, 8, 0.35f);
  ASSERT_EQ(s.by_position.size(), 3u);
  for (int b = 0; b < 3; ++b) EXPECT_NEAR(s.by_position[b].nmse(), alpha * alpha, 1e-5 * alpha * alpha) << b;
  EXPECT_EQ(s.by_position[0].pairs, 4 * 64 * 65 / 2);  // heads × causal pairs of queries 0..63
  EXPECT_EQ(s.by_position[2].pairs, 4 * (129 + 130 + 131));
  EXPECT_NEAR(s.nmse(), alpha * alpha, 1e-5 * alpha * alpha);
  // Exact keys: 0 in every bucket.
  const LogitErrorSums z = logit_error(q.data(), k.data(), k.data(), n, 4, 2, 8, 0.35f);
  for (const auto& b : z.by_position) EXPECT_EQ(b.sq_err, 0.0);
}

// Error only on keys j ≥ 64, d = 1, q = k = 1 (every logit 1), k̂_j = 1 + α
// for j ≥ 64: query i has i − 63 wrong logits (α² each) out of i + 1.
//   bucket 0 (i < 64): 0;  bucket 1: α²·Σ_{i=64}^{127}(i−63) / Σ(i+1) = α²·2080/6176;
//   bucket 2 (i = 128..130): α²·(65+66+67)/(129+130+131) = α²·198/390.
// Query stride 64 keeps rows 0, 64, 128: bucket 1 = α²·1/65, bucket 2 = α²·65/129.
TEST(LogitNmse, HandComputedLateKeyError) {
  const int64_t n = 131;
  const double alpha = 0.5;
  const std::vector<float> q(n, 1.0f), k(n, 1.0f);
  std::vector<float> kh(n, 1.0f);
  for (int64_t j = 64; j < n; ++j) kh[j] = static_cast<float>(1 + alpha);
  const LogitErrorSums s = logit_error(q.data(), k.data(), kh.data(), n, 1, 1, 1, 1.0f);
  ASSERT_EQ(s.by_position.size(), 3u);
  EXPECT_EQ(s.by_position[0].nmse(), 0.0);
  EXPECT_NEAR(s.by_position[1].nmse(), alpha * alpha * 2080.0 / 6176.0, 1e-12);
  EXPECT_NEAR(s.by_position[2].nmse(), alpha * alpha * 198.0 / 390.0, 1e-12);
  EXPECT_NEAR(s.nmse(), alpha * alpha * (2080.0 + 198.0) / (64 * 65 / 2 + 6176.0 + 390.0), 1e-12);
  const LogitErrorSums st = logit_error(q.data(), k.data(), kh.data(), n, 1, 1, 1, 1.0f, 64);
  ASSERT_EQ(st.by_position.size(), 3u);
  EXPECT_EQ(st.by_position[0].pairs, 1);
  EXPECT_NEAR(st.by_position[1].nmse(), alpha * alpha / 65.0, 1e-12);
  EXPECT_NEAR(st.by_position[2].nmse(), alpha * alpha * 65.0 / 129.0, 1e-12);
  // merge() adds bucket sums (a shorter vector grows).
  LogitErrorSums m;
  m.merge(st);
  m.merge(s);
  EXPECT_NEAR(m.by_position[1].sq_err, alpha * alpha * (2080.0 + 1.0), 1e-9);
  EXPECT_EQ(m.by_position[2].pairs, 390 + 129);
}

TEST(BaselinePlans, EffectiveBits) {
  Model m = tiny_model();
  EXPECT_DOUBLE_EQ(baseline_plan("q8_0", m.config()).achieved().k, 8.5);
  EXPECT_DOUBLE_EQ(baseline_plan("q4_0", m.config()).achieved().v, 4.5);
  EXPECT_DOUBLE_EQ(baseline_plan("kivi2", m.config()).achieved().k, 3.0);
  EXPECT_DOUBLE_EQ(baseline_plan("kivi4", m.config()).achieved().total, 5.0);
  EXPECT_DOUBLE_EQ(baseline_plan("fp16", m.config()).achieved().k, 16.0);
  EXPECT_THROW(baseline_plan("q2_k", m.config()), Error);
}

// End to end on the tiny model: an fp16 plan is near-exact, 2-bit KIVI is not,
// deterministic plans have zero spread, the JSON carries every field.
TEST(EvaluatePlans, TinyModelReport) {
  Model m = tiny_model();
  const auto t = tokens(64);
  std::vector<PlanEntry> plans;
  for (const char* n : {"fp16", "kivi2", "q4_0"}) plans.push_back({n, "", baseline_plan(n, m.config())});
  Plan u = baseline_plan("fp16", m.config());
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 2; ++h) {
      u.layers[l][h].key = Codec::tq_mse(2, 32, 17 + l * 2 + h);
      u.layers[l][h].value = Codec::tq_mse(2, 32, 29 + l * 2 + h);
    }
  u.method = "uniform";
  u.budget_k = u.budget_v = 2.5;
  plans.push_back({"tq2", "", u});
  EvalOptions opt;
  opt.ctx = 32;
  opt.n_seeds = 3;
  const auto r = evaluate_plans(m, t, plans, opt);
  ASSERT_EQ(r["plans"].size(), 4u);
  EXPECT_EQ(r["n_chunks"], 2);
  EXPECT_EQ(r["ppl_scored_tokens"], 2 * 15);
  const auto& fp16 = r["plans"][0];
  const auto& kivi = r["plans"][1];
  const auto& tq = r["plans"][3];
  EXPECT_GT(fp16["mae"]["mean"].get<double>(), 0.0);
  EXPECT_LT(fp16["mae"]["mean"].get<double>(), 1e-2 * kivi["mae"]["mean"].get<double>());
  EXPECT_NEAR(fp16["ppl_k"]["mean"].get<double>(), r["fp"]["ppl"].get<double>(), 1e-3 * r["fp"]["ppl"].get<double>());
  EXPECT_TRUE(kivi["deterministic"].get<bool>());
  EXPECT_EQ(kivi["ppl_k"]["sd"].get<double>(), 0.0);
  EXPECT_FALSE(tq["deterministic"].get<bool>());
  EXPECT_GT(tq["mae"]["mean_sd"].get<double>(), 0.0);  // rotations differ across seeds
  EXPECT_EQ(tq["mae"]["per_seed"].size(), 3u);
  EXPECT_DOUBLE_EQ(tq["bits"]["k"].get<double>(), 2.5);  // 2 + 16/32
  // NMSE by position: ctx 32 → one bucket [0, 32); fp16 keys err by fp16 rounding only
  // (relative 2^-11 per element, so NMSE ≪ 1e-5), 2-bit KIVI far more; "all" = the one bucket.
  ASSERT_EQ(r["position_buckets"].size(), 1u);
  EXPECT_EQ(r["position_buckets"][0]["end"], 32);
  EXPECT_EQ(r["position_buckets"][0]["pairs_per_layer"], 2 * 4 * 32 * 33 / 2);  // windows × heads × causal pairs
  const double nf = fp16["nmse"]["mean"].get<double>(), nk = kivi["nmse"]["mean"].get<double>();
  EXPECT_GT(nf, 0.0);
  EXPECT_LT(nf, 1e-5);
  EXPECT_GT(nk, 1e3 * nf);
  EXPECT_LT(nk, 1.0);
  EXPECT_DOUBLE_EQ(kivi["nmse_by_position"]["mean"][0].get<double>(), nk);
  EXPECT_EQ(tq["nmse_by_position"]["per_seed"].size(), 3u);
  EXPECT_GT(tq["nmse"]["sd"].get<double>(), 0.0);
  EXPECT_FALSE(fp16.contains("fit_ctx"));
  // tq2 (K 2.5 bits) has no partner at equal stored bits or the same K budget; kivi2 (3.0) neither → no comparisons.
  EXPECT_TRUE(r["comparisons"].empty());
  const std::string table = format_eval_report(r);
  EXPECT_NE(table.find("kivi2"), std::string::npos);
  EXPECT_NE(table.find("Attention-logit NMSE by query position"), std::string::npos);
  // Same-name plans are refused.
  plans.push_back({"tq2", "", u});
  EXPECT_THROW(evaluate_plans(m, t, plans, opt), Error);
}

// A window longer than a fitted plan's calibration windows: the buckets cover
// every position < ctx, the plan's "fit" ctx is reported and its buckets past
// it are marked; the per-bucket NMSE recombines to the all-position NMSE.
TEST(EvaluatePlans, NmseBucketsPastFitCtx) {
  Model m = tiny_model();
  const auto t = tokens(140);
  std::vector<PlanEntry> plans;
  Plan k = baseline_plan("kivi2", m.config());
  k.fit = {{"method", "test"}, {"ctx", 64}, {"calibration_tokens", 640}};
  plans.push_back({"kivi2-fitted", "", k});
  EvalOptions opt;
  opt.ctx = 70;
  opt.perplexity = false;
  const auto r = evaluate_plans(m, t, plans, opt);
  ASSERT_EQ(r["position_buckets"].size(), 2u);
  EXPECT_EQ(r["position_buckets"][1]["begin"], 64);
  EXPECT_EQ(r["position_buckets"][1]["end"], 70);
  EXPECT_EQ(r["position_buckets"][1]["pairs_per_layer"], 2 * 4 * (65 + 66 + 67 + 68 + 69 + 70));
  const auto& p = r["plans"][0];
  EXPECT_EQ(p["fit_ctx"], 64);
  EXPECT_EQ(p["fit_calibration_tokens"], 640);
  const double b0 = p["nmse_by_position"]["mean"][0].get<double>(), b1 = p["nmse_by_position"]["mean"][1].get<double>();
  const double all = p["nmse"]["mean"].get<double>();
  EXPECT_GT(b0, 0.0);
  EXPECT_GT(b1, 0.0);
  EXPECT_GE(all, std::min(b0, b1));  // a ratio of sums lies between the buckets' ratios
  EXPECT_LE(all, std::max(b0, b1));
  const std::string table = format_eval_report(r);
  EXPECT_NE(table.find("*64-69"), std::string::npos);
  EXPECT_NE(table.find("kivi2-fitted 64"), std::string::npos);
}

// A query stride ≥ ctx keeps only query 0 of each window (one key: KL 0 by
// construction), and a fitted plan's "fit" ctx must be a positive integer:
// both are errors before any pass (bad-input sweep of session 3).
TEST(EvaluatePlans, RejectsStrideAtCtxAndBadFitCtx) {
  Model m = tiny_model();
  const auto t = tokens(140);
  EvalOptions opt;
  opt.ctx = 64;
  opt.perplexity = false;
  std::vector<PlanEntry> plans{{"kivi2", "", baseline_plan("kivi2", m.config())}};
  opt.query_stride = 64;
  EXPECT_THROW(evaluate_plans(m, t, plans, opt), Error);
  opt.query_stride = 63;
  EXPECT_NO_THROW(evaluate_plans(m, t, plans, opt));
  opt.query_stride = 1;
  for (const nlohmann::json& bad : {nlohmann::json(-5), nlohmann::json("512"), nlohmann::json(nullptr),
                                    nlohmann::json(1e18), nlohmann::json::array({512})}) {
    Plan k = baseline_plan("kivi2", m.config());
    k.fit = {{"method", "test"}, {"ctx", bad}};
    std::vector<PlanEntry> one{{"fitted", "", k}};
    EXPECT_THROW(evaluate_plans(m, t, one, opt), Error) << bad.dump();
  }
}

// perplexity_kv = false: K-only perplexity only (same value as with the K+V pass on).
TEST(EvaluatePlans, KOnlyPerplexity) {
  Model m = tiny_model();
  const auto t = tokens(64);
  std::vector<PlanEntry> plans{{"kivi2", "", baseline_plan("kivi2", m.config())},
                               {"kivi2b", "", baseline_plan("kivi2", m.config())}};
  EvalOptions opt;
  opt.ctx = 32;
  const auto both = evaluate_plans(m, t, plans, opt);
  opt.perplexity_kv = false;
  const auto k = evaluate_plans(m, t, plans, opt);
  EXPECT_FALSE(k["plans"][0].contains("ppl_kv"));
  ASSERT_TRUE(both["plans"][0].contains("ppl_kv"));
  EXPECT_DOUBLE_EQ(k["plans"][0]["ppl_k"]["mean"].get<double>(), both["plans"][0]["ppl_k"]["mean"].get<double>());
  EXPECT_GT(both["plans"][0]["ppl_kv"]["mean"].get<double>(), 0.0);
  ASSERT_EQ(k["comparisons"].size(), 1u);  // equal bits: compared, K-only difference only
  EXPECT_EQ(k["comparisons"][0]["ppl_k_diff"]["mean"].get<double>(), 0.0);
  EXPECT_FALSE(k["comparisons"][0].contains("ppl_kv_diff"));
  EXPECT_NE(format_eval_report(k).find("ΔPPL K-only"), std::string::npos);
  // One seed measures no spread: the table prints values without "± 0.0000" (the header says so, its only ±);
  // with two seeds every MAE / KL / PPL cell carries its sd.
  const auto count_pm = [](const std::string& s) {
    size_t n = 0;
    for (size_t at = s.find("±"); at != std::string::npos; at = s.find("±", at + 1)) ++n;
    return n;
  };
  const std::string one = format_eval_report(both);
  EXPECT_EQ(both["seeds"].get<int>(), 1);
  EXPECT_EQ(count_pm(one), 1u) << one;
  EXPECT_NE(one.find("one seed: no spread is measured, no ± is printed"), std::string::npos) << one;
  opt.perplexity_kv = true;
  opt.n_seeds = 2;
  const std::string two = format_eval_report(evaluate_plans(m, t, plans, opt));
  EXPECT_GE(count_pm(two), 2u * 4u + 2u) << two;  // 2 plans × (MAE, KL, PPL K, PPL K+V) + the header's two
}
