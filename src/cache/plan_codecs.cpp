// PlanCodecs: plan codec → quantizer, per (layer, KV head, side).
#include "ratekv/cache/plan_codecs.h"

#include <filesystem>

#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"

namespace ratekv::cache {

using nlohmann::json;

namespace {

void require_all_channels(const Codec& c, int d, const std::string& field) {
  check(c.groups.size() == 1, "{}: kind {} needs exactly one group, got {}", field, codec_kind_name(c.kind),
        c.groups.size());
  const auto& ch = c.groups[0].channels;
  bool ok = static_cast<int>(ch.size()) == d;
  for (int i = 0; ok && i < d; ++i) ok = ch[i] == i;
  check(ok, "{}: kind {} must list the channels 0..{} in order (channel subsets are only supported by "
        "tq-mse-grouped)", field, codec_kind_name(c.kind), d - 1);
}

uint32_t mix32(uint64_t seed, uint64_t run) {
  uint64_t z = seed ^ (run * 0x9e3779b97f4a7c15ull);
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return static_cast<uint32_t>((z ^ (z >> 31)) >> 32);
}

}  // namespace

PlanTarget plan_target(const ModelConfig& cfg) {
  PlanTarget t;
  t.arch = cfg.arch;
  t.n_layers = cfg.n_layers;
  t.n_kv_heads = cfg.n_kv_heads;
  t.head_dim = cfg.head_dim;
  t.rope_layout = rope_layout_name(cfg.rope_layout);
  return t;
}

json PlanCodecs::quantizer_json(const Codec& c, KVSide side, int d, RopeLayout layout, const std::string& field) {
  switch (c.kind) {
    case CodecKind::FP16:
      return json();
    case CodecKind::TqMse: {
      require_all_channels(c, d, field);
      check(c.norm == NormStorage::FP16, "{}: tq-mse needs norm \"fp16\"", field);
      return {{"kind", "tq_mse"}, {"dim", d},         {"bits", c.groups[0].bits}, {"seed", c.groups[0].seed},
              {"rotation", "haar"}, {"norm", "fp16"}, {"norm_correction", c.norm_correction}};
    }
    case CodecKind::TqMseGrouped: {
      check(c.norm == NormStorage::FP16, "{}: tq-mse-grouped needs norm \"fp16\"", field);
      const auto pairs = rope_pairs(layout, d);
      json groups = json::array();
      for (size_t g = 0; g < c.groups.size(); ++g) {
        const CodecGroup& cg = c.groups[g];
        if (cg.blocks.empty()) continue;
        std::vector<int> ch;
        for (int b : cg.blocks) {
          check(b >= 0 && b < d / 2, "{}.groups[{}]: block {} outside 0..{}", field, g, b, d / 2 - 1);
          ch.push_back(pairs[b][0]);
          ch.push_back(pairs[b][1]);
        }
        groups.push_back({{"channels", ch}, {"bits", cg.bits}, {"seed", cg.seed}});
      }
      return {{"kind", "grouped_tq_mse"}, {"dim", d},         {"rotation", "haar"},
              {"norm", "fp16"},           {"norm_correction", c.norm_correction}, {"groups", groups}};
    }
    case CodecKind::Kivi:
      require_all_channels(c, d, field);
      return {{"kind", side == KVSide::key ? "kivi_key" : "kivi_value"},
              {"dim", d},
              {"bits", c.groups[0].bits},
              {"group_size", c.group_size}};
    case CodecKind::QuaRot:
      require_all_channels(c, d, field);
      return {{"kind", "quarot"},         {"dim", d},         {"bits", c.groups[0].bits}, {"seed", c.groups[0].seed},
              {"symmetric", false}, {"group_size", c.group_size}, {"rotation", "hadamard"}};
    case CodecKind::Q8_0:
    case CodecKind::Q4_0:
      require_all_channels(c, d, field);
      return {{"kind", c.kind == CodecKind::Q8_0 ? "q8_0" : "q4_0"}, {"dim", d}};
    case CodecKind::Vq:
      return json();  // not a quant::Quantizer: VqCodec (cache/vq_codec.h)
  }
  fail("{}: unsupported codec kind", field);
}

PlanCodecs::PlanCodecs(Plan plan, const ModelConfig& cfg, const std::string& name)
    : PlanCodecs(std::move(plan), cfg, name, nullptr) {}

PlanCodecs::PlanCodecs(Plan plan, const ModelConfig& cfg, const std::string& name,
                       std::shared_ptr<const VqTensors> vq_tensors)
    : plan_(std::move(plan)), cfg_(cfg), vq_tensors_(std::move(vq_tensors)) {
  plan_.validate(name);
  plan_.validate_against(plan_target(cfg_), name);
  const int L = cfg_.n_layers, H = cfg_.n_kv_heads, d = cfg_.head_dim;
  vq_.resize(static_cast<size_t>(L) * H * 2);
  bool any_vq = false;
  for (int l = 0; l < L; ++l)
    for (int s = 0; s < 2; ++s) {
      int n = 0;
      for (int h = 0; h < H; ++h) n += (s == 0 ? plan_.layers[l][h].key : plan_.layers[l][h].value).kind == CodecKind::Vq;
      check(n == 0 || n == H, "{}: layers[{}]: {} of {} KV heads' {} codecs are vq; a layer side is all vq or none",
            name, l, n, H, s == 0 ? "key" : "value");
      any_vq = any_vq || n > 0;
    }
  if (any_vq) {
    if (!vq_tensors_) {
      check(plan_.tensors_file.has_value(), "{}: tensors: vq codecs need a side file", name);
      std::filesystem::path p(*plan_.tensors_file);
      if (p.is_relative() && !plan_.source_dir.empty()) p = std::filesystem::path(plan_.source_dir) / p;
      try {
        vq_tensors_ = std::make_shared<const VqTensors>(VqTensors::load(p.string(), plan_));
      } catch (const Error& e) {
        fail("{}: tensors '{}' (the plan's side file, relative to its directory): {}", name, *plan_.tensors_file,
             e.what());
      }
    } else {
      vq_tensors_->validate_against(plan_, name);
    }
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h)
        for (int s = 0; s < 2; ++s) {
          const Codec& c = s == 0 ? plan_.layers[l][h].key : plan_.layers[l][h].value;
          if (c.kind != CodecKind::Vq) continue;
          const VqTensors::Entry& e = vq_tensors_->at(l, h, s);
          vq_[(static_cast<size_t>(l) * H + h) * 2 + s] = std::make_unique<VqCodec>(c, d, e.codebooks, e.channel_scale);
        }
  }
  check(static_cast<int>(plan_.layers.size()) == L, "{}: {} layers, model has {}", name, plan_.layers.size(), L);
  q_.resize(static_cast<size_t>(L) * H * 2);
  for (int l = 0; l < L; ++l) {
    check(static_cast<int>(plan_.layers[l].size()) == H, "{}: layers[{}] has {} heads, model has {} KV heads", name,
          l, plan_.layers[l].size(), H);
    for (int h = 0; h < H; ++h)
      for (int s = 0; s < 2; ++s) {
        const Codec& c = s == 0 ? plan_.layers[l][h].key : plan_.layers[l][h].value;
        const std::string field = fmt::format("{}: layers[{}].heads[{}].{}", name, l, h, s == 0 ? "key" : "value");
        const json desc = quantizer_json(c, static_cast<KVSide>(s), d, cfg_.rope_layout, field);
        if (desc.is_null()) continue;
        try {
          q_[(static_cast<size_t>(l) * H + h) * 2 + s] = quant::make_quantizer(desc);
        } catch (const Error& e) {
          fail("{}: {}", field, e.what());
        }
        check(q_[(static_cast<size_t>(l) * H + h) * 2 + s]->scope() != quant::QuantScope::per_token_shared,
              "{}: per-token-shared codecs (TaSQ) are not supported by the fake-quant cache", field);
      }
  }
}

