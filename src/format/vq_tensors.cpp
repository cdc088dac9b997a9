// VqTensors and vq_layout_digest: the vq plan's tensor side file
// (ratekv/format/vq_tensors.h).
#include "ratekv/format/vq_tensors.h"

#include <cmath>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/io/safetensors.h"
#include "ratekv/io/sha256.h"

namespace ratekv {

using nlohmann::json;
namespace {

// fp16 bits of values that must be fp16 numbers already (Error naming the tensor otherwise).
std::vector<uint16_t> to_fp16_exact(const std::vector<float>& v, const std::string& path, const std::string& tensor) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    out[i] = fp32_to_fp16(v[i]);
    check(fp16_to_fp32(out[i]) == v[i],
          "{}: {}[{}] = {}: not an fp16 number (the side file stores fp16; round with round_fp16 first)", path, tensor,
          i, v[i]);
  }
  return out;
}


const char* side_name(int s) { return s == 0 ? "key" : "value"; }

std::string tensor_name(int l, int h, int s, const char* what) {
  return fmt::format("l{}.h{}.{}.{}", l, h, side_name(s), what);
}

const Codec& codec_of(const Plan& p, int l, int h, int s) {
  return s == 0 ? p.layers[l][h].key : p.layers[l][h].value;
}

}  // namespace

// ---------------------------------------------------------------------------
// VqTensors
// ---------------------------------------------------------------------------

