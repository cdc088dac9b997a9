// CacheFormat: fp16 pages, or a plan's packed pages with the tables the CUDA
// kernels take (ratekv/engine/cache_format.h).
#include "ratekv/engine/cache_format.h"

#include <fmt/format.h>

#include "ratekv/common/error.h"
#include "ratekv/quant/grouped_tq_mse.h"
#include "ratekv/quant/tq_mse.h"

namespace ratekv::engine {

namespace {

// Widest TQ-MSE group: 5..8-bit groups keep their high bits in the extension
// pages (docs/packed_format.md §5), as in the CPU packed cache.
constexpr int kMaxWideBits = 8;

// Where one (layer, KV head, side) is stored: scalar pages (TQ-MSE groups)
// or the vq pages (a vq or fp16 codec).
enum class Store { scalar, vq, fp16 };

// The TQ-MSE groups of one (layer, KV head, side): (encoder, channels), or
// the vq pages, or an error string naming the plan field.
struct SideGroups {
  std::vector<std::pair<const quant::TQMSE*, std::vector<int>>> groups;
  std::string error;
  Store store = Store::scalar;
};

SideGroups side_groups(const cache::PlanCodecs& codecs, int l, int h, int s) {
  SideGroups r;
  const Plan& plan = codecs.plan();
  const Codec& codec = s == 0 ? plan.layers[l][h].key : plan.layers[l][h].value;
  const std::string field = fmt::format("plan: layers[{}].heads[{}].{}", l, h, s == 0 ? "key" : "value");
  if (!codec.offset.empty()) {
    r.error = fmt::format("GPU engine: {}: the codec has a key offset; the GPU pages have no place for it (the CPU "
                          "fake-quant cache serves key offsets)", field);
    return r;
  }
  if (codec.kind == CodecKind::Vq) {  // TaSQ / CQ: the vq pages (layer checks in layer_stores)
    r.store = Store::vq;
    return r;
  }
  if (codec.kind == CodecKind::FP16) {
    r.store = Store::fp16;
    return r;
  }
  if (codec.kind != CodecKind::TqMse && codec.kind != CodecKind::TqMseGrouped) {
    r.error = fmt::format(
        "GPU engine: {}: codec kind '{}' is not served on the GPU: no packed storage (the engine serves tq-mse and "
        "tq-mse-grouped codecs: uniform TQ-MSE, Block-GTQ, RateQuant; vq codecs: TaSQ, CQ; fp16 sides; and the fp16 "
        "cache, CacheFormat::fp16)",
        field, codec_kind_name(codec.kind));
    return r;
  }
  const quant::Quantizer* q = codecs.quantizer(l, h, static_cast<cache::KVSide>(s));
  const int d = codecs.config().head_dim;
  auto add = [&](const quant::TQMSE& tq, std::vector<int> ch) {
    if (!r.error.empty()) return;
    // A 0-bit group stores nothing: its channels are in no group of the
    // layout and reconstruct as 0, as in the CPU packed cache
    // (docs/packed_format.md §6; the GPU writers skip them, the readers write 0).
    if (tq.bits() == 0) return;
    if (tq.bits() < packed::kMinBits || tq.bits() > kMaxWideBits) {
      r.error = fmt::format("GPU engine: {}: a {}-bit group; the packed pages store 1..{}-bit groups", field,
                            tq.bits(), kMaxWideBits);
      return;
    }
    if (tq.config().norm != quant::NormCoding::fp16 || tq.config().norm_correction) {
      r.error = fmt::format("GPU engine: {}: the GPU stores plain fp16 norms (no other norm coding or norm correction)",
                            field);
      return;
    }
    r.groups.emplace_back(&tq, std::move(ch));
  };
  if (const auto* tq = dynamic_cast<const quant::TQMSE*>(q)) {
    std::vector<int> all(d);
    for (int i = 0; i < d; ++i) all[i] = i;
    add(*tq, std::move(all));
  } else if (const auto* gq = dynamic_cast<const quant::GroupedTQMSE*>(q)) {
    for (size_t g = 0; g < gq->codecs().size(); ++g) add(gq->codecs()[g], gq->config().groups[g].channels);
  } else {
    r.error = fmt::format("GPU engine: {}: quantizer is not TQ-MSE", field);
  }
  return r;
}

std::string plan_level_reason(const cache::PlanCodecs& codecs) {
  const Plan& p = codecs.plan();
  const ModelConfig& c = codecs.config();
  if (p.fp16_window != 0 || p.sink_tokens != 0)
    return fmt::format(
        "GPU engine: plan: fp16_window {} / sink_tokens {}: the GPU cache has no fp16 window or sink tokens (use a "
        "plan with 0 and 0)",
        p.fp16_window, p.sink_tokens);
  if (c.head_dim != 64 && c.head_dim != 128 && c.head_dim != 256)
    return fmt::format("GPU engine: head_dim {} has no decode kernel (64, 128, 256)", c.head_dim);
  if (c.gqa_ratio() > 16) return fmt::format("GPU engine: GQA {} > 16 has no decode kernel", c.gqa_ratio());
  return {};
}

// The stores of layer l's sides (every KV head agrees, or an error naming the
// plan field): the layer's vq pages hold its key side (vq or fp16) and its
// value side when that is vq or fp16; the vq decode kernel reads keys from
// the vq pages, so vq / fp16 values need vq / fp16 keys.
struct LayerStores {
  Store store[2] = {Store::scalar, Store::scalar};
  bool wide = false;  // a TQ-MSE group of 5..8 bits (extension pages)
  std::string error;
  bool has_vq() const { return store[0] != Store::scalar || store[1] != Store::scalar; }
};

LayerStores layer_stores(const cache::PlanCodecs& codecs, int l) {
  LayerStores r;
  const ModelConfig& c = codecs.config();
  for (int s = 0; s < 2; ++s) {
    const char* side = s == 0 ? "key" : "value";
    for (int h = 0; h < c.n_kv_heads; ++h) {
      SideGroups g = side_groups(codecs, l, h, s);
      if (!g.error.empty()) {
        r.error = g.error;
        return r;
      }
      if (h == 0) r.store[s] = g.store;
      for (const auto& grp : g.groups) r.wide = r.wide || grp.first->bits() > packed::kMaxBits;
      if (g.store != r.store[s]) {
        r.error = fmt::format(
            "GPU engine: plan: layers[{}].heads[{}].{}: stored {} but head 0's {} is {}; a layer side is in the vq "
            "pages (vq / fp16 codecs) on every KV head or on none",
            l, h, side, g.store == Store::scalar ? "as TQ-MSE" : g.store == Store::vq ? "vq" : "fp16", side,
            r.store[s] == Store::scalar ? "TQ-MSE" : r.store[s] == Store::vq ? "vq" : "fp16");
        return r;
      }
    }
    if (r.store[s] != Store::vq) continue;
    const cache::VqCodec* c0 = codecs.vq(l, 0, static_cast<cache::KVSide>(s));
    for (int h = 1; h < c.n_kv_heads; ++h) {
      const cache::VqCodec* ch = codecs.vq(l, h, static_cast<cache::KVSide>(s));
      if (ch->n_groups() != c0->n_groups() || ch->n_centroids() != c0->n_centroids() ||
          ch->shared_scale() != c0->shared_scale()) {
        r.error = fmt::format("GPU engine: plan: layers[{}].heads[{}].{}: {} groups of {} centroids, shared scale {}; "
                              "head 0 has {} of {}, shared scale {}; the vq pages need the same groups, width and "
                              "scale kind on every KV head",
                              l, h, side, ch->n_groups(), ch->n_centroids(), ch->shared_scale(), c0->n_groups(),
                              c0->n_centroids(), c0->shared_scale());
        return r;
      }
    }
  }
  if (r.wide && r.has_vq())
    r.error = fmt::format(
        "GPU engine: plan: layers[{}]: 5..8-bit TQ-MSE groups beside vq / fp16 sides; the vq decode kernel reads "
        "TQ-MSE values without extension pages (give that layer's values at most 4 bits)",
        l);
  else if (r.store[0] == Store::scalar && r.store[1] != Store::scalar)
    r.error = fmt::format(
        "GPU engine: plan: layers[{}].heads[0].value: a {} value side under TQ-MSE keys; the GPU's vq decode reads "
        "the keys from the vq pages (vq or fp16 keys), so vq / fp16 values need vq / fp16 keys",
        l, r.store[1] == Store::vq ? "vq" : "fp16");
  return r;
}

}  // namespace

std::string CacheFormat::unsupported_reason(const cache::PlanCodecs& codecs) {
  if (std::string r = plan_level_reason(codecs); !r.empty()) return r;
  const ModelConfig& c = codecs.config();
  for (int l = 0; l < c.n_layers; ++l)
    if (LayerStores st = layer_stores(codecs, l); !st.error.empty()) return st.error;
  return {};
}

CacheFormat CacheFormat::fp16(const ModelConfig& cfg) {
  CacheFormat f;
  f.fp16_ = true;
  f.label_ = "fp16";
  f.n_layers_ = cfg.n_layers;
  f.head_dim_ = cfg.head_dim;
  f.n_kv_heads_ = cfg.n_kv_heads;
  f.page_bytes_.assign(cfg.n_layers, size_t{2} * 2 * packed::kPageTokens * cfg.head_dim * cfg.n_kv_heads);
  return f;
}

CacheFormat CacheFormat::packed(std::shared_ptr<const cache::PlanCodecs> codecs, std::string label) {
  check(codecs != nullptr, "CacheFormat::packed: codecs is null");
  if (std::string r = plan_level_reason(*codecs); !r.empty()) fail("{}", r);
  const ModelConfig& c = codecs->config();
  CacheFormat f;
  f.fp16_ = false;
  f.n_layers_ = c.n_layers;
  f.head_dim_ = c.head_dim;
  f.n_kv_heads_ = c.n_kv_heads;
  int kb = -1, vb = -1;  // uniform widths, or 0 when mixed
  bool uniform = true;
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerStores st = layer_stores(*codecs, l);
    if (!st.error.empty()) fail("{}", st.error);
    if (st.has_vq()) uniform = false;
    std::vector<packed::HeadSpec> specs(c.n_kv_heads), ext_specs(c.n_kv_heads);
    bool any_wide = false;
    std::vector<float> rot, lvl;
    for (int h = 0; h < c.n_kv_heads; ++h)
      for (int s = 0; s < 2; ++s) {
        SideGroups sg = side_groups(*codecs, l, h, s);
        if (sg.store != Store::scalar) continue;  // in the vq pages
        auto& side = s == 0 ? specs[h].key : specs[h].value;
        auto& ext_side = s == 0 ? ext_specs[h].key : ext_specs[h].value;
        int& ub = s == 0 ? kb : vb;
        if (sg.groups.size() != 1 || static_cast<int>(sg.groups[0].second.size()) != c.head_dim) uniform = false;
        for (auto& [tq, ch] : sg.groups) {
          if (ub < 0) ub = tq->bits();
          if (ub != tq->bits()) uniform = false;
          // A b-bit group (b = 5..8): its low 4 bits here, the high b − 4 in
          // the extension layout, in the order of the wide groups (as
          // PackedKVCache and cuda::PackedPlan(layout, ext, …) match them).
          side.push_back(packed::GroupSpec{ch, std::min(tq->bits(), packed::kMaxBits)});
          if (tq->bits() > packed::kMaxBits) {
            ext_side.push_back(packed::GroupSpec{ch, tq->bits() - packed::kMaxBits});
            any_wide = true;
          }
          const Eigen::MatrixXd P = tq->rotation().matrix();
          const int m = tq->dim();
          for (int i = 0; i < m; ++i)
            for (int j = 0; j < m; ++j) rot.push_back(static_cast<float>(P(i, j)));
          const auto& L = tq->codebook().levels;
          lvl.insert(lvl.end(), L.begin(), L.end());
        }
      }
    f.layouts_.emplace_back(c.head_dim, std::move(specs));
    f.page_bytes_.push_back(f.layouts_.back().page_bytes());
    f.rotations_.push_back(std::move(rot));
    f.levels_.push_back(std::move(lvl));
    f.ext_.emplace_back();
    if (any_wide) {
      f.ext_.back().emplace(c.head_dim, std::move(ext_specs));
      f.page_bytes_.back() += f.ext_.back()->page_bytes();
    }
    f.vq_.emplace_back();
    if (!st.has_vq()) continue;
    packed::VqSideSpec spec[2];
    for (int s = 0; s < 2; ++s) {
      if (st.store[s] == Store::fp16) spec[s].kind = packed::VqSideKind::fp16;
      if (st.store[s] != Store::vq) continue;
      const cache::VqCodec& c0 = *codecs->vq(l, 0, static_cast<cache::KVSide>(s));
      int bits = 0;
      while ((1 << bits) < c0.n_centroids()) ++bits;
      spec[s] = packed::VqSideSpec{packed::VqSideKind::vq, c0.n_groups(), bits, c0.shared_scale()};
    }
    VqLayer V{packed::VqLayerLayout(c.head_dim, c.n_kv_heads, spec[0], spec[1]), {}, {}, {}, {}};
    for (int h = 0; h < c.n_kv_heads; ++h)
      for (int s = 0; s < 2; ++s) {
        const cache::VqCodec* vc = codecs->vq(l, h, static_cast<cache::KVSide>(s));
        if (!vc) continue;
        const int G = vc->n_groups(), K = vc->n_centroids(), g = vc->group_size();
        // C̃ = C / a: one decode per one-hot index at scale 1 (VqCodec's own reconstruction codewords).
        std::vector<int32_t> z(G, 0);
        std::vector<float> xhat(c.head_dim);
        for (int gi = 0; gi < G; ++gi) {
          const std::vector<int>& ch = vc->group_channels(gi);
          for (int j = 0; j < K; ++j) {
            z[gi] = j;
            vc->decode(z.data(), 1.0f, xhat.data());
            for (int i = 0; i < g; ++i) V.codewords.push_back(xhat[ch[i]]);
          }
          z[gi] = 0;
          V.channels.insert(V.channels.end(), ch.begin(), ch.end());
        }
        V.codebooks.insert(V.codebooks.end(), vc->codebooks().begin(), vc->codebooks().end());
        V.channel_scale.insert(V.channel_scale.end(), vc->channel_scale().begin(), vc->channel_scale().end());
      }
    f.page_bytes_.back() += V.layout.page_bytes();
    f.vq_.back() = std::move(V);
  }
  f.label_ = !label.empty() ? label
             : uniform     ? fmt::format("K{}V{}", kb, vb)
                           : "plan:" + codecs->plan().method;
  f.codecs_ = std::move(codecs);
  return f;
}

