// ratekv/quant/rotation.h — the seeded random orthogonal rotation Π of
// TurboQuant (docs/design.md §2.1).
//
// Kinds:
//   haar      Π = Q·diag(sign R_ii) from the Householder QR of an m×m matrix
//             G with i.i.d. N(0,1) entries (G(i,j) drawn row-major from
//             SplitMix64 + Box–Muller of `seed`). The sign fix makes Π exactly
//             Haar-distributed (Mezzadri 2007). QR in double, Π stored fp32.
//   hadamard  randomized Walsh–Hadamard, m a power of two: Π = H·D/√m with H
//             the Sylvester Hadamard matrix and D = diag(±1) drawn from `seed`
//             (SplitMix64 top bit). O(m log m) per vector.
//   identity  Π = I (for tests and ablations).
#pragma once

#include <Eigen/Core>

#include <cstdint>
#include <string>
#include <vector>

namespace ratekv::quant {

enum class RotationKind { haar, hadamard, identity };

/// "haar" | "hadamard" | "identity".
std::string to_string(RotationKind k);
/// Inverse of to_string; throws Error naming the accepted values.
RotationKind rotation_kind_from_string(const std::string& s);

/// A fixed orthogonal m×m map, a pure function of (kind, m, seed).
class Rotation {
 public:
  /// Throws Error if m < 1 (or m not a power of two for hadamard).
  Rotation(RotationKind kind, int m, uint64_t seed);

  RotationKind kind() const { return kind_; }
  int dim() const { return m_; }
  uint64_t seed() const { return seed_; }

  /// y = Π x. x, y: (m); may not alias.
  void apply(const float* x, float* y) const;
  /// x = Πᵀ y (the inverse). y, x: (m); may not alias.
  void apply_transpose(const float* y, float* x) const;
  /// Dense Π (m×m), for tests and references.
  Eigen::MatrixXd matrix() const;

 private:
  RotationKind kind_;
  int m_;
  uint64_t seed_;
  Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> pi_;  // haar only
  std::vector<float> signs_;                                                  // hadamard only
};

/// In-place unnormalized fast Walsh–Hadamard transform x <- H x, n a power of two.
void fwht(float* x, int n);

}  // namespace ratekv::quant
