// Calibration statistics: validation and the JSON file (ratekv/format/calib_stats.h).
#include "ratekv/format/calib_stats.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <fstream>
#include <sstream>

#include <fmt/ranges.h>

#include "format/json_file.h"
#include "format/plan_target_check.h"
#include "ratekv/common/error.h"

namespace ratekv {

using nlohmann::json;

namespace {

void check_values(const std::vector<double>& v, size_t n, const std::string& name, const std::string& field) {
  check(v.size() == n, "{}: {}: {} values, expected {}", name, field, v.size(), n);
  for (size_t i = 0; i < v.size(); ++i)
    check(std::isfinite(v[i]) && v[i] >= 0.0, "{}: {}[flat {}] = {}: expected finite and >= 0", name, field, i, v[i]);
}

// Nested arrays of fixed shape -> flat row-major vector.
void flatten(const json& j, const std::vector<size_t>& shape, size_t dim, const std::string& path,
             const std::string& name, std::vector<double>& out, bool signed_values = false) {
  check(j.is_array(), "{}: {}: expected an array", name, path);
  check(j.size() == shape[dim], "{}: {}: {} entries, expected {}", name, path, j.size(), shape[dim]);
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string p = fmt::format("{}[{}]", path, i);
    if (dim + 1 < shape.size()) {
      flatten(j[i], shape, dim + 1, p, name, out, signed_values);
    } else {
      check(j[i].is_number(), "{}: {}: expected a number", name, p);
      const double x = j[i].get<double>();
      check(std::isfinite(x) && (signed_values || x >= 0.0), "{}: {} = {}: expected finite{}", name, p, x,
            signed_values ? "" : " and >= 0");
      out.push_back(x);
    }
  }
}

json nest(const std::vector<double>& v, const std::vector<size_t>& shape, size_t dim, size_t& pos) {
  json a = json::array();
  for (size_t i = 0; i < shape[dim]; ++i) {
    if (dim + 1 < shape.size()) a.push_back(nest(v, shape, dim + 1, pos));
    else a.push_back(v[pos++]);
  }
  return a;
}

json nest(const std::vector<double>& v, const std::vector<size_t>& shape) {
  size_t pos = 0;
  return nest(v, shape, 0, pos);
}

// Every key of object `o` must be one of `known`; `path` names the object ("" = top level).
void only_known_keys(const json& o, std::initializer_list<const char*> known, const std::string& path,
                     const std::string& name) {
  check(o.is_object(), "{}: {}: expected an object", name, path.empty() ? "<top>" : path);
  for (const auto& [key, v] : o.items()) {
    bool ok = false;
    for (const char* k : known) ok = ok || key == k;
    check(ok, "{}: {}{}: unknown key (this build reads {}); a misspelled or foreign field would be ignored", name,
          path.empty() ? "" : path + ".", key, fmt::join(known, ", "));
  }
}

const json& need(const json& o, const char* key, const std::string& path, const std::string& name) {
  check(o.is_object(), "{}: {}: expected an object", name, path.empty() ? "<top>" : path);
  auto it = o.find(key);
  check(it != o.end(), "{}: {}{}: missing", name, path.empty() ? "" : path + ".", key);
  return *it;
}

double need_number(const json& o, const char* key, const std::string& path, const std::string& name) {
  const json& v = need(o, key, path, name);
  check(v.is_number(), "{}: {}.{}: expected a number", name, path, key);
  return v.get<double>();
}

}  // namespace

const std::vector<std::string>& curve_quantizers() {
  static const std::vector<std::string> names = {"kivi", "quarot", "tq-mse", "block-gtq"};
  return names;
}

bool curve_width_ok(const std::vector<double>& bits, size_t j) {
  const double b = bits[j];
  return std::isfinite(b) && b >= 0 && b <= 16 && b == std::floor(b) && (j == 0 || b > bits[j - 1]);
}

