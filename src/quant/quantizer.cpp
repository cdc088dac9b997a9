// Quantizer kinds, norm codings, JSON factory and the distortion measure.
#include "ratekv/quant/quantizer.h"

#include <cmath>
#include <vector>

#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/quant/ggml_blocks.h"
#include "ratekv/quant/grouped_tq_mse.h"
#include "ratekv/quant/kivi.h"
#include "ratekv/quant/quarot.h"
#include "ratekv/quant/tq_mse.h"
#include "ratekv/quant/tq_prod.h"

namespace ratekv::quant {

namespace {
struct KindName {
  QuantKind k;
  const char* name;
};
constexpr KindName kKinds[] = {
    {QuantKind::tq_mse, "tq_mse"},       {QuantKind::tq_prod, "tq_prod"},
    {QuantKind::grouped_tq_mse, "grouped_tq_mse"}, {QuantKind::kivi_key, "kivi_key"},
    {QuantKind::kivi_value, "kivi_value"}, {QuantKind::quarot, "quarot"},
    {QuantKind::ggml_q8_0, "q8_0"},      {QuantKind::ggml_q4_0, "q4_0"},
    {QuantKind::tasq, "tasq"},
};
}  // namespace

std::string to_string(QuantKind k) {
  for (const auto& e : kKinds)
    if (e.k == k) return e.name;
  return "?";
}

std::string to_string(QuantScope s) {
  switch (s) {
    case QuantScope::per_vector: return "per_vector";
    case QuantScope::per_channel_tokens: return "per_channel_tokens";
    case QuantScope::per_token_shared: return "per_token_shared";
  }
  return "?";
}

QuantKind quant_kind_from_string(const std::string& s) {
  std::string known;
  for (const auto& e : kKinds) {
    if (s == e.name) return e.k;
    known += known.empty() ? "" : ", ";
    known += e.name;
  }
  fail("quantizer: unknown kind '{}' (expected one of {})", s, known);
}

int norm_bits(NormCoding c) { return c == NormCoding::fp16 ? 16 : 32; }

float store_norm(NormCoding c, float n) { return c == NormCoding::fp16 ? round_fp16(n) : n; }

std::string to_string(NormCoding c) { return c == NormCoding::fp16 ? "fp16" : "fp32"; }

NormCoding norm_coding_from_string(const std::string& s) {
  if (s == "fp16") return NormCoding::fp16;
  if (s == "fp32") return NormCoding::fp32;
  fail("quantizer: unknown norm coding '{}' (expected fp16 or fp32)", s);
}

namespace detail {

int json_int(const nlohmann::json& j, const char* key, const char* what) {
  check(j.is_object() && j.contains(key), "{}: description lacks field '{}'", what, key);
  const auto& v = j.at(key);
  check(v.is_number_integer(), "{}: field '{}' must be an integer, got {}", what, key, v.dump());
  const int64_t x = v.get<int64_t>();
  check(x >= -(1ll << 30) && x <= (1ll << 30), "{}: field '{}' = {} is out of range", what, key, x);
  return (int)x;
}

uint64_t json_u64(const nlohmann::json& j, const char* key, const char* what, uint64_t def) {
  if (!j.contains(key)) return def;
  const auto& v = j.at(key);
  check(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0),
        "{}: field '{}' must be a non-negative integer, got {}", what, key, v.dump());
  return v.get<uint64_t>();
}

void check_finite(const float* x, int64_t n, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    check(std::isfinite(x[i]), "{} has a non-finite value at element {}", what, i);
}

}  // namespace detail

std::unique_ptr<Quantizer> make_quantizer(const nlohmann::json& desc) {
  check(desc.is_object() && desc.contains("kind") && desc.at("kind").is_string(),
        "quantizer: description must be an object with a string field 'kind', got {}", desc.dump());
  const QuantKind k = quant_kind_from_string(desc.at("kind").get<std::string>());
  switch (k) {
    case QuantKind::tq_mse: return std::make_unique<TQMSE>(TQMSE::config_from_json(desc));
    case QuantKind::tq_prod: return std::make_unique<TQProd>(TQProd::config_from_json(desc));
    case QuantKind::grouped_tq_mse: return std::make_unique<GroupedTQMSE>(GroupedTQMSE::config_from_json(desc));
    case QuantKind::kivi_key: return std::make_unique<KIVIKey>(KIVIKey::config_from_json(desc));
    case QuantKind::kivi_value: return std::make_unique<KIVIValue>(KIVIValue::config_from_json(desc));
    case QuantKind::quarot: return std::make_unique<QuaRot>(QuaRot::config_from_json(desc));
    case QuantKind::ggml_q8_0:
      return std::make_unique<GgmlBlockQuantizer>(GgmlType::q8_0, detail::json_int(desc, "dim", "q8_0"));
    case QuantKind::ggml_q4_0:
      return std::make_unique<GgmlBlockQuantizer>(GgmlType::q4_0, detail::json_int(desc, "dim", "q4_0"));
    case QuantKind::tasq: break;
  }
  fail("quantizer: kind '{}' cannot be built by make_quantizer (TaSQ needs fitted codebooks)", to_string(k));
}

double relative_distortion(const Quantizer& q, const float* x, int64_t N) {
  const int64_t n = N * q.dim();
  std::vector<float> xhat(n);
  q.fake_quant(x, N, xhat.data());
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double e = (double)x[i] - xhat[i];
    num += e * e;
    den += (double)x[i] * x[i];
  }
  check(den > 0, "relative_distortion: the {} input rows are all zero", N);
  return num / den;
}

}  // namespace ratekv::quant
