// Seeded Haar / randomized-Hadamard rotations (TurboQuant, docs/design.md §2.1).
#include "ratekv/quant/rotation.h"

#include <Eigen/QR>
#include <cmath>

#include "ratekv/common/error.h"
#include "ratekv/quant/prng.h"

namespace ratekv::quant {

std::string to_string(RotationKind k) {
  switch (k) {
    case RotationKind::haar: return "haar";
    case RotationKind::hadamard: return "hadamard";
    case RotationKind::identity: return "identity";
  }
  return "?";
}

RotationKind rotation_kind_from_string(const std::string& s) {
  if (s == "haar") return RotationKind::haar;
  if (s == "hadamard") return RotationKind::hadamard;
  if (s == "identity") return RotationKind::identity;
  fail("rotation: unknown kind '{}' (expected haar, hadamard or identity)", s);
}

static bool is_pow2(int m) { return m > 0 && (m & (m - 1)) == 0; }

Rotation::Rotation(RotationKind kind, int m, uint64_t seed) : kind_(kind), m_(m), seed_(seed) {
  check(m >= 1 && m <= 65536, "rotation: dimension {} is out of range (expected 1..65536)", m);
  SplitMix64 rng(seed);
  if (kind == RotationKind::haar) {
    Eigen::MatrixXd g(m, m);
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < m; ++j) g(i, j) = rng.gaussian();
    Eigen::HouseholderQR<Eigen::MatrixXd> qr(g);
    Eigen::MatrixXd q = qr.householderQ() * Eigen::MatrixXd::Identity(m, m);
    const Eigen::MatrixXd& r = qr.matrixQR();
    for (int j = 0; j < m; ++j)
      if (r(j, j) < 0) q.col(j) = -q.col(j);
    pi_ = q.cast<float>();
  } else if (kind == RotationKind::hadamard) {
    check(is_pow2(m), "rotation: randomized Hadamard needs a power-of-two dimension, got {}", m);
    signs_.resize(m);
    for (int i = 0; i < m; ++i) signs_[i] = rng.sign();
  }
}

void fwht(float* x, int n) {
  for (int h = 1; h < n; h *= 2)
    for (int i = 0; i < n; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
}

void Rotation::apply(const float* x, float* y) const {
  switch (kind_) {
    case RotationKind::haar:
      Eigen::Map<Eigen::VectorXf>(y, m_).noalias() = pi_ * Eigen::Map<const Eigen::VectorXf>(x, m_);
      return;
    case RotationKind::hadamard: {
      const float s = 1.0f / std::sqrt((float)m_);
      for (int i = 0; i < m_; ++i) y[i] = x[i] * signs_[i];
      fwht(y, m_);
      for (int i = 0; i < m_; ++i) y[i] *= s;
      return;
    }
    case RotationKind::identity:
      for (int i = 0; i < m_; ++i) y[i] = x[i];
      return;
  }
}

void Rotation::apply_transpose(const float* y, float* x) const {
  switch (kind_) {
    case RotationKind::haar:
      Eigen::Map<Eigen::VectorXf>(x, m_).noalias() = pi_.transpose() * Eigen::Map<const Eigen::VectorXf>(y, m_);
      return;
    case RotationKind::hadamard: {
      const float s = 1.0f / std::sqrt((float)m_);
      for (int i = 0; i < m_; ++i) x[i] = y[i];
      fwht(x, m_);
      for (int i = 0; i < m_; ++i) x[i] *= s * signs_[i];
      return;
    }
    case RotationKind::identity:
      for (int i = 0; i < m_; ++i) x[i] = y[i];
      return;
  }
}

Eigen::MatrixXd Rotation::matrix() const {
  Eigen::MatrixXd out(m_, m_);
  std::vector<float> e(m_), col(m_);
  for (int j = 0; j < m_; ++j) {
    std::fill(e.begin(), e.end(), 0.0f);
    e[j] = 1.0f;
    apply(e.data(), col.data());
    for (int i = 0; i < m_; ++i) out(i, j) = col[i];
  }
  return out;
}

}  // namespace ratekv::quant
