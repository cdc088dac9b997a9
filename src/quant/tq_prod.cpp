// TurboQuant-prod: (b−1)-bit TQ-MSE + 1-bit QJL residual sketch.
#include "ratekv/quant/tq_prod.h"

#include <cmath>
#include <vector>

#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/quant/prng.h"

namespace ratekv::quant {

static TQMSEConfig mse_config(const TQProdConfig& c) {
  check(c.dim >= 2, "tq_prod: dim {} is too small (expected ≥ 2)", c.dim);
  check(c.bits >= 1 && c.bits <= 9, "tq_prod: bits {} is out of range (expected 1..9)", c.bits);
  TQMSEConfig m;
  m.dim = c.dim;
  m.bits = c.bits - 1;
  m.seed = c.seed;
  m.rotation = c.rotation;
  m.norm = NormCoding::fp32;  // the unit vector's norm is 1 by construction; not stored
  return m;
}

TQProd::TQProd(const TQProdConfig& cfg) : ConfiguredQuantizer(cfg), mse_(mse_config(cfg)) {
  SplitMix64 rng(mix_seed(cfg.seed, 0x514a4c));
  s_.resize(cfg.dim, cfg.dim);
  for (int i = 0; i < cfg.dim; ++i)
    for (int j = 0; j < cfg.dim; ++j) s_(i, j) = (float)rng.gaussian();
}

TQProdConfig TQProd::config_from_json(const nlohmann::json& j) {
  TQProdConfig c;
  c.dim = detail::json_int(j, "dim", "tq_prod");
  c.bits = detail::json_int(j, "bits", "tq_prod");
  c.seed = detail::json_u64(j, "seed", "tq_prod", 0);
  if (j.contains("rotation")) c.rotation = rotation_kind_from_string(j.at("rotation").get<std::string>());
  return c;
}

nlohmann::json TQProd::to_json() const {
  return {{"kind", "tq_prod"}, {"dim", cfg_.dim}, {"bits", cfg_.bits}, {"seed", cfg_.seed},
          {"rotation", to_string(cfg_.rotation)}};
}

double TQProd::bits_per_element(int64_t T) const {
  check(T >= 1, "tq_prod: bits_per_element needs T ≥ 1, got {}", T);
  return cfg_.bits + 32.0 / cfg_.dim;
}

void TQProd::fake_quant(const float* x, int64_t T, float* xhat) const {
  check(T >= 0, "tq_prod: fake_quant got T = {} rows", T);
  const int m = cfg_.dim;
  std::vector<float> u(m), ut(m), r(m), s(m), back(m);
  std::vector<uint8_t> idx(m);
  const float qjl_scale = std::sqrt(3.14159265358979f / 2.0f) / m;
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * m;
    double n2 = 0.0;
    for (int i = 0; i < m; ++i) n2 += (double)xr[i] * xr[i];
    const float n = (float)std::sqrt(n2);
    check(std::isfinite(n), "tq_prod: input row {}'s L2 norm is {} (a non-finite value, or values so large that the "
          "float norm overflows)", t, n);
    const float inv = n > 0 ? 1.0f / n : 0.0f;
    for (int i = 0; i < m; ++i) u[i] = xr[i] * inv;
    mse_.encode(u.data(), idx.data());
    mse_.decode(idx.data(), cfg_.bits > 1 ? 1.0f : 0.0f, ut.data());  // ‖u‖ = 1 is implied, not stored
    double g2 = 0.0;
    for (int i = 0; i < m; ++i) {
      r[i] = u[i] - ut[i];
      g2 += (double)r[i] * r[i];
    }
    const float gamma = round_fp16((float)std::sqrt(g2));
    Eigen::Map<Eigen::VectorXf>(s.data(), m).noalias() = s_ * Eigen::Map<const Eigen::VectorXf>(r.data(), m);
    for (int i = 0; i < m; ++i) s[i] = s[i] >= 0 ? 1.0f : -1.0f;
    Eigen::Map<Eigen::VectorXf>(back.data(), m).noalias() =
        s_.transpose() * Eigen::Map<const Eigen::VectorXf>(s.data(), m);
    const float nst = round_fp16(n);
    check(std::isfinite(nst), "tq_prod: norm {} of input row {} overflows fp16", n, t);
    float* out = xhat + t * m;
    for (int i = 0; i < m; ++i) out[i] = nst * (ut[i] + gamma * qjl_scale * back[i]);
  }
}

}  // namespace ratekv::quant
