// PackedKVCache storage (include/ratekv/cache/packed_kv_cache.h, docs/design.md
// §6): the layers' layouts and groups from the plan's codecs, append (sink,
// fp16 window, quantization of the tokens leaving the window into the scalar,
// extension and vq pages) and the byte accounting. Attention from the codes:
// packed_attention.cpp.
#include "ratekv/cache/packed_kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <omp.h>

#include "packed_attention_kernels.h"
#include "ratekv/cache/vq_page_codec.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/common/parallel_errors.h"
#include "ratekv/quant/grouped_tq_mse.h"

namespace ratekv::cache {

using detail::kMaxWideBits;
using packed::kPageTokens;

// ---- construction ------------------------------------------------------------------

PackedKVCache::PackedKVCache(const KVCacheShape& shape, std::shared_ptr<const PlanCodecs> codecs,
                             PackedCacheOptions opt)
    : shape_(shape), codecs_(std::move(codecs)), opt_(opt) {
  check(codecs_ != nullptr, "PackedKVCache: no plan codecs");
  shape.validate("PackedKVCache");
  const ModelConfig& c = codecs_->config();
  check(shape.n_layers == c.n_layers && shape.n_kv_heads == c.n_kv_heads && shape.head_dim == c.head_dim,
        "PackedKVCache: cache shape (layers {}, KV heads {}, head_dim {}) does not match the plan's model "
        "(layers {}, KV heads {}, head_dim {})",
        shape.n_layers, shape.n_kv_heads, shape.head_dim, c.n_layers, c.n_kv_heads, c.head_dim);
  window_ = opt_.fp16_window.value_or(codecs_->plan().fp16_window);
  sink_ = opt_.sink_tokens.value_or(codecs_->plan().sink_tokens);
  check(window_ >= 0 && sink_ >= 0, "PackedKVCache: fp16 window {} and sink tokens {} must be ≥ 0", window_, sink_);
  check(opt_.pages_per_split >= 1, "PackedKVCache: pages_per_split {} must be ≥ 1", opt_.pages_per_split);

  const int Hkv = shape.n_kv_heads, d = shape.head_dim;
  layers_.reserve(shape.n_layers);
  for (int l = 0; l < shape.n_layers; ++l) {
    std::vector<packed::HeadSpec> specs(Hkv), ext_specs(Hkv);
    std::vector<Head> heads(Hkv);
    bool any_wide = false;
    // vq and fp16 sides: the layer's vq pages (docs/packed_format.md §7), one
    // kind per layer side.
    std::array<packed::VqSideSpec, 2> vq_spec{};
    std::array<std::vector<const VqCodec*>, 2> vq_heads;
    for (int s = 0; s < 2; ++s) {
      const auto side_codec = [&](int h) -> const Codec& {
        return s == 0 ? codecs_->plan().layers[l][h].key : codecs_->plan().layers[l][h].value;
      };
      int n_fp16 = 0;
      for (int h = 0; h < Hkv; ++h) n_fp16 += side_codec(h).kind == CodecKind::FP16;
      check(n_fp16 == 0 || n_fp16 == Hkv,
            "PackedKVCache: plan: layers[{}]: {} of {} KV heads' {} codecs are fp16; the packed cache stores a "
            "layer side as fp16 only when every KV head's codec is fp16",
            l, n_fp16, Hkv, s == 0 ? "key" : "value");
      if (n_fp16 == Hkv) vq_spec[s].kind = packed::VqSideKind::fp16;
      if (codecs_->layer_is_vq(l, static_cast<KVSide>(s))) {  // PlanCodecs: then every head is vq
        for (int h = 0; h < Hkv; ++h) vq_heads[s].push_back(codecs_->vq(l, h, static_cast<KVSide>(s)));
        const VqCodec& c0 = *vq_heads[s][0];
        for (int h = 1; h < Hkv; ++h)
          check(vq_heads[s][h]->n_groups() == c0.n_groups() && vq_heads[s][h]->n_centroids() == c0.n_centroids(),
                "PackedKVCache: plan: layers[{}].heads[{}].{}: {} groups of 2^k = {} centroids, head 0 has {} of {}; "
                "the packed vq pages need the same groups and width on every KV head of a layer side",
                l, h, s == 0 ? "key" : "value", vq_heads[s][h]->n_groups(), vq_heads[s][h]->n_centroids(),
                c0.n_groups(), c0.n_centroids());
        int bits = 0;
        while ((1 << bits) < c0.n_centroids()) ++bits;
        vq_spec[s] = packed::VqSideSpec{packed::VqSideKind::vq, c0.n_groups(), bits, c0.shared_scale()};
      }
    }
    for (int h = 0; h < Hkv; ++h)
      for (int s = 0; s < 2; ++s) {
        const Codec& codec = s == 0 ? codecs_->plan().layers[l][h].key : codecs_->plan().layers[l][h].value;
        const std::string field = fmt::format("plan: layers[{}].heads[{}].{}", l, h, s == 0 ? "key" : "value");
        check(codec.offset.empty(),
              "PackedKVCache: {}: the codec has a key offset; the packed pages have no place for it (FakeQuantKVCache "
              "serves key offsets)", field);
        if (codec.kind == CodecKind::Vq || codec.kind == CodecKind::FP16) continue;  // vq pages
        check(codec.kind == CodecKind::TqMse || codec.kind == CodecKind::TqMseGrouped,
              "PackedKVCache: {}: codec kind '{}' has no packed storage (the packed cache serves tq-mse, "
              "tq-mse-grouped, vq and fp16 codecs; FakeQuantKVCache serves every kind)",
              field, codec_kind_name(codec.kind));
        const quant::Quantizer* q = codecs_->quantizer(l, h, static_cast<KVSide>(s));
        std::vector<std::pair<const quant::TQMSE*, std::vector<int>>> groups;
        if (const auto* tq = dynamic_cast<const quant::TQMSE*>(q)) {
          std::vector<int> all(d);
          for (int i = 0; i < d; ++i) all[i] = i;
          if (tq->bits() > 0) groups.emplace_back(tq, std::move(all));
        } else if (const auto* gq = dynamic_cast<const quant::GroupedTQMSE*>(q)) {
          for (size_t g = 0; g < gq->codecs().size(); ++g)
            if (gq->codecs()[g].bits() > 0) groups.emplace_back(&gq->codecs()[g], gq->config().groups[g].channels);
        } else {
          fail("PackedKVCache: {}: quantizer '{}' is not TQ-MSE", field, q ? quant::to_string(q->kind()) : "none");
        }
        // No groups (every channel at 0 bits): the side stores nothing.
        auto& spec_side = s == 0 ? specs[h].key : specs[h].value;
        auto& ext_side = s == 0 ? ext_specs[h].key : ext_specs[h].value;
        int off = 0;
        for (auto& [tq, ch] : groups) {
          check(tq->bits() >= packed::kMinBits && tq->bits() <= kMaxWideBits,
                "PackedKVCache: {}: {}-bit group; the packed cache stores {}..{} bits", field, tq->bits(),
                packed::kMinBits, kMaxWideBits);
          const bool wide = tq->bits() > packed::kMaxBits;
          spec_side.push_back(packed::GroupSpec{ch, std::min(tq->bits(), packed::kMaxBits)});
          if (wide) {
            ext_side.push_back(packed::GroupSpec{ch, tq->bits() - packed::kMaxBits});
            any_wide = true;
          }
          Group G;
          G.tq = tq;
          G.channels = ch;
          G.levels = tq->codebook().levels.data();
          G.bits = tq->bits();
          G.wide = wide;
          if (!wide)
            for (int j = 0; j < (1 << G.bits); ++j) G.lv16[j] = G.levels[j];
          G.dim = static_cast<int>(ch.size());
          G.rot_offset = off;
          off += G.dim;
          heads[h].side[s].push_back(std::move(G));
        }
        heads[h].rot_dim[s] = off;
      }
    packed::LayerLayout layout(d, std::move(specs));
    for (int h = 0; h < Hkv; ++h)
      for (int s = 0; s < 2; ++s)
        for (size_t g = 0; g < heads[h].side[s].size(); ++g) {
          const packed::GroupLayout& gl = layout.head(h).side(static_cast<packed::Side>(s))[g];
          Group& G = heads[h].side[s][g];
          G.dim_pad = gl.dim_pad;
          G.code_offset = layout.head(h).block_offset + gl.code_offset;
          G.norm_offset = layout.head(h).block_offset + gl.norm_offset;
        }
    Layer L{std::move(layout), std::move(heads), {}, {}, {}, 0, {}, {}, {}, {}, 0, {}, {}, {}, {}, {}, 0.0};
    if (vq_spec[0].kind != packed::VqSideKind::none || vq_spec[1].kind != packed::VqSideKind::none) {
      L.vq_layout.emplace(d, Hkv, vq_spec[0], vq_spec[1]);
      L.vq_heads = std::move(vq_heads);
    }
    L.rope_theta = c.layer_rope_theta(l);
    if (any_wide) {
      L.ext_layout.emplace(d, std::move(ext_specs));
      for (int h = 0; h < Hkv; ++h)
        for (int s = 0; s < 2; ++s) {
          size_t e = 0;  // index among this side's wide groups
          for (Group& G : L.heads[h].side[s]) {
            if (!G.wide) continue;
            G.ext = L.ext_layout->head(h).side(static_cast<packed::Side>(s))[e++];
            G.ext_code_offset = L.ext_layout->head(h).block_offset + G.ext.code_offset;
          }
        }
    }
    layers_.push_back(std::move(L));
  }
}

// ---- append --------------------------------------------------------------------------

// vq and fp16 sides of tokens [c0, c0 + n) (code slots) into the vq pages
// with the format's reference encoder/writer (packed_vq_format.h): the shared
// scales first, serially (an fp16 overflow throws), then the pages in
// parallel (tokens of one page may share bytes, pages never do).
void PackedKVCache::quantize_vq_rows(Layer& L, const float* k, const float* k_pre, const float* v, int64_t c0,
                                     int64_t n) {
  const packed::VqLayerLayout& VL = *L.vq_layout;
  const int Hkv = shape_.n_kv_heads, d = shape_.head_dim;
  const int64_t row = int64_t{Hkv} * d;
  for (int s = 0; s < 2; ++s) {
    const packed::Side side = static_cast<packed::Side>(s);
    const packed::VqSideKind kind = VL.side(side).kind;
    if (kind == packed::VqSideKind::none) continue;
    const float* src = s == 1 ? v : kind == packed::VqSideKind::vq ? k_pre : k;  // vq keys: pre-RoPE
    const auto& heads = L.vq_heads[s];
    std::vector<float> sc(n, 1.0f);
    if (kind == packed::VqSideKind::vq)
      for (int64_t t = 0; t < n; ++t) sc[t] = vq_token_scale(heads, src + t * row);
    const int64_t p0 = c0 / kPageTokens, p1 = (c0 + n - 1) / kPageTokens + 1;
    FirstError err;
#pragma omp parallel for schedule(static) if (p1 - p0 > 1 && n * row >= 4096)
    for (int64_t pg = p0; pg < p1; ++pg) err.run([&] {
      std::span<uint8_t> page(L.vq_pages[pg]);
      std::vector<uint16_t> h16(d);
      for (int64_t c = std::max(c0, pg * kPageTokens); c < std::min(c0 + n, (pg + 1) * kPageTokens); ++c) {
        const int64_t t = c - c0;
        const int slot = static_cast<int>(c % kPageTokens);
        if (kind == packed::VqSideKind::vq) {
          encode_vq_token(VL, page, side, slot, heads, src + t * row, sc[t]);
        } else {
          for (int h = 0; h < Hkv; ++h) {
            for (int i = 0; i < d; ++i) h16[i] = fp32_to_fp16(src[t * row + int64_t{h} * d + i]);
            packed::write_fp16_row(VL, page, h, side, slot, h16);
          }
        }
      }
    });
    err.rethrow();
  }
}

void PackedKVCache::quantize_rows(Layer& L, int layer, const float* k, const float* k_pre, const float* v,
                                  int64_t n) {
  (void)layer;
  const int Hkv = shape_.n_kv_heads, d = shape_.head_dim;
  const int64_t row = int64_t{Hkv} * d;
  const size_t page_bytes = L.layout.page_bytes();
  const int64_t c0 = L.n_codes, c1 = c0 + n;
  while (static_cast<int64_t>(L.pages.size()) * kPageTokens < c1) {
    L.pages.emplace_back(page_bytes, uint8_t{0});  // 0 bytes (no allocation) when every side is vq / fp16
    if (L.ext_layout) L.ext_pages.emplace_back(L.ext_layout->page_bytes(), uint8_t{0});
    if (L.vq_layout) L.vq_pages.emplace_back(L.vq_layout->page_bytes(), uint8_t{0});
  }
  if (L.vq_layout) quantize_vq_rows(L, k, k_pre, v, c0, n);
  // An fp16 overflow of a norm throws inside the loop: carried out of the region (FirstError).
  FirstError err;
#pragma omp parallel for schedule(static) if (Hkv > 1 && n * d >= 4096)
  for (int h = 0; h < Hkv; ++h) err.run([&] {
    std::vector<float> xg(d);
    std::vector<uint8_t> idx(d), hi(d);
    for (int s = 0; s < 2; ++s) {
      const float* src = s == 0 ? k : v;
      for (size_t g = 0; g < L.heads[h].side[s].size(); ++g) {
        const Group& G = L.heads[h].side[s][g];
        const packed::GroupLayout& gl = L.layout.head(h).side(static_cast<packed::Side>(s))[g];
        for (int64_t t = 0; t < n; ++t) {
          const float* x = src + t * row + int64_t{h} * d;
          for (int i = 0; i < G.dim; ++i) xg[i] = x[G.channels[i]];
          const float norm = G.tq->encode(xg.data(), idx.data());
          const int64_t c = c0 + t;
          uint8_t* page = L.pages[c / kPageTokens].data();
          const int slot = static_cast<int>(c % kPageTokens);
          if (G.wide) {  // low nibble in the page, high bits in the extension page
            for (int i = 0; i < G.dim; ++i) {
              hi[i] = static_cast<uint8_t>(idx[i] >> 4);
              idx[i] &= 0x0F;
            }
            pack_token_codes(G.ext, static_cast<packed::Side>(s), L.ext_pages[c / kPageTokens].data() + G.ext_code_offset,
                             slot, hi.data());
          }
          pack_token_codes(gl, static_cast<packed::Side>(s), page + G.code_offset, slot, idx.data());
          const uint16_t hbits = fp32_to_fp16(norm);
          std::memcpy(page + G.norm_offset + 2 * static_cast<size_t>(slot), &hbits, 2);
        }
      }
    }
  });
  err.rethrow();
  L.n_codes = c1;
}

void PackedKVCache::check_append(int layer, int64_t n, const int32_t* pos, const float* k_post,
                                 const float* v) const {
  check(layer >= 0 && layer < shape_.n_layers, "PackedKVCache::append: layer {} out of range [0, {})", layer,
        shape_.n_layers);
  check(n > 0, "PackedKVCache::append: n = {} must be positive", n);
  const Layer& L = layers_[layer];
  const int64_t T0 = static_cast<int64_t>(L.pos.size()), T = T0 + n;
  check(T <= shape_.n_ctx, "PackedKVCache::append: layer {}: {} cached + {} new tokens exceed capacity n_ctx = {}",
        layer, T0, n, shape_.n_ctx);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t prev = (i == 0) ? (T0 > 0 ? L.pos.back() : -1) : pos[i - 1];
    check(pos[i] > prev, "PackedKVCache::append: layer {}: position {} is not greater than the previous {}", layer,
          pos[i], prev);
  }
  check_rows(L, layer, n, k_post, v);
}

