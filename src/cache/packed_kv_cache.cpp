// PackedKVCache: codes in the packed format, attention from the codes
// (include/ratekv/cache/packed_kv_cache.h, docs/design.md §6).
#include "ratekv/cache/packed_kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <omp.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RATEKV_PACKED_FAST 1
#endif

#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/cache/vq_page_codec.h"
#include "ratekv/quant/grouped_tq_mse.h"

namespace ratekv::cache {

using packed::kPageTokens;
using packed::kTileChannels;
using packed::kTileTokens;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Query rows per KV head up to which keys are scored with the per-step table
// (decode); above it, per-page levels tiles and axpy loops (prefill).
constexpr int64_t kLutMaxRows = 8;
// Queries per prefill work item.
constexpr int64_t kQueryBlock = 32;
// Widest group the cache stores (5..8 bits: low nibble + extension pages).
constexpr int kMaxWideBits = 8;

// (token r, channel c) of every (lane, bit) of a chunk, per side.
struct InverseTable {
  uint8_t r[2][packed::kWarpLanes][8];
  uint8_t c[2][packed::kWarpLanes][8];
  InverseTable() {
    for (int s = 0; s < 2; ++s)
      for (int r0 = 0; r0 < kTileTokens; ++r0)
        for (int c0 = 0; c0 < kTileChannels; ++c0) {
          const packed::ElementPos e = packed::element_pos(static_cast<packed::Side>(s), r0, c0);
          r[s][e.lane][e.elem] = static_cast<uint8_t>(r0);
          c[s][e.lane][e.elem] = static_cast<uint8_t>(c0);
        }
  }
};
const InverseTable& inverse_table() {
  static const InverseTable t;
  return t;
}

// Token index range [lo, hi) visible to a query at position p (positions
// strictly increasing): as DenseKVCache.
void key_range(const std::vector<int32_t>& kpos, int32_t p, int64_t window, int64_t& lo, int64_t& hi) {
  hi = std::upper_bound(kpos.begin(), kpos.end(), p) - kpos.begin();
  lo = 0;
  if (window > 0) {
    const int64_t first = static_cast<int64_t>(p) - window + 1;
    lo = std::lower_bound(kpos.begin(), kpos.end(), first, [](int32_t a, int64_t b) { return a < b; }) -
         kpos.begin();
  }
}

inline float logit(float dot, const AttnParams& p) {
  float x = dot * p.scale;
  if (p.softcap > 0) x = p.softcap * std::tanh(x / p.softcap);
  return x;
}

inline float norm_at(const uint8_t* page, size_t norm_offset, int slot) {
  uint16_t h;
  std::memcpy(&h, page + norm_offset + 2 * static_cast<size_t>(slot), 2);  // little endian (x86/arm64)
  return fp16_to_fp32(h);
}

}  // namespace

void merge_partial(AttnPartial& a, float* o_a, const AttnPartial& b, const float* o_b, int len) {
  if (b.m == kNegInf) return;
  if (a.m == kNegInf) {
    a = b;
    std::memcpy(o_a, o_b, sizeof(float) * len);
    return;
  }
  const float m = std::max(a.m, b.m);
  const float fa = std::exp(a.m - m), fb = std::exp(b.m - m);
  for (int i = 0; i < len; ++i) o_a[i] = o_a[i] * fa + o_b[i] * fb;
  a.l = a.l * fa + b.l * fb;
  a.m = m;
}

// ---- format fast paths ---------------------------------------------------------

// One read-modify-write of one lane word per code (two more for the 3-bit
// tile-3 bits): the code's bits sit in nibble e of word code_bit_pos(b, tt, e,
// 0).word, contiguous from bit code_bit_pos(b, tt, e, 0).bit, except 3 bits in
// token tile 3 (bit 3 of nibble e of words 0, 1, 2). Same bytes as the
// reference write_codes (test FastPackUnpackMatchReference).
void pack_token_codes(const packed::GroupLayout& G, packed::Side side, uint8_t* seg, int slot,
                      const uint8_t* codes) {
  const int tt = slot / kTileTokens, r = slot % kTileTokens, b = G.bits;
  const uint32_t low = (1u << b) - 1u;
  auto rmw = [&](size_t byte, uint32_t mask, uint32_t bits) {
    uint32_t w;
    std::memcpy(&w, seg + byte, 4);
    w = (w & ~mask) | bits;
    std::memcpy(seg + byte, &w, 4);
  };
  for (int c = 0; c < G.dim_pad; ++c) {
    const uint32_t code = c < G.dim ? codes[c] : 0u;
    const int ct = c / kTileChannels;
    const packed::ElementPos e = packed::element_pos(side, r, c % kTileChannels);
    const size_t row0 = static_cast<size_t>(ct) * b;  // first lane-word row of this channel tile
    if (b != 3 || tt < 3) {
      const packed::CodeBitPos p = packed::code_bit_pos(b, tt, e.elem, 0);
      rmw((row0 + p.word) * packed::kLaneRowBytes + 4 * e.lane, low << p.bit, code << p.bit);
    } else {
      for (int i = 0; i < 3; ++i) {
        const packed::CodeBitPos p = packed::code_bit_pos(b, tt, e.elem, i);
        rmw((row0 + p.word) * packed::kLaneRowBytes + 4 * e.lane, 1u << p.bit, ((code >> i) & 1u) << p.bit);
      }
    }
  }
}

