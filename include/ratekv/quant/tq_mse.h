// ratekv/quant/tq_mse.h — TurboQuant-MSE (arXiv 2504.19874; docs/design.md §2).
//
// For a vector x of dimension m:
//   n = ‖x‖₂, u = x/n, y = Π u (rotation.h), idx_i = #{j : y_i > θ_j} with θ
//   the Lloyd–Max thresholds of f_m at b bits (lloyd_max.h), stored norm
//   ñ = store_norm(n) (fp16 by default). With norm correction the stored norm
//   is n/‖c[idx]‖ so that ‖x̂‖ = n.
//   x̂ = ñ Πᵀ c[idx].
// Rotated-domain operations (docs/design.md §2.3): with q_rot = Π q,
//   q·x̂ = ñ Σ_i q_rot[i] c[idx_i]                       (score_rotated)
//   Σ_t w_t x̂_t = Πᵀ (Σ_t w_t ñ_t c[idx_t])              (accumulate_rotated + unrotate)
// b = 0 drops the vector: nothing stored, x̂ = 0, 0 bits.
//
// Effective bits per element = (m·b + norm_bits)/m for b ≥ 1, 0 for b = 0.
// JSON: {"kind":"tq_mse","dim":m,"bits":b,"seed":s,"rotation":"haar",
//        "norm":"fp16","norm_correction":false}
#pragma once

#include <cstdint>
#include <optional>

#include "ratekv/quant/lloyd_max.h"
#include "ratekv/quant/quantizer.h"
#include "ratekv/quant/rotation.h"

namespace ratekv::quant {

struct TQMSEConfig {
  int dim = 0;       // m ≥ 2 (hadamard: power of two)
  int bits = 0;      // 0..8
  uint64_t seed = 0; // rotation seed (caller derives one per (layer, head, group), prng.h mix_seed)
  RotationKind rotation = RotationKind::haar;
  NormCoding norm = NormCoding::fp16;
  bool norm_correction = false;
};

class TQMSE final : public ConfiguredQuantizer<TQMSEConfig, QuantKind::tq_mse> {
 public:
  /// Throws Error on dim < 2, bits ∉ [0,8], or a Hadamard rotation of non-power-of-two dim.
  explicit TQMSE(const TQMSEConfig& cfg);
  /// Parses the JSON description (see file comment). Throws Error on bad fields.
  static TQMSEConfig config_from_json(const nlohmann::json& j);

  int bits() const { return cfg_.bits; }
  const Rotation& rotation() const { return rot_; }
  /// Lloyd–Max codebook in use; throws Error if bits == 0.
  const Codebook& codebook() const;

  // ---- per-vector encode / decode (the first-class operations) ------------
  /// Encodes x (m) into idx (m codes < 2^b, one per byte) and returns the
  /// stored norm ñ (exactly representable in the norm coding). bits = 0:
  /// writes nothing, returns 0. Throws Error on non-finite x.
  float encode(const float* x, uint8_t* idx) const;
  /// Scalar reference encoder, the definition of the codes: n = ‖x‖ summed in
  /// double, u = x/n (fp32), y = Rotation::apply(u) (fp32), idx_i = linear
  /// count of thresholds below y_i. encode() (branchless binary search) is
  /// tested bit-exact against it.
  float encode_ref(const float* x, uint8_t* idx) const;
  /// x̂ = ñ Πᵀ c[idx]. x: (m). bits = 0: zeros.
  void decode(const uint8_t* idx, float norm, float* x) const;
  /// Packed form: codes bit-packed (bitpack.h) into packed_code_bytes() bytes.
  float encode_packed(const float* x, uint8_t* codes) const;
  void decode_packed(const uint8_t* codes, float norm, float* x) const;
  size_t packed_code_bytes() const;

  // ---- rotated-domain attention operations -------------------------------
  /// q_rot = Π q. q, q_rot: (m).
  void rotate(const float* q, float* q_rot) const { rot_.apply(q, q_rot); }
  /// y = Πᵀ y_rot. (m).
  void unrotate(const float* y_rot, float* y) const { rot_.apply_transpose(y_rot, y); }
  /// q·x̂ = ñ Σ_i q_rot[i] c[idx_i]  (0 for bits = 0).
  float score_rotated(const float* q_rot, const uint8_t* idx, float norm) const;
  /// acc_rot[i] += w·ñ·c[idx_i]; unrotate(acc_rot) once at the end.
  void accumulate_rotated(float w, const uint8_t* idx, float norm, float* acc_rot) const;

  // ---- Quantizer ------------------------------------------------------------
  double bits_per_element(int64_t T) const override;
  using Quantizer::bits_per_element;  // the steady-state overload
  nlohmann::json to_json() const override;
  void fake_quant(const float* x, int64_t T, float* xhat) const override;

 private:
  float finish_norm(float n, const uint8_t* idx) const;
  Rotation rot_;
  const Codebook* cb_ = nullptr;
};

}  // namespace ratekv::quant