void PackedKVCache::append(int layer, int64_t n, const int32_t* pos, const float* k_pre, const float* k_post,
                           const float* v) {
  check_append(layer, n, pos, k_post, v);
  Layer& L = layers_[layer];
  const int64_t T0 = static_cast<int64_t>(L.pos.size());
  // Strong guarantee: when quantizing fails (a norm or a vq scale that overflows fp16), the layer is left
  // as it was before the call — no positions without codes, no half-written window.
  const size_t n_sink = L.sink_k.size(), n_win_k = L.win_k.size(), n_win_kpre = L.win_kpre.size(),
               n_win_v = L.win_v.size(), n_pages = L.pages.size(), n_ext = L.ext_pages.size(),
               n_vq = L.vq_pages.size();
  const int64_t win_start = L.win_start, n_codes = L.n_codes;
  try {
    append_rows(L, layer, T0, n, pos, k_pre, k_post, v);
  } catch (...) {
    L.sink_k.resize(n_sink);
    L.sink_v.resize(n_sink);
    L.win_k.resize(n_win_k);
    L.win_kpre.resize(n_win_kpre);
    L.win_v.resize(n_win_v);
    L.pos.resize(static_cast<size_t>(T0));
    L.pages.resize(n_pages);
    L.ext_pages.resize(n_ext);
    L.vq_pages.resize(n_vq);
    L.win_start = win_start;
    L.n_codes = n_codes;  // code slots past n_codes are rewritten (not OR-ed) by the next append
    throw;
  }
}