const quant::Quantizer* PlanCodecs::quantizer(int layer, int head, KVSide side) const {
  check(layer >= 0 && layer < cfg_.n_layers && head >= 0 && head < cfg_.n_kv_heads,
        "PlanCodecs: (layer {}, head {}) outside ({}, {})", layer, head, cfg_.n_layers, cfg_.n_kv_heads);
  return q_[(static_cast<size_t>(layer) * cfg_.n_kv_heads + head) * 2 + static_cast<int>(side)].get();
}

const VqCodec* PlanCodecs::vq(int layer, int head, KVSide side) const {
  check(layer >= 0 && layer < cfg_.n_layers && head >= 0 && head < cfg_.n_kv_heads,
        "PlanCodecs: (layer {}, head {}) outside ({}, {})", layer, head, cfg_.n_layers, cfg_.n_kv_heads);
  return vq_[(static_cast<size_t>(layer) * cfg_.n_kv_heads + head) * 2 + static_cast<int>(side)].get();
}

void PlanCodecs::fake_quant_layer(int layer, KVSide side, const float* x, int64_t T, float* out) const {
  check(layer_is_vq(layer, side), "PlanCodecs::fake_quant_layer: layer {} {} codecs are not vq", layer,
        side == KVSide::key ? "key" : "value");
  std::vector<const VqCodec*> heads(cfg_.n_kv_heads);
  for (int h = 0; h < cfg_.n_kv_heads; ++h) heads[h] = vq(layer, h, side);
  vq_fake_quant_layer(heads, x, T, out);
}

