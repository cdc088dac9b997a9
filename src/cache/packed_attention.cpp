// PackedKVCache attention from the codes (include/ratekv/cache/
// packed_kv_cache.h, docs/design.md §6): the work items over (KV head, query
// block, sequence part), their log-sum-exp merge, and attend_rows, which walks
// the sink / window fp16 rows and the code pages and hands each page's groups
// to the AVX2 fast path (packed_attention_avx2.cpp) or the scalar path
// (packed_attention_scalar.cpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <omp.h>

#include "packed_attention_kernels.h"
#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"

namespace ratekv::cache {

using packed::kPageTokens;
using packed::kTileChannels;
using packed::kTileTokens;
using namespace detail;

namespace detail {

void RowStates::reset() {
  std::fill(s, s + R, SoftmaxState{});
  std::fill(o_rot, o_rot + R * Dv, 0.0f);
  std::fill(o_plain, o_plain + R * d, 0.0f);
}

void RowStates::rescale(int64_t r, float mx) {
  const float alpha = s[r].raise_max(mx);
  if (alpha == 1.0f) return;
  for (int i = 0; i < Dv; ++i) o_rot[r * Dv + i] *= alpha;
  for (int i = 0; i < d; ++i) o_plain[r * d + i] *= alpha;
}

void attend_fp16_token(RowStates& st, const float* q_orig, const float* kr, const float* vr, int64_t t,
                       const int64_t* lo, const int64_t* hi, const AttnParams& p) {
  const int d = st.d;
  for (int64_t r = 0; r < st.R; ++r) {
    if (t < lo[r] || t >= hi[r]) continue;
    float dot = 0;
    for (int i = 0; i < d; ++i) dot += q_orig[r * d + i] * kr[i];
    const float s = attention_logit(dot, p);
    if (s > st.s[r].m) st.rescale(r, s);
    const float e = std::exp(s - st.s[r].m);
    st.s[r].l += e;
    for (int i = 0; i < d; ++i) st.o_plain[r * d + i] += e * vr[i];
  }
}

void softmax_page(RowStates& st, float* S, int nu, int64_t t_first, const int64_t* lo, const int64_t* hi,
                  const AttnParams& p) {
  for (int64_t r = 0; r < st.R; ++r) {
    float* sr = S + r * kPageTokens;
    float mx = st.s[r].m;
    for (int u = 0; u < nu; ++u) {
      const int64_t t = t_first + u;
      if (t < lo[r] || t >= hi[r]) {
        sr[u] = kNegInf;
      } else {
        sr[u] = attention_logit(sr[u], p);
        mx = std::max(mx, sr[u]);
      }
    }
    if (mx == kNegInf) {
      std::fill(sr, sr + nu, 0.0f);
      continue;
    }
    st.rescale(r, mx);
    float sum = 0;
    for (int u = 0; u < nu; ++u) {
      sr[u] = std::exp(sr[u] - mx);  // exp(−∞) = 0 for masked slots
      sum += sr[u];
    }
    st.s[r].l += sum;
  }
}

}  // namespace detail

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
// [lo, hi): online softmax per page, partial state (SoftmaxState, o_rot, o_plain).
//   q_orig (R, d) post-RoPE queries, q_rot (R, Dk) rotated per key group,
//   o_rot (R, Dv) value accumulator in the value groups' rotated domains,
//   o_plain (R, d) accumulator of the fp16 sink/window rows.
void PackedKVCache::attend_rows(const Layer& L, int hk, int64_t R, const float* q_orig, const float* q_rot,
                                const int64_t* lo, const int64_t* hi, int64_t a, int64_t b, const AttnParams& p,
                                SoftmaxState* s, float* o_rot, float* o_plain) const {
  const int d = shape_.head_dim, Hkv = shape_.n_kv_heads;
  const int64_t row = int64_t{Hkv} * d;
  const Head& H = L.heads[hk];
  const int Dk = H.rot_dim[0], Dv = H.rot_dim[1];
  RowStates st{R, Dv, d, s, o_rot, o_plain};
  st.reset();

  const int64_t T = static_cast<int64_t>(L.pos.size());
  const int64_t s_end = std::min<int64_t>(sink_, T);
  const int64_t q_end = s_end + L.n_codes;

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
    attend_fp16_token(st, q_orig, kr.data(), vr.data(), t, lo, hi, p);
  };
  for (int64_t t = a; t < std::min(b, s_end); ++t) plain_token(t);

