// ratekv/calib/calibrate.h — run a model over calibration tokens and collect
// KVStats (the library side of `ratekv calibrate`).
#pragma once

#include <cstdint>
#include <span>

#include "ratekv/calib/kv_stats.h"
#include "ratekv/model/model.h"

namespace ratekv::calib {

/// Runs `model` over `tokens` in consecutive chunks of `ctx` tokens (the last
/// one may be shorter), each from a fresh fp32 cache at positions 0..,
/// collecting every statistic of kv_stats.h through ForwardHooks. No logits
/// are computed. Progress ("calibrate: tokens") on stderr. The returned stats
/// carry the model's shape identity, N and ctx; the caller fills file names
/// and hashes. Throws Error for empty tokens, ParamError "calibrate.ctx" for
/// ctx < 1 or ctx beyond the model's position limit.
KVStats calibrate(Model& model, std::span<const int32_t> tokens, int64_t ctx);

}  // namespace ratekv::calib
