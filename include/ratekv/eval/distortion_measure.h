// ratekv/eval/distortion_measure.h — measure RateQuant's distortion curves on
// calibration text (docs/design.md §4.2): for each quantizer and code width b, the
// mean squared error per element of every (layer, KV head) component's
// post-RoPE keys and values through exactly the codec a plan of that
// quantizer uses (cache/plan_codecs.h), then the fit D_i(b) = α_i β^(−b)
// (calib/distortion_curves.h).
//
// Quantizers and the plans measured at width b (alloc/make_plan.h, code unit):
//   tq-mse, kivi, quarot  uniform K b / V b, that quantizer (kivi/quarot:
//                         group_size channels or tokens per scale group)
//   block-gtq             keys: Block-GTQ over RoPE blocks at b·d + 16 bits per
//                         head (the budget ratequant+block-gtq gives a
//                         component of width b), values: TQ-MSE b.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "ratekv/format/calib_stats.h"
#include "ratekv/calib/distortion_curves.h"
#include "ratekv/model/model.h"

namespace ratekv::eval {

struct CurveMeasureOptions {
  std::vector<std::string> quantizers = {"kivi", "quarot", "tq-mse", "block-gtq"};
  std::vector<int> bits = {1, 2, 3, 4, 5};  ///< code widths (≥ 2 distinct, 1..8)
  int64_t ctx = 512;                        ///< tokens per forward chunk (fresh cache per chunk)
  int group_size = 32;                      ///< kivi / quarot scale group
  uint64_t seed = 0;                        ///< plan seed (rotations)
};

/// Runs `model` over `tokens` in chunks of opt.ctx (positions 0.. each) and,
/// through ForwardHooks, quantizes every chunk's K (post-RoPE) and V with each
/// (quantizer, width) plan, accumulating Σ‖x − x̂‖² per component; returns
/// mse = Σ / (N·head_dim) and the fitted curves per quantizer. `stats` gives
/// the model identity and the Block-GTQ block energies. Work per layer is
/// spread over OpenMP threads; the result does not depend on their number.
/// Throws ParamError naming the CurveMeasureOptions field for unknown or
/// repeated quantizers, widths outside 1..8, fewer than two distinct widths or
/// a bad ctx; Error for empty tokens, stats that do not match the model, or a
/// zero measured distortion (a component with all-zero K or V cannot be fitted).
std::map<std::string, calib::QuantizerCurves> measure_distortion_curves(Model& model, std::span<const int32_t> tokens,
                                                                        const CalibStats& stats,
                                                                        const CurveMeasureOptions& opt);

}  // namespace ratekv::eval
