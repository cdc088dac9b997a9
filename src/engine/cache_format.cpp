// CacheFormat: fp16 pages, or a plan's packed pages with the tables the CUDA
// kernels take (ratekv/engine/cache_format.h).
#include "ratekv/engine/cache_format.h"

#include <fmt/format.h>

#include "ratekv/common/error.h"
#include "ratekv/quant/grouped_tq_mse.h"
#include "ratekv/quant/tq_mse.h"

namespace ratekv::engine {

namespace {

// The TQ-MSE groups of one (layer, KV head, side): (encoder, channels), or an
// error string naming the plan field.
struct SideGroups {
  std::vector<std::pair<const quant::TQMSE*, std::vector<int>>> groups;
  std::string error;
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
  if (codec.kind != CodecKind::TqMse && codec.kind != CodecKind::TqMseGrouped) {
    r.error = fmt::format(
        "GPU engine: {}: codec kind '{}' is not served on the GPU yet (the engine serves tq-mse and tq-mse-grouped "
        "codecs: uniform TQ-MSE, Block-GTQ, RateQuant; fp16 K/V as a whole cache with -ctk f16 -ctv f16)",
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
    if (tq.bits() < packed::kMinBits || tq.bits() > packed::kMaxBits) {
      r.error = fmt::format(
          "GPU engine: {}: a {}-bit group; the GPU quantizers write 0..4-bit groups only (5..8-bit groups, the "
          "extension pages of the CPU packed cache: not on the GPU yet, engine issue 2 of 3)",
          field, tq.bits());
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

}  // namespace

std::string CacheFormat::unsupported_reason(const cache::PlanCodecs& codecs) {
  if (std::string r = plan_level_reason(codecs); !r.empty()) return r;
  const ModelConfig& c = codecs.config();
  for (int l = 0; l < c.n_layers; ++l)
    for (int h = 0; h < c.n_kv_heads; ++h)
      for (int s = 0; s < 2; ++s)
        if (SideGroups g = side_groups(codecs, l, h, s); !g.error.empty()) return g.error;
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
    std::vector<packed::HeadSpec> specs(c.n_kv_heads);
    std::vector<float> rot, lvl;
    for (int h = 0; h < c.n_kv_heads; ++h)
      for (int s = 0; s < 2; ++s) {
        SideGroups sg = side_groups(*codecs, l, h, s);
        if (!sg.error.empty()) fail("{}", sg.error);
        auto& side = s == 0 ? specs[h].key : specs[h].value;
        int& ub = s == 0 ? kb : vb;
        if (sg.groups.size() != 1 || static_cast<int>(sg.groups[0].second.size()) != c.head_dim) uniform = false;
        for (auto& [tq, ch] : sg.groups) {
          if (ub < 0) ub = tq->bits();
          if (ub != tq->bits()) uniform = false;
          side.push_back(packed::GroupSpec{ch, tq->bits()});
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

}  // namespace ratekv::engine
