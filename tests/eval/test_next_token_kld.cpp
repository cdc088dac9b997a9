// Next-token KLD, top-1 agreement and Δp (eval/next_token_kld.h) against an
// independent long-double computation on hand-made distributions, closed
// forms, llama.cpp's summary conventions, and end to end in evaluate_plans on
// a tiny model (the report's numbers recomputed from the model's logits).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ratekv/cache/fake_quant_cache.h"
#include "ratekv/cache/plan_codecs.h"
#include "ratekv/common/error.h"
#include "ratekv/eval/baseline_plans.h"
#include "ratekv/eval/next_token_kld.h"
#include "ratekv/eval/plan_eval.h"
#include "ratekv/model/perplexity.h"

#include "../support/tiny_model.h"

using namespace ratekv;
using namespace ratekv::eval;

namespace {

// KL(softmax(r) ‖ softmax(x)) in long double, written differently from the
// library: probabilities from the raw exponentials (the logits here are small),
// log of the ratio of probabilities.
long double kl_ref(const std::vector<float>& r, const std::vector<float>& x) {
  long double zr = 0, zx = 0;
  for (size_t v = 0; v < r.size(); ++v) {
    zr += std::exp(static_cast<long double>(r[v]));
    zx += std::exp(static_cast<long double>(x[v]));
  }
  long double kl = 0;
  for (size_t v = 0; v < r.size(); ++v) {
    const long double p = std::exp(static_cast<long double>(r[v])) / zr;
    const long double q = std::exp(static_cast<long double>(x[v])) / zx;
    kl += p * std::log(p / q);
  }
  return kl;
}

long double prob_ref(const std::vector<float>& x, int t) {
  long double z = 0;
  for (float v : x) z += std::exp(static_cast<long double>(v));
  return std::exp(static_cast<long double>(x[t])) / z;
}

Model tiny_model() { return ratekv_test::eval_tiny_model(); }

}  // namespace

TEST(NextTokenKld, ClosedFormsAndInvariances) {
  // p = (1/2, 1/2), q = (3/4, 1/4): KL = ½ ln(2/3) + ½ ln 2 = ½ ln(4/3); argmax ties → index 0 on both.
  const std::vector<float> r = {0.0f, 0.0f}, x = {std::log(3.0f), 0.0f};
  TokenComparison c = compare_next_token(r.data(), x.data(), 2, 1);
  EXPECT_NEAR(c.kld, 0.5 * std::log(4.0 / 3.0), 1e-7);
  EXPECT_TRUE(c.same_top1);
  EXPECT_NEAR(c.delta_p, 0.25 - 0.5, 1e-7);
  // Reversed roles: KL(q ‖ p) = ¾ ln(3/2) + ¼ ln(1/2); the argmax of (0, 0) is index 0 = argmax of x.
  c = compare_next_token(x.data(), r.data(), 2, 0);
  EXPECT_NEAR(c.kld, 0.75 * std::log(1.5) + 0.25 * std::log(0.5), 1e-7);
  // A constant shift of the logits is the same distribution: KLD 0, Δp 0 (not the same array).
  std::vector<float> y = {1.5f, -2.0f, 0.25f, 3.0f}, z = y;
  for (float& v : z) v += 7.0f;
  c = compare_next_token(y.data(), z.data(), 4, 2);
  EXPECT_NEAR(c.kld, 0.0, 1e-12);
  EXPECT_NEAR(c.delta_p, 0.0, 1e-12);
  EXPECT_TRUE(c.same_top1);
  // A different argmax.
  std::vector<float> w = y;
  std::swap(w[0], w[3]);
  c = compare_next_token(y.data(), w.data(), 4, 3);
  EXPECT_FALSE(c.same_top1);
  EXPECT_GT(c.kld, 0.1);
  // Bad input.
  EXPECT_THROW(compare_next_token(y.data(), w.data(), 4, 4), Error);
  EXPECT_THROW(compare_next_token(y.data(), w.data(), 0, 0), Error);
  w[1] = std::nanf("");
  EXPECT_THROW(compare_next_token(y.data(), w.data(), 4, 0), Error);
}