void PackedKVCache::check_rows(const Layer& L, int layer, int64_t n, const float* k_post, const float* v) const {
  const int Hkv = shape_.n_kv_heads, d = shape_.head_dim;
  const int64_t row = int64_t{Hkv} * d;
  for (int s = 0; s < 2; ++s) {
    const char* side = s == 0 ? "key" : "value";
    const float* src = s == 0 ? k_post : v;
    for (int64_t i = 0; i < n * row; ++i)
      check(std::isfinite(src[i]), "PackedKVCache::append: layer {}: {} of token {}, KV head {}, channel {} is {} "
            "(K/V must be finite)", layer, side, i / row, (i % row) / d, i % d, src[i]);
    for (int h = 0; h < Hkv; ++h)
      for (size_t g = 0; g < L.heads[h].side[s].size(); ++g) {
        const Group& G = L.heads[h].side[s][g];
        if (G.bits == 0) continue;  // stores nothing
        for (int64_t t = 0; t < n; ++t) {
          const float* x = src + t * row + int64_t{h} * d;
          double acc = 0.0;
          for (int c : G.channels) acc += double{x[c]} * x[c];
          const float norm = static_cast<float>(std::sqrt(acc));
          check(std::isfinite(fp16_to_fp32(fp32_to_fp16(norm))),
                "PackedKVCache::append: layer {}: {} of token {}, KV head {}: channel group {} has norm {}, beyond "
                "the fp16 norm the packed format stores (at most 65504)", layer, side, t, h, g, norm);
        }
      }
  }
}

