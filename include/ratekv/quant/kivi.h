// ratekv/quant/kivi.h — KIVI-style asymmetric integer KV quantization
// (Liu et al. 2024, "KIVI"; docs/design.md §9.3 baseline). Integer primitive: int_quant.h.
//
// Keys (KIVIKey, scope per_channel_tokens): the rows of a head's history are
//   cut into groups of g consecutive tokens; within a group every channel gets
//   its own fp16 scale and zero over its g values. The T mod g newest rows are
//   the fp16 window (stored as fp16 until their group fills).
//   bits_per_element(T) = [F·d·b + (F/g)·d·32 + (T−F)·d·16] / (T·d), F = g⌊T/g⌋;
//   steady state b + 32/g.
// Values (KIVIValue, scope per_vector): per token, channels in contiguous
//   groups of G (the last one may be shorter), fp16 scale and zero per group.
//   bits_per_element = b + 32·⌈d/G⌉/d.
// JSON: {"kind":"kivi_key","dim":d,"bits":b,"group_size":g}
//       {"kind":"kivi_value","dim":d,"bits":b,"group_size":G}
#pragma once

#include "ratekv/quant/quantizer.h"

namespace ratekv::quant {

struct KIVIConfig {
  int dim = 0;         // head_dim d ≥ 1
  int bits = 0;        // 1..8
  int group_size = 0;  // keys: tokens per group g; values: channels per group G (≥ 1)
};

/// KIVI keys: per-channel over token groups, fp16 window for the partial group.
class KIVIKey final : public ConfiguredQuantizer<KIVIConfig, QuantKind::kivi_key, QuantScope::per_channel_tokens> {
 public:
  /// Throws Error on dim < 1, bits ∉ [1,8] or group_size < 1.
  explicit KIVIKey(const KIVIConfig& cfg);
  static KIVIConfig config_from_json(const nlohmann::json& j);

  int tokens_per_group() const override { return cfg_.group_size; }
  double bits_per_element(int64_t T) const override;
  using Quantizer::bits_per_element;  // the steady-state overload
  nlohmann::json to_json() const override;
  /// x, xhat: (T, d) = the head's rows in token order starting at a group boundary.
  void fake_quant(const float* x, int64_t T, float* xhat) const override;
};

/// KIVI values: per-token over channel groups.
class KIVIValue final : public ConfiguredQuantizer<KIVIConfig, QuantKind::kivi_value> {
 public:
  /// Throws Error on dim < 1, bits ∉ [1,8] or group_size < 1 (clamped to dim).
  explicit KIVIValue(const KIVIConfig& cfg);
  static KIVIConfig config_from_json(const nlohmann::json& j);

  double bits_per_element(int64_t T) const override;
  using Quantizer::bits_per_element;  // the steady-state overload
  nlohmann::json to_json() const override;
  void fake_quant(const float* x, int64_t T, float* xhat) const override;
};

}  // namespace ratekv::quant
