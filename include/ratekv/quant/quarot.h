// ratekv/quant/quarot.h — QuaRot-style KV quantization (Ashkboos et al. 2024):
// rotate each head vector by a randomized Hadamard transform (Haar for
// non-power-of-two dims unless set), then per-token integer quantization over
// channel groups of G in the rotated domain (int_quant.h), rotate back.
// Symmetric (default, b ≥ 2): bits_per_element = b + 16·⌈d/G⌉/d.
// Asymmetric (b ≥ 1):          bits_per_element = b + 32·⌈d/G⌉/d.
// JSON: {"kind":"quarot","dim":d,"bits":b,"seed":s,"symmetric":true,
//        "group_size":G,"rotation":"hadamard"}
#pragma once

#include "ratekv/quant/quantizer.h"
#include "ratekv/quant/rotation.h"

namespace ratekv::quant {

struct QuaRotConfig {
  int dim = 0;
  int bits = 0;
  uint64_t seed = 0;
  bool symmetric = true;
  int group_size = 0;  // channels per scale group; 0 = whole vector
  RotationKind rotation = RotationKind::hadamard;
};

class QuaRot final : public ConfiguredQuantizer<QuaRotConfig, QuantKind::quarot> {
 public:
  /// Throws Error on dim < 1, bits out of range for the mode, or a Hadamard
  /// rotation of a non-power-of-two dim.
  explicit QuaRot(const QuaRotConfig& cfg);
  /// Missing "rotation" means hadamard for power-of-two dims, haar otherwise.
  static QuaRotConfig config_from_json(const nlohmann::json& j);

  double bits_per_element(int64_t T) const override;
  using Quantizer::bits_per_element;  // the steady-state overload
  nlohmann::json to_json() const override;
  void fake_quant(const float* x, int64_t T, float* xhat) const override;

 private:
  Rotation rot_;
};

}  // namespace ratekv::quant
