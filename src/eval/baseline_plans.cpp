// Baseline cache plans from the model shape (eval/baseline_plans.h).
#include "ratekv/eval/baseline_plans.h"

#include "ratekv/cache/plan_codecs.h"
#include "ratekv/common/error.h"

namespace ratekv::eval {

std::vector<std::string> baseline_names() { return {"fp16", "q8_0", "q4_0", "kivi2", "kivi4"}; }

Plan baseline_plan(const std::string& name, const ModelConfig& cfg) {
  const int d = cfg.head_dim;
  Codec c;
  if (name == "fp16") {
    c = Codec::fp16();
  } else if (name == "q8_0" || name == "q4_0" || name == "kivi2" || name == "kivi4") {
    check(d % 32 == 0, "--baseline {}: head_dim {} is not a multiple of 32", name, d);
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
    fail("--baseline '{}': unknown baseline (expected one of {})", name, known);
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

}  // namespace ratekv::eval
