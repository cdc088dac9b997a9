// format/plan_target_check.h — the range check of the model a plan or a
// statistics file names, shared by Plan::validate and CalibStats::validate.
// Internal to the format module.
#pragma once

#include <string>

#include "ratekv/format/plan.h"

namespace ratekv::format {

/// Checks arch non-empty, n_layers 1..4096, n_kv_heads 1..1024, head_dim even
/// in 2..1024, rope_layout "interleaved" or "neox". Throws Error
/// "<name>: model.<field> = …: expected …".
void validate_plan_target(const PlanTarget& m, const std::string& name);

}  // namespace ratekv::format