void validate_curve_fit(const std::string& quantizer, const DistortionCurves& c, const std::string& name) {
  const auto& known = curve_quantizers();
  check(std::find(known.begin(), known.end(), quantizer) != known.end(),
        "{}: curves.{}: unknown quantizer (curves are measured for {})", name, quantizer, fmt::join(known, ", "));
  for (const auto& [field, b] : {std::pair{"beta_k", c.beta_k}, std::pair{"beta_v", c.beta_v}})
    check(std::isfinite(b) && b > 1.0 && b <= kMaxCurveBeta,
          "{}: curves.{}.{} = {}: expected finite, > 1 and <= {} (distortion falls by at most {}x per code bit)", name,
          quantizer, field, b, kMaxCurveBeta, kMaxCurveBeta);
  check(c.bits.size() >= 2, "{}: curves.{}.bits: {} widths; expected the ≥ 2 code widths the curves were fitted at",
        name, quantizer, c.bits.size());
  for (size_t j = 0; j < c.bits.size(); ++j)
    check(curve_width_ok(c.bits, j), "{}: curves.{}.bits[{}] = {}: expected ascending distinct integer code widths in "
          "0..16", name, quantizer, j, c.bits[j]);
  for (const auto& [field, v] : {std::pair{"alpha_k", &c.alpha_k}, std::pair{"alpha_v", &c.alpha_v}})
    for (size_t i = 0; i < v->size(); ++i)
      check(std::isfinite((*v)[i]) && (*v)[i] > 0.0 && (*v)[i] <= kMaxCurveAlpha,
            "{}: curves.{}.{}[flat {}] = {}: expected finite, > 0 and <= {}", name, quantizer, field, i, (*v)[i],
            kMaxCurveAlpha);
}

std::vector<double> CalibStats::centered_block_energies(int layer, int head) const {
  check(!k_pre_mean.empty(), "stats: centered block energies need k_pre_mean (statistics from ratekv calibrate)");
  std::vector<double> s = block_energies(layer, head);
  const size_t d = (size_t)model.head_dim, L = d / 2;
  const double* mu = k_pre_mean.data() + ((size_t)layer * model.n_kv_heads + head) * d;
  const bool neox = model.rope_layout == "neox";
  for (size_t i = 0; i < L; ++i) {
    const double a = neox ? mu[i] : mu[2 * i], b = neox ? mu[i + L] : mu[2 * i + 1];
    // E‖k_i − R_p μ_i‖² = E‖k_i‖² − ‖μ_i‖² (E_t k_pre = μ, RoPE keeps block norms), floored at 0.
    const size_t off = ((size_t)layer * model.n_kv_heads + head) * L + i;
    const double kc = std::max(0.0, k_block_energy[off] - (a * a + b * b));
    s[i] = 0.5 * (q_block_energy[off] + kc);
  }
  return s;
}

std::vector<double> CalibStats::block_energies(int layer, int head) const {
  check(layer >= 0 && layer < model.n_layers && head >= 0 && head < model.n_kv_heads,
        "stats: (layer {}, head {}) outside ({} layers, {} KV heads)", layer, head, model.n_layers, model.n_kv_heads);
  const size_t L = (size_t)model.head_dim / 2;
  const size_t off = ((size_t)layer * model.n_kv_heads + head) * L;
  std::vector<double> s(L);
  for (size_t i = 0; i < L; ++i) s[i] = 0.5 * (q_block_energy[off + i] + k_block_energy[off + i]);
  return s;
}

void CalibStats::validate(const std::string& name) const {
  const auto& m = model;
  format::validate_plan_target(m, name);
  check(n_tokens >= 0, "{}: n_tokens = {}: expected >= 0", name, n_tokens);
  const size_t nc = (size_t)m.n_layers * m.n_kv_heads, ne = nc * (m.head_dim / 2);
  check_values(q_block_energy, ne, name, "q_block_energy");
  check_values(k_block_energy, ne, name, "k_block_energy");
  if (!k_pre_mean.empty()) {
    check(k_pre_mean.size() == nc * m.head_dim, "{}: k_pre_mean: {} values, expected {}", name, k_pre_mean.size(),
          nc * m.head_dim);
    for (size_t i = 0; i < k_pre_mean.size(); ++i)
      check(std::isfinite(k_pre_mean[i]), "{}: k_pre_mean[flat {}] = {}: expected finite", name, i, k_pre_mean[i]);
  }
  for (const auto& [key, s] : sensitivity) {
    check_values(s.k, nc, name, "sensitivity." + key + ".k");
    check_values(s.v, nc, name, "sensitivity." + key + ".v");
  }
  for (const auto& [key, c] : curves) {
    check(c.alpha_k.size() == nc && c.alpha_v.size() == nc, "{}: curves.{}: {} and {} alphas, expected {}", name, key,
          c.alpha_k.size(), c.alpha_v.size(), nc);
    validate_curve_fit(key, c, name);
  }
}