TEST(NextTokenKld, RandomDistributionsAgainstLongDouble) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 30; ++trial) {
    const int V = 2 + static_cast<int>(rng() % 2000);
    std::normal_distribution<float> nd(0.0f, trial % 3 == 0 ? 4.0f : 1.0f);
    std::vector<float> r(V), x(V);
    for (int v = 0; v < V; ++v) {
      r[v] = nd(rng);
      x[v] = r[v] + (trial % 5 == 0 ? 0.01f : 0.5f) * nd(rng);  // small and large perturbations
    }
    const int t = static_cast<int>(rng() % V);
    const TokenComparison c = compare_next_token(r.data(), x.data(), V, t);
    const long double kl = kl_ref(r, x);
    EXPECT_NEAR(c.kld, static_cast<double>(kl), 1e-12 + 1e-9 * static_cast<double>(kl)) << "trial " << trial;
    EXPECT_NEAR(c.delta_p, static_cast<double>(prob_ref(x, t) - prob_ref(r, t)), 1e-12);
    const int ar = static_cast<int>(std::max_element(r.begin(), r.end()) - r.begin());
    const int ax = static_cast<int>(std::max_element(x.begin(), x.end()) - x.begin());
    EXPECT_EQ(c.same_top1, ar == ax);
  }
}

TEST(NextTokenKld, SummaryFollowsLlamaPerplexity) {
  NextTokenStats s;
  EXPECT_THROW(s.summary(), Error);
  // KLD 0, 1, ..., 9 (added out of order), top-1 on 7 of 10, Δp ±0.1.
  for (int i : {3, 9, 0, 5, 1, 8, 2, 7, 6, 4}) s.add({static_cast<double>(i), i < 7, i % 2 ? 0.1 : -0.3});
  const NextTokenSummary m = s.summary();
  EXPECT_EQ(m.n, 10);
  EXPECT_DOUBLE_EQ(m.kld_mean, 4.5);
  EXPECT_NEAR(m.kld_mean_err, std::sqrt(8.25 / 9.0), 1e-12);  // population variance 8.25, / (n − 1)
  EXPECT_DOUBLE_EQ(m.kld_median, 4.5);                         // even n: mean of the two middle values
  EXPECT_NEAR(m.kld_p99, 8.91, 1e-12);                         // 0.99 · 9 = 8.91 → between 8 and 9
  EXPECT_NEAR(m.kld_p90, 8.1, 1e-12);
  EXPECT_DOUBLE_EQ(m.kld_max, 9.0);
  EXPECT_DOUBLE_EQ(m.top1, 0.7);
  EXPECT_NEAR(m.delta_p_mean, (5 * 0.1 - 5 * 0.3) / 10, 1e-15);
  EXPECT_NEAR(m.delta_p_rms, std::sqrt((5 * 0.01 + 5 * 0.09) / 10), 1e-15);
  // Odd n: the middle value; merge adds another accumulator's tokens.
  NextTokenStats t;
  t.add({100.0, false, 0.0});
  s.merge(t);
  EXPECT_DOUBLE_EQ(s.summary().kld_median, 5.0);
  EXPECT_DOUBLE_EQ(s.summary().kld_max, 100.0);
  EXPECT_DOUBLE_EQ(sorted_percentile({2.0}, 0.99), 2.0);
}

