// KIVI-style asymmetric integer quantization: per-channel keys, per-token values.
#include "ratekv/quant/kivi.h"

#include <algorithm>
#include <vector>

#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/quant/int_quant.h"

namespace ratekv::quant {

static void check_cfg(const KIVIConfig& c, const char* what) {
  check(c.dim >= 1, "{}: dim {} is too small (expected ≥ 1)", what, c.dim);
  check(c.bits >= 1 && c.bits <= 8, "{}: bits {} is out of range (expected 1..8)", what, c.bits);
  check(c.group_size >= 1, "{}: group_size {} must be ≥ 1", what, c.group_size);
}

static KIVIConfig kivi_from_json(const nlohmann::json& j, const char* what) {
  KIVIConfig c;
  c.dim = detail::json_int(j, "dim", what);
  c.bits = detail::json_int(j, "bits", what);
  c.group_size = detail::json_int(j, "group_size", what);
  return c;
}

static nlohmann::json kivi_to_json(const KIVIConfig& c, const char* kind) {
  return {{"kind", kind}, {"dim", c.dim}, {"bits", c.bits}, {"group_size", c.group_size}};
}

// ---- keys -------------------------------------------------------------------

KIVIKey::KIVIKey(const KIVIConfig& cfg) : ConfiguredQuantizer(cfg) { check_cfg(cfg, "kivi_key"); }
KIVIConfig KIVIKey::config_from_json(const nlohmann::json& j) { return kivi_from_json(j, "kivi_key"); }
nlohmann::json KIVIKey::to_json() const { return kivi_to_json(cfg_, "kivi_key"); }

double KIVIKey::bits_per_element(int64_t T) const {
  check(T >= 1, "kivi_key: bits_per_element needs T ≥ 1, got {}", T);
  const int64_t g = cfg_.group_size, d = cfg_.dim;
  const int64_t full = g * (T / g);
  const double bits = (double)full * d * cfg_.bits + (double)(full / g) * d * 32.0 + (double)(T - full) * d * 16.0;
  return bits / ((double)T * d);
}

void KIVIKey::fake_quant(const float* x, int64_t T, float* xhat) const {
  check(T >= 0, "kivi_key: fake_quant got T = {} rows", T);
  const int64_t g = cfg_.group_size, d = cfg_.dim;
  const int64_t full = g * (T / g);
  std::vector<uint8_t> codes(g);
  for (int64_t t0 = 0; t0 < full; t0 += g)
    for (int64_t c = 0; c < d; ++c) {
      const IntGroupParams p = quantize_asym(x + t0 * d + c, g, d, cfg_.bits, codes.data());
      dequantize_asym(codes.data(), g, p, xhat + t0 * d + c, d);
    }
  for (int64_t i = full * d; i < T * d; ++i) {  // fp16 window
    check(std::isfinite(x[i]), "kivi_key: non-finite value in window row {}", i / d);
    xhat[i] = round_fp16(x[i]);
    check(std::isfinite(xhat[i]), "kivi_key: value {} in fp16 window row {} overflows fp16 (|x| ≤ 65504)", x[i],
          i / d);
  }
}

// ---- values -----------------------------------------------------------------

KIVIValue::KIVIValue(const KIVIConfig& cfg) : ConfiguredQuantizer(cfg) {
  check_cfg(cfg, "kivi_value");
  cfg_.group_size = std::min(cfg_.group_size, cfg_.dim);
}
KIVIConfig KIVIValue::config_from_json(const nlohmann::json& j) { return kivi_from_json(j, "kivi_value"); }
nlohmann::json KIVIValue::to_json() const { return kivi_to_json(cfg_, "kivi_value"); }

double KIVIValue::bits_per_element(int64_t T) const {
  check(T >= 1, "kivi_value: bits_per_element needs T ≥ 1, got {}", T);
  const int64_t ngroups = (cfg_.dim + cfg_.group_size - 1) / cfg_.group_size;
  return cfg_.bits + 32.0 * (double)ngroups / cfg_.dim;
}

void KIVIValue::fake_quant(const float* x, int64_t T, float* xhat) const {
  check(T >= 0, "kivi_value: fake_quant got T = {} rows", T);
  const int64_t d = cfg_.dim, G = cfg_.group_size;
  std::vector<uint8_t> codes(G);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c0 = 0; c0 < d; c0 += G) {
      const int64_t n = std::min(G, d - c0);
      const IntGroupParams p = quantize_asym(x + t * d + c0, n, 1, cfg_.bits, codes.data());
      dequantize_asym(codes.data(), n, p, xhat + t * d + c0, 1);
    }
}

}  // namespace ratekv::quant