std::string vq_layout_digest(const Plan& plan) {
  std::string s;
  for (int l = 0; l < plan.model.n_layers && l < static_cast<int>(plan.layers.size()); ++l)
    for (int h = 0; h < static_cast<int>(plan.layers[l].size()); ++h)
      for (int side = 0; side < 2; ++side) {
        const Codec& c = codec_of(plan, l, h, side);
        if (c.kind != CodecKind::Vq) continue;
        s += fmt::format("{}.{}.{} g{} n{} s{}:", l, h, side, c.group_size, static_cast<int>(c.norm), c.scale_heads);
        for (const auto& g : c.groups) s += fmt::format("{}{};", g.bits, fmt::join(g.channels, ","));
        s += '\n';
      }
  return sha256_hex(std::span(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
}

VqTensors VqTensors::for_plan(const Plan& plan) {
  VqTensors t;
  t.model = plan.model;
  t.entries.resize(static_cast<size_t>(plan.model.n_layers) * plan.model.n_kv_heads * 2);
  return t;
}

VqTensors::Entry& VqTensors::at(int layer, int head, int side) {
  const size_t i = (static_cast<size_t>(layer) * model.n_kv_heads + head) * 2 + side;
  check(layer >= 0 && layer < model.n_layers && head >= 0 && head < model.n_kv_heads && (side == 0 || side == 1),
        "VqTensors: (layer {}, head {}, side {}) out of range", layer, head, side);
  return entries[i];
}

const VqTensors::Entry& VqTensors::at(int layer, int head, int side) const {
  return const_cast<VqTensors*>(this)->at(layer, head, side);
}

void VqTensors::validate_against(const Plan& plan, const std::string& name) const {
  plan.validate_against(model, name + " (side file)");
  const int L = plan.model.n_layers, H = plan.model.n_kv_heads, d = plan.model.head_dim;
  check(entries.size() == static_cast<size_t>(L) * H * 2, "{}: {} entries, expected {}", name, entries.size(),
        static_cast<size_t>(L) * H * 2);
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h)
      for (int s = 0; s < 2; ++s) {
        const Codec& c = codec_of(plan, l, h, s);
        const Entry& e = at(l, h, s);
        const std::string tn = tensor_name(l, h, s, "codebooks");
        if (c.kind != CodecKind::Vq) {
          check(!e.present, "{}: {}: present, but the plan's codec there is {} (side file of another plan?)", name,
                tn, codec_kind_name(c.kind));
          continue;
        }
        check(e.present, "{}: {}: missing (the plan's codec there is vq)", name, tn);
        const int64_t G = static_cast<int64_t>(c.groups.size()), K = int64_t{1} << c.groups[0].bits,
                      g = c.group_size;
        check(static_cast<int64_t>(e.codebooks.size()) == G * K * g,
              "{}: {}: {} values, expected (G {}, K {}, g {}) = {} (side file of another plan?)", name, tn,
              e.codebooks.size(), G, K, g, G * K * g);
        // Centroids are a fixed cost counted as fp16 (codebook_bytes); a value past the fp16 range
        // overflows the decoded key/value (s · C / a) to inf and the attention to NaN.
        for (float v : e.codebooks)
          check(std::isfinite(v) && std::abs(v) <= 65504.0f,
                "{}: {}: centroid {} is not a finite value within the fp16 range (|c| ≤ 65504)", name, tn, v);
        if (!e.channel_scale.empty()) {
          const std::string an = tensor_name(l, h, s, "channel_scale");
          check(static_cast<int>(e.channel_scale.size()) == d, "{}: {}: {} values, expected head_dim {}", name, an,
                e.channel_scale.size(), d);
          for (float v : e.channel_scale)
            check(std::isfinite(v) && v > 0.0f, "{}: {}: channel scale {} must be finite and > 0", name, an, v);
        }
      }
}

int64_t VqTensors::stored_bytes() const {
  int64_t b = 0;
  for (const auto& e : entries) b += static_cast<int64_t>(e.codebooks.size() + e.channel_scale.size()) * 2;
  return b;
}

int64_t VqTensors::codebook_bytes() const {
  int64_t b = 0;
  for (const auto& e : entries) b += static_cast<int64_t>(e.codebooks.size()) * 2;
  return b;
}

void VqTensors::save(const std::string& path) const { write(path, ""); }

void VqTensors::save(const std::string& path, const Plan& plan) const {
  validate_against(plan, path);
  write(path, vq_layout_digest(plan));
}

void VqTensors::write(const std::string& path, const std::string& layout_digest) const {
  SafetensorsWriter w;
  const int H = model.n_kv_heads;
  for (int l = 0; l < model.n_layers; ++l)
    for (int h = 0; h < H; ++h)
      for (int s = 0; s < 2; ++s) {
        const Entry& e = at(l, h, s);
        if (!e.present) continue;
        // Shape (G, K, g) is implied by the plan; stored flat per group count, as F16: the cost the plan
        // reports (plan_codebook_bytes). Values must already be fp16 numbers (the fitter rounds them).
        w.add_f16(tensor_name(l, h, s, "codebooks"), {static_cast<int64_t>(e.codebooks.size())},
                  to_fp16_exact(e.codebooks, path, tensor_name(l, h, s, "codebooks")));
        if (!e.channel_scale.empty())
          w.add_f16(tensor_name(l, h, s, "channel_scale"), {static_cast<int64_t>(e.channel_scale.size())},
                    to_fp16_exact(e.channel_scale, path, tensor_name(l, h, s, "channel_scale")));
      }
  json meta = {{"format", kFormat},
               {"version", kFormatVersion},
               {"model",
                {{"arch", model.arch},
                 {"n_layers", model.n_layers},
                 {"n_kv_heads", model.n_kv_heads},
                 {"head_dim", model.head_dim},
                 {"rope_layout", model.rope_layout}}}};
  if (!layout_digest.empty()) meta["layout_sha256"] = layout_digest;
  w.set_metadata("format", kFormat);
  w.set_metadata("ratekv", meta.dump());
  w.write(path);
}

VqTensors VqTensors::load(const std::string& path, const Plan& plan) {
  const SafetensorsFile f = SafetensorsFile::open(path);
  const auto& md = f.metadata();
  check(md.count("format") && md.at("format") == kFormat,
        "{}: not a ratekv vq side file (__metadata__.format must be \"{}\")", path, kFormat);
  VqTensors t = for_plan(plan);
  std::string file_digest;  // "" = a file written before the digest existed
  try {
    const json m = json::parse(f.metadata_value("ratekv"));
    check(m.at("version").get<int>() == kFormatVersion, "{}: version {}: this build reads vq side file version {}",
          path, m.at("version").get<int>(), kFormatVersion);
    const json& mm = m.at("model");
    t.model.arch = mm.at("arch").get<std::string>();
    t.model.n_layers = mm.at("n_layers").get<int>();
    t.model.n_kv_heads = mm.at("n_kv_heads").get<int>();
    t.model.head_dim = mm.at("head_dim").get<int>();
    t.model.rope_layout = mm.at("rope_layout").get<std::string>();
    if (m.contains("layout_sha256")) file_digest = m.at("layout_sha256").get<std::string>();
  } catch (const json::exception& e) {
    fail("{}: __metadata__.ratekv: missing or mistyped field: {}", path, e.what());
  }
  plan.validate_against(t.model, path);
  if (!file_digest.empty()) {
    const std::string want = vq_layout_digest(plan);
    check(file_digest == want,
          "{}: __metadata__.ratekv.layout_sha256 = {}, but the plan's vq codecs (channel groups, group size, widths) "
          "give {}: this side file was fitted for another plan",
          path, file_digest, want);
  }
  for (int l = 0; l < t.model.n_layers; ++l)
    for (int h = 0; h < t.model.n_kv_heads; ++h)
      for (int s = 0; s < 2; ++s) {
        Entry& e = t.at(l, h, s);
        const std::string cn = tensor_name(l, h, s, "codebooks"), an = tensor_name(l, h, s, "channel_scale");
        for (const std::string& n : {cn, an})
          if (const StTensor* t = f.find(n))
            check(t->dtype == StDtype::F16,
                  "{}: {}: stored as {}, expected F16 (the side file stores codebooks and channel scales as fp16, "
                  "the cost the plan reports; re-fit with `ratekv plan --method tasq|cq`)",
                  path, n, st_dtype_name(t->dtype));
        if (f.find(cn)) {
          e.present = true;
          e.codebooks = f.read_f32(cn);
        }
        if (f.find(an)) {
          check(e.present, "{}: {} without {}", path, an, cn);
          e.channel_scale = f.read_f32(an);
        }
      }
  t.validate_against(plan, path);
  return t;
}

}  // namespace ratekv