void PackedKVCache::append_rows(Layer& L, int layer, int64_t T0, int64_t n, const int32_t* pos, const float* k_pre,
                                const float* k_post, const float* v) {
  const int64_t T = T0 + n;
  const int64_t row = int64_t{shape_.n_kv_heads} * shape_.head_dim;
  int64_t t = T0;
  // Sink rows: fp16 forever.
  for (; t < T && t < sink_; ++t)
    for (int64_t i = 0; i < row; ++i) {
      L.sink_k.push_back(fp32_to_fp16(k_post[(t - T0) * row + i]));
      L.sink_v.push_back(fp32_to_fp16(v[(t - T0) * row + i]));
    }
  const bool keep_pre = vq_side(L, 0) && L.vq_layout->side(packed::Side::key).kind == packed::VqSideKind::vq;
  check(!keep_pre || k_pre != nullptr, "PackedKVCache::append: layer {}: vq keys need the pre-RoPE keys (k_pre)",
        layer);
  if (L.win_k.empty()) L.win_start = t;  // every earlier token is sink or codes
  L.win_k.insert(L.win_k.end(), k_post + (t - T0) * row, k_post + n * row);
  if (keep_pre) L.win_kpre.insert(L.win_kpre.end(), k_pre + (t - T0) * row, k_pre + n * row);
  L.win_v.insert(L.win_v.end(), v + (t - T0) * row, v + n * row);
  L.pos.insert(L.pos.end(), pos, pos + n);
  // Tokens that left the window (or never entered it, W = 0): quantize them.
  const int64_t q_end = std::max<int64_t>(std::min<int64_t>(sink_, T), T - window_);
  if (q_end > L.win_start) {
    const int64_t m = q_end - L.win_start;
    quantize_rows(L, layer, L.win_k.data(), keep_pre ? L.win_kpre.data() : nullptr, L.win_v.data(), m);
    L.win_k.erase(L.win_k.begin(), L.win_k.begin() + m * row);
    if (keep_pre) L.win_kpre.erase(L.win_kpre.begin(), L.win_kpre.begin() + m * row);
    L.win_v.erase(L.win_v.begin(), L.win_v.begin() + m * row);
    L.win_start = q_end;
  }
}