namespace {

// The b-bit code of fragment element e of token tile tt from a lane's b words.
// Wherever the format keeps a code's bits contiguous in one word (every case
// but 3-bit token tile 3) one shift and mask; else bit by bit.
template <int B>
inline unsigned extract_code(const uint32_t* w, int tt, int e) {
  const packed::CodeBitPos p0 = packed::code_bit_pos(B, tt, e, 0);
  if (B != 3 || tt < 3) return (w[p0.word] >> p0.bit) & ((1u << B) - 1u);
  unsigned code = 0;
  for (int i = 0; i < B; ++i) {
    const packed::CodeBitPos p = packed::code_bit_pos(B, tt, e, i);
    code |= ((w[p.word] >> p.bit) & 1u) << i;
  }
  return code;
}

template <int B>
void unpack_codes_b(const packed::GroupLayout& G, int s, const uint8_t* seg, int n_tt, uint8_t* codes) {
  const InverseTable& inv = inverse_table();
  const int n_ct = G.dim_pad / kTileChannels;
  for (int ct = 0; ct < n_ct; ++ct)
    for (int lane = 0; lane < packed::kWarpLanes; ++lane) {
      uint32_t w[B];
      for (int j = 0; j < B; ++j)
        std::memcpy(&w[j], seg + (static_cast<size_t>(ct) * B + j) * packed::kLaneRowBytes + 4 * lane, 4);
      for (int tt = 0; tt < n_tt; ++tt) {
        uint8_t* tile = codes + static_cast<size_t>(tt) * kTileTokens * G.dim_pad + ct * kTileChannels;
        for (int e = 0; e < 8; ++e)
          tile[inv.r[s][lane][e] * G.dim_pad + inv.c[s][lane][e]] = static_cast<uint8_t>(extract_code<B>(w, tt, e));
      }
    }
}

}  // namespace

void unpack_codes(const packed::GroupLayout& G, packed::Side side, const uint8_t* seg, int n_slots,
                  uint8_t* codes) {
  const int s = static_cast<int>(side);
  const int n_tt = (n_slots + kTileTokens - 1) / kTileTokens;
  switch (G.bits) {
    case 1: return unpack_codes_b<1>(G, s, seg, n_tt, codes);
    case 2: return unpack_codes_b<2>(G, s, seg, n_tt, codes);
    case 3: return unpack_codes_b<3>(G, s, seg, n_tt, codes);
    case 4: return unpack_codes_b<4>(G, s, seg, n_tt, codes);
    default: fail("unpack_codes: {} bits outside 1..4", G.bits);
  }
}

// ---- decode fast path (AVX2): nibble words, tile rows, codebook permutes ------------

namespace {

#ifdef RATEKV_PACKED_FAST
constexpr bool kHaveFast = true;
#else
constexpr bool kHaveFast = false;
#endif

// Column of natural-order position k (0..15) of a tile row read by tile_row():
// k = 4j + n takes nibble n of the 16-bit half of lane word j; by element_pos
// that is column 2j + n mod 2 + 8·⌊n/2⌋.
constexpr int nat_col(int k) { return 2 * (k >> 2) + (k & 1) + 8 * ((k >> 1) & 1); }

#ifdef RATEKV_PACKED_FAST
// Nibble words of token tiles [tt0, tt1) of channel tile ct of a b-bit code
// segment: nw[tt·32 + lane] has the code of fragment element e in nibble e
// (code_bit_pos(): one shift and mask per word; 3 bits, tile 3: bit 3 of the
// nibbles of words 0, 1, 2).
template <int B>
void nibble_words_b(const uint8_t* seg, int ct, int tt0, int tt1, uint32_t* nw) {
  uint32_t w[B][packed::kWarpLanes];
  std::memcpy(w, seg + static_cast<size_t>(ct) * B * packed::kLaneRowBytes, sizeof(w));
  for (int tt = tt0; tt < tt1; ++tt) {
    uint32_t* o = nw + tt * packed::kWarpLanes;
    for (int L = 0; L < packed::kWarpLanes; ++L) {
      if constexpr (B == 3) {
        o[L] = tt < 3 ? (w[tt][L] & 0x77777777u)
                      : (((w[0][L] >> 3) & 0x11111111u) | ((w[1][L] >> 2) & 0x22222222u) |
                         ((w[2][L] >> 1) & 0x44444444u));
      } else {
        constexpr uint32_t mask = B == 1 ? 0x11111111u : B == 2 ? 0x33333333u : 0xFFFFFFFFu;
        const int q = tt * B;
        o[L] = (w[q / 4][L] >> (q % 4)) & mask;
      }
    }
  }
}

void nibble_words(int bits, const uint8_t* seg, int ct, int tt0, int tt1, uint32_t* nw) {
  switch (bits) {
    case 1: return nibble_words_b<1>(seg, ct, tt0, tt1, nw);
    case 2: return nibble_words_b<2>(seg, ct, tt0, tt1, nw);
    case 3: return nibble_words_b<3>(seg, ct, tt0, tt1, nw);
    default: return nibble_words_b<4>(seg, ct, tt0, tt1, nw);
  }
}

// Row x (0..15) of a 16×16 tile as 16 nibbles in natural order: the 16-bit
// half ⌊x/8⌋ of the nibble words of lanes 4(x mod 8) .. 4(x mod 8) + 3
// (element_pos: keys row = token, values row = channel).
inline uint64_t tile_row(const uint32_t* nw, int x) {
  const uint32_t* p = nw + 4 * (x & 7);
  const int sh = 16 * (x >> 3);
  return static_cast<uint64_t>((p[0] >> sh) & 0xFFFFu) | (static_cast<uint64_t>((p[1] >> sh) & 0xFFFFu) << 16) |
         (static_cast<uint64_t>((p[2] >> sh) & 0xFFFFu) << 32) | (static_cast<uint64_t>((p[3] >> sh) & 0xFFFFu) << 48);
}

struct LevelRegs {
  __m256 lo, hi;
  bool two;  // 16 levels: blend lo/hi on bit 3 of the code
};

// The 16 codebook levels of a natural-order row: a = positions 0..7, b = 8..15.
inline void decode16(uint64_t x, const LevelRegs& t, __m256& a, __m256& b) {
  const __m128i v = _mm_cvtsi64_si128(static_cast<long long>(x));
  const __m128i m = _mm_set1_epi8(0x0F);
  const __m128i bytes = _mm_unpacklo_epi8(_mm_and_si128(v, m), _mm_and_si128(_mm_srli_epi16(v, 4), m));
  const __m256i i0 = _mm256_cvtepu8_epi32(bytes), i1 = _mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8));
  a = _mm256_permutevar8x32_ps(t.lo, i0);
  b = _mm256_permutevar8x32_ps(t.lo, i1);
  if (t.two) {
    a = _mm256_blendv_ps(a, _mm256_permutevar8x32_ps(t.hi, i0), _mm256_castsi256_ps(_mm256_slli_epi32(i0, 28)));
    b = _mm256_blendv_ps(b, _mm256_permutevar8x32_ps(t.hi, i1), _mm256_castsi256_ps(_mm256_slli_epi32(i1, 28)));
  }
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

}  // namespace

