// ratekv/quant/tq_prod.h — TurboQuant-prod (arXiv 2504.19874, Alg. 2;
// docs/design.md §2.4): (b−1)-bit TQ-MSE of the unit vector plus a 1-bit QJL
// sketch of its residual, giving an unbiased inner-product estimate.
//
//   n = ‖x‖, u = x/n, ũ = TQ-MSE_{b−1}(u) (unit norm input, no norm stored
//   for it), r = u − ũ, γ = ‖r‖, s = sign(S r) ∈ {±1}^m (sign(0) = +1) with S
//   an m×m i.i.d. N(0,1) matrix drawn from mix_seed(seed, 0x514a4c),
//   x̂ = ñ (ũ + γ̃ √(π/2)/m · Sᵀ s)   (ñ, γ̃ the stored fp16 norms).
// Effective bits per element = (m·(b−1) + m + 16 + 16)/m = b + 32/m.
// Off by default in plans: public reports say QJL variance hurts softmax
// attention; `ratekv rd` measures its MSE next to TQ-MSE.
// JSON: {"kind":"tq_prod","dim":m,"bits":b,"seed":s,"rotation":"haar"}
#pragma once

#include <Eigen/Core>

#include "ratekv/quant/tq_mse.h"

namespace ratekv::quant {

struct TQProdConfig {
  int dim = 0;        // m ≥ 2
  int bits = 0;       // total bits per coordinate, 1..9 (MSE part uses bits − 1)
  uint64_t seed = 0;
  RotationKind rotation = RotationKind::haar;
};

class TQProd final : public ConfiguredQuantizer<TQProdConfig, QuantKind::tq_prod> {
 public:
  /// Throws Error on dim < 2 or bits ∉ [1, 9].
  explicit TQProd(const TQProdConfig& cfg);
  static TQProdConfig config_from_json(const nlohmann::json& j);

  double bits_per_element(int64_t T) const override;
  using Quantizer::bits_per_element;  // the steady-state overload
  nlohmann::json to_json() const override;
  void fake_quant(const float* x, int64_t T, float* xhat) const override;

 private:
  TQMSE mse_;  // bits − 1 (0 = no MSE stage)
  Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> s_;  // (m, m) QJL matrix
};

}  // namespace ratekv::quant
