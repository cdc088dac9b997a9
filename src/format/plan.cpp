// The plan format: JSON (de)serialization and validation (ratekv/format/plan.h).
#include "ratekv/format/plan.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <sstream>

#include <fmt/ranges.h>

#include "format/json_file.h"
#include "format/plan_target_check.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/format/stored_bytes.h"

namespace ratekv {

using nlohmann::json;

// ---------------------------------------------------------------------------
// Names and bit accounting
// ---------------------------------------------------------------------------

namespace {

struct KindName {
  CodecKind kind;
  const char* name;
};
constexpr KindName kKinds[] = {
    {CodecKind::FP16, "fp16"}, {CodecKind::TqMseGrouped, "tq-mse-grouped"}, {CodecKind::TqMse, "tq-mse"},
    {CodecKind::Kivi, "kivi"}, {CodecKind::QuaRot, "quarot"},                {CodecKind::Q8_0, "q8_0"},
    {CodecKind::Q4_0, "q4_0"},  {CodecKind::Vq, "vq"},
};

bool uses_rotation_seed(CodecKind k) {
  return k == CodecKind::TqMseGrouped || k == CodecKind::TqMse || k == CodecKind::QuaRot;
}

int64_t group_channels(const Codec& c, const CodecGroup& g) {
  return c.kind == CodecKind::TqMseGrouped ? 2 * (int64_t)g.blocks.size() : (int64_t)g.channels.size();
}

}  // namespace

const char* codec_kind_name(CodecKind k) {
  for (const auto& e : kKinds)
    if (e.kind == k) return e.name;
  return "?";
}

CodecKind parse_codec_kind(const std::string& s, const std::string& field) {
  for (const auto& e : kKinds)
    if (s == e.name) return e.kind;
  fail("{} = \"{}\": expected one of fp16, tq-mse-grouped, tq-mse, kivi, quarot, q8_0, q4_0, vq", field, s);
}

double Codec::code_bits(int head_dim) const {
  if (kind == CodecKind::FP16) return 16.0;
  int64_t bits = 0;
  if (kind == CodecKind::Vq) {  // one index of `bits` bits per group
    for (const auto& g : groups) bits += g.bits;
    return (double)bits / head_dim;
  }
  for (const auto& g : groups) bits += (int64_t)g.bits * group_channels(*this, g);
  return (double)bits / head_dim;
}

double Codec::effective_bits(int head_dim) const { return codec_stored_bits(*this, head_dim) / head_dim; }

Codec Codec::fp16() { return Codec{}; }

Codec Codec::tq_mse(int bits, int head_dim, uint32_t seed) {
  Codec c;
  c.kind = CodecKind::TqMse;
  c.norm = NormStorage::FP16;
  CodecGroup g;
  g.bits = bits;
  g.seed = seed;
  for (int i = 0; i < head_dim; ++i) g.channels.push_back(i);
  c.groups.push_back(std::move(g));
  return c;
}

Plan::Achieved Plan::achieved() const {
  Achieved a;
  if (layers.empty()) return a;
  const PlanStoredBytes sb = plan_stored_bytes(*this);
  a.k = sb.k_bits_per_element();
  a.v = sb.v_bits_per_element();
  int64_t n = 0;
  const int d = model.head_dim;
  for (const auto& layer : layers)
    for (const auto& h : layer) {
      a.k_code += h.key.code_bits(d);
      a.v_code += h.value.code_bits(d);
      ++n;
    }
  if (n > 0) {
    a.k_code /= n;
    a.v_code /= n;
  }
  a.total = 0.5 * (a.k + a.v);
  return a;
}

// ---------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------

namespace {

void validate_codec(const Codec& c, int d, bool key, const std::string& name, const std::string& path) {
  const std::string kind = codec_kind_name(c.kind);
  check(!c.norm_correction || c.kind == CodecKind::TqMse || c.kind == CodecKind::TqMseGrouped,
        "{}: {}.norm_correction: kind {} has no TQ-MSE norm to correct (tq-mse and tq-mse-grouped only)", name, path,
        kind);
  if (!c.offset.empty()) {
    check(key, "{}: {}.offset: a value codec has no offset (keys only: a pre-RoPE key offset)", name, path);
    check(c.kind != CodecKind::FP16 && c.kind != CodecKind::Vq,
          "{}: {}.offset: kind {} takes no offset (every kind but fp16 and vq does)", name, path, kind);
    check((int)c.offset.size() == d, "{}: {}.offset: {} values, expected head_dim {}", name, path, c.offset.size(),
          d);
    for (size_t i = 0; i < c.offset.size(); ++i)
      check(std::isfinite(c.offset[i]) && round_fp16(c.offset[i]) == c.offset[i],
            "{}: {}.offset[{}] = {}: expected a finite fp16 number", name, path, i, c.offset[i]);
  }
  if (c.kind == CodecKind::FP16) {
    check(c.groups.empty(), "{}: {}.groups: kind fp16 has no groups (found {})", name, path, c.groups.size());
    check(c.norm == NormStorage::None, "{}: {}.norm: kind fp16 stores no norm (expected \"none\")", name, path);
    check(c.group_size == 0, "{}: {}.group_size = {}: expected 0 for kind fp16", name, path, c.group_size);
    return;
  }
  check(!c.groups.empty(), "{}: {}.groups: kind {} needs at least one group", name, path, kind);
  const bool grouped = c.kind == CodecKind::TqMseGrouped;
  if (c.kind == CodecKind::Vq) {
    check(c.norm == NormStorage::None || c.norm == NormStorage::SharedFP16,
          "{}: {}.norm: kind vq stores \"none\" or \"shared-fp16\"", name, path);
    check(c.group_size >= 1 && c.group_size <= d && d % c.group_size == 0,
          "{}: {}.group_size = {}: expected a divisor of head_dim {} (channels per vq group)", name, path,
          c.group_size, d);
    check((int64_t)c.groups.size() * c.group_size == d, "{}: {}.groups: {} groups of {} channels, head_dim is {}",
          name, path, c.groups.size(), c.group_size, d);
    if (c.norm == NormStorage::SharedFP16)
      check(c.scale_heads >= 1, "{}: {}.scale_heads = {}: expected ≥ 1 with norm shared-fp16", name, path,
            c.scale_heads);
    else
      check(c.scale_heads == 0, "{}: {}.scale_heads = {}: expected 0 with norm none", name, path, c.scale_heads);
  } else {
    check(c.norm != NormStorage::SharedFP16, "{}: {}.norm: \"shared-fp16\" is for kind vq only", name, path);
    check(c.scale_heads == 0, "{}: {}.scale_heads = {}: only kind vq shares a scale", name, path, c.scale_heads);
  }
  if (!grouped && c.kind != CodecKind::Vq)
    check(c.groups.size() == 1, "{}: {}.groups: kind {} has exactly one group (found {})", name, path, kind,
          c.groups.size());

  // Bits range and metadata rules per kind.
  for (size_t gi = 0; gi < c.groups.size(); ++gi) {
    const auto& g = c.groups[gi];
    const std::string gp = fmt::format("{}.groups[{}]", path, gi);
    switch (c.kind) {
      case CodecKind::TqMseGrouped:
        check(g.bits >= 0 && g.bits <= 8, "{}: {}.bits = {}: expected 0..8", name, gp, g.bits);
        break;
      case CodecKind::TqMse:
      case CodecKind::Kivi:
      case CodecKind::QuaRot:
        check(g.bits >= 1 && g.bits <= 8, "{}: {}.bits = {}: expected 1..8", name, gp, g.bits);
        break;
      case CodecKind::Q8_0:
        check(g.bits == 8, "{}: {}.bits = {}: expected 8 for kind q8_0", name, gp, g.bits);
        break;
      case CodecKind::Q4_0:
        check(g.bits == 4, "{}: {}.bits = {}: expected 4 for kind q4_0", name, gp, g.bits);
        break;
      case CodecKind::Vq:
        check(g.bits >= 1 && g.bits <= 16, "{}: {}.bits = {}: expected an index width 1..16", name, gp, g.bits);
        check(g.bits == c.groups[0].bits, "{}: {}.bits = {}: every vq group has the same width ({})", name, gp,
              g.bits, c.groups[0].bits);
        check((int)g.channels.size() == c.group_size, "{}: {}.channels: {} channels, expected group_size {}", name,
              gp, g.channels.size(), c.group_size);
        break;
      case CodecKind::FP16:
        break;
    }
    if (grouped) {
      check(!g.blocks.empty(), "{}: {}.blocks: expected at least one RoPE block", name, gp);
      check(g.channels.empty(), "{}: {}.channels: kind tq-mse-grouped lists \"blocks\", not \"channels\"", name,
            gp);
    } else {
      check(g.blocks.empty(), "{}: {}.blocks: kind {} lists \"channels\", not \"blocks\"", name, gp, kind);
    }
  }
  switch (c.kind) {
    case CodecKind::TqMseGrouped:
    case CodecKind::TqMse:
      check(c.group_size == 0, "{}: {}.group_size = {}: expected 0 for kind {}", name, path, c.group_size, kind);
      break;
    case CodecKind::Kivi:
    case CodecKind::QuaRot:
      check(c.norm == NormStorage::None, "{}: {}.norm: kind {} stores scales, not a norm (expected \"none\")", name,
            path, kind);
      check(c.group_size >= 1 && c.group_size <= d && d % c.group_size == 0,
            "{}: {}.group_size = {}: expected a divisor of head_dim {}", name, path, c.group_size, d);
      break;
    case CodecKind::Q8_0:
    case CodecKind::Q4_0:
      check(c.norm == NormStorage::None, "{}: {}.norm: kind {} stores scales, not a norm (expected \"none\")", name,
            path, kind);
      check(c.group_size == 32, "{}: {}.group_size = {}: expected 32 for kind {}", name, path, c.group_size, kind);
      check(d % 32 == 0, "{}: {}: kind {} needs head_dim divisible by 32 (head_dim {})", name, path, kind, d);
      break;
    case CodecKind::Vq:
    case CodecKind::FP16:
      break;
  }

  // Coverage: every block (grouped) or channel exactly once.
  const int n = grouped ? d / 2 : d;
  const char* what = grouped ? "blocks" : "channels";
  std::vector<int> owner(n, -1);
  for (size_t gi = 0; gi < c.groups.size(); ++gi) {
    const auto& list = grouped ? c.groups[gi].blocks : c.groups[gi].channels;
    for (size_t k = 0; k < list.size(); ++k) {
      const int x = list[k];
      check(x >= 0 && x < n, "{}: {}.groups[{}].{}[{}] = {}: expected 0..{}", name, path, gi, what, k, x, n - 1);
      check(owner[x] < 0, "{}: {}.groups[{}].{}[{}] = {}: already in groups[{}]", name, path, gi, what, k, x,
            owner[x]);
      owner[x] = (int)gi;
    }
  }
  for (int x = 0; x < n; ++x)
    check(owner[x] >= 0, "{}: {}: {} {} is in no group (every one of the {} must be covered)", name, path,
          grouped ? "RoPE block" : "channel", x, n);
}

}  // namespace

namespace format {

void validate_plan_target(const PlanTarget& m, const std::string& name) {
  check(!m.arch.empty(), "{}: model.arch: expected a non-empty string", name);
  check(m.n_layers >= 1 && m.n_layers <= 4096, "{}: model.n_layers = {}: expected 1..4096", name, m.n_layers);
  check(m.n_kv_heads >= 1 && m.n_kv_heads <= 1024, "{}: model.n_kv_heads = {}: expected 1..1024", name,
        m.n_kv_heads);
  check(m.head_dim >= 2 && m.head_dim <= 1024 && m.head_dim % 2 == 0,
        "{}: model.head_dim = {}: expected an even number in 2..1024", name, m.head_dim);
  check(m.rope_layout == "interleaved" || m.rope_layout == "neox",
        "{}: model.rope_layout = \"{}\": expected \"interleaved\" or \"neox\"", name, m.rope_layout);
}

}  // namespace format

void Plan::validate(const std::string& name) const {
  check(!method.empty(), "{}: method: expected a non-empty string", name);
  const auto& m = model;
  format::validate_plan_target(m, name);
  check(fp16_window >= 0, "{}: fp16_window = {}: expected >= 0", name, fp16_window);
  check(sink_tokens >= 0, "{}: sink_tokens = {}: expected >= 0", name, sink_tokens);
  check(budget_unit == "effective" || budget_unit == "code",
        "{}: budget.unit = \"{}\": expected \"effective\" or \"code\"", name, budget_unit);
  check(std::isfinite(budget_k) && budget_k >= 0 && budget_k <= 64, "{}: budget.k = {}: expected 0..64", name,
        budget_k);
  check(std::isfinite(budget_v) && budget_v >= 0 && budget_v <= 64, "{}: budget.v = {}: expected 0..64", name,
        budget_v);
  check((int)layers.size() == m.n_layers, "{}: layers: {} entries, expected model.n_layers = {}", name,
        layers.size(), m.n_layers);
  bool any_vq = false;
  for (const auto& layer : layers)
    for (const auto& hp : layer) any_vq = any_vq || hp.key.kind == CodecKind::Vq || hp.value.kind == CodecKind::Vq;
  check(!any_vq || (tensors_file && !tensors_file->empty()),
        "{}: tensors: kind vq codecs need a \"tensors\" side file with their codebooks", name);
  for (size_t l = 0; l < layers.size(); ++l) {
    check((int)layers[l].size() == m.n_kv_heads, "{}: layers[{}].heads: {} entries, expected model.n_kv_heads = {}",
          name, l, layers[l].size(), m.n_kv_heads);
    for (size_t h = 0; h < layers[l].size(); ++h) {
      const std::string p = fmt::format("layers[{}].heads[{}]", l, h);
      validate_codec(layers[l][h].key, m.head_dim, true, name, p + ".key");
      validate_codec(layers[l][h].value, m.head_dim, false, name, p + ".value");
    }
    // A shared per-token scale spans every KV head of the layer: all heads of
    // that side must be vq with norm shared-fp16 and scale_heads = n_kv_heads.
    for (int s = 0; s < 2; ++s) {
      int shared = 0;
      for (const auto& hp : layers[l]) shared += (s == 0 ? hp.key : hp.value).norm == NormStorage::SharedFP16;
      if (shared == 0) continue;
      const char* side = s == 0 ? "key" : "value";
      check(shared == m.n_kv_heads, "{}: layers[{}]: {} of {} heads' {} codecs use a shared-fp16 scale; it is "
            "shared by all KV heads of a layer or none", name, l, shared, m.n_kv_heads, side);
      for (size_t h = 0; h < layers[l].size(); ++h) {
        const Codec& c = s == 0 ? layers[l][h].key : layers[l][h].value;
        check(c.scale_heads == m.n_kv_heads, "{}: layers[{}].heads[{}].{}.scale_heads = {}: expected n_kv_heads {}",
              name, l, h, side, c.scale_heads, m.n_kv_heads);
      }
    }
  }
}

void Plan::validate_against(const PlanTarget& t, const std::string& name) const {
  std::vector<std::string> bad;
  if (t.arch != model.arch) bad.push_back(fmt::format("arch \"{}\" vs model \"{}\"", model.arch, t.arch));
  if (t.n_layers != model.n_layers)
    bad.push_back(fmt::format("n_layers = {} vs model {}", model.n_layers, t.n_layers));
  if (t.n_kv_heads != model.n_kv_heads)
    bad.push_back(fmt::format("n_kv_heads = {} vs model {}", model.n_kv_heads, t.n_kv_heads));
  if (t.head_dim != model.head_dim)
    bad.push_back(fmt::format("head_dim = {} vs model {}", model.head_dim, t.head_dim));
  if (t.rope_layout != model.rope_layout)
    bad.push_back(fmt::format("rope_layout \"{}\" vs model \"{}\"", model.rope_layout, t.rope_layout));
  if (!bad.empty())
    fail("{}: plan was made for a different model ({}{}): {}", name, model.file.empty() ? "" : model.file + ", ",
         model.arch, fmt::join(bad, "; "));
}

// ---------------------------------------------------------------------------
// JSON
// ---------------------------------------------------------------------------

namespace {

json codec_to_json(const Codec& c) {
  json j;
  j["kind"] = codec_kind_name(c.kind);
  j["norm"] = c.norm == NormStorage::FP16 ? "fp16" : c.norm == NormStorage::SharedFP16 ? "shared-fp16" : "none";
  j["group_size"] = c.group_size;
  if (c.norm == NormStorage::SharedFP16) j["scale_heads"] = c.scale_heads;
  json groups = json::array();
  for (const auto& g : c.groups) {
    json jg;
    jg["bits"] = g.bits;
    if (c.kind == CodecKind::TqMseGrouped) jg["blocks"] = g.blocks;
    else jg["channels"] = g.channels;
    if (uses_rotation_seed(c.kind)) jg["seed"] = g.seed;
    groups.push_back(std::move(jg));
  }
  j["groups"] = std::move(groups);
  if (c.norm_correction) j["norm_correction"] = true;
  if (!c.offset.empty()) j["offset"] = c.offset;
  return j;
}

// Typed access to JSON fields with "name: path: problem" errors.
struct Reader {
  std::string name;

  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }
  static const char* type_of(const json& v) {
    if (v.is_null()) return "null";
    if (v.is_boolean()) return "a boolean";
    if (v.is_number_integer()) return "an integer";
    if (v.is_number()) return "a number";
    if (v.is_string()) return "a string";
    if (v.is_array()) return "an array";
    return "an object";
  }
  const json& object(const json& v, const std::string& path) const {
    check(v.is_object(), "{}: {}: is {}, expected an object", name, path.empty() ? "<top>" : path, type_of(v));
    return v;
  }
  const json& member(const json& o, const std::string& path, const char* key) const {
    auto it = o.find(key);
    check(it != o.end(), "{}: {}: missing", name, join(path, key));
    return *it;
  }
  int64_t integer(const json& o, const std::string& path, const char* key, int64_t lo, int64_t hi) const {
    const json& v = member(o, path, key);
    check(v.is_number_integer(), "{}: {} is {}: expected an integer", name, join(path, key), type_of(v));
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      check(u <= (uint64_t)hi, "{}: {} = {}: expected {}..{}", name, join(path, key), u, lo, hi);
      return (int64_t)u;
    }
    const int64_t x = v.get<int64_t>();
    check(x >= lo && x <= hi, "{}: {} = {}: expected {}..{}", name, join(path, key), x, lo, hi);
    return x;
  }
  int element(const json& v, const std::string& path) const {
    check(v.is_number_integer(), "{}: {} is {}: expected an integer", name, path, type_of(v));
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      check(u <= (uint64_t)std::numeric_limits<int>::max(), "{}: {} = {}: out of range", name, path, u);
      return (int)u;
    }
    const int64_t x = v.get<int64_t>();
    check(x >= std::numeric_limits<int>::min() && x <= std::numeric_limits<int>::max(),
          "{}: {} = {}: out of range", name, path, x);
    return (int)x;
  }
  double number(const json& o, const std::string& path, const char* key) const {
    const json& v = member(o, path, key);
    check(v.is_number(), "{}: {} is {}: expected a number", name, join(path, key), type_of(v));
    return v.get<double>();
  }
  std::string string(const json& o, const std::string& path, const char* key) const {
    const json& v = member(o, path, key);
    check(v.is_string(), "{}: {} is {}: expected a string", name, join(path, key), type_of(v));
    std::string out = v.get<std::string>();
    // A NUL would cut every message that quotes the value; no file name holds one (a tab or a newline may:
    // this repository's own writers put file names here, so those pass).
    const size_t nul = out.find('\0');
    check(nul == std::string::npos, "{}: {}: a NUL character (U+0000) at byte {}: expected text without one", name,
          join(path, key), nul);
    return out;
  }
  const json& array(const json& o, const std::string& path, const char* key) const {
    const json& v = member(o, path, key);
    check(v.is_array(), "{}: {} is {}: expected an array", name, join(path, key), type_of(v));
    return v;
  }
  // Every key of object `o` at `path` must be one of `known`: a key this build
  // does not read (e.g. "norm_correction", a typo) would otherwise be ignored.
  void only_known(const json& o, const std::string& path, std::initializer_list<const char*> known) const {
    object(o, path);
    for (const auto& [key, v] : o.items()) {
      bool ok = false;
      for (const char* k : known) ok = ok || key == k;
      check(ok, "{}: {}: unknown key (this build reads {}); it would be ignored", name, join(path, key),
            fmt::join(known, ", "));
    }
  }
  std::vector<int> int_list(const json& o, const std::string& path, const char* key) const {
    const json& a = array(o, path, key);
    std::vector<int> out;
    for (size_t i = 0; i < a.size(); ++i) out.push_back(element(a[i], fmt::format("{}[{}]", join(path, key), i)));
    return out;
  }
};

