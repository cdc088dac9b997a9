// Distortion curves: fit, validation, serialization and the report table
// (calib/distortion_curves.h).
#include "ratekv/calib/distortion_curves.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "ratekv/common/error.h"

namespace ratekv::calib {

using nlohmann::json;

void fit_curves(QuantizerCurves& c, size_t n) {
  const quant::SharedBetaFit k = quant::fit_rd_shared_beta(c.bits, c.mse_k, n);
  const quant::SharedBetaFit v = quant::fit_rd_shared_beta(c.bits, c.mse_v, n);
  c.fit.beta_k = k.beta;
  c.fit.beta_v = v.beta;
  c.fit.alpha_k = k.alpha;
  c.fit.alpha_v = v.alpha;
  c.fit.bits = c.bits;
}

CurveFitReport curve_fit_report(const QuantizerCurves& c, size_t n) {
  return {quant::fit_rd_shared_beta(c.bits, c.mse_k, n), quant::fit_rd_shared_beta(c.bits, c.mse_v, n)};
}

void validate_curves(const std::map<std::string, QuantizerCurves>& curves, size_t n, const std::string& name) {
  for (const auto& [q, c] : curves) {
    const size_t nb = c.bits.size();
    check(nb >= 2, "{}: curves.{}.bits has {} widths, expected ≥ 2", name, q, nb);
    for (size_t j = 0; j < nb; ++j)
      check(curve_width_ok(c.bits, j), "{}: curves.{}.bits[{}] = {}: expected ascending distinct integer code widths "
            "in 0..16", name, q, j, c.bits[j]);
    for (const auto& [field, v] : {std::pair{"mse_k", &c.mse_k}, std::pair{"mse_v", &c.mse_v}}) {
      check(v->size() == n * nb, "{}: curves.{}.{} has {} values, expected {} components × {} widths", name, q, field,
            v->size(), n, nb);
      for (size_t i = 0; i < v->size(); ++i)
        check(std::isfinite((*v)[i]) && (*v)[i] > 0, "{}: curves.{}.{} = {} at flat index {}: expected finite and > 0",
              name, q, field, (*v)[i], i);
    }
    for (const auto& [field, v] : {std::pair{"alpha_k", &c.fit.alpha_k}, std::pair{"alpha_v", &c.fit.alpha_v}})
      check(v->size() == n, "{}: curves.{}.{} has {} values, expected {}", name, q, field, v->size(), n);
    check(c.fit.bits == c.bits, "{}: curves.{}: the fit's widths differ from the measured widths", name, q);
    validate_curve_fit(q, c.fit, name);  // known quantizer, β and α in their ranges
  }
}

void write_curves(const std::map<std::string, QuantizerCurves>& curves, int L, int H, SafetensorsWriter& w,
                  json& meta) {
  meta = json::object();
  for (const auto& [q, c] : curves) {
    const int64_t nb = static_cast<int64_t>(c.bits.size());
    auto f32 = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
    w.add_f32("curves." + q + ".mse_k", {L, H, nb}, f32(c.mse_k));
    w.add_f32("curves." + q + ".mse_v", {L, H, nb}, f32(c.mse_v));
    w.add_f32("curves." + q + ".alpha_k", {L, H}, f32(c.fit.alpha_k));
    w.add_f32("curves." + q + ".alpha_v", {L, H}, f32(c.fit.alpha_v));
    meta[q] = {{"bits", c.bits}, {"beta_k", c.fit.beta_k}, {"beta_v", c.fit.beta_v}};
  }
}

std::map<std::string, QuantizerCurves> read_curves(const SafetensorsFile& f, const json& meta, int L, int H,
                                                   const std::string& path) {
  check(meta.is_object(), "{}: __metadata__ curves: expected an object of quantizers", path);
  std::map<std::string, QuantizerCurves> out;
  for (const auto& [q, m] : meta.items()) {
    QuantizerCurves c;
    try {
      for (const auto& [key, v] : m.items())
        check(key == "bits" || key == "beta_k" || key == "beta_v",
              "{}: __metadata__ curves.{}.{}: unknown key (this build reads bits, beta_k, beta_v)", path, q, key);
      c.bits = m.at("bits").get<std::vector<double>>();
      c.fit.bits = c.bits;
      c.fit.beta_k = m.at("beta_k").get<double>();
      c.fit.beta_v = m.at("beta_v").get<double>();
    } catch (const json::exception& e) {
      fail("{}: __metadata__ curves.{}: missing or mistyped field: {}", path, q, e.what());
    }
    check(c.bits.size() >= 2 && c.bits.size() <= 64, "{}: curves.{}.bits: expected 2..64 widths, got {}", path, q,
          c.bits.size());
    for (size_t j = 0; j < c.bits.size(); ++j)  // named as this file spells the field (validate_curves: its own words)
      check(curve_width_ok(c.bits, j), "{}: __metadata__ curves.{}.bits[{}] = {}: expected ascending distinct integer "
            "code widths in 0..16", path, q, j, c.bits[j]);
    const int64_t nb = static_cast<int64_t>(c.bits.size());
    const std::string prefix = "curves." + q + ".";  // (a lambda may not capture a structured binding before clang 16)
    auto rd = [&](const std::string& t, std::vector<int64_t> shape) {
      f.expect(prefix + t, StDtype::F32, shape);
      const std::vector<float> v = f.read_f32(prefix + t);
      return std::vector<double>(v.begin(), v.end());
    };
    c.mse_k = rd("mse_k", {L, H, nb});
    c.mse_v = rd("mse_v", {L, H, nb});
    c.fit.alpha_k = rd("alpha_k", {L, H});
    c.fit.alpha_v = rd("alpha_v", {L, H});
    out.emplace(q, std::move(c));
  }
  validate_curves(out, static_cast<size_t>(L) * H, path);
  return out;
}

namespace {

struct Spread {
  double min, median, max;
};
Spread spread(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v.front(), v[v.size() / 2], v.back()};
}

}  // namespace