// ---- construction ------------------------------------------------------------------

PackedKVCache::PackedKVCache(const KVCacheShape& shape, std::shared_ptr<const PlanCodecs> codecs,
                             PackedCacheOptions opt)
    : shape_(shape), codecs_(std::move(codecs)), opt_(opt) {
  check(codecs_ != nullptr, "PackedKVCache: no plan codecs");
  check(shape.n_layers > 0 && shape.n_heads > 0 && shape.n_kv_heads > 0 && shape.head_dim > 0 && shape.n_ctx > 0,
        "PackedKVCache: shape must be positive (n_layers {}, n_heads {}, n_kv_heads {}, head_dim {}, n_ctx {})",
        shape.n_layers, shape.n_heads, shape.n_kv_heads, shape.head_dim, shape.n_ctx);
  check(shape.n_heads % shape.n_kv_heads == 0, "PackedKVCache: n_kv_heads {} must divide n_heads {}",
        shape.n_kv_heads, shape.n_heads);
  check(shape.n_ctx <= std::numeric_limits<int32_t>::max(), "PackedKVCache: n_ctx {} exceeds int32 positions",
        shape.n_ctx);
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
        if (codec.kind == CodecKind::Vq || codec.kind == CodecKind::FP16) continue;  // vq pages
        check(codec.kind == CodecKind::TqMse || codec.kind == CodecKind::TqMseGrouped,
              "PackedKVCache: {}: codec kind '{}' has no packed storage (the packed cache serves tq-mse, "
              "tq-mse-grouped, vq and fp16 codecs; use --cache fake for other kinds)",
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
#pragma omp parallel for schedule(static) if (p1 - p0 > 1 && n * row >= 4096)
    for (int64_t pg = p0; pg < p1; ++pg) {
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
    }
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
#pragma omp parallel for schedule(static) if (Hkv > 1 && n * d >= 4096)
  for (int h = 0; h < Hkv; ++h) {
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
  }
  L.n_codes = c1;
}

void PackedKVCache::append(int layer, int64_t n, const int32_t* pos, const float* k_pre, const float* k_post,
                           const float* v) {
  check(layer >= 0 && layer < shape_.n_layers, "PackedKVCache::append: layer {} out of range [0, {})", layer,
        shape_.n_layers);
  check(n > 0, "PackedKVCache::append: n = {} must be positive", n);
  Layer& L = layers_[layer];
  const int64_t T0 = static_cast<int64_t>(L.pos.size()), T = T0 + n;
  check(T <= shape_.n_ctx, "PackedKVCache::append: layer {}: {} cached + {} new tokens exceed capacity n_ctx = {}",
        layer, T0, n, shape_.n_ctx);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t prev = (i == 0) ? (T0 > 0 ? L.pos.back() : -1) : pos[i - 1];
    check(pos[i] > prev, "PackedKVCache::append: layer {}: position {} is not greater than the previous {}", layer,
          pos[i], prev);
  }
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

// ---- attention -----------------------------------------------------------------------

void PackedKVCache::unpack_group(const Layer& L, int hk, int s, size_t g, int64_t pg, int n_slots, uint8_t* codes,
                                 uint8_t* tmp) const {
  const Group& G = L.heads[hk].side[s][g];
  const packed::Side side = static_cast<packed::Side>(s);
  unpack_codes(L.layout.head(hk).side(side)[g], side, L.pages[pg].data() + G.code_offset, n_slots, codes);
  if (!G.wide) return;
  unpack_codes(G.ext, side, L.ext_pages[pg].data() + G.ext_code_offset, n_slots, tmp);
  const size_t n = static_cast<size_t>((n_slots + kTileTokens - 1) / kTileTokens) * kTileTokens * G.dim_pad;
  for (size_t i = 0; i < n; ++i) codes[i] = static_cast<uint8_t>(codes[i] | (tmp[i] << 4));
}

// Attention of R query rows of KV head hk over tokens [a, b) ∩ each row's
// [lo, hi): online softmax per page, partial state (m, l, o_rot, o_plain).
//   q_orig (R, d) post-RoPE queries, q_rot (R, Dk) rotated per key group,
//   o_rot (R, Dv) value accumulator in the value groups' rotated domains,
//   o_plain (R, d) accumulator of the fp16 sink/window rows.
void PackedKVCache::attend_rows(const Layer& L, int hk, int64_t R, const float* q_orig, const float* q_rot,
                                const int64_t* lo, const int64_t* hi, int64_t a, int64_t b, const AttnParams& p,
                                float* m, float* l, float* o_rot, float* o_plain) const {
  const int d = shape_.head_dim, Hkv = shape_.n_kv_heads;
  const int64_t row = int64_t{Hkv} * d;
  const Head& H = L.heads[hk];
  const int Dk = H.rot_dim[0], Dv = H.rot_dim[1];
  std::fill(m, m + R, kNegInf);
  std::fill(l, l + R, 0.0f);
  std::fill(o_rot, o_rot + R * Dv, 0.0f);
  std::fill(o_plain, o_plain + R * d, 0.0f);

  const int64_t T = static_cast<int64_t>(L.pos.size());
  const int64_t s_end = std::min<int64_t>(sink_, T);
  const int64_t q_end = s_end + L.n_codes;

  // Rescales row r's state to the new max mx (≥ m[r]).
  auto rescale = [&](int64_t r, float mx) {
    if (mx == m[r]) return;
    const float alpha = m[r] == kNegInf ? 0.0f : std::exp(m[r] - mx);
    l[r] *= alpha;
    for (int i = 0; i < Dv; ++i) o_rot[r * Dv + i] *= alpha;
    for (int i = 0; i < d; ++i) o_plain[r * d + i] *= alpha;
    m[r] = mx;
  };

  // fp16 rows (sink and window), one token at a time.
  std::vector<float> kr(d), vr(d);
  auto plain_token = [&](int64_t t) {
    if (t < s_end) {
      for (int i = 0; i < d; ++i) {
        kr[i] = fp16_to_fp32(L.sink_k[t * row + int64_t{hk} * d + i]);
        vr[i] = fp16_to_fp32(L.sink_v[t * row + int64_t{hk} * d + i]);
      }
    } else {
      const int64_t w = t - L.win_start;
      for (int i = 0; i < d; ++i) {
        kr[i] = round_fp16(L.win_k[w * row + int64_t{hk} * d + i]);
        vr[i] = round_fp16(L.win_v[w * row + int64_t{hk} * d + i]);
      }
    }
    for (int64_t r = 0; r < R; ++r) {
      if (t < lo[r] || t >= hi[r]) continue;
      float dot = 0;
      for (int i = 0; i < d; ++i) dot += q_orig[r * d + i] * kr[i];
      const float s = logit(dot, p);
      if (s > m[r]) rescale(r, s);
      const float e = std::exp(s - m[r]);
      l[r] += e;
      for (int i = 0; i < d; ++i) o_plain[r * d + i] += e * vr[i];
    }
  };
  for (int64_t t = a; t < std::min(b, s_end); ++t) plain_token(t);

  // Code tokens [ca, cb) as code slots.
  const int64_t ca = std::max(a, s_end) - s_end, cb = std::min(b, q_end) - s_end;
  if (cb > ca) {
    const bool lut = R <= kLutMaxRows;
    // Per-step tables tab[r][g][i·2^b + j] = q_rot[r][i]·c[j] (decode path).
    std::vector<std::vector<float>> tabs;
    if (lut) {
      tabs.resize(R * H.side[0].size());
      for (int64_t r = 0; r < R; ++r)
        for (size_t g = 0; g < H.side[0].size(); ++g) {
          const Group& G = H.side[0][g];
          const int nl = 1 << G.bits;
          auto& tab = tabs[r * H.side[0].size() + g];
          tab.resize(static_cast<size_t>(G.dim) * nl);
          const float* qr = q_rot + r * Dk + G.rot_offset;
          for (int i = 0; i < G.dim; ++i)
            for (int j = 0; j < nl; ++j) tab[i * nl + j] = qr[i] * G.levels[j];
        }
    }
    int max_pad = 0;
    for (int s = 0; s < 2; ++s)
      for (const Group& G : H.side[s]) max_pad = std::max(max_pad, G.dim_pad);
    std::vector<uint8_t> codes(static_cast<size_t>(kPageTokens) * max_pad), codes_hi(codes.size());
    // Fast path (decode rows, groups ≤ 4 bits): the rotated queries in each
    // key group's natural tile order, qn[r][nat_offset + ct·16 + k] =
    // q_rot[r][ct·16 + nat_col(k)] (0 for padded coordinates).
    const bool fast_ok = lut && kHaveFast && !opt_.reference_attention;
    std::vector<int> nat_off(H.side[0].size() + 1, 0);
    for (size_t g = 0; g < H.side[0].size(); ++g) nat_off[g + 1] = nat_off[g] + H.side[0][g].dim_pad;
    std::vector<float> qn, pwn;
    std::vector<uint32_t> nw;
    if (fast_ok) {
      qn.assign(static_cast<size_t>(R) * nat_off.back(), 0.0f);
      for (int64_t r = 0; r < R; ++r)
        for (size_t g = 0; g < H.side[0].size(); ++g) {
          const Group& G = H.side[0][g];
          for (int i = 0; i < G.dim_pad; ++i) {
            const int c = (i & ~15) + nat_col(i & 15);
            if (c < G.dim) qn[r * nat_off.back() + nat_off[g] + i] = q_rot[r * Dk + G.rot_offset + c];
          }
        }
      pwn.resize(static_cast<size_t>(R) * kPageTokens);
      nw.resize(static_cast<size_t>(max_pad / kTileChannels) * packed::kTilesPerPage * packed::kWarpLanes);
    }
    std::vector<float> tile(static_cast<size_t>(kPageTokens) * max_pad);
    std::vector<float> S(static_cast<size_t>(R) * kPageTokens);
    std::vector<float> nrm(kPageTokens);
    // vq / fp16 sides (docs/packed_format.md §7): one row of KV head hk at a
    // time, through the format's reference reader and the codec's decoder;
    // vq keys are pre-RoPE and get RoPE at their position with the layer's base.
    const packed::VqLayerLayout* VL = L.vq_layout ? &*L.vq_layout : nullptr;
    std::vector<int32_t> vz(VL ? static_cast<size_t>(d) : 0);
    std::vector<uint16_t> h16(d);
    std::vector<float> rc(d / 2), rs(d / 2), xrow(d);
    const RopeLayout rope_layout = codecs_->config().rope_layout;
    auto vq_row = [&](int s, int64_t pg, int slot, int64_t t, float* x) {
      const packed::Side side = static_cast<packed::Side>(s);
      const packed::VqSideSpec& sp = VL->side(side);
      const std::span<const uint8_t> page(L.vq_pages[pg]);
      if (sp.kind == packed::VqSideKind::fp16) {
        packed::read_fp16_row(*VL, page, hk, side, slot, h16);
        for (int i = 0; i < d; ++i) x[i] = fp16_to_fp32(h16[i]);
        return;
      }
      const float sc = sp.shared_scale ? fp16_to_fp32(packed::read_vq_scale(*VL, page, side, slot)) : 1.0f;
      packed::read_vq_indices(*VL, page, hk, side, slot, std::span<int32_t>(vz.data(), sp.n_groups));
      L.vq_heads[s][hk]->decode(vz.data(), sc, x);
      if (s == 0) {
        rope_angles(L.pos[t], d, L.rope_theta, rc.data(), rs.data());
        apply_rope(x, 1, d, rope_layout, rc.data(), rs.data());
      }
    };

    for (int64_t pg = ca / kPageTokens; pg * kPageTokens < cb; ++pg) {
      const uint8_t* page = L.pages[pg].data();
      const int u0 = static_cast<int>(std::max<int64_t>(ca - pg * kPageTokens, 0));
      const int u1 = static_cast<int>(std::min<int64_t>(cb - pg * kPageTokens, kPageTokens));
      const int nu = u1 - u0;
      const int64_t t0 = s_end + pg * kPageTokens;  // token index of slot 0
      // Rows that see any token of this page.
      // Scores S[r][u] (u relative to u0).
      std::fill(S.begin(), S.begin() + R * kPageTokens, 0.0f);
      for (size_t g = 0; g < H.side[0].size(); ++g) {
        const Group& G = H.side[0][g];
#ifdef RATEKV_PACKED_FAST
        if (fast_ok && !G.wide) {
          // S[r][u] += n_u · Σ_k qn[r][k] · c[code_k] over the group's channel tiles.
          const int n_ct = G.dim_pad / kTileChannels, tt0 = u0 / kTileTokens, tt1 = (u1 + kTileTokens - 1) / kTileTokens;
          for (int ct = 0; ct < n_ct; ++ct)
            nibble_words(G.bits, page + G.code_offset, ct, tt0, tt1, nw.data() + ct * packed::kTilesPerPage * 32);
          const LevelRegs lv{_mm256_loadu_ps(G.lv16.data()), _mm256_loadu_ps(G.lv16.data() + 8), G.bits == 4};
          const float* qg = qn.data() + nat_off[g];
          const size_t qstride = nat_off.back();
          __m256 acc[kLutMaxRows];
          for (int u = u0; u < u1; ++u) {
            for (int64_t r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
            const uint32_t* nwu = nw.data() + (u / kTileTokens) * 32;
            for (int ct = 0; ct < n_ct; ++ct) {
              __m256 a, b;
              decode16(tile_row(nwu + ct * packed::kTilesPerPage * 32, u % kTileTokens), lv, a, b);
              for (int64_t r = 0; r < R; ++r) {
                const float* q = qg + r * qstride + ct * kTileChannels;
                acc[r] = _mm256_fmadd_ps(a, _mm256_loadu_ps(q), acc[r]);
                acc[r] = _mm256_fmadd_ps(b, _mm256_loadu_ps(q + 8), acc[r]);
              }
            }
            const float n = norm_at(page, G.norm_offset, u);
            for (int64_t r = 0; r < R; ++r) S[r * kPageTokens + (u - u0)] += n * hsum(acc[r]);
          }
          continue;
        }
#endif
        unpack_group(L, hk, 0, g, pg, u1, codes.data(), codes_hi.data());
        for (int u = u0; u < u1; ++u) nrm[u] = norm_at(page, G.norm_offset, u);
        if (lut) {
          const int nl = 1 << G.bits;
          for (int64_t r = 0; r < R; ++r) {
            const float* tab = tabs[r * H.side[0].size() + g].data();
            float* sr = S.data() + r * kPageTokens;
            for (int u = u0; u < u1; ++u) {
              const uint8_t* cu = codes.data() + static_cast<size_t>(u) * G.dim_pad;
              // Four independent partial sums: the table lookups are not
              // serialized behind one add chain. dim is even (RoPE pairs or
              // head_dim); the padded tail codes are 0 but never read.
              float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
              int i = 0;
              for (; i + 4 <= G.dim; i += 4) {
                a0 += tab[i * nl + cu[i]];
                a1 += tab[(i + 1) * nl + cu[i + 1]];
                a2 += tab[(i + 2) * nl + cu[i + 2]];
                a3 += tab[(i + 3) * nl + cu[i + 3]];
              }
              for (; i < G.dim; ++i) a0 += tab[i * nl + cu[i]];
              sr[u - u0] += nrm[u] * ((a0 + a1) + (a2 + a3));
            }
          }
        } else {
          // Transposed levels tile with the norms folded in, tile[i][u] =
          // n_u·c[idx_{u,i}], then S[r] += Σ_i q_rot[r][i]·tile[i] (axpy over
          // the page's tokens: contiguous, vectorizes without reassociation).
          for (int u = u0; u < u1; ++u) {
            const uint8_t* cu = codes.data() + static_cast<size_t>(u) * G.dim_pad;
            for (int i = 0; i < G.dim; ++i) tile[static_cast<size_t>(i) * kPageTokens + (u - u0)] = G.levels[cu[i]] * nrm[u];
          }
          for (int64_t r = 0; r < R; ++r) {
            float* __restrict sr = S.data() + r * kPageTokens;
            const float* qr = q_rot + r * Dk + G.rot_offset;
            for (int i = 0; i < G.dim; ++i) {
              const float qi = qr[i];
              const float* __restrict ti = tile.data() + static_cast<size_t>(i) * kPageTokens;
              for (int u = 0; u < nu; ++u) sr[u] += qi * ti[u];
            }
          }
        }
      }
      if (vq_side(L, 0))  // S[r][u] += q_r · k̂_t (post-RoPE)
        for (int u = u0; u < u1; ++u) {
          vq_row(0, pg, u, t0 + u, xrow.data());
          for (int64_t r = 0; r < R; ++r) {
            const float* qr = q_orig + r * d;
            float acc = 0;
            for (int i = 0; i < d; ++i) acc += qr[i] * xrow[i];
            S[r * kPageTokens + (u - u0)] += acc;
          }
        }
      // Masked online softmax over the page; S becomes the probabilities p.
      for (int64_t r = 0; r < R; ++r) {
        float* sr = S.data() + r * kPageTokens;
        float mx = m[r];
        for (int u = 0; u < nu; ++u) {
          const int64_t t = t0 + u0 + u;
          if (t < lo[r] || t >= hi[r]) {
            sr[u] = kNegInf;
          } else {
            sr[u] = logit(sr[u], p);
            mx = std::max(mx, sr[u]);
          }
        }
        if (mx == kNegInf) {
          std::fill(sr, sr + nu, 0.0f);
          continue;
        }
        rescale(r, mx);
        float sum = 0;
        for (int u = 0; u < nu; ++u) {
          sr[u] = std::exp(sr[u] - mx);  // exp(−∞) = 0 for masked slots
          sum += sr[u];
        }
        l[r] += sum;
      }
      // Values: o_rot[r][g] += Σ_u p[r][u] · n_u · c[idx_u] in the group's rotated domain.
      for (size_t g = 0; g < H.side[1].size(); ++g) {
        const Group& G = H.side[1][g];
#ifdef RATEKV_PACKED_FAST
        if (fast_ok && !G.wide) {
          // The value tile is the key tile transposed: row x = channel, its 16
          // tokens in natural order. pwn[r][tt·16 + k] = p_t·n_t of token
          // tt·16 + nat_col(k) (0 outside [u0, u1)); o_rot[r][c] += Σ levels·pwn.
          const int n_ct = G.dim_pad / kTileChannels, tt0 = u0 / kTileTokens, tt1 = (u1 + kTileTokens - 1) / kTileTokens;
          for (int i = tt0 * kTileTokens; i < tt1 * kTileTokens; ++i) {
            const int u = (i & ~15) + nat_col(i & 15);
            const bool in = u >= u0 && u < u1;
            const float n = in ? norm_at(page, G.norm_offset, u) : 0.0f;
            for (int64_t r = 0; r < R; ++r) pwn[r * kPageTokens + i] = in ? S[r * kPageTokens + (u - u0)] * n : 0.0f;
          }
          for (int ct = 0; ct < n_ct; ++ct)
            nibble_words(G.bits, page + G.code_offset, ct, tt0, tt1, nw.data() + ct * packed::kTilesPerPage * 32);
          const LevelRegs lv{_mm256_loadu_ps(G.lv16.data()), _mm256_loadu_ps(G.lv16.data() + 8), G.bits == 4};
          __m256 acc[kLutMaxRows];
          for (int ct = 0; ct < n_ct; ++ct)
            for (int x = 0; x < kTileChannels && ct * kTileChannels + x < G.dim; ++x) {
              for (int64_t r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
              for (int tt = tt0; tt < tt1; ++tt) {
                __m256 a, b;
                decode16(tile_row(nw.data() + (ct * packed::kTilesPerPage + tt) * 32, x), lv, a, b);
                for (int64_t r = 0; r < R; ++r) {
                  const float* w = pwn.data() + r * kPageTokens + tt * kTileTokens;
                  acc[r] = _mm256_fmadd_ps(a, _mm256_loadu_ps(w), acc[r]);
                  acc[r] = _mm256_fmadd_ps(b, _mm256_loadu_ps(w + 8), acc[r]);
                }
              }
              for (int64_t r = 0; r < R; ++r) o_rot[r * Dv + G.rot_offset + ct * kTileChannels + x] += hsum(acc[r]);
            }
          continue;
        }
#endif
        unpack_group(L, hk, 1, g, pg, u1, codes.data(), codes_hi.data());
        for (int u = u0; u < u1; ++u) {
          const float n = norm_at(page, G.norm_offset, u);
          const uint8_t* cu = codes.data() + static_cast<size_t>(u) * G.dim_pad;
          float* tu = tile.data() + static_cast<size_t>(u - u0) * G.dim;
          for (int i = 0; i < G.dim; ++i) tu[i] = G.levels[cu[i]] * n;
        }
        for (int64_t r = 0; r < R; ++r) {
          const float* pr = S.data() + r * kPageTokens;
          float* __restrict o = o_rot + r * Dv + G.rot_offset;
          for (int u = 0; u < nu; ++u) {
            const float w = pr[u];
            if (w == 0.0f) continue;  // masked (or underflowed) token
            const float* __restrict tu = tile.data() + static_cast<size_t>(u) * G.dim;
            for (int i = 0; i < G.dim; ++i) o[i] += w * tu[i];
          }
        }
      }
      if (vq_side(L, 1))  // o_plain[r] += p_r,t · v̂_t (original channel order)
        for (int u = u0; u < u1; ++u) {
          bool any = false;
          for (int64_t r = 0; r < R; ++r) any = any || S[r * kPageTokens + (u - u0)] != 0.0f;
          if (!any) continue;  // masked (or underflowed) for every row
          vq_row(1, pg, u, t0 + u, xrow.data());
          for (int64_t r = 0; r < R; ++r) {
            const float w = S[r * kPageTokens + (u - u0)];
            if (w == 0.0f) continue;
            float* __restrict o = o_plain + r * d;
            for (int i = 0; i < d; ++i) o[i] += w * xrow[i];
          }
        }
    }
  }

  for (int64_t t = std::max(a, q_end); t < std::min(b, T); ++t) plain_token(t);
}

void PackedKVCache::attend(int layer, int64_t n, const int32_t* pos, const float* q, float* out,
                           const AttnParams& params) {
  check(layer >= 0 && layer < shape_.n_layers, "PackedKVCache::attend: layer {} out of range [0, {})", layer,
        shape_.n_layers);
  check(n > 0, "PackedKVCache::attend: n = {} must be positive", n);
  check(params.scale > 0 && std::isfinite(params.scale), "PackedKVCache::attend: scale {} must be finite and positive",
        params.scale);
  const Layer& L = layers_[layer];
  const int64_t T = static_cast<int64_t>(L.pos.size());
  const int H = shape_.n_heads, Hkv = shape_.n_kv_heads, d = shape_.head_dim, ratio = H / Hkv;
  const int64_t qrow = int64_t{H} * d;
  std::vector<int64_t> qlo(n), qhi(n);
  for (int64_t i = 0; i < n; ++i) {
    key_range(L.pos, pos[i], params.sliding_window, qlo[i], qhi[i]);
    check(qhi[i] > qlo[i], "PackedKVCache::attend: layer {}: query at position {} sees no cached key (append first)",
          layer, pos[i]);
  }

  // Work items: (KV head, query block, sequence part). Decode (few rows):
  // one query block, the pages split into parts; prefill: query blocks, one part.
  const bool decode = n * ratio <= kLutMaxRows;
  const int64_t qb = decode ? n : kQueryBlock;
  const int64_t n_qblocks = (n + qb - 1) / qb;
  const int64_t split_tokens = int64_t{opt_.pages_per_split} * kPageTokens;
  const int64_t n_parts = decode ? std::max<int64_t>(1, (L.n_codes + split_tokens - 1) / split_tokens) : 1;
  const int64_t s_end = std::min<int64_t>(sink_, T);
  const int64_t n_items = int64_t{Hkv} * n_qblocks * n_parts;
  const int64_t R_max = qb * ratio;
  int max_dv = 0;
  for (const Head& Hd : L.heads) max_dv = std::max(max_dv, Hd.rot_dim[1]);
  // Partial states of every item: m, l (R_max), o_rot (R_max, max_dv), o_plain (R_max, d).
  std::vector<float> st_m(n_items * R_max), st_l(n_items * R_max), st_o(n_items * R_max * max_dv),
      st_p(n_items * R_max * d);
  const bool par = n_items > 1 && n * H * T * d >= (int64_t{1} << 15);

#pragma omp parallel for schedule(dynamic) if (par)
  for (int64_t it = 0; it < n_items; ++it) {
    const int hk = static_cast<int>(it / (n_qblocks * n_parts));
    const int64_t qbi = (it / n_parts) % n_qblocks, part = it % n_parts;
    const Head& Hd = L.heads[hk];
    const int Dk = Hd.rot_dim[0];
    const int64_t i0 = qbi * qb, nq = std::min(qb, n - i0), R = nq * ratio;
    std::vector<float> q_orig(R * d), q_rot(R * Dk), qg(d), qr(d);
    std::vector<int64_t> lo(R), hi(R);
    int64_t a = std::numeric_limits<int64_t>::max(), b = 0;
    for (int64_t i = 0; i < nq; ++i)
      for (int j = 0; j < ratio; ++j) {
        const int64_t r = i * ratio + j;
        const float* qv = q + (i0 + i) * qrow + int64_t{hk * ratio + j} * d;
        std::memcpy(q_orig.data() + r * d, qv, sizeof(float) * d);
        for (const Group& G : Hd.side[0]) {
          for (int c = 0; c < G.dim; ++c) qg[c] = qv[G.channels[c]];
          G.tq->rotate(qg.data(), q_rot.data() + r * Dk + G.rot_offset);
        }
        lo[r] = qlo[i0 + i];
        hi[r] = qhi[i0 + i];
        a = std::min(a, lo[r]);
        b = std::max(b, hi[r]);
      }
    if (decode) {  // this part's token range
      const int64_t pa = part == 0 ? 0 : s_end + part * split_tokens;
      const int64_t pb = part + 1 == n_parts ? T : s_end + (part + 1) * split_tokens;
      a = std::max(a, pa);
      b = std::min(b, pb);
    }
    float* m = st_m.data() + it * R_max;
    float* l = st_l.data() + it * R_max;
    float* o = st_o.data() + it * R_max * max_dv;
    float* op = st_p.data() + it * R_max * d;
    if (b > a) {
      attend_rows(L, hk, R, q_orig.data(), q_rot.data(), lo.data(), hi.data(), a, b, params, m, l, o, op);
    } else {
      std::fill(m, m + R, kNegInf);
      std::fill(l, l + R, 0.0f);
    }
  }

  // Merge the parts (log-sum-exp), rotate back once per output row, normalize.
#pragma omp parallel for schedule(static) if (par)
  for (int64_t x = 0; x < int64_t{Hkv} * n_qblocks; ++x) {
    const int hk = static_cast<int>(x / n_qblocks);
    const int64_t qbi = x % n_qblocks;
    const Head& Hd = L.heads[hk];
    const int Dv = Hd.rot_dim[1];
    const int64_t i0 = qbi * qb, nq = std::min(qb, n - i0), R = nq * ratio;
    const int64_t it0 = x * n_parts;
    std::vector<float> y(d), tmp(Dv + d), tmp2(Dv + d);
    for (int64_t r = 0; r < R; ++r) {
      AttnPartial acc{st_m[it0 * R_max + r], st_l[it0 * R_max + r]};
      // o_rot and o_plain of part 0, concatenated.
      // Dv = 0 (values fp16/vq, all in o_plain): st_o is empty, and memcpy from its null data() is UB.
      if (Dv > 0) std::memcpy(tmp.data(), st_o.data() + (it0 * R_max + r) * max_dv, sizeof(float) * Dv);
      std::memcpy(tmp.data() + Dv, st_p.data() + (it0 * R_max + r) * d, sizeof(float) * d);
      for (int64_t part = 1; part < n_parts; ++part) {
        const int64_t it = it0 + part;
        const AttnPartial other{st_m[it * R_max + r], st_l[it * R_max + r]};
        if (Dv > 0) std::memcpy(tmp2.data(), st_o.data() + (it * R_max + r) * max_dv, sizeof(float) * Dv);
        std::memcpy(tmp2.data() + Dv, st_p.data() + (it * R_max + r) * d, sizeof(float) * d);
        merge_partial(acc, tmp.data(), other, tmp2.data(), Dv + d);
      }
      const int64_t i = i0 + r / ratio;
      const int h = hk * ratio + static_cast<int>(r % ratio);
      float* outr = out + i * qrow + int64_t{h} * d;
      const float inv = 1.0f / acc.l;
      for (int c = 0; c < d; ++c) outr[c] = tmp[Dv + c] * inv;
      for (const Group& G : Hd.side[1]) {
        G.tq->unrotate(tmp.data() + G.rot_offset, y.data());
        for (int c = 0; c < G.dim; ++c) outr[G.channels[c]] += y[c] * inv;
      }
    }
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
