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
/// method "baseline:<name>", plan seed 0, no window, no sink. Throws
/// ParamError "baseline_plan.name" for an unknown name (listing the known
/// ones) or a head_dim that is not a multiple of 32 for q8_0 / q4_0 / kivi.
Plan baseline_plan(const std::string& name, const ModelConfig& cfg);

/// KV cache type names as llama.cpp's -ctk / -ctv take them, plus ratekv's
/// own: f16, q8_0, q4_0 (llama.cpp's blocks of 32: 16, 8.5, 4.5 effective
/// bits) and tq2, tq3, tq4 (uniform TurboQuant-MSE, docs/design.md §2: one
/// b-bit group over the whole head and one fp16 norm per token and head,
/// b + 16/head_dim effective bits).
std::vector<std::string> cache_type_names();

/// A plan with key type `k_type` and value type `v_type` (cache_type_names)
/// on every (layer, KV head), built from the model shape alone (no
/// calibration statistics). tq rotation seeds are alloc::group_seed(seed, l,
/// h, side, 0), the seeds `plan --method uniform --seed S` gives. method
/// "cache-type:<k_type>/<v_type>", no window, no sink. Throws Error naming
/// k_type / v_type for an unknown name (listing the known ones) or a head_dim
/// that is not a multiple of 32 for q8_0 / q4_0.
Plan cache_type_plan(const std::string& k_type, const std::string& v_type, const ModelConfig& cfg,
                     uint64_t seed = 0);

}  // namespace ratekv::eval
