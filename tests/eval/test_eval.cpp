// Evaluation metrics: logit MAE / attention KL closed forms, baseline plans,
// and a small end-to-end evaluate_plans run (perplexity itself is tested in
// tests/model with ratekv/perplexity.h).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ratekv/cache/fake_quant_cache.h"
#include "ratekv/cache/plan_codecs.h"
#include "ratekv/error.h"
#include "ratekv/eval/baseline_plans.h"
#include "ratekv/eval/logit_error.h"
#include "ratekv/eval/plan_eval.h"

#include "../support/tiny_model.h"

using namespace ratekv;
using namespace ratekv::eval;

namespace {

using ratekv_test::randn;

// 2 layers, 4 query / 2 KV heads, head_dim 32 (so q8_0 / kivi apply), d_model 24.
Model tiny_model() {
  ModelConfig c;
  c.arch = "llama";
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 32;
  c.d_model = 24;
  c.d_ff = 19;
  c.n_vocab = 41;
  c.n_ctx_train = 128;
  c.rope_theta = 100.0;
  c.rms_eps = 1e-5f;
  std::mt19937 g(3);
  ModelWeights w;
  const size_t d = 24, qd = 128, kvd = 64;
  w.token_embd = randn(41 * d, g, 1.0f);
  w.output_norm = randn(d, g, 0.1f, 1.0f);
  for (int l = 0; l < 2; ++l) {
    LayerWeights L;
    L.attn_norm = randn(d, g, 0.1f, 1.0f);
    L.ffn_norm = randn(d, g, 0.1f, 1.0f);
    L.wqkv = randn((qd + 2 * kvd) * d, g, 0.4f);
    L.wo = randn(d * qd, g, 0.1f);
    L.w_gate_up = randn(2 * 19 * d, g, 0.3f);
    L.w_down = randn(d * 19, g, 0.3f);
    w.layers.push_back(std::move(L));
  }
  return Model::from_weights(c, std::move(w));
}

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
  // tq2 (K 2.5 bits) has no partner at equal bits except none; kivi2 (3.0) neither → no comparisons.
  EXPECT_TRUE(r["comparisons"].empty());
  const std::string table = format_eval_report(r);
  EXPECT_NE(table.find("kivi2"), std::string::npos);
  // Same-name plans are refused.
  plans.push_back({"tq2", "", u});
  EXPECT_THROW(evaluate_plans(m, t, plans, opt), Error);
}