const float* PlanCodecs::key_offset(int layer, int head) const {
  check(layer >= 0 && layer < cfg_.n_layers && head >= 0 && head < cfg_.n_kv_heads,
        "PlanCodecs: (layer {}, head {}) outside ({}, {})", layer, head, cfg_.n_layers, cfg_.n_kv_heads);
  const std::vector<float>& o = plan_.layers[layer][head].key.offset;
  return o.empty() ? nullptr : o.data();
}

bool PlanCodecs::has_key_offsets() const {
  for (const auto& layer : plan_.layers)
    for (const auto& h : layer)
      if (!h.key.offset.empty()) return true;
  return false;
}

void PlanCodecs::fake_quant(int layer, int head, KVSide side, const float* x, int64_t T, float* xhat) const {
  fake_quant(layer, head, side, x, nullptr, T, xhat);
}

void PlanCodecs::fake_quant(int layer, int head, KVSide side, const float* x, const int32_t* pos, int64_t T,
                            float* xhat) const {
  const float* off = side == KVSide::key ? key_offset(layer, head) : nullptr;
  if (off != nullptr) {
    check(pos != nullptr,
          "PlanCodecs::fake_quant: layers[{}].heads[{}].key has an offset (pre-RoPE): the rows' positions are needed",
          layer, head);
    // r_t = x_t − R_{pos_t} μ, quantized, then R_{pos_t} μ added back.
    const int d = cfg_.head_dim;
    std::vector<float> rot(static_cast<size_t>(T) * d), r(static_cast<size_t>(T) * d);
    for (int64_t t = 0; t < T; ++t) {
      std::copy(off, off + d, rot.begin() + t * d);
      apply_rope(rot.data() + t * d, 1, d, pos[t], cfg_.rope_layout, cfg_.layer_rope_theta(layer));
      for (int i = 0; i < d; ++i) r[t * d + i] = x[t * d + i] - rot[t * d + i];
    }
    fake_quant_rows(layer, head, side, r.data(), T, r.data());
    for (int64_t i = 0; i < T * d; ++i) xhat[i] = r[i] + rot[i];
    return;
  }
  fake_quant_rows(layer, head, side, x, T, xhat);
}

void PlanCodecs::fake_quant_rows(int layer, int head, KVSide side, const float* x, int64_t T, float* xhat) const {
  check(vq(layer, head, side) == nullptr,
        "PlanCodecs::fake_quant: layer {} head {} is a vq codec; it is quantized per layer (fake_quant_layer)", layer,
        head);
  const quant::Quantizer* q = quantizer(layer, head, side);
  if (q == nullptr) {
    const int64_t n = T * cfg_.head_dim;
    float v = 0;
    const int64_t bad = round_fp16_span(x, n, xhat, &v);
    check(bad < 0, "PlanCodecs::fake_quant: layer {} head {} {}: token {}, channel {} is {}, beyond fp16 (|x| <= "
          "65504), and the codec stores it as fp16", layer, head, side == KVSide::key ? "key" : "value",
          bad / cfg_.head_dim, bad % cfg_.head_dim, v);
    return;
  }
  q->fake_quant(x, T, xhat);
}

Plan reseeded_plan(const Plan& plan, uint64_t run_seed) {
  Plan p = plan;
  if (run_seed == 0) return p;
  for (auto& layer : p.layers)
    for (auto& h : layer)
      for (Codec* c : {&h.key, &h.value}) {
        if (c->kind != CodecKind::TqMse && c->kind != CodecKind::TqMseGrouped && c->kind != CodecKind::QuaRot) continue;
        for (auto& g : c->groups)
          if (g.bits > 0) g.seed = mix32(g.seed, run_seed);
      }
  return p;
}

}  // namespace ratekv::cache
