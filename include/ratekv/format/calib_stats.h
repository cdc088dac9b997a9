// ratekv/format/calib_stats.h — the calibration statistics the allocators consume.
//
// `ratekv calibrate` measures these on unlabeled text (docs/design.md §3.1, §4.1);
// `ratekv plan` turns them into a plan. In memory: CalibStats. On disk (until
// the safetensors stats file exists) a JSON file, format "ratekv-calib-stats",
// version 1:
//
//   {
//     "format": "ratekv-calib-stats", "version": 1,
//     "model": {"arch": "llama", "n_layers": 30, "n_kv_heads": 3, "head_dim": 64,
//               "rope_layout": "interleaved", "file": "…gguf", "sha256": "…"},
//     "source": "calib.txt", "n_tokens": 2048,
//     "q_block_energy": [[[…d/2…] × n_kv_heads] × n_layers],   // see CalibStats
//     "k_block_energy": [[[…d/2…] × n_kv_heads] × n_layers],
//     "k_pre_mean": [[[…d…] × n_kv_heads] × n_layers],             // optional: E_t k, pre-RoPE
//     "sensitivity": {"grad": {"k": [[…n_kv_heads…] × n_layers], "v": […]},
//                     "activation": {…}},                         // optional, any names
//     "curves": {"tq-mse": {"bits": [1, 2, 3, 4, 5],            // widths fitted at
//                           "beta_k": 3.5, "beta_v": 3.5,
//                           "alpha_k": [[…] × n_layers], "alpha_v": […]}}   // optional
//   }
// "model" may also hold "n_heads" (query heads; informational, checked to be a
// multiple of n_kv_heads). A key not listed here is an error naming it (a
// misspelled or foreign field would otherwise be silently ignored).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ratekv/format/plan.h"

namespace ratekv {

/// Per-component sensitivities w of one estimator (e.g. "grad": mean over
/// tokens of ‖∂L/∂K_{l,h,t}‖²; "activation": a magnitude proxy).
/// Layout (n_layers, n_kv_heads), row-major; entries finite and ≥ 0.
struct Sensitivity {
  std::vector<double> k;
  std::vector<double> v;
  /// Where k / v were read from, as the file format spells it, for messages: empty for the JSON form (its
  /// fields sensitivity.<name>.k / .v); the safetensors reader (calib/kv_stats.h to_alloc_stats) sets the
  /// tensors they are sums of ("grad_sq_k_post" and "grad_sq_v", "k_block_energy" and "v_sq").
  std::string k_tensor;
  std::string v_tensor;
};

/// Fitted distortion curves D(b) = α β^(−b) of one quantizer: one β per side,
/// one α per component. alpha_k / alpha_v: (n_layers, n_kv_heads) row-major,
/// in (0, kMaxCurveAlpha]; beta_k, beta_v in (1, kMaxCurveBeta]. `bits`: the
/// code widths the curves were measured and fitted at (≥ 2, ascending,
/// distinct, whole numbers in 0..16); RateQuant hands out only widths within
/// [bits.front(), bits.back()] (alloc/make_plan.h).
struct DistortionCurves {
  double beta_k = 0.0;
  double beta_v = 0.0;
  std::vector<double> alpha_k;
  std::vector<double> alpha_v;
  std::vector<double> bits;
};

/// The largest β a stats file may hold: the distortion falls by at most this
/// factor per code bit. High-rate scalar quantization gains 4× per bit
/// (6.02 dB); measured fits are 3.3–5.8 and the steepest measured step
/// (integer quantizers, 1 → 2 bits) ×12 (docs/calibration_stats.md).
inline constexpr double kMaxCurveBeta = 64.0;
/// The largest α: the float32 range the statistics file stores α in. A fit of
/// positive errors has α = exp(…) > 0, so α = 0 is no measurement either.
inline constexpr double kMaxCurveAlpha = 3.4028234663852886e38;  // FLT_MAX

/// The quantizers distortion curves are measured for (`ratekv calibrate
/// --curves`) and the allocators read: kivi, quarot, tq-mse, block-gtq.
const std::vector<std::string>& curve_quantizers();

/// Whether bits[j] is a curve width: a whole number of code bits in 0..16, above
/// bits[j − 1] (a fractional width used to be rounded inward silently).
bool curve_width_ok(const std::vector<double>& bits, size_t j);

/// Checks one quantizer's fitted curve parameters: `quantizer` one of
/// curve_quantizers(), β in (1, kMaxCurveBeta], every α in (0, kMaxCurveAlpha],
/// bits ≥ 2 ascending distinct integer widths in 0..16 (curve_width_ok). Throws Error
/// "<name>: curves.<quantizer>.<field> ...". (Sizes are the caller's to check.)
void validate_curve_fit(const std::string& quantizer, const DistortionCurves& c, const std::string& name);

/// Everything the allocators read from calibration.
struct CalibStats {
  ModelIdentity model;     ///< the model the statistics were measured on
  std::string source;      ///< calibration text (file name), informational
  int64_t n_tokens = 0;    ///< calibration tokens
  /// E_{t, g∈G(h)} ‖q_{g,t}^{(i)}‖²: mean squared norm of RoPE block i of the
  /// query heads reading KV head h (RoPE preserves block norms, so pre- or
  /// post-RoPE is the same). (n_layers, n_kv_heads, head_dim/2) row-major.
  std::vector<double> q_block_energy;
  /// E_t ‖k_{h,t}^{(i)}‖², same layout.
  std::vector<double> k_block_energy;
  /// E_t k_{h,t} pre-RoPE (the key offsets of docs/design.md §2.5), (n_layers,
  /// n_kv_heads, head_dim) row-major, any sign; empty when the statistics lack it.
  std::vector<double> k_pre_mean;
  /// Sensitivity estimators by name ("grad", "activation"); may be empty.
  std::map<std::string, Sensitivity> sensitivity;
  /// Fitted curves by quantizer name ("tq-mse", "kivi", "quarot",
  /// "block-gtq"); may be empty.
  std::map<std::string, DistortionCurves> curves;

  /// Block-GTQ energies s_i = ½(q_i + k_i) of (layer, head): (head_dim/2,).
  std::vector<double> block_energies(int layer, int head) const;
  /// Block-GTQ energies of keys centered on k_pre_mean (docs/design.md §2.5):
  /// ½(q_i + max(0, k_i − ‖μ_i‖²)), μ_i the RoPE block i of the mean (the
  /// model's layout). Throws Error when k_pre_mean is absent.
  std::vector<double> centered_block_energies(int layer, int head) const;
  /// Checks shapes and ranges; throws Error naming `name` and the field.
  void validate(const std::string& name = "stats") const;
};

/// JSON form (see file comment).
nlohmann::json stats_to_json(const CalibStats& s);
/// Parses and validates; `name` prefixes errors.
CalibStats stats_from_json(const nlohmann::json& j, const std::string& name);
/// Reads a JSON statistics file. Throws Error for I/O, syntax, schema, shapes.
CalibStats load_stats_json(const std::string& path);
/// Writes a JSON statistics file (validates first).
void save_stats_json(const CalibStats& s, const std::string& path);

}  // namespace ratekv