constexpr int64_t kIntMax = std::numeric_limits<int>::max();

Codec codec_from_json(const Reader& r, const json& j, const std::string& path) {
  r.only_known(j, path, {"kind", "norm", "group_size", "scale_heads", "groups", "norm_correction", "offset"});
  Codec c;
  c.kind = parse_codec_kind(r.string(j, path, "kind"), r.name + ": " + Reader::join(path, "kind"));
  const std::string norm = r.string(j, path, "norm");
  check(norm == "none" || norm == "fp16" || norm == "shared-fp16",
        "{}: {} = \"{}\": expected \"none\", \"fp16\" or \"shared-fp16\"", r.name, Reader::join(path, "norm"),
        norm);
  c.norm = norm == "fp16" ? NormStorage::FP16 : norm == "shared-fp16" ? NormStorage::SharedFP16 : NormStorage::None;
  c.group_size = j.contains("group_size") ? (int)r.integer(j, path, "group_size", 0, kIntMax) : 0;
  c.scale_heads = j.contains("scale_heads") ? (int)r.integer(j, path, "scale_heads", 0, 1024) : 0;
  const json& groups = r.array(j, path, "groups");
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const std::string gp = fmt::format("{}.groups[{}]", path, gi);
    const json& jg = r.object(groups[gi], gp);
    r.only_known(jg, gp, {"bits", "blocks", "channels", "seed"});
    CodecGroup g;
    g.bits = (int)r.integer(jg, gp, "bits", std::numeric_limits<int>::min(), kIntMax);
    if (jg.contains("blocks")) g.blocks = r.int_list(jg, gp, "blocks");
    if (jg.contains("channels")) g.channels = r.int_list(jg, gp, "channels");
    check(jg.contains("blocks") || jg.contains("channels"), "{}: {}: missing \"blocks\" or \"channels\"", r.name,
          gp);
    if (jg.contains("seed")) g.seed = (uint32_t)r.integer(jg, gp, "seed", 0, 0xffffffffll);
    c.groups.push_back(std::move(g));
  }
  if (j.contains("norm_correction")) {
    const json& v = j.at("norm_correction");
    check(v.is_boolean(), "{}: {} is {}: expected a boolean", r.name, Reader::join(path, "norm_correction"),
          Reader::type_of(v));
    c.norm_correction = v.get<bool>();
  }
  if (j.contains("offset")) {
    const json& a = r.array(j, path, "offset");
    for (size_t i = 0; i < a.size(); ++i) {
      check(a[i].is_number(), "{}: {}[{}] is {}: expected a number", r.name, Reader::join(path, "offset"), i,
            Reader::type_of(a[i]));
      c.offset.push_back(a[i].get<float>());
    }
    check(!c.offset.empty(), "{}: {}: empty (omit the key for no offset)", r.name, Reader::join(path, "offset"));
  }
  return c;
}

}  // namespace