json stats_to_json(const CalibStats& s) {
  const auto& m = s.model;
  const std::vector<size_t> s2 = {(size_t)m.n_layers, (size_t)m.n_kv_heads};
  const std::vector<size_t> s3 = {(size_t)m.n_layers, (size_t)m.n_kv_heads, (size_t)m.head_dim / 2};
  json j;
  j["format"] = "ratekv-calib-stats";
  j["version"] = 1;
  j["model"] = {{"arch", m.arch},           {"n_layers", m.n_layers}, {"n_kv_heads", m.n_kv_heads},
                {"head_dim", m.head_dim},   {"rope_layout", m.rope_layout}, {"file", m.file},
                {"sha256", m.sha256}};
  j["source"] = s.source;
  j["n_tokens"] = s.n_tokens;
  j["q_block_energy"] = nest(s.q_block_energy, s3);
  j["k_block_energy"] = nest(s.k_block_energy, s3);
  if (!s.k_pre_mean.empty())
    j["k_pre_mean"] = nest(s.k_pre_mean, {(size_t)m.n_layers, (size_t)m.n_kv_heads, (size_t)m.head_dim});
  json sens = json::object();
  for (const auto& [key, w] : s.sensitivity) sens[key] = {{"k", nest(w.k, s2)}, {"v", nest(w.v, s2)}};
  j["sensitivity"] = std::move(sens);
  json curves = json::object();
  for (const auto& [key, c] : s.curves)
    curves[key] = {{"bits", c.bits},
                   {"beta_k", c.beta_k},
                   {"beta_v", c.beta_v},
                   {"alpha_k", nest(c.alpha_k, s2)},
                   {"alpha_v", nest(c.alpha_v, s2)}};
  j["curves"] = std::move(curves);
  return j;
}

