// cli/eval_run.h — what `ratekv eval` and `ratekv panel` share once they have
// their plans: the baseline entries, the evaluation with the model's BOS
// rule, the report's model and text records, and the text table on stdout.
#pragma once

#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/loaded_model.h"
#include "ratekv/eval/plan_eval.h"

namespace ratekv::cli {

/// Appends one entry per baseline name (eval::baseline_plan; named by the
/// baseline, no file) to `entries`. Throws ParamError "baseline_plan.name"
/// for an unknown name or a head_dim a baseline cannot serve.
void add_baseline_entries(std::vector<eval::PlanEntry>& entries, const std::vector<std::string>& baselines,
                          const ModelConfig& cfg);

/// eval::evaluate_plans over `tokens` with opt.bos_id set from the model
/// (its BOS id when it adds one, else −1), the report's "model"."file" and
/// "text" ({file, sha256} of text_path) filled in, and the text rendering
/// printed on stdout (flushed). Returns the report. Throws Error like
/// evaluate_plans, or when text_path cannot be hashed.
nlohmann::json evaluate_and_print(const LoadedModel& lm, std::span<const int32_t> tokens,
                                  const std::vector<eval::PlanEntry>& entries, eval::EvalOptions opt,
                                  const std::string& model_path, const std::string& text_path);

}  // namespace ratekv::cli
