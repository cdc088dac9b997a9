// KVStats: validation, conversion to the allocators' statistics, and the
// safetensors file format (docs/calibration_stats.md).
#include "ratekv/calib/kv_stats.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <initializer_list>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "ratekv/common/error.h"
#include "ratekv/common/param_error.h"
#include "ratekv/io/safetensors.h"

namespace ratekv::calib {

using nlohmann::json;

namespace {

constexpr const char* kMetaKey = "ratekv";

struct TensorSpec {
  const char* name;
  std::vector<double> KVStats::*field;
  std::vector<int64_t> shape;
  bool nonneg;  // energies and second moments
};

std::vector<TensorSpec> tensor_specs(const KVStats& s) {
  const int64_t L = s.model.n_layers, H = s.n_heads, Hkv = s.model.n_kv_heads, d = s.model.head_dim;
  return {
      {"q_block_energy", &KVStats::q_block_energy, {L, Hkv, d / 2}, true},
      {"k_block_energy", &KVStats::k_block_energy, {L, Hkv, d / 2}, true},
      {"k_pre_mean", &KVStats::k_pre_mean, {L, Hkv, d}, false},
      {"k_pre_cov", &KVStats::k_pre_cov, {L, Hkv, d, d}, false},
      {"q_pre_sq", &KVStats::q_pre_sq, {L, H, d}, true},
      {"v_sq", &KVStats::v_sq, {L, Hkv, d}, true},
  };
}

// The optional gradient tensors, (L, Hkv, d) each.
struct GradSpec {
  const char* name;
  std::vector<double> GradSensitivity::*field;
};
constexpr GradSpec kGradSpecs[] = {
    {"grad_sq_k_pre", &GradSensitivity::k_pre_sq},
    {"grad_sq_k_post", &GradSensitivity::k_post_sq},
    {"grad_sq_v", &GradSensitivity::v_sq},
};

// Σ over the last axis of an (n, m) row-major tensor.
std::vector<double> row_sums(const std::vector<double>& x, size_t m) {
  std::vector<double> s(x.size() / m, 0.0);
  for (size_t i = 0; i < s.size(); ++i) {
    for (size_t j = 0; j < m; ++j) s[i] += x[i * m + j];
  }
  return s;
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t x : shape) n *= x;
  return n;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

}  // namespace

ModelIdentity model_identity(const ModelConfig& cfg) {
  ModelIdentity id;
  id.arch = cfg.arch;
  id.n_layers = cfg.n_layers;
  id.n_kv_heads = cfg.n_kv_heads;
  id.head_dim = cfg.head_dim;
  id.rope_layout = rope_layout_name(cfg.rope_layout);
  return id;
}

void KVStats::validate(const std::string& name) const {
  check(model.n_layers > 0 && n_heads > 0 && model.n_kv_heads > 0 && model.head_dim > 0 && model.head_dim % 2 == 0,
        "{}: model shape must be positive with an even head_dim (n_layers {}, n_heads {}, n_kv_heads {}, head_dim {})",
        name, model.n_layers, n_heads, model.n_kv_heads, model.head_dim);
  check(n_heads % model.n_kv_heads == 0, "{}: n_kv_heads {} must divide n_heads {}", name, model.n_kv_heads,
        n_heads);
  check(model.head_dim <= 4096 && model.n_layers <= 4096 && n_heads <= 4096,
        "{}: model shape too large (n_layers {}, n_heads {}, head_dim {}; expected ≤ 4096 each)", name,
        model.n_layers, n_heads, model.head_dim);
  check(model.rope_layout == "interleaved" || model.rope_layout == "neox",
        "{}: model.rope_layout '{}': expected interleaved or neox", name, model.rope_layout);
  check(n_tokens >= 1, "{}: n_tokens = {}: expected ≥ 1", name, n_tokens);
  check(ctx >= 1, "{}: ctx = {}: expected ≥ 1", name, ctx);
  for (const auto& t : tensor_specs(*this)) {
    const auto& v = this->*t.field;
    check(static_cast<int64_t>(v.size()) == numel(t.shape), "{}: tensor {} has {} values, expected shape {} = {}",
          name, t.name, v.size(), shape_str(t.shape), numel(t.shape));
    for (size_t i = 0; i < v.size(); ++i) {
      check(std::isfinite(v[i]), "{}: tensor {} has a non-finite value at flat index {}", name, t.name, i);
      check(!t.nonneg || v[i] >= 0, "{}: tensor {} = {} at flat index {}: expected ≥ 0", name, t.name, v[i], i);
    }
  }
  const int64_t ng = int64_t{model.n_layers} * model.n_kv_heads * model.head_dim;
  check(grad.n_sequences >= 0, "{}: sensitivity.n_sequences = {}: expected ≥ 0", name, grad.n_sequences);
  for (const auto& t : kGradSpecs) {
    const auto& v = grad.*t.field;
    if (grad.n_sequences == 0) {
      check(v.empty(), "{}: tensor {} is present but sensitivity.n_sequences = 0", name, t.name);
      continue;
    }
    check(static_cast<int64_t>(v.size()) == ng, "{}: tensor {} has {} values, expected ({}, {}, {}) = {}", name,
          t.name, v.size(), model.n_layers, model.n_kv_heads, model.head_dim, ng);
    for (size_t i = 0; i < v.size(); ++i) {
      check(std::isfinite(v[i]) && v[i] >= 0, "{}: tensor {} = {} at flat index {}: expected finite and ≥ 0", name,
            t.name, v[i], i);
    }
  }
  if (grad.n_sequences > 0) {
    check(grad.seq_len >= 2, "{}: sensitivity.seq_len = {}: expected ≥ 2", name, grad.seq_len);
    check(std::isfinite(grad.mean_loss) && grad.mean_loss >= 0, "{}: sensitivity.mean_loss = {}: expected finite, ≥ 0",
          name, grad.mean_loss);
  }
  validate_curves(curves, static_cast<size_t>(model.n_layers) * model.n_kv_heads, name);
}

void KVStats::validate_against(const ModelConfig& cfg, const std::string& name) const {
  std::string bad;
  auto cmp = [&](const char* what, const std::string& have, const std::string& want) {
    if (have != want) bad += fmt::format("{}{} = {}, model has {}", bad.empty() ? "" : "; ", what, have, want);
  };
  cmp("arch", model.arch, cfg.arch);
  cmp("n_layers", std::to_string(model.n_layers), std::to_string(cfg.n_layers));
  cmp("n_heads", std::to_string(n_heads), std::to_string(cfg.n_heads));
  cmp("n_kv_heads", std::to_string(model.n_kv_heads), std::to_string(cfg.n_kv_heads));
  cmp("head_dim", std::to_string(model.head_dim), std::to_string(cfg.head_dim));
  cmp("rope_layout", model.rope_layout, rope_layout_name(cfg.rope_layout));
  check(bad.empty(), "{}: statistics were made for another model: {}", name, bad);
}

CalibStats KVStats::to_alloc_stats() const {
  CalibStats a;
  a.model = model;
  a.source = text_file;
  a.n_tokens = n_tokens;
  a.q_block_energy = q_block_energy;
  a.k_block_energy = k_block_energy;
  a.k_pre_mean = k_pre_mean;
  const size_t d = model.head_dim;
  a.sensitivity["activation"] = {row_sums(k_block_energy, d / 2), row_sums(v_sq, d), "k_block_energy", "v_sq"};
  if (grad.n_sequences > 0)
    a.sensitivity["grad"] = {row_sums(grad.k_post_sq, d), row_sums(grad.v_sq, d), "grad_sq_k_post", "grad_sq_v"};
  for (const auto& [q, c] : curves) a.curves[q] = c.fit;
  return a;
}

void KVStats::save(const std::string& path) const {
  validate(path);
  SafetensorsWriter w;
  for (const auto& t : tensor_specs(*this)) {
    const auto& v = this->*t.field;
    std::vector<float> f(v.begin(), v.end());
    w.add_f32(t.name, t.shape, f);
  }
  if (grad.n_sequences > 0) {
    for (const auto& t : kGradSpecs) {
      const auto& v = grad.*t.field;
      w.add_f32(t.name, {model.n_layers, model.n_kv_heads, model.head_dim}, std::vector<float>(v.begin(), v.end()));
    }
  }
  json meta = {
      {"format", kFormat},
      {"version", kFormatVersion},
      {"model",
       {{"arch", model.arch},
        {"n_layers", model.n_layers},
        {"n_heads", n_heads},
        {"n_kv_heads", model.n_kv_heads},
        {"head_dim", model.head_dim},
        {"rope_layout", model.rope_layout},
        {"file", model.file},
        {"sha256", model.sha256}}},
      {"text", {{"file", text_file}, {"sha256", text_sha256}}},
      {"n_tokens", n_tokens},
      {"ctx", ctx},
  };
  if (grad.n_sequences > 0) {
    meta["sensitivity"] = {{"n_sequences", grad.n_sequences},
                           {"seq_len", grad.seq_len},
                           {"mean_loss", grad.mean_loss},
                           {"loss", "mean next-token cross-entropy of each sequence (nats)"}};
  }
  if (!curves.empty()) write_curves(curves, model.n_layers, model.n_kv_heads, w, meta["curves"]);
  w.set_metadata("format", kFormat);
  w.set_metadata(kMetaKey, meta.dump());
  w.write(path);
}

KVStats KVStats::load(const std::string& path) {
  const SafetensorsFile f = SafetensorsFile::open(path);
  const auto& md = f.metadata();
  check(md.count("format") && md.at("format") == kFormat,
        "{}: not a ratekv calibration statistics file (__metadata__.format must be \"{}\")", path, kFormat);
  json m;
  try {
    m = json::parse(f.metadata_value(kMetaKey));
  } catch (const json::exception& e) {
    fail("{}: __metadata__.{} is not valid JSON: {}", path, kMetaKey, e.what());
  }
  KVStats s;
  // Every metadata key and tensor must be one this build reads: a misspelled or
  // foreign field would otherwise be silently ignored.
  auto only_known = [&](const json& o, std::initializer_list<const char*> known, const std::string& where) {
    check(o.is_object(), "{}: __metadata__.{}{}: expected an object", path, kMetaKey, where);
    for (const auto& [key, v] : o.items()) {
      bool ok = false;
      for (const char* k : known) ok = ok || key == k;
      check(ok, "{}: __metadata__.{}{}.{}: unknown key (this build reads {})", path, kMetaKey, where, key,
            fmt::join(known, ", "));
    }
  };
  only_known(m, {"format", "version", "model", "text", "n_tokens", "ctx", "sensitivity", "curves"}, "");
  if (m.contains("model"))
    only_known(m["model"], {"arch", "n_layers", "n_heads", "n_kv_heads", "head_dim", "rope_layout", "file", "sha256"},
               ".model");
  if (m.contains("text")) only_known(m["text"], {"file", "sha256"}, ".text");
  if (m.contains("sensitivity")) only_known(m["sensitivity"], {"n_sequences", "seq_len", "mean_loss", "loss"},
                                            ".sensitivity");
  try {
    const int version = m.at("version").get<int>();
    check(version == kFormatVersion, "{}: format version {} is not supported (this build reads version {})", path,
          version, kFormatVersion);
    const json& mo = m.at("model");
    s.model.arch = mo.at("arch").get<std::string>();
    s.model.n_layers = mo.at("n_layers").get<int>();
    s.n_heads = mo.at("n_heads").get<int>();
    s.model.n_kv_heads = mo.at("n_kv_heads").get<int>();
    s.model.head_dim = mo.at("head_dim").get<int>();
    s.model.rope_layout = mo.at("rope_layout").get<std::string>();
    s.model.file = mo.at("file").get<std::string>();
    s.model.sha256 = mo.at("sha256").get<std::string>();
    s.text_file = m.at("text").at("file").get<std::string>();
    s.text_sha256 = m.at("text").at("sha256").get<std::string>();
    s.n_tokens = m.at("n_tokens").get<int64_t>();
    s.ctx = m.at("ctx").get<int64_t>();
    if (m.contains("sensitivity")) {
      const json& g = m.at("sensitivity");
      s.grad.n_sequences = g.at("n_sequences").get<int64_t>();
      s.grad.seq_len = g.at("seq_len").get<int64_t>();
      s.grad.mean_loss = g.at("mean_loss").get<double>();
      check(s.grad.n_sequences >= 1, "{}: __metadata__.{}.sensitivity.n_sequences = {}: expected ≥ 1", path,
            kMetaKey, s.grad.n_sequences);
    }
  } catch (const json::exception& e) {
    fail("{}: __metadata__.{}: missing or mistyped field: {}", path, kMetaKey, e.what());
  }
  check(s.model.n_layers > 0 && s.n_heads > 0 && s.model.n_kv_heads > 0 && s.model.head_dim > 1 &&
            s.model.head_dim <= 4096 && s.model.n_layers <= 4096 && s.n_heads <= 4096,
        "{}: __metadata__ model shape out of range (n_layers {}, n_heads {}, n_kv_heads {}, head_dim {})", path,
        s.model.n_layers, s.n_heads, s.model.n_kv_heads, s.model.head_dim);
  for (const auto& t : tensor_specs(s)) {
    f.expect(t.name, StDtype::F32, t.shape);
    const std::vector<float> v = f.read_f32(t.name);
    (s.*t.field).assign(v.begin(), v.end());
  }
  if (s.grad.n_sequences > 0) {
    for (const auto& t : kGradSpecs) {
      f.expect(t.name, StDtype::F32, {s.model.n_layers, s.model.n_kv_heads, s.model.head_dim});
      const std::vector<float> v = f.read_f32(t.name);
      (s.grad.*t.field).assign(v.begin(), v.end());
    }
  }
  if (m.contains("curves")) s.curves = read_curves(f, m.at("curves"), s.model.n_layers, s.model.n_kv_heads, path);
  for (const StTensor& t : f.tensors()) {
    bool known = false;
    for (const auto& spec : tensor_specs(s)) known = known || t.name == spec.name;
    if (s.grad.n_sequences > 0)
      for (const auto& spec : kGradSpecs) known = known || t.name == spec.name;
    for (const auto& [q, c] : s.curves)
      for (const char* part : {"mse_k", "mse_v", "alpha_k", "alpha_v"}) known = known || t.name == "curves." + q + "." + part;
    check(known, "{}: tensor '{}': unknown to this build (not a statistic it reads; a gradient tensor needs "
          "__metadata__ sensitivity, a curve tensor its quantizer under __metadata__ curves)", path, t.name);
  }
  s.validate(path);
  return s;
}

bool is_safetensors_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char buf[9] = {};
  if (!in.read(buf, 9)) return false;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(buf[i]);
  return n >= 2 && buf[8] == '{';
}

CalibStats load_alloc_stats(const std::string& path) {
  check_param(std::filesystem::exists(path), "load_alloc_stats.path", "'{}': file not found", path);
  if (is_safetensors_file(path)) {
    CalibStats a = KVStats::load(path).to_alloc_stats();
    a.validate(path);
    return a;
  }
  return load_stats_json(path);
}

}  // namespace ratekv::calib
