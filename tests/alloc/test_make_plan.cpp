// Plans built from statistics, and the statistics JSON file (alloc/make_plan.h, format/calib_stats.h).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "ratekv/alloc/block_gtq.h"
#include "ratekv/alloc/make_plan.h"
#include "ratekv/common/error.h"
#include "ratekv/common/param_error.h"

using namespace ratekv;
using namespace ratekv::alloc;

namespace {

// 3 layers × 2 KV heads × head_dim 16 (8 RoPE blocks), deterministic values:
// low blocks carry more energy, layer 0 and the keys are more sensitive.
CalibStats synthetic_stats() {
  CalibStats s;
  s.model = {{"llama", 3, 2, 16, "interleaved"}, "tiny.gguf", "00ff"};
  s.source = "calib.txt";
  s.n_tokens = 97;
  for (int l = 0; l < 3; ++l)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 8; ++i) {
        s.q_block_energy.push_back(std::pow(2.0, 6 - i) * (1 + l) + h);
        s.k_block_energy.push_back(i == 7 ? 0.0 : 1.0 + 0.5 * h);
      }
  Sensitivity g;
  g.k = {8, 4, 2, 1, 1, 0.5};
  g.v = {1, 1, 0.5, 0.5, 0.25, 0};
  s.sensitivity["grad"] = g;
  s.sensitivity["activation"] = {{1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 1}};
  DistortionCurves c;
  c.beta_k = 3.5;
  c.beta_v = 3.6;
  c.alpha_k = {1, 1, 2, 2, 1, 1};
  c.alpha_v = {1, 2, 1, 2, 1, 2};
  s.curves["tq-mse"] = c;
  DistortionCurves k = c;
  k.beta_k = k.beta_v = 2.5;
  s.curves["kivi"] = k;
  s.curves["block-gtq"] = c;
  return s;
}

std::string tmp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("ratekv_test_alloc_" + name)).string();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// The library parameter a ParamError names (the CLI maps it to its flag).
std::string param_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ParamError& e) {
    return e.param();
  } catch (const Error& e) {
    return std::string("(not a ParamError: ") + e.what() + ")";
  }
  return "(no error)";
}

}  // namespace

TEST(MakePlan, UniformCodeAndEffectiveBudgets) {
  const CalibStats st = synthetic_stats();
  PlanRequest rq;
  rq.method = "uniform";
  rq.budget_unit = "code";
  rq.k_bits = 3;
  rq.v_bits = 2;
  Plan p = make_plan(st, rq);
  EXPECT_DOUBLE_EQ(p.achieved().k, 3.0 + 1.0);  // 16-bit norm / 16 channels
  EXPECT_DOUBLE_EQ(p.achieved().v, 2.0 + 1.0);
  EXPECT_EQ(p.layers[2][1].key.kind, CodecKind::TqMse);
  rq.budget_unit = "effective";
  rq.k_bits = 3.99;  // 2 code bits + 1 norm bit fit, 3 + 1 do not
  rq.v_bits = 4.0;
  p = make_plan(st, rq);
  EXPECT_DOUBLE_EQ(p.achieved().k_code, 2.0);
  EXPECT_DOUBLE_EQ(p.achieved().v_code, 3.0);
  rq.k_bits = 1.5;
  EXPECT_EQ(error_of([&] { make_plan(st, rq); }),
            "PlanRequest.k_bits 1.5 (effective bits per element): gives 0 code bits per element, outside 1..8 for "
            "tq-mse at head_dim 16 (metadata 1 bits per element)");
  rq.budget_unit = "code";
  rq.k_bits = 2.5;
  EXPECT_EQ(error_of([&] { make_plan(st, rq); }),
            "PlanRequest.k_bits 2.5: with budget unit \"code\" a uniform codec needs a whole number of bits");
}

TEST(MakePlan, RejectsNonFiniteOrOutOfRangeBudgets) {
  // Regression: `ratekv plan --method uniform --kbits nan` used to cast NaN to int ("gives -2147483648 code bits"),
  // and block-gtq errors for --kbits 99 did not name the flag. The library names its parameter (ParamError), the
  // CLI maps it to the flag (tests/cli/test_cli_flags.cpp).
  const CalibStats st = synthetic_stats();
  for (const char* method : {"uniform", "block-gtq", "ratequant"}) {
    PlanRequest rq;
    rq.method = method;
    rq.k_bits = std::nan("");
    EXPECT_EQ(error_of([&] { make_plan(st, rq); }),
              "PlanRequest.k_bits nan: expected a finite number of bits per element in 0..64")
        << method;
    EXPECT_EQ(param_of([&] { make_plan(st, rq); }), "PlanRequest.k_bits") << method;
    rq.k_bits = 3;
    rq.v_bits = 99;
    EXPECT_EQ(error_of([&] { make_plan(st, rq); }),
              "PlanRequest.v_bits 99: expected a finite number of bits per element in 0..64")
        << method;
    rq.v_bits = -1;
    EXPECT_EQ(error_of([&] { make_plan(st, rq); }),
              "PlanRequest.v_bits -1: expected a finite number of bits per element in 0..64")
        << method;
    EXPECT_EQ(param_of([&] { make_plan(st, rq); }), "PlanRequest.v_bits") << method;
    rq.v_bits = 3;
    rq.avg_bits = std::numeric_limits<double>::infinity();
    EXPECT_EQ(error_of([&] { make_plan(st, rq); }),
              "PlanRequest.avg_bits inf: expected a finite number of bits per element in 0..64")
        << method;
  }
}

