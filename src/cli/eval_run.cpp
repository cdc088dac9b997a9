// The evaluation run `ratekv eval` and `ratekv panel` share (cli/eval_run.h).
#include "cli/eval_run.h"

#include <cstdio>
#include <filesystem>

#include "ratekv/eval/baseline_plans.h"
#include "ratekv/io/sha256.h"

namespace ratekv::cli {

void add_baseline_entries(std::vector<eval::PlanEntry>& entries, const std::vector<std::string>& baselines,
                          const ModelConfig& cfg) {
  for (const auto& b : baselines) {
    eval::PlanEntry e;
    e.name = b;
    e.plan = eval::baseline_plan(b, cfg);
    entries.push_back(std::move(e));
  }
}

nlohmann::json evaluate_and_print(const LoadedModel& lm, std::span<const int32_t> tokens,
                                  const std::vector<eval::PlanEntry>& entries, eval::EvalOptions opt,
                                  const std::string& model_path, const std::string& text_path) {
  opt.bos_id = lm.add_bos ? lm.tokenizer->bos_id() : -1;
  nlohmann::json rep = eval::evaluate_plans(*lm.model, tokens, entries, opt);
  rep["model"]["file"] = std::filesystem::path(model_path).filename().string();
  rep["text"] = {{"file", std::filesystem::path(text_path).filename().string()}, {"sha256", sha256_file(text_path)}};
  std::fputs(eval::format_eval_report(rep).c_str(), stdout);
  std::fflush(stdout);
  return rep;
}

}  // namespace ratekv::cli