json Plan::to_json() const {
  json j;
  j["format"] = "ratekv-plan";
  j["version"] = kFormatVersion;
  j["method"] = method;
  j["model"] = {{"arch", model.arch},         {"n_layers", model.n_layers},
                {"n_kv_heads", model.n_kv_heads}, {"head_dim", model.head_dim},
                {"rope_layout", model.rope_layout}, {"file", model.file},
                {"sha256", model.sha256}};
  j["stats"] = stats_file;
  j["tensors"] = tensors_file ? json(*tensors_file) : json(nullptr);
  if (!fit.is_null()) j["fit"] = fit;
  j["seed"] = seed;
  j["fp16_window"] = fp16_window;
  j["sink_tokens"] = sink_tokens;
  j["budget"] = {{"unit", budget_unit}, {"k", budget_k}, {"v", budget_v}};
  const Achieved a = achieved();
  j["achieved"] = {{"k", a.k}, {"v", a.v}, {"total", a.total}, {"k_code", a.k_code}, {"v_code", a.v_code}};
  json jl = json::array();
  for (const auto& layer : layers) {
    json heads = json::array();
    for (const auto& h : layer) heads.push_back({{"key", codec_to_json(h.key)}, {"value", codec_to_json(h.value)}});
    jl.push_back({{"heads", std::move(heads)}});
  }
  j["layers"] = std::move(jl);
  return j;
}