// ---- bookkeeping ---------------------------------------------------------------------

int64_t PackedKVCache::n_tokens() const { return static_cast<int64_t>(layers_[0].pos.size()); }

void PackedKVCache::clear() {
  for (Layer& L : layers_) {
    L.pages.clear();
    L.ext_pages.clear();
    L.vq_pages.clear();
    L.win_kpre.clear();
    L.n_codes = 0;
    L.sink_k.clear();
    L.sink_v.clear();
    L.win_k.clear();
    L.win_v.clear();
    L.win_start = 0;
    L.pos.clear();
  }
}

size_t PackedKVCache::page_bytes() const {
  size_t b = 0;
  for (const Layer& L : layers_) {
    b += L.pages.size() * L.layout.page_bytes();
    if (L.ext_layout) b += L.ext_pages.size() * L.ext_layout->page_bytes();
    if (L.vq_layout) b += L.vq_pages.size() * L.vq_layout->page_bytes();
  }
  return b;
}

size_t PackedKVCache::bytes() const {
  size_t b = page_bytes();
  for (const Layer& L : layers_)
    b += (L.sink_k.size() + L.sink_v.size()) * sizeof(uint16_t) +
         (L.win_k.size() + L.win_kpre.size() + L.win_v.size()) * sizeof(float) +
         L.pos.size() * sizeof(int32_t);
  return b;
}

