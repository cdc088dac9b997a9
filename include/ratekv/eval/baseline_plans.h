// ratekv/eval/baseline_plans.h — plans for the cache types users already
// know (docs/design.md §9.3 baselines), built from the model shape alone (no
// calibration): fp16, llama.cpp q8_0 / q4_0, KIVI-style int keys/values.
#pragma once

#include <string>
#include <vector>

#include "ratekv/model/model.h"
#include "ratekv/format/plan.h"

namespace ratekv::eval {

/// Names accepted by baseline_plan().
std::vector<std::string> baseline_names();

/// A plan with the same codec on every (layer, KV head), K and V:
///   fp16            16 bits per element
///   q8_0, q4_0      llama.cpp cache types (8.5 / 4.5 effective bits)
///   kivi2, kivi4    KIVI 2 / 4 bits, groups of 32 (keys: 32 tokens per
///                   channel, values: 32 channels per token; fp16 scale and
///                   zero per group, +1 bit per element → 3.0 / 5.0)
/// method "baseline:<name>", plan seed 0, no window, no sink. Throws Error
/// for an unknown name (listing the known ones) or a head_dim that is not a
/// multiple of 32 for q8_0 / q4_0 / kivi.
Plan baseline_plan(const std::string& name, const ModelConfig& cfg);

}  // namespace ratekv::eval