Plan Plan::from_json(const json& j, const std::string& name) {
  const Reader r{name};
  r.only_known(j, "", {"format", "version", "method", "model", "stats", "tensors", "fit", "seed", "fp16_window",
                       "sink_tokens", "budget", "achieved", "layers"});
  const std::string format = r.string(j, "", "format");
  check(format == "ratekv-plan", "{}: format = \"{}\": expected \"ratekv-plan\"", name, format);
  const int64_t version = r.integer(j, "", "version", 0, kIntMax);
  check(version == kFormatVersion, "{}: version = {}: this build reads plan format version {}", name, version,
        kFormatVersion);
  Plan p;
  p.method = r.string(j, "", "method");
  const json& m = r.object(r.member(j, "", "model"), "model");
  r.only_known(m, "model", {"arch", "n_layers", "n_kv_heads", "head_dim", "rope_layout", "file", "sha256"});
  p.model.arch = r.string(m, "model", "arch");
  p.model.n_layers = (int)r.integer(m, "model", "n_layers", 1, 4096);
  p.model.n_kv_heads = (int)r.integer(m, "model", "n_kv_heads", 1, 1024);
  p.model.head_dim = (int)r.integer(m, "model", "head_dim", 2, 1024);
  p.model.rope_layout = r.string(m, "model", "rope_layout");
  p.model.file = m.contains("file") ? r.string(m, "model", "file") : "";
  p.model.sha256 = m.contains("sha256") ? r.string(m, "model", "sha256") : "";
  p.stats_file = j.contains("stats") ? r.string(j, "", "stats") : "";
  if (j.contains("tensors") && !j["tensors"].is_null()) p.tensors_file = r.string(j, "", "tensors");
  if (j.contains("fit")) p.fit = j["fit"];
  p.seed = j.contains("seed") ? (uint64_t)r.integer(j, "", "seed", 0, std::numeric_limits<int64_t>::max()) : 0;
  p.fp16_window = (int)r.integer(j, "", "fp16_window", 0, kIntMax);
  p.sink_tokens = (int)r.integer(j, "", "sink_tokens", 0, kIntMax);
  const json& b = r.object(r.member(j, "", "budget"), "budget");
  r.only_known(b, "budget", {"unit", "k", "v"});
  p.budget_unit = r.string(b, "budget", "unit");
  p.budget_k = r.number(b, "budget", "k");
  p.budget_v = r.number(b, "budget", "v");
  const json& layers = r.array(j, "", "layers");
  check((int)layers.size() == p.model.n_layers, "{}: layers: {} entries, expected model.n_layers = {}", name,
        layers.size(), p.model.n_layers);
  for (size_t l = 0; l < layers.size(); ++l) {
    const std::string lp = fmt::format("layers[{}]", l);
    r.only_known(layers[l], lp, {"heads"});
    const json& heads = r.array(r.object(layers[l], lp), lp, "heads");
    check((int)heads.size() == p.model.n_kv_heads, "{}: {}.heads: {} entries, expected model.n_kv_heads = {}", name,
          lp, heads.size(), p.model.n_kv_heads);
    std::vector<HeadPlan> hv;
    for (size_t h = 0; h < heads.size(); ++h) {
      const std::string hp = fmt::format("{}.heads[{}]", lp, h);
      const json& jh = r.object(heads[h], hp);
      r.only_known(jh, hp, {"key", "value"});
      HeadPlan head;
      head.key = codec_from_json(r, r.member(jh, hp, "key"), hp + ".key");
      head.value = codec_from_json(r, r.member(jh, hp, "value"), hp + ".value");
      hv.push_back(std::move(head));
    }
    p.layers.push_back(std::move(hv));
  }
  p.validate(name);
  if (j.contains("achieved")) {
    const json& a = r.object(j["achieved"], "achieved");
    r.only_known(a, "achieved", {"k", "v", "total", "k_code", "v_code"});
    const Achieved mine = p.achieved();
    const std::pair<const char*, double> fields[] = {
        {"k", mine.k}, {"v", mine.v}, {"total", mine.total}, {"k_code", mine.k_code}, {"v_code", mine.v_code}};
    for (const auto& [key, val] : fields) {
      if (!a.contains(key)) continue;
      const double stored = r.number(a, "achieved", key);
      check(std::abs(stored - val) <= 1e-6 * (1.0 + std::abs(val)),
            "{}: achieved.{} = {}: the codecs store {} bits per element (edited by hand, or written before "
            "achieved counted every stored byte: tile padding, extension norms, vq segment rounding?)",
            name, key, stored, val);
    }
  }
  return p;
}

