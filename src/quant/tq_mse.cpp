// TurboQuant-MSE: rotate, Lloyd–Max quantize each coordinate, fp16 norm.
#include "ratekv/quant/tq_mse.h"

#include <cmath>
#include <vector>

#include "ratekv/common/error.h"
#include "ratekv/quant/bitpack.h"

namespace ratekv::quant {

TQMSE::TQMSE(const TQMSEConfig& cfg)
    : ConfiguredQuantizer(cfg), rot_((check(cfg.dim >= 2, "tq_mse: dim {} is too small (expected ≥ 2)", cfg.dim),
                       check(cfg.bits >= 0 && cfg.bits <= 8, "tq_mse: bits {} is out of range (expected 0..8)",
                             cfg.bits),
                       cfg.rotation),
                      cfg.dim, cfg.seed) {
  if (cfg_.bits > 0) cb_ = &lloyd_max_codebook(cfg_.dim, cfg_.bits);
}

TQMSEConfig TQMSE::config_from_json(const nlohmann::json& j) {
  TQMSEConfig c;
  c.dim = detail::json_int(j, "dim", "tq_mse");
  c.bits = detail::json_int(j, "bits", "tq_mse");
  c.seed = detail::json_u64(j, "seed", "tq_mse", 0);
  if (j.contains("rotation")) c.rotation = rotation_kind_from_string(j.at("rotation").get<std::string>());
  if (j.contains("norm")) c.norm = norm_coding_from_string(j.at("norm").get<std::string>());
  if (j.contains("norm_correction")) c.norm_correction = j.at("norm_correction").get<bool>();
  return c;
}

const Codebook& TQMSE::codebook() const {
  check(cb_ != nullptr, "tq_mse: a 0-bit quantizer has no codebook");
  return *cb_;
}

nlohmann::json TQMSE::to_json() const {
  return {{"kind", "tq_mse"},
          {"dim", cfg_.dim},
          {"bits", cfg_.bits},
          {"seed", cfg_.seed},
          {"rotation", to_string(cfg_.rotation)},
          {"norm", to_string(cfg_.norm)},
          {"norm_correction", cfg_.norm_correction}};
}

double TQMSE::bits_per_element(int64_t T) const {
  check(T >= 1, "tq_mse: bits_per_element needs T ≥ 1, got {}", T);
  if (cfg_.bits == 0) return 0.0;
  return ((double)cfg_.dim * cfg_.bits + norm_bits(cfg_.norm)) / cfg_.dim;
}

float TQMSE::finish_norm(float n, const uint8_t* idx) const {
  if (cfg_.norm_correction && n > 0) {
    double c2 = 0.0;
    for (int i = 0; i < cfg_.dim; ++i) c2 += (double)cb_->levels[idx[i]] * cb_->levels[idx[i]];
    n = (float)(n / std::sqrt(c2));
  }
  const float stored = store_norm(cfg_.norm, n);
  check(std::isfinite(stored), "tq_mse: vector norm {} overflows its {} encoding", n, to_string(cfg_.norm));
  return stored;
}

namespace {
// ‖x‖ with the sum in double (the reference definition of n).
float vec_norm(const float* x, int m) {
  double s = 0.0;
  for (int i = 0; i < m; ++i) s += (double)x[i] * x[i];
  return (float)std::sqrt(s);
}
}  // namespace

float TQMSE::encode_ref(const float* x, uint8_t* idx) const {
  if (cfg_.bits == 0) return 0.0f;
  const int m = cfg_.dim;
  detail::check_finite(x, m, "tq_mse: input vector");
  const float n = vec_norm(x, m);
  std::vector<float> u(m), y(m);
  const float inv = n > 0 ? 1.0f / n : 0.0f;
  for (int i = 0; i < m; ++i) u[i] = x[i] * inv;
  rot_.apply(u.data(), y.data());
  for (int i = 0; i < m; ++i) {
    int c = 0;
    for (float th : cb_->thresholds) c += y[i] > th ? 1 : 0;
    idx[i] = (uint8_t)c;
  }
  return finish_norm(n, idx);
}

float TQMSE::encode(const float* x, uint8_t* idx) const {
  if (cfg_.bits == 0) return 0.0f;
  const int m = cfg_.dim;
  const float n = vec_norm(x, m);
  check(std::isfinite(n), "tq_mse: input vector's L2 norm is {} (a non-finite value, or values so large that the "
        "float norm overflows)", n);
  thread_local std::vector<float> scratch;
  if (scratch.size() < 2 * (size_t)m) scratch.resize(2 * (size_t)m);
  float* u = scratch.data();
  float* y = scratch.data() + m;
  const float inv = n > 0 ? 1.0f / n : 0.0f;
  for (int i = 0; i < m; ++i) u[i] = x[i] * inv;
  rot_.apply(u, y);
  // Branchless binary search over the 2^b − 1 ascending thresholds (the probe
  // index pos + step − 1 never exceeds 2^b − 2): idx = #{j : y > θ_j}.
  const float* th = cb_->thresholds.data();
  const int K = 1 << cfg_.bits;
  for (int i = 0; i < m; ++i) {
    const float v = y[i];
    int pos = 0;
    for (int step = K / 2; step >= 1; step /= 2) pos += (v > th[pos + step - 1]) ? step : 0;
    idx[i] = (uint8_t)pos;
  }
  return finish_norm(n, idx);
}

void TQMSE::decode(const uint8_t* idx, float norm, float* x) const {
  const int m = cfg_.dim;
  if (cfg_.bits == 0) {
    for (int i = 0; i < m; ++i) x[i] = 0.0f;
    return;
  }
  thread_local std::vector<float> scratch;
  if (scratch.size() < (size_t)m) scratch.resize(m);
  float* c = scratch.data();
  const float* lv = cb_->levels.data();
  for (int i = 0; i < m; ++i) c[i] = norm * lv[idx[i]];
  rot_.apply_transpose(c, x);
}

size_t TQMSE::packed_code_bytes() const { return cfg_.bits == 0 ? 0 : packed_bytes(cfg_.dim, cfg_.bits); }

float TQMSE::encode_packed(const float* x, uint8_t* codes) const {
  if (cfg_.bits == 0) return 0.0f;
  thread_local std::vector<uint8_t> idx;
  idx.resize(cfg_.dim);
  const float n = encode(x, idx.data());
  pack_bits(idx.data(), idx.size(), cfg_.bits, codes);
  return n;
}

void TQMSE::decode_packed(const uint8_t* codes, float norm, float* x) const {
  if (cfg_.bits == 0) return decode(nullptr, 0.0f, x);
  thread_local std::vector<uint8_t> idx;
  idx.resize(cfg_.dim);
  unpack_bits(codes, idx.size(), cfg_.bits, idx.data());
  decode(idx.data(), norm, x);
}

float TQMSE::score_rotated(const float* q_rot, const uint8_t* idx, float norm) const {
  if (cfg_.bits == 0) return 0.0f;
  const float* lv = cb_->levels.data();
  float s = 0.0f;
  for (int i = 0; i < cfg_.dim; ++i) s += q_rot[i] * lv[idx[i]];
  return norm * s;
}

void TQMSE::accumulate_rotated(float w, const uint8_t* idx, float norm, float* acc_rot) const {
  if (cfg_.bits == 0) return;
  const float* lv = cb_->levels.data();
  const float a = w * norm;
  for (int i = 0; i < cfg_.dim; ++i) acc_rot[i] += a * lv[idx[i]];
}

void TQMSE::fake_quant(const float* x, int64_t T, float* xhat) const {
  check(T >= 0, "tq_mse: fake_quant got T = {} rows", T);
  const int m = cfg_.dim;
  std::vector<uint8_t> idx(m);
  for (int64_t t = 0; t < T; ++t) {
    const float n = encode(x + t * m, idx.data());  // reads the row fully before decode writes it
    decode(idx.data(), n, xhat + t * m);
  }
}

}  // namespace ratekv::quant