std::span<const uint8_t> PackedKVCache::page(int layer, int i) const {
  const Layer& L = layers_.at(layer);
  check(i >= 0 && i < static_cast<int>(L.pages.size()), "PackedKVCache::page: page {} outside [0, {})", i,
        L.pages.size());
  return {L.pages[i].data(), L.layout.page_bytes()};
}

const packed::LayerLayout* PackedKVCache::ext_layout(int layer) const {
  const Layer& L = layers_.at(layer);
  return L.ext_layout ? &*L.ext_layout : nullptr;
}

std::span<const uint8_t> PackedKVCache::ext_page(int layer, int i) const {
  const Layer& L = layers_.at(layer);
  check(L.ext_layout.has_value(), "PackedKVCache::ext_page: layer {} has no 5..8-bit groups", layer);
  check(i >= 0 && i < static_cast<int>(L.ext_pages.size()), "PackedKVCache::ext_page: page {} outside [0, {})", i,
        L.ext_pages.size());
  return {L.ext_pages[i].data(), L.ext_layout->page_bytes()};
}

}  // namespace ratekv::cache

namespace ratekv::cache {

const packed::VqLayerLayout* PackedKVCache::vq_layout(int layer) const {
  const Layer& L = layers_.at(layer);
  return L.vq_layout ? &*L.vq_layout : nullptr;
}

std::span<const uint8_t> PackedKVCache::vq_page(int layer, int i) const {
  const Layer& L = layers_.at(layer);
  check(L.vq_layout.has_value(), "PackedKVCache::vq_page: layer {} has no vq or fp16 sides", layer);
  check(i >= 0 && i < static_cast<int>(L.vq_pages.size()), "PackedKVCache::vq_page: page {} outside [0, {})", i,
        L.vq_pages.size());
  return {L.vq_pages[i].data(), L.vq_layout->page_bytes()};
}

}  // namespace ratekv::cache
