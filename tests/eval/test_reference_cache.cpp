// The evaluation's reference cache (eval/reference_cache.h): a second evaluation
// that reads the fp16-reference logits and fp32 activations from disk reports
// what a run without the cache reports (perplexities, MAE/KL and next-token
// statistics of every plan and seed; the fp32 cache's own comparison to the
// precision its F32 storage keeps); a cache of another key or shape is an
// error naming the file; K-only / K+V passes can each be skipped; the fp16-cache
// reference's perplexity is the fp16 baseline plan's.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "ratekv/common/error.h"
#include "ratekv/common/param_error.h"
#include "ratekv/eval/baseline_plans.h"
#include "ratekv/eval/plan_eval.h"
#include "ratekv/eval/reference_cache.h"
#include "../support/temp_dir.h"
#include "../support/tiny_model.h"

using namespace ratekv;
using namespace ratekv::eval;

namespace {

Model model() {
  ratekv_test::TinyShape s;
  s.n_layers = 2;
  s.head_dim = 32;  // q8_0 / kivi need multiples of 32
  s.d_model = 24;
  s.n_vocab = 41;
  s.n_ctx = 128;
  return ratekv_test::tiny_model(5, s, RopeLayout::NeoX);
}

std::vector<int32_t> tokens(size_t n) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 11 + 5) % 41);
  return t;
}

std::vector<PlanEntry> plans(const ModelConfig& cfg) {
  std::vector<PlanEntry> e;
  Plan u;
  u.method = "uniform";
  static_cast<PlanTarget&>(u.model) = PlanTarget{cfg.arch, cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, "neox"};
  u.layers.assign(cfg.n_layers, std::vector<HeadPlan>(cfg.n_kv_heads));
  for (int l = 0; l < cfg.n_layers; ++l)
    for (int h = 0; h < cfg.n_kv_heads; ++h) {
      u.layers[l][h].key = Codec::tq_mse(2, cfg.head_dim, 3 + l + 5 * h);
      u.layers[l][h].value = Codec::tq_mse(2, cfg.head_dim, 40 + l + 5 * h);
    }
  e.push_back({"tq2", "", u});
  e.push_back({"q4_0", "", baseline_plan("q4_0", cfg)});
  return e;
}

void expect_same_plans(const nlohmann::json& a, const nlohmann::json& b) {
  ASSERT_EQ(a["plans"].size(), b["plans"].size());
  for (size_t p = 0; p < a["plans"].size(); ++p) {
    const auto &x = a["plans"][p], &y = b["plans"][p];
    EXPECT_EQ(x["ppl_kv"]["per_seed"], y["ppl_kv"]["per_seed"]) << x["name"];
    EXPECT_EQ(x["mae"]["per_seed"], y["mae"]["per_seed"]) << x["name"];
    EXPECT_EQ(x["kl"]["per_seed"], y["kl"]["per_seed"]) << x["name"];
    EXPECT_EQ(x["next_token"]["kv"]["kld_mean"]["per_seed"], y["next_token"]["kv"]["kld_mean"]["per_seed"]);
    EXPECT_EQ(x["next_token"]["kv"]["top1"]["per_seed"], y["next_token"]["kv"]["top1"]["per_seed"]);
    EXPECT_EQ(x["stored"]["first_window"], y["stored"]["first_window"]);
  }
}

}  // namespace