TEST(MakePlan, LlamaCppAndFp16Baselines) {
  CalibStats st = synthetic_stats();
  // q8_0 / q4_0 need head_dim divisible by 32: widen the synthetic model.
  st.model.head_dim = 64;
  st.q_block_energy.assign(3 * 2 * 32, 1.0);
  st.k_block_energy.assign(3 * 2 * 32, 2.0);
  PlanRequest rq;
  rq.method = "uniform";
  rq.quantizer = "q8_0";
  rq.v_quantizer = "q4_0";
  rq.k_bits = 8.5;
  rq.v_bits = 4.5;
  Plan p = make_plan(st, rq);
  EXPECT_EQ(p.layers[1][1].key.kind, CodecKind::Q8_0);
  EXPECT_EQ(p.layers[1][1].value.kind, CodecKind::Q4_0);
  EXPECT_DOUBLE_EQ(p.achieved().k, 8.5);
  EXPECT_DOUBLE_EQ(p.achieved().v, 4.5);
  rq.v_bits = 4.4;
  EXPECT_EQ(error_of([&] { make_plan(st, rq); }),
            "PlanRequest.v_bits 4.4 (effective bits per element): q4_0 stores at least 4.5 bits per element");
  rq.budget_unit = "code";
  rq.k_bits = 8;
  rq.v_bits = 4;
  EXPECT_DOUBLE_EQ(make_plan(st, rq).achieved().total, 6.5);
  rq.quantizer = "fp16";
  rq.v_quantizer = "";
  rq.k_bits = rq.v_bits = 16;
  p = make_plan(st, rq);
  EXPECT_EQ(p.layers[0][0].value.kind, CodecKind::FP16);
  EXPECT_DOUBLE_EQ(p.achieved().total, 16.0);
  rq.quantizer = "kivi";
  rq.k_bits = rq.v_bits = 2;
  p = make_plan(st, rq);
  EXPECT_DOUBLE_EQ(p.achieved().k, 3.0);  // 2 + fp16 scale and zero per 32
  rq.quantizer = "q5_1";
  EXPECT_EQ(error_of([&] { make_plan(st, rq); }),
            "PlanRequest.quantizer \"q5_1\": expected tq-mse, kivi, quarot, q8_0, q4_0 or fp16");
}

TEST(MakePlan, BlockGtqMatchesTheAllocatorAndBeatsUniform) {
  const CalibStats st = synthetic_stats();
  PlanRequest rq;
  rq.method = "block-gtq";
  rq.k_bits = 3.0;  // effective: 48 bits per head
  rq.v_bits = 3.0;
  rq.seed = 17;
  PlanDiagnostics dg;
  const Plan p = make_plan(st, rq, &dg);
  ASSERT_EQ(dg.key_j.size(), 6u);
  for (int l = 0; l < 3; ++l)
    for (int h = 0; h < 2; ++h) {
      const BlockAllocation a = allocate_block_gtq(st.block_energies(l, h), 48, {0, 4, 16});
      const Codec& k = p.layers[l][h].key;
      ASSERT_EQ(k.kind, CodecKind::TqMseGrouped);
      ASSERT_EQ(k.groups.size(), a.groups.size());
      for (size_t g = 0; g < a.groups.size(); ++g) {
        EXPECT_EQ(k.groups[g].bits, a.groups[g].bits);
        EXPECT_EQ(k.groups[g].blocks, a.groups[g].blocks);
        EXPECT_EQ(k.groups[g].seed, a.groups[g].bits > 0 ? group_seed(17, l, h, 0, (int)g) : 0u);
      }
      EXPECT_LE(k.effective_bits(16), 3.0);
      EXPECT_DOUBLE_EQ(dg.key_j[l * 2 + h], a.distortion);
      EXPECT_LE(dg.key_j[l * 2 + h], dg.key_j_uniform[l * 2 + h]);
      EXPECT_DOUBLE_EQ(p.layers[l][h].value.effective_bits(16), 3.0);  // 2 code bits + norm
    }
  // The energy of block 7 of every head is small: the high-energy block 0 gets the most bits.
  EXPECT_GT(p.layers[0][0].key.groups[0].bits, 0);
  EXPECT_EQ(p.layers[0][0].key.groups[0].blocks.front(), 0);
  // Same request, same plan; another seed changes only the seeds.
  EXPECT_EQ(make_plan(st, rq).to_json(), p.to_json());
  rq.seed = 18;
  const Plan q = make_plan(st, rq);
  EXPECT_NE(q.layers[0][0].key.groups[0].seed, p.layers[0][0].key.groups[0].seed);
  EXPECT_EQ(q.layers[0][0].key.groups[0].blocks, p.layers[0][0].key.groups[0].blocks);
  // Infeasible: b_min = 2 everywhere needs 2·16 + 16 = 48 bits = 3 bits/element.
  rq.b_min = 2;
  rq.k_bits = 2.9;
  EXPECT_NE(
      error_of([&] { make_plan(st, rq); }).find("PlanRequest.k_bits 2.9 (effective): block-gtq: budget of 46 bits"),
      std::string::npos);
}