// evaluate_plans on a tiny model: the report's KLD / top-1 / Δp of each plan
// equal a recomputation from the model's own logits (a fp16-cache pass and the
// plan's pass, compared in long double), and its perplexities equal
// model/perplexity.h's. The fp16 plan against the fp16 reference gives KLD 0
// and top-1 100 % (the same computation) — one case among others.
TEST(NextTokenKld, EvaluatePlansMatchesARecomputation) {
  Model m = tiny_model();
  const ModelConfig& cfg = m.config();
  std::vector<int32_t> t(96);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>((i * 7 + 3 + i * i) % 41);
  std::vector<PlanEntry> plans;
  for (const char* n : {"fp16", "kivi2", "q4_0"}) plans.push_back({n, "", baseline_plan(n, cfg)});
  EvalOptions opt;
  opt.ctx = 32;
  opt.n_seeds = 1;
  const auto r = evaluate_plans(m, t, plans, opt);
  const int V = cfg.n_vocab, ctx = 32, first = 16;
  const auto ref_codecs = std::make_shared<const cache::PlanCodecs>(baseline_plan("fp16", cfg), cfg, "fp16");
  auto run = [&](const std::shared_ptr<const cache::PlanCodecs>& c, bool kv, int64_t w) {
    cache::FakeQuantOptions fo;
    fo.quantize_v = kv;
    cache::FakeQuantKVCache cache(cfg.kv_shape(ctx), c, fo);
    std::vector<int32_t> win(t.begin() + w * ctx, t.begin() + (w + 1) * ctx);
    std::vector<float> logits(static_cast<size_t>(ctx) * V);
    m.forward(win, 0, cache, logits.data(), true);
    return logits;
  };
  for (size_t p = 0; p < plans.size(); ++p) {
    SCOPED_TRACE(plans[p].name);
    const auto codecs = std::make_shared<const cache::PlanCodecs>(plans[p].plan, cfg, plans[p].name);
    for (int mode = 0; mode < 2; ++mode) {
      long double kl = 0, dp = 0;
      int same = 0, n = 0;
      for (int64_t w = 0; w < 3; ++w) {
        const auto lr = run(ref_codecs, true, w), lx = run(codecs, mode == 1, w);
        for (int i = first; i < ctx - 1; ++i) {
          const std::vector<float> rr(lr.begin() + i * V, lr.begin() + (i + 1) * V);
          const std::vector<float> xx(lx.begin() + i * V, lx.begin() + (i + 1) * V);
          const int target = t[w * ctx + i + 1];
          kl += kl_ref(rr, xx);
          dp += prob_ref(xx, target) - prob_ref(rr, target);
          same += (std::max_element(rr.begin(), rr.end()) - rr.begin()) == (std::max_element(xx.begin(), xx.end()) - xx.begin());
          ++n;
        }
      }
      const auto& nt = r["plans"][p]["next_token"][mode == 0 ? "k" : "kv"];
      EXPECT_EQ(nt["n"]["mean"].get<double>(), 3 * 15);
      EXPECT_NEAR(nt["kld_mean"]["mean"].get<double>(), static_cast<double>(kl / n), 1e-9);
      EXPECT_NEAR(nt["top1"]["mean"].get<double>(), static_cast<double>(same) / n, 1e-12);
      EXPECT_NEAR(nt["delta_p_mean"]["mean"].get<double>(), static_cast<double>(dp / n), 1e-9);
      if (plans[p].name == "fp16" && mode == 1) {  // K+V fp16 is the reference cache itself
        EXPECT_EQ(nt["kld_mean"]["mean"].get<double>(), 0.0);
        EXPECT_EQ(nt["top1"]["mean"].get<double>(), 1.0);
      }
      // Perplexity: the library's perplexity() on the same cache.
      cache::FakeQuantOptions fo;
      fo.quantize_v = mode == 1;
      cache::FakeQuantKVCache cache(cfg.kv_shape(ctx), codecs, fo);
      const PerplexityResult pr = perplexity(m, cache, t, ctx, 0, false, -1);
      EXPECT_DOUBLE_EQ(r["plans"][p][mode == 0 ? "ppl_k" : "ppl_kv"]["mean"].get<double>(), pr.ppl);
    }
  }
  // Stored bytes of the first window: planned == measured (fp16 in the packed cache's pages; KIVI and q4_0
  // counted by their quantizers: KIVI's keys hold the window's 32 tokens as one full group).
  for (const auto& p : r["plans"]) {
    const auto& fw = p["stored"]["first_window"];
    EXPECT_EQ(fw["planned_bytes"].get<double>(), fw["measured_bytes"].get<double>()) << p["name"];
  }
  EXPECT_EQ(r["plans"][0]["stored"]["first_window"]["measured_by"], "packed cache pages");
  // one 64-slot page: 2 layers × 2 KV heads × 2 sides × 64 slots × 32 channels × 2 bytes
  EXPECT_EQ(r["plans"][0]["stored"]["first_window"]["measured_bytes"].get<double>(), 2.0 * 2 * 2 * 64 * 32 * 2);
  // q4_0 and KIVI-2 move the distribution; fp16 (K+V) does not.
  EXPECT_GT(r["plans"][1]["next_token"]["kv"]["kld_mean"]["mean"].get<double>(), 1e-4);
  EXPECT_EQ(r["plans"][0]["next_token"]["kv"]["top1"]["mean"].get<double>(), 1.0);
  // The fp32 cache against the fp16 cache: a tiny, non-zero divergence.
  const double fk = r["fp"]["next_token"]["kld_mean"].get<double>();
  EXPECT_GT(fk, 0.0);
  EXPECT_LT(fk, 1e-4);
  const std::string table = format_eval_report(r);
  EXPECT_NE(table.find("KLD p99"), std::string::npos);
  EXPECT_NE(table.find("top-1"), std::string::npos);
}
