// QuaRot-style: Hadamard rotation + per-token integer quantization.
#include "ratekv/quant/quarot.h"

#include <algorithm>
#include <vector>

#include "ratekv/common/error.h"
#include "ratekv/quant/int_quant.h"

namespace ratekv::quant {

static QuaRotConfig normalized(QuaRotConfig c) {
  check(c.dim >= 1, "quarot: dim {} is too small (expected ≥ 1)", c.dim);
  if (c.symmetric)
    check(c.bits >= 2 && c.bits <= 8, "quarot: symmetric bits {} is out of range (expected 2..8)", c.bits);
  else
    check(c.bits >= 1 && c.bits <= 8, "quarot: asymmetric bits {} is out of range (expected 1..8)", c.bits);
  check(c.group_size >= 0, "quarot: group_size {} must be ≥ 0", c.group_size);
  if (c.group_size == 0 || c.group_size > c.dim) c.group_size = c.dim;
  return c;
}

QuaRot::QuaRot(const QuaRotConfig& cfg) : ConfiguredQuantizer(normalized(cfg)), rot_(cfg_.rotation, cfg_.dim, cfg_.seed) {}

QuaRotConfig QuaRot::config_from_json(const nlohmann::json& j) {
  QuaRotConfig c;
  c.dim = detail::json_int(j, "dim", "quarot");
  c.bits = detail::json_int(j, "bits", "quarot");
  c.seed = detail::json_u64(j, "seed", "quarot", 0);
  if (j.contains("symmetric")) c.symmetric = j.at("symmetric").get<bool>();
  if (j.contains("group_size")) c.group_size = detail::json_int(j, "group_size", "quarot");
  const bool pow2 = c.dim > 0 && (c.dim & (c.dim - 1)) == 0;
  c.rotation = j.contains("rotation") ? rotation_kind_from_string(j.at("rotation").get<std::string>())
                                      : (pow2 ? RotationKind::hadamard : RotationKind::haar);
  return c;
}

nlohmann::json QuaRot::to_json() const {
  return {{"kind", "quarot"},          {"dim", cfg_.dim},
          {"bits", cfg_.bits},         {"seed", cfg_.seed},
          {"symmetric", cfg_.symmetric}, {"group_size", cfg_.group_size},
          {"rotation", to_string(cfg_.rotation)}};
}

double QuaRot::bits_per_element(int64_t T) const {
  check(T >= 1, "quarot: bits_per_element needs T ≥ 1, got {}", T);
  const int64_t ngroups = (cfg_.dim + cfg_.group_size - 1) / cfg_.group_size;
  return cfg_.bits + (cfg_.symmetric ? 16.0 : 32.0) * (double)ngroups / cfg_.dim;
}

void QuaRot::fake_quant(const float* x, int64_t T, float* xhat) const {
  check(T >= 0, "quarot: fake_quant got T = {} rows", T);
  const int d = cfg_.dim, G = cfg_.group_size;
  std::vector<float> y(d);
  std::vector<uint8_t> codes(G);
  for (int64_t t = 0; t < T; ++t) {
    detail::check_finite(x + t * d, d, "quarot: input row");
    rot_.apply(x + t * d, y.data());
    for (int c0 = 0; c0 < d; c0 += G) {
      const int n = std::min(G, d - c0);
      if (cfg_.symmetric) {
        const IntGroupParams p = quantize_sym(y.data() + c0, n, 1, cfg_.bits, codes.data());
        dequantize_sym(codes.data(), n, cfg_.bits, p, y.data() + c0, 1);
      } else {
        const IntGroupParams p = quantize_asym(y.data() + c0, n, 1, cfg_.bits, codes.data());
        dequantize_asym(codes.data(), n, p, y.data() + c0, 1);
      }
    }
    rot_.apply_transpose(y.data(), xhat + t * d);
  }
}

}  // namespace ratekv::quant