Plan Plan::load(const std::string& path) {
  const json j = format::read_json_file(path, "plan", "a JSON plan (the JSON object `ratekv plan` writes)");
  Plan p = from_json(j, std::filesystem::path(path).filename().string());
  p.source_dir = std::filesystem::path(path).parent_path().string();
  return p;
}

void Plan::save(const std::string& path) const {
  validate(path);
  // A loaded plan names its side file relative to the directory it came from: saved elsewhere, the JSON would
  // point at a file that is not there (found only when the codecs load it, naming a file the user never made).
  if (tensors_file && !source_dir.empty() && std::filesystem::path(*tensors_file).is_relative()) {
    namespace fs = std::filesystem;
    const fs::path from = fs::path(source_dir) / *tensors_file;
    fs::path dir = fs::path(path).parent_path();
    if (dir.empty()) dir = ".";
    const fs::path to = dir / *tensors_file;
    std::error_code ec;
    check(fs::equivalent(from, to, ec) || fs::exists(to),
          "{}: the plan's side file '{}' (field tensors, relative to the plan's directory) is in '{}', not beside "
          "the new file: copy it to '{}' first", path, *tensors_file, source_dir, to.string());
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  check((bool)out, "{}: cannot open for writing", path);
  out << to_json().dump(1) << '\n';
  out.close();  // a full disk shows at close, not at <<
  check((bool)out, "{}: write failed", path);
}

}  // namespace ratekv