TEST(MakePlan, RateQuantSpendsTheExactBudget) {
  const CalibStats st = synthetic_stats();
  PlanRequest rq;
  rq.method = "ratequant";
  rq.budget_unit = "code";
  rq.avg_bits = 2.5;
  PlanDiagnostics dg;
  const Plan p = make_plan(st, rq, &dg);
  ASSERT_TRUE(dg.ratequant.has_value());
  int sum = 0;
  for (int b : dg.ratequant->bits) sum += b;
  EXPECT_EQ(sum, 30);  // 12 components × 2.5
  EXPECT_DOUBLE_EQ(p.achieved().k_code + p.achieved().v_code, 5.0);
  // Independent: the allocator on the same numbers.
  RateQuantProblem prob;
  for (int i = 0; i < 6; ++i)
    for (int side = 0; side < 2; ++side) {
      prob.weight.push_back(side ? st.sensitivity.at("grad").v[i] : st.sensitivity.at("grad").k[i]);
      prob.alpha.push_back(side ? st.curves.at("tq-mse").alpha_v[i] : st.curves.at("tq-mse").alpha_k[i]);
      prob.beta.push_back(side ? 3.6 : 3.5);
      prob.b_min.push_back(1);
      prob.b_max.push_back(8);
    }
  prob.total_bits = 30;
  EXPECT_EQ(allocate_ratequant(prob).bits, dg.ratequant->bits);
  EXPECT_EQ(p.layers[0][0].key.groups[0].bits, dg.ratequant->bits[0]);
  EXPECT_EQ(p.layers[2][1].value.groups[0].bits, dg.ratequant->bits[11]);
  // The integer optimum is never worse than the uniform split at the same budget.
  ASSERT_TRUE(dg.uniform_split.has_value());
  EXPECT_LE(dg.ratequant->distortion, dg.uniform_split->cost);
  // Zero-sensitivity V of (2, 1) sits at b_min.
  EXPECT_EQ(dg.ratequant->bits[11], 1);

  // Mismatched curves: allocate with kivi's, build tq-mse codecs.
  rq.curves_from = "kivi";
  EXPECT_NO_THROW(make_plan(st, rq));
  rq.curves_from = "quarot";
  EXPECT_EQ(error_of([&] { make_plan(st, rq); }),
            "distortion curves \"quarot\": not in the statistics file (it has: block-gtq, kivi, tq-mse)");
  rq.curves_from.clear();
  rq.sensitivity = "fisher";
  EXPECT_EQ(error_of([&] { make_plan(st, rq); }),
            "PlanRequest.sensitivity \"fisher\": not in the statistics file (it has: activation, grad)");
  rq.sensitivity = "grad";
  rq.avg_bits = 2.45;
  EXPECT_NE(error_of([&] { make_plan(st, rq); }).find("is not a whole number of bits"), std::string::npos);

  // Composition: keys split over blocks at each component's budget.
  rq.method = "ratequant+block-gtq";
  rq.avg_bits = 3.0;
  PlanDiagnostics dc;
  const Plan c = make_plan(st, rq, &dc);
  for (int l = 0; l < 3; ++l)
    for (int h = 0; h < 2; ++h) {
      const int kb = dc.ratequant->bits[(l * 2 + h) * 2];
      EXPECT_EQ(c.layers[l][h].key.kind, CodecKind::TqMseGrouped);
      EXPECT_LE(c.layers[l][h].key.effective_bits(16), kb + 1.0);
    }

  // Uniform baseline at 2.5: K3V2 or K2V3, whichever the curves predict is better.
  PlanRequest u;
  u.method = "uniform";
  u.budget_unit = "code";
  u.avg_bits = 2.5;
  PlanDiagnostics du;
  const Plan up = make_plan(st, u, &du);
  ASSERT_TRUE(du.uniform_split.has_value());
  EXPECT_EQ(du.uniform_split->k_bits + du.uniform_split->v_bits, 5);
  EXPECT_EQ(up.layers[1][0].key.groups[0].bits, du.uniform_split->k_bits);
}

