// Baseline cache plans from the model shape (eval/baseline_plans.h).
#include "ratekv/eval/baseline_plans.h"

#include "ratekv/alloc/make_plan.h"
#include "ratekv/cache/plan_codecs.h"
#include "ratekv/common/error.h"
#include "ratekv/common/param_error.h"

namespace ratekv::eval {

std::vector<std::string> baseline_names() { return {"fp16", "q8_0", "q4_0", "kivi2", "kivi4"}; }

Plan baseline_plan(const std::string& name, const ModelConfig& cfg) {
  const int d = cfg.head_dim;
  Codec c;
  if (name == "fp16") {
    c = Codec::fp16();
  } else if (name == "q8_0" || name == "q4_0" || name == "kivi2" || name == "kivi4") {
    check_param(d % 32 == 0, "baseline_plan.name", "{}: head_dim {} is not a multiple of 32", name, d);
    CodecGroup g;
    for (int i = 0; i < d; ++i) g.channels.push_back(i);
    if (name == "q8_0" || name == "q4_0") {
      c.kind = name == "q8_0" ? CodecKind::Q8_0 : CodecKind::Q4_0;
      g.bits = name == "q8_0" ? 8 : 4;
      c.group_size = 32;
    } else {
      c.kind = CodecKind::Kivi;
      g.bits = name == "kivi2" ? 2 : 4;
      c.group_size = 32;
    }
    c.norm = NormStorage::None;
    c.groups.push_back(g);
  } else {
    std::string known;
    for (const auto& n : baseline_names()) known += (known.empty() ? "" : ", ") + n;
    fail_param("baseline_plan.name", "'{}': unknown baseline (expected one of {})", name, known);
  }
  Plan p;
  p.method = "baseline:" + name;
  static_cast<PlanTarget&>(p.model) = cache::plan_target(cfg);
  p.budget_unit = "effective";
  p.budget_k = p.budget_v = c.effective_bits(d);
  p.layers.assign(cfg.n_layers, std::vector<HeadPlan>(cfg.n_kv_heads, HeadPlan{c, c}));
  p.validate("baseline " + name);
  return p;
}

std::vector<std::string> cache_type_names() { return {"f16", "q8_0", "q4_0", "tq2", "tq3", "tq4"}; }

namespace {

Codec cache_type_codec(const std::string& type, const char* param, const ModelConfig& cfg, uint64_t seed, int layer,
                       int head, int side) {
  const int d = cfg.head_dim;
  if (type == "f16") return Codec::fp16();
  if (type == "tq2" || type == "tq3" || type == "tq4")
    return Codec::tq_mse(type[2] - '0', d, alloc::group_seed(seed, layer, head, side, 0));
  if (type == "q8_0" || type == "q4_0") {
    check(d % 32 == 0, "cache_type_plan: {} '{}': head_dim {} is not a multiple of 32 (llama.cpp blocks)", param,
          type, d);
    Codec c;
    c.kind = type == "q8_0" ? CodecKind::Q8_0 : CodecKind::Q4_0;
    c.norm = NormStorage::None;
    c.group_size = 32;
    CodecGroup g;
    g.bits = type == "q8_0" ? 8 : 4;
    for (int i = 0; i < d; ++i) g.channels.push_back(i);
    c.groups.push_back(std::move(g));
    return c;
  }
  std::string known;
  for (const auto& n : cache_type_names()) known += (known.empty() ? "" : ", ") + n;
  fail("cache_type_plan: {} '{}': unknown cache type (expected one of {})", param, type, known);
}

}  // namespace

Plan cache_type_plan(const std::string& k_type, const std::string& v_type, const ModelConfig& cfg, uint64_t seed) {
  // Validate both names before building anything.
  cache_type_codec(k_type, "k_type", cfg, seed, 0, 0, 0);
  cache_type_codec(v_type, "v_type", cfg, seed, 0, 0, 1);
  Plan p;
  p.method = "cache-type:" + k_type + "/" + v_type;
  static_cast<PlanTarget&>(p.model) = cache::plan_target(cfg);
  p.seed = seed;
  p.budget_unit = "effective";
  p.layers.assign(cfg.n_layers, std::vector<HeadPlan>(cfg.n_kv_heads));
  for (int l = 0; l < cfg.n_layers; ++l)
    for (int h = 0; h < cfg.n_kv_heads; ++h) {
      p.layers[l][h].key = cache_type_codec(k_type, "k_type", cfg, seed, l, h, 0);
      p.layers[l][h].value = cache_type_codec(v_type, "v_type", cfg, seed, l, h, 1);
    }
  p.budget_k = p.layers[0][0].key.effective_bits(cfg.head_dim);
  p.budget_v = p.layers[0][0].value.effective_bits(cfg.head_dim);
  p.validate("cache types " + k_type + "/" + v_type);
  return p;
}

}  // namespace ratekv::eval