CalibStats stats_from_json(const json& j, const std::string& name) {
  const json& fmt_ = need(j, "format", "", name);
  check(fmt_ == "ratekv-calib-stats", "{}: format = {}: expected \"ratekv-calib-stats\"", name, fmt_.dump());
  const json& ver = need(j, "version", "", name);
  check(ver == 1, "{}: version = {}: this build reads statistics version 1", name, ver.dump());
  only_known_keys(j, {"format", "version", "model", "source", "n_tokens", "q_block_energy", "k_block_energy",
                      "k_pre_mean", "sensitivity", "curves"},
                  "", name);
  CalibStats s;
  const json& m = need(j, "model", "", name);
  only_known_keys(m, {"arch", "n_layers", "n_heads", "n_kv_heads", "head_dim", "rope_layout", "file", "sha256"},
                  "model", name);
  auto str = [&](const json& o, const char* key, const std::string& path) {
    const json& v = need(o, key, path, name);
    check(v.is_string(), "{}: {}.{}: expected a string", name, path, key);
    return v.get<std::string>();
  };
  auto integer = [&](const json& o, const char* key, const std::string& path, int64_t lo, int64_t hi) {
    const json& v = need(o, key, path, name);
    check(v.is_number_integer(), "{}: {}{}: expected an integer", name, path.empty() ? "" : path + ".", key);
    const int64_t x = v.get<int64_t>();
    check(x >= lo && x <= hi, "{}: {}{} = {}: expected {}..{}", name, path.empty() ? "" : path + ".", key, x, lo, hi);
    return x;
  };
  s.model.arch = str(m, "arch", "model");
  s.model.n_layers = (int)integer(m, "n_layers", "model", 1, 4096);
  s.model.n_kv_heads = (int)integer(m, "n_kv_heads", "model", 1, 1024);
  s.model.head_dim = (int)integer(m, "head_dim", "model", 2, 1024);
  s.model.rope_layout = str(m, "rope_layout", "model");
  if (m.contains("file")) s.model.file = str(m, "file", "model");
  if (m.contains("sha256")) s.model.sha256 = str(m, "sha256", "model");
  check(s.model.head_dim % 2 == 0, "{}: model.head_dim = {}: expected an even number", name, s.model.head_dim);
  if (m.contains("n_heads")) {
    const int64_t nh = integer(m, "n_heads", "model", 1, 1 << 20);
    check(nh % s.model.n_kv_heads == 0, "{}: model.n_heads = {}: expected a multiple of n_kv_heads = {}", name, nh,
          s.model.n_kv_heads);
  }
  if (j.contains("source")) s.source = str(j, "source", "");
  if (j.contains("n_tokens")) s.n_tokens = integer(j, "n_tokens", "", 0, INT64_MAX);
  const std::vector<size_t> s2 = {(size_t)s.model.n_layers, (size_t)s.model.n_kv_heads};
  const std::vector<size_t> s3 = {s2[0], s2[1], (size_t)s.model.head_dim / 2};
  flatten(need(j, "q_block_energy", "", name), s3, 0, "q_block_energy", name, s.q_block_energy);
  flatten(need(j, "k_block_energy", "", name), s3, 0, "k_block_energy", name, s.k_block_energy);
  if (j.contains("k_pre_mean"))
    flatten(j["k_pre_mean"], {s2[0], s2[1], (size_t)s.model.head_dim}, 0, "k_pre_mean", name, s.k_pre_mean, true);
  if (j.contains("sensitivity")) {
    const json& sens = j["sensitivity"];
    check(sens.is_object(), "{}: sensitivity: expected an object", name);
    for (const auto& [key, v] : sens.items()) {
      const std::string p = "sensitivity." + key;
      only_known_keys(v, {"k", "v"}, p, name);
      Sensitivity w;
      flatten(need(v, "k", p, name), s2, 0, p + ".k", name, w.k);
      flatten(need(v, "v", p, name), s2, 0, p + ".v", name, w.v);
      s.sensitivity[key] = std::move(w);
    }
  }
  if (j.contains("curves")) {
    const json& cs = j["curves"];
    check(cs.is_object(), "{}: curves: expected an object", name);
    for (const auto& [key, v] : cs.items()) {
      const std::string p = "curves." + key;
      only_known_keys(v, {"bits", "beta_k", "beta_v", "alpha_k", "alpha_v"}, p, name);
      DistortionCurves c;
      const json& bits = need(v, "bits", p, name);
      check(bits.is_array(), "{}: {}.bits: expected an array of the code widths the curves were fitted at", name, p);
      for (size_t i = 0; i < bits.size(); ++i) {
        check(bits[i].is_number(), "{}: {}.bits[{}]: expected a number", name, p, i);
        c.bits.push_back(bits[i].get<double>());
      }
      c.beta_k = need_number(v, "beta_k", p, name);
      c.beta_v = need_number(v, "beta_v", p, name);
      flatten(need(v, "alpha_k", p, name), s2, 0, p + ".alpha_k", name, c.alpha_k);
      flatten(need(v, "alpha_v", p, name), s2, 0, p + ".alpha_v", name, c.alpha_v);
      s.curves[key] = std::move(c);
    }
  }
  s.validate(name);
  return s;
}

CalibStats load_stats_json(const std::string& path) {
  const json j = format::read_json_file(path, "statistics",
                                "a ratekv stats file (the .safetensors of `ratekv calibrate`, or JSON statistics of "
                                "format \"ratekv-calib-stats\")");
  return stats_from_json(j, std::filesystem::path(path).filename().string());
}

void save_stats_json(const CalibStats& s, const std::string& path) {
  s.validate(path);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  check((bool)out, "{}: cannot open for writing", path);
  out << stats_to_json(s).dump(1) << '\n';
  out.close();  // a full disk shows at close, not at <<
  check((bool)out, "{}: write failed", path);
}

}  // namespace ratekv
