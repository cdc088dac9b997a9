// ratekv/calib/distortion_curves.h — measured distortion of each quantizer at
// several code widths, per K/V component, and the fitted RateQuant curves
// D_i(b) = α_i β^(−b) (docs/design.md §4.2), stored with the
// calibration statistics (docs/calibration_stats.md, "Distortion curves").
//
// Components are (layer l, KV head h) per side; layouts (L, Hkv) and
// (L, Hkv, nb) row-major, nb = number of measured widths. D is the mean
// squared reconstruction error per element, Σ‖x − x̂‖² / (T·head_dim), of the
// post-RoPE keys (resp. values) through the quantizer's plan codec.
// One β per (quantizer, side), one α per component, by least squares in the
// log domain (quant/rd_fit.h fit_rd_shared_beta).
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ratekv/format/calib_stats.h"
#include "ratekv/quant/rd_fit.h"
#include "ratekv/io/safetensors.h"

namespace ratekv::calib {

/// One quantizer's measurements and fit.
struct QuantizerCurves {
  std::vector<double> bits;   ///< (nb,) code bits per element measured, distinct, ascending
  std::vector<double> mse_k;  ///< (L, Hkv, nb) mean squared error per element, keys (> 0)
  std::vector<double> mse_v;  ///< (L, Hkv, nb) values
  DistortionCurves fit;  ///< β_k, β_v, α_k, α_v (L, Hkv)
};

/// Fits α, β per side from bits / mse_k / mse_v (n_components = L·Hkv) and
/// stores them in c.fit. Throws Error (from fit_rd_shared_beta) on bad data.
void fit_curves(QuantizerCurves& c, size_t n_components);

/// Per-side fit quality of `c` (re-fitted from its measurements).
struct CurveFitReport {
  quant::SharedBetaFit k, v;
};
CurveFitReport curve_fit_report(const QuantizerCurves& c, size_t n_components);

/// Checks every entry: its name (curve_quantizers()), bits (nb ≥ 2
/// distinct ascending), mse (n, nb) positive finite, α (n) and β in the
/// ranges of validate_curve_fit. `name` prefixes errors (naming the
/// quantizer and field).
void validate_curves(const std::map<std::string, QuantizerCurves>& curves, size_t n_components,
                     const std::string& name);

/// Serialization: tensors "curves.<q>.mse_k" / "mse_v" (L, Hkv, nb) and
/// "curves.<q>.alpha_k" / "alpha_v" (L, Hkv), F32; metadata JSON
/// {"<q>": {"bits": [...], "beta_k": x, "beta_v": y}} (stored as F64 in JSON).
void write_curves(const std::map<std::string, QuantizerCurves>& curves, int n_layers, int n_kv_heads,
                  SafetensorsWriter& w, nlohmann::json& meta);
/// Inverse of write_curves (`meta` is the "curves" object). Throws Error
/// naming `path`, the quantizer and the field or tensor.
std::map<std::string, QuantizerCurves> read_curves(const SafetensorsFile& f, const nlohmann::json& meta, int n_layers,
                                                   int n_kv_heads, const std::string& path);

/// A readable table: per quantizer and side β, α range (min, median, max),
/// R² of ln D (global and within components) and max |log error|.
std::string format_curve_table(const std::map<std::string, QuantizerCurves>& curves, size_t n_components);

/// The same numbers plus the measurements as JSON (for results files).
nlohmann::json curves_to_json(const std::map<std::string, QuantizerCurves>& curves, size_t n_components);

}  // namespace ratekv::calib