std::string format_curve_table(const std::map<std::string, QuantizerCurves>& curves, size_t n) {
  std::string s = fmt::format("{:<10} {:>4} {:>7} {:>10} {:>10} {:>10} {:>8} {:>8} {:>9}  widths\n", "quantizer", "side",
                              "beta", "alpha min", "alpha med", "alpha max", "R2 log", "R2 within", "max|dlnD|");
  for (const auto& [q, c] : curves) {
    const CurveFitReport r = curve_fit_report(c, n);
    for (int side = 0; side < 2; ++side) {
      const quant::SharedBetaFit& f = side == 0 ? r.k : r.v;
      const Spread a = spread(f.alpha);
      s += fmt::format("{:<10} {:>4} {:>7.3f} {:>10.3e} {:>10.3e} {:>10.3e} {:>8.4f} {:>8.4f} {:>9.3f}  {}..{}\n", q,
                       side == 0 ? "K" : "V", f.beta, a.min, a.median, a.max, f.r2_log, f.r2_within,
                       f.max_abs_log_err, c.bits.front(), c.bits.back());
    }
  }
  return s;
}

json curves_to_json(const std::map<std::string, QuantizerCurves>& curves, size_t n) {
  json j = json::object();
  for (const auto& [q, c] : curves) {
    const CurveFitReport r = curve_fit_report(c, n);
    json e = {{"bits", c.bits}};
    for (int side = 0; side < 2; ++side) {
      const quant::SharedBetaFit& f = side == 0 ? r.k : r.v;
      const Spread a = spread(f.alpha);
      e[side == 0 ? "k" : "v"] = {{"beta", f.beta},
                                  {"alpha", f.alpha},
                                  {"alpha_min", a.min},
                                  {"alpha_median", a.median},
                                  {"alpha_max", a.max},
                                  {"r2_log", f.r2_log},
                                  {"r2_within", f.r2_within},
                                  {"rms_log_err", f.rms_log_err},
                                  {"max_abs_log_err", f.max_abs_log_err},
                                  {"mse", side == 0 ? c.mse_k : c.mse_v}};
    }
    j[q] = e;
  }
  return j;
}

}  // namespace ratekv::calib