TEST(ReferenceCache, CachedRunEqualsUncachedRun) {
  Model m = model();
  const ModelConfig& cfg = m.config();
  const auto t = tokens(3 * 40);
  EvalOptions opt;
  opt.ctx = 40;
  opt.n_seeds = 2;
  opt.perplexity_k = false;
  const nlohmann::json plain = evaluate_plans(m, t, plans(cfg), opt);
  ratekv_test::TempDir dir("refcache");
  opt.reference_cache = (dir / "ref").string();
  opt.reference_key = reference_key("model-sha", opt.ctx, -1, t);
  const nlohmann::json first = evaluate_plans(m, t, plans(cfg), opt);  // computes and writes 3 windows
  for (int w = 0; w < 3; ++w) EXPECT_TRUE(std::filesystem::exists(dir / "ref" / fmt::format("window{}.safetensors", w)));
  const nlohmann::json second = evaluate_plans(m, t, plans(cfg), opt);  // reads them
  for (const nlohmann::json* r : {&first, &second}) {
    expect_same_plans(plain, *r);
    EXPECT_EQ((*r)["fp"]["ppl"], plain["fp"]["ppl"]);
    EXPECT_NEAR((*r)["fp"]["next_token"]["kld_mean"].get<double>(), plain["fp"]["next_token"]["kld_mean"].get<double>(),
                1e-6 * (1e-9 + plain["fp"]["next_token"]["kld_mean"].get<double>()) + 1e-12);
    EXPECT_FALSE((*r)["plans"][0].contains("ppl_k"));  // perplexity_k off: no K-only pass
    EXPECT_FALSE((*r)["plans"][0]["next_token"].contains("k"));
  }
  // The plans' perplexities really depend on the reference being right: a tampered fp16 logit row
  // changes the KLD the cached run reports (the cache is read, not recomputed).
  {
    const ReferenceShape sh{opt.ctx, cfg.n_vocab, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim};
    ReferenceCache rc(opt.reference_cache, opt.reference_key, sh);
    auto w0 = rc.load(0, true);
    ASSERT_TRUE(w0.has_value());
    for (float& x : w0->ref_logits) x *= 1.5f;
    rc.save(0, *w0);
    const nlohmann::json tampered = evaluate_plans(m, t, plans(cfg), opt);
    EXPECT_NE(tampered["plans"][0]["next_token"]["kv"]["kld_mean"]["per_seed"],
              plain["plans"][0]["next_token"]["kv"]["kld_mean"]["per_seed"]);
    EXPECT_EQ(tampered["plans"][0]["ppl_kv"]["per_seed"], plain["plans"][0]["ppl_kv"]["per_seed"]);
  }
  // Another key (other tokens) in the same directory: an error naming the file.
  EvalOptions other = opt;
  other.reference_key = reference_key("model-sha", opt.ctx, -1, tokens(3 * 40 + 1));
  try {
    evaluate_plans(m, t, plans(cfg), other);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("window0.safetensors': made for another model, text or window set"),
              std::string::npos)
        << e.what();
  }
  EvalOptions nokey = opt;
  nokey.reference_key.clear();
  try {
    evaluate_plans(m, t, plans(cfg), nokey);
    FAIL() << "expected an error";
  } catch (const ParamError& e) {
    EXPECT_EQ(e.param(), "EvalOptions.reference_key");
  }
}

// The report's "fp16_cache" perplexity (the reference's own next-token NLL) equals the K+V
// perplexity of the fp16 baseline plan, which runs its own forward pass through the plan path
// (same fp16 rounding of K and V), with and without the cache; and it differs from the fp32 cache's.
TEST(ReferenceCache, Fp16CachePerplexityIsTheFp16PlansPerplexity) {
  Model m = model();
  const ModelConfig& cfg = m.config();
  const auto t = tokens(3 * 40);
  EvalOptions opt;
  opt.ctx = 40;
  opt.n_seeds = 1;
  opt.perplexity_k = false;
  std::vector<PlanEntry> e{{"fp16", "", baseline_plan("fp16", cfg)}, {"q4_0", "", baseline_plan("q4_0", cfg)}};
  const nlohmann::json plain = evaluate_plans(m, t, e, opt);
  ratekv_test::TempDir dir("refcache_fp16");
  opt.reference_cache = (dir / "ref").string();
  opt.reference_key = reference_key("model-sha", opt.ctx, -1, t);
  const nlohmann::json first = evaluate_plans(m, t, e, opt);
  const nlohmann::json second = evaluate_plans(m, t, e, opt);
  const double fp16_plan = plain["plans"][0]["ppl_kv"]["mean"].get<double>();
  for (const nlohmann::json* r : {&plain, &first, &second}) {
    ASSERT_TRUE(r->contains("fp16_cache"));
    EXPECT_NEAR((*r)["fp16_cache"]["ppl"].get<double>(), fp16_plan, 1e-9 * fp16_plan);
  }
  EXPECT_NE(plain["fp16_cache"]["ppl"].get<double>(), plain["plans"][1]["ppl_kv"]["mean"].get<double>());
  EXPECT_GT(plain["fp16_cache"]["ppl"].get<double>(), 1.0);
}

TEST(ReferenceCache, KeyDependsOnEveryInput) {
  const auto t = tokens(80);
  const std::string k = reference_key("a", 40, -1, t);
  EXPECT_EQ(k, reference_key("a", 40, -1, t));
  EXPECT_NE(k, reference_key("b", 40, -1, t));
  EXPECT_NE(k, reference_key("a", 20, -1, t));
  EXPECT_NE(k, reference_key("a", 40, 1, t));
  auto t2 = t;
  t2[79] += 1;
  EXPECT_NE(k, reference_key("a", 40, -1, t2));
}

TEST(ReferenceCache, NeedsAtLeastOnePerplexityMode) {
  Model m = model();
  EvalOptions opt;
  opt.ctx = 40;
  opt.perplexity_k = false;
  opt.perplexity_kv = false;
  try {
    evaluate_plans(m, tokens(80), plans(m.config()), opt);
    FAIL() << "expected an error";
  } catch (const ParamError& e) {
    EXPECT_EQ(e.param(), "EvalOptions.perplexity_k");
  }
}