TEST(Stats, JsonRoundTripAndErrors) {
  const CalibStats st = synthetic_stats();
  const std::string path = tmp_path("stats.json");
  save_stats_json(st, path);
  const CalibStats back = load_stats_json(path);
  EXPECT_EQ(stats_to_json(back), stats_to_json(st));
  EXPECT_EQ(back.block_energies(1, 1)[0], 0.5 * (64.0 * 2 + 1 + 1.5));
  std::filesystem::remove(path);

  nlohmann::json j = stats_to_json(st);
  j["k_block_energy"][2][1].erase(3);
  EXPECT_EQ(error_of([&] { stats_from_json(j, "s.json"); }), "s.json: k_block_energy[2][1]: 7 entries, expected 8");
  j = stats_to_json(st);
  j["sensitivity"]["grad"]["v"][0][1] = -1.0;
  EXPECT_EQ(error_of([&] { stats_from_json(j, "s.json"); }),
            "s.json: sensitivity.grad.v[0][1] = -1: expected finite and >= 0");
  j = stats_to_json(st);
  j["curves"]["kivi"]["beta_v"] = 0.5;
  EXPECT_EQ(error_of([&] { stats_from_json(j, "s.json"); }),
            "s.json: curves.kivi.beta_v = 0.5: expected finite, > 1 and <= 64 (distortion falls by at most 64x per "
            "code bit)");
  j = stats_to_json(st);
  j.erase("q_block_energy");
  EXPECT_EQ(error_of([&] { stats_from_json(j, "s.json"); }), "s.json: q_block_energy: missing");
  j = stats_to_json(st);
  j["model"]["head_dim"] = 15;
  EXPECT_NE(error_of([&] { stats_from_json(j, "s.json"); }).find("model.head_dim = 15"), std::string::npos);
}

// Curves that cannot be measured distortions: β beyond the physical range
// (1, 64], α not in (0, FLT_MAX], a quantizer no curves are measured for.
TEST(Stats, CurvesOutOfRangeOrOfUnknownQuantizer) {
  const nlohmann::json good = stats_to_json(synthetic_stats());
  auto error_after = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = good;
    edit(j);
    return error_of([&] { stats_from_json(j, "s.json"); });
  };
  EXPECT_EQ(error_after([](nlohmann::json&) {}), "(no error)");
  EXPECT_EQ(error_after([](nlohmann::json& j) { j["curves"]["kivi"]["beta_k"] = 1e308; }),
            "s.json: curves.kivi.beta_k = 1e+308: expected finite, > 1 and <= 64 (distortion falls by at most 64x "
            "per code bit)");
  EXPECT_EQ(error_after([](nlohmann::json& j) { j["curves"]["kivi"]["beta_v"] = 1.0; }),
            "s.json: curves.kivi.beta_v = 1: expected finite, > 1 and <= 64 (distortion falls by at most 64x "
            "per code bit)");
  EXPECT_EQ(error_after([](nlohmann::json& j) { j["curves"]["tq-mse"]["alpha_v"][2][1] = 0.0; }),
            "s.json: curves.tq-mse.alpha_v[flat 5] = 0: expected finite, > 0 and <= 3.4028234663852886e+38");
  EXPECT_EQ(error_after([](nlohmann::json& j) { j["curves"]["tq-mse"]["alpha_k"][0][0] = 1e300; }),
            "s.json: curves.tq-mse.alpha_k[flat 0] = 1e+300: expected finite, > 0 and <= 3.4028234663852886e+38");
  EXPECT_EQ(error_after([](nlohmann::json& j) { j["curves"]["tq_mse"] = j["curves"]["tq-mse"]; }),
            "s.json: curves.tq_mse: unknown quantizer (curves are measured for kivi, quarot, tq-mse, block-gtq)");
}

TEST(MakePlan, SummaryTable) {
  const CalibStats st = synthetic_stats();
  PlanRequest rq;
  rq.method = "block-gtq";
  const Plan p = make_plan(st, rq);
  const std::string s = plan_summary(p);
  EXPECT_NE(s.find("plan: method block-gtq, model tiny.gguf (3 layers × 2 KV heads, head_dim 16, interleaved)"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("achieved effective bits/element: K "), std::string::npos);
  // One row per layer.
  for (int l = 0; l < 3; ++l) EXPECT_NE(s.find(fmt::format("\n{:>5}  blk ", l)), std::string::npos) << s;
}