  // Code tokens [ca, cb) as code slots.
  const int64_t ca = std::max(a, s_end) - s_end, cb = std::min(b, q_end) - s_end;
  if (cb > ca) {
    const bool lut = R <= kLutMaxRows;
    const size_t n_kg = H.side[0].size();
    // Per-step tables tab[r][g][i·2^b + j] = q_rot[r][i]·c[j] (decode path).
    std::vector<std::vector<float>> tabs;
    if (lut) {
      tabs.resize(R * n_kg);
      for (int64_t r = 0; r < R; ++r)
        for (size_t g = 0; g < n_kg; ++g) {
          const Group& G = H.side[0][g];
          build_key_table(q_rot + r * Dk + G.rot_offset, G.dim, G.bits, G.levels, tabs[r * n_kg + g]);
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
    std::vector<int> nat_off(n_kg + 1, 0);
    for (size_t g = 0; g < n_kg; ++g) nat_off[g + 1] = nat_off[g] + H.side[0][g].dim_pad;
    std::vector<float> qn, pwn;
    std::vector<uint32_t> nw;
    if (fast_ok) {
      qn.assign(static_cast<size_t>(R) * nat_off.back(), 0.0f);
      for (int64_t r = 0; r < R; ++r)
        for (size_t g = 0; g < n_kg; ++g) {
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
      auto view = [&](const Group& G) {
        return PageGroup{page, G.code_offset, G.norm_offset, G.dim, G.dim_pad, G.bits, G.levels, G.lv16.data()};
      };
      // Scores S[r][u] (u relative to u0).
      std::fill(S.begin(), S.begin() + R * kPageTokens, 0.0f);
      for (size_t g = 0; g < n_kg; ++g) {
        const Group& G = H.side[0][g];
#ifdef RATEKV_PACKED_FAST
        if (fast_ok && !G.wide) {
          fast_key_scores(view(G), qn.data() + nat_off[g], nat_off.back(), R, u0, u1, S.data(), nw.data());
          continue;
        }
#endif
        unpack_group(L, hk, 0, g, pg, u1, codes.data(), codes_hi.data());
        for (int u = u0; u < u1; ++u) nrm[u] = norm_at(page, G.norm_offset, u);
        if (lut) {
          for (int64_t r = 0; r < R; ++r)
            lut_key_scores(view(G), codes.data(), nrm.data(), tabs[r * n_kg + g].data(), u0, u1,
                           S.data() + r * kPageTokens);
        } else {
          tile_key_scores(view(G), codes.data(), nrm.data(), q_rot + G.rot_offset, Dk, R, u0, u1, tile.data(),
                          S.data());
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
      softmax_page(st, S.data(), nu, t0 + u0, lo, hi, p);
      // Values: o_rot[r][g] += Σ_u p[r][u] · n_u · c[idx_u] in the group's rotated domain.
      for (size_t g = 0; g < H.side[1].size(); ++g) {
        const Group& G = H.side[1][g];
#ifdef RATEKV_PACKED_FAST
        if (fast_ok && !G.wide) {
          fast_value_accumulate(view(G), S.data(), R, u0, u1, pwn.data(), nw.data(), o_rot + G.rot_offset, Dv);
          continue;
        }
#endif
        unpack_group(L, hk, 1, g, pg, u1, codes.data(), codes_hi.data());
        scalar_value_accumulate(view(G), codes.data(), S.data(), R, u0, u1, tile.data(), o_rot + G.rot_offset, Dv);
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
  check_attend_args("PackedKVCache::attend", layer, shape_.n_layers, n, params);
  const Layer& L = layers_[layer];
  const int64_t T = static_cast<int64_t>(L.pos.size());
  const int H = shape_.n_heads, Hkv = shape_.n_kv_heads, d = shape_.head_dim, ratio = H / Hkv;
  const int64_t qrow = int64_t{H} * d;
  std::vector<int64_t> qlo, qhi;
  query_key_ranges("PackedKVCache::attend", layer, L.pos, n, pos, params.sliding_window, qlo, qhi);

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
  // Partial states of every item: SoftmaxState (R_max), o_rot (R_max, max_dv), o_plain (R_max, d).
  std::vector<SoftmaxState> st_s(n_items * R_max);
  std::vector<float> st_o(n_items * R_max * max_dv), st_p(n_items * R_max * d);
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
    SoftmaxState* s = st_s.data() + it * R_max;
    float* o = st_o.data() + it * R_max * max_dv;
    float* op = st_p.data() + it * R_max * d;
    if (b > a) attend_rows(L, hk, R, q_orig.data(), q_rot.data(), lo.data(), hi.data(), a, b, params, s, o, op);
    // else: the part sees no key; its states stay empty (m = −∞, l = 0) and merge as nothing.
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
      SoftmaxState acc = st_s[it0 * R_max + r];
      // o_rot and o_plain of part 0, concatenated.
      // Dv = 0 (values fp16/vq, all in o_plain): st_o is empty, and memcpy from its null data() is UB.
      if (Dv > 0) std::memcpy(tmp.data(), st_o.data() + (it0 * R_max + r) * max_dv, sizeof(float) * Dv);
      std::memcpy(tmp.data() + Dv, st_p.data() + (it0 * R_max + r) * d, sizeof(float) * d);
      for (int64_t part = 1; part < n_parts; ++part) {
        const int64_t it = it0 + part;
        if (Dv > 0) std::memcpy(tmp2.data(), st_o.data() + (it * R_max + r) * max_dv, sizeof(float) * Dv);
        std::memcpy(tmp2.data() + Dv, st_p.data() + (it * R_max + r) * d, sizeof(float) * d);
        acc.merge(st_s[it * R_max + r], tmp.data(), tmp2.data(), Dv + d);
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

}  // namespace ratekv::cache