size_t CacheFormat::page_bytes_all_layers() const {
  size_t s = 0;
  for (size_t b : page_bytes_) s += b;
  return s;
}

const packed::LayerLayout& CacheFormat::layout(int layer) const {
  check(!fp16_, "CacheFormat::layout: the fp16 format has no packed layout");
  return layouts_.at(layer);
}
std::span<const float> CacheFormat::rotations(int layer) const {
  check(!fp16_, "CacheFormat::rotations: the fp16 format has no rotations");
  return rotations_.at(layer);
}
std::span<const float> CacheFormat::levels(int layer) const {
  check(!fp16_, "CacheFormat::levels: the fp16 format has no levels");
  return levels_.at(layer);
}
const CacheFormat::VqLayer* CacheFormat::vq(int layer) const {
  if (fp16_) return nullptr;
  const auto& v = vq_.at(layer);
  return v ? &*v : nullptr;
}
bool CacheFormat::has_vq() const {
  for (const auto& v : vq_)
    if (v) return true;
  return false;
}
const packed::LayerLayout* CacheFormat::ext_layout(int layer) const {
  if (fp16_) return nullptr;
  const auto& e = ext_.at(layer);
  return e ? &*e : nullptr;
}
size_t CacheFormat::scalar_page_bytes(int layer) const {
  const VqLayer* v = vq(layer);
  return page_bytes(layer) - (v ? v->layout.page_bytes() : 0);
}

}  // namespace ratekv::engine
