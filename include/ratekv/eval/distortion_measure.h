// ratekv/eval/distortion_measure.h — measure RateQuant's distortion curves on
// calibration text (docs/design.md §4.2): for each quantizer and code width b, the
// mean squared error per element of every (layer, KV head) component's
// post-RoPE keys and values through exactly the codec a plan of that
// quantizer uses (cache/plan_codecs.h), then the fit D_i(b) = α_i β^(−b)
// (calib/distortion_curves.h).
//
// One measurement, two sources of activations: DistortionAccumulator takes
// captured K/V per layer (the Python package's transformers hooks feed it,
// python/ratekv/calibration.py); measure_distortion_curves runs the C++ model
// runtime and feeds the same accumulator from its ForwardHooks (`ratekv
// calibrate --curves`).
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
#include <memory>
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

/// Checks opt's quantizers (kivi, quarot, tq-mse, block-gtq; each once) and
/// widths (≥ 2 distinct, in 1..8): throws ParamError naming
/// CurveMeasureOptions.quantizers / .bits. Needs no model, so a front end can
/// refuse bad options before it loads one (the accumulator calls it too).
void validate_curve_options(const CurveMeasureOptions& opt);

/// The distortion of every (quantizer, width) plan of a CurveMeasureOptions
/// on activations given chunk by chunk: for each chunk of each layer, the
/// post-RoPE keys and the values go through the plan's codec
/// (cache::fake_quant_sequence: no fp16 window, no sink), Σ‖x − x̂‖² summed in
/// double per (layer, KV head, side). finish() divides by N·head_dim and fits
/// D = α β^(−b) (calib::fit_curves). Work per chunk is spread over OpenMP
/// threads; the result does not depend on their number.
class DistortionAccumulator {
 public:
  /// The codecs of every plan of opt (opt.ctx is not used here), made by
  /// alloc::make_plan from `stats` (model identity, Block-GTQ block energies)
  /// for `cfg`. Throws ParamError naming the CurveMeasureOptions field for
  /// unknown or repeated quantizers, widths outside 1..8 or fewer than two
  /// distinct widths; Error when stats do not match cfg (layers, KV heads,
  /// head_dim).
  DistortionAccumulator(const ModelConfig& cfg, const CalibStats& stats, const CurveMeasureOptions& opt);
  ~DistortionAccumulator();
  DistortionAccumulator(DistortionAccumulator&&) noexcept;
  DistortionAccumulator& operator=(DistortionAccumulator&&) noexcept;

  /// One chunk of T ≥ 1 tokens of `layer`, positions 0.. within the chunk:
  /// k_post, v (T, n_kv_heads, head_dim) row-major float32 — the keys
  /// attention reads (after RoPE) and the values. Throws Error for a layer
  /// outside 0..n_layers−1, T < 1 or a non-finite element (naming the layer
  /// and side).
  void add(int layer, const float* k_post, const float* v, int64_t T);
  /// Tokens added to `layer` so far.
  int64_t tokens(int layer) const;
  /// The measured mse (L, Hkv, nb) = Σ / (N·head_dim) and fitted curves per
  /// quantizer, N the tokens every layer received. Throws Error when no tokens
  /// were added, layers received different numbers of tokens, or a measured
  /// distortion is zero (a component with all-zero K or V cannot be fitted).
  std::map<std::string, calib::QuantizerCurves> finish() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Runs `model` over `tokens` in chunks of opt.ctx (positions 0.. each) and
/// feeds every chunk's K (post-RoPE) and V, through ForwardHooks, to a
/// DistortionAccumulator; returns its finish(). Throws as the accumulator
/// does, ParamError (CurveMeasureOptions.ctx) for a ctx outside the model's
/// positions, and Error for empty tokens.
std::map<std::string, calib::QuantizerCurves> measure_distortion_curves(Model& model, std::span<const int32_t> tokens,
                                                                        const CalibStats& stats,
                                                                        const CurveMeasureOptions& opt);

}  // namespace ratekv::eval
