// ref::packed_decode_attention (include/ratekv/ref/packed_decode_attention.h).
#include "ratekv/ref/packed_decode_attention.h"

#include <algorithm>
#include <cmath>

#include "packed_pages.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/model/sliding_window.h"
#include "ratekv/ref/int8_levels.h"

namespace ratekv::ref {

using packed::kPageTokens;
using packed::Side;

std::vector<float> packed_decode_attention(const PackedPlan& plan, const DecodeBatch& batch,
                                           std::span<const uint8_t> pool, std::span<const uint8_t> ext_pool,
                                           std::span<const float> q, float scale, PackedRounding rounding) {
  constexpr const char* what = "ref::packed_decode_attention";
  const packed::LayerLayout& L = plan.layout();
  const size_t n_pages = detail::pool_pages(pool.size(), L.page_bytes(), what, "pool");
  if (plan.has_wide()) {
    const size_t n_ext = detail::pool_pages(ext_pool.size(), plan.ext_layout()->page_bytes(), what, "ext_pool");
    check(n_ext == n_pages || L.page_bytes() == 0, "{}: ext_pool has {} pages, pool {}", what, n_ext, n_pages);
  }
  check_batch(batch, n_pages, 0, what);
  const int nb = batch.batch(), hq = plan.n_heads(), d = plan.head_dim(), gqa = plan.gqa();
  check(q.size() == static_cast<size_t>(nb) * hq * d, "{}: q has {} floats, expected batch {} x n_heads {} x head_dim {}",
        what, q.size(), nb, hq, d);
  std::vector<float> out(q.size(), 0.0f);

  for (int h = 0; h < L.n_kv_heads(); ++h) {
    const auto& KG = L.head(h).key;
    const auto& VG = L.head(h).value;
    const auto& spec = L.spec(h);
    // Levels as the kernel holds them, per group.
    std::vector<std::vector<double>> klv(KG.size()), vlv(VG.size());
    for (int s = 0; s < 2; ++s)
      for (size_t g = 0; g < (s == 0 ? KG : VG).size(); ++g) {
        const Side side = s == 0 ? Side::key : Side::value;
        const std::span<const float> lv = plan.levels(h, side, static_cast<int>(g));
        std::vector<double>& dst = (s == 0 ? klv : vlv)[g];
        if (rounding == PackedRounding::int8_levels) {
          check(lv.size() <= 16, "{}: int8 levels need groups of at most 4 bits (KV head {} {} group {} has {})",
                what, h, s == 0 ? "key" : "value", g, plan.bits(h, side, static_cast<int>(g)));
          const std::vector<float> l8 = int8_levels(lv);
          dst.assign(l8.begin(), l8.end());
        } else if (rounding == PackedRounding::exact) {
          dst.assign(lv.begin(), lv.end());
        } else {
          for (float v : lv) dst.push_back(round_fp16(v));
        }
      }
    std::vector<size_t> voff(VG.size() + 1, 0);
    for (size_t g = 0; g < VG.size(); ++g) voff[g + 1] = voff[g] + VG[g].dim;
    const size_t Dv = voff.back();
    int max_dim = 1;
    for (const auto* G : {&KG, &VG})
      for (const packed::GroupLayout& gl : *G) max_dim = std::max(max_dim, gl.dim);

    for (int b = 0; b < nb; ++b) {
      const int64_t T = batch.seq_lens[b];
      // Keys t0 .. T−1: all, or the sliding window's (model/sliding_window.h).
      const int64_t t0 = first_visible_key(T - 1, batch.window), n_vis = T - t0;
      // Rotated, scaled queries of the GQA rows, per key group.
      std::vector<std::vector<std::vector<double>>> qr(gqa, std::vector<std::vector<double>>(KG.size()));
      for (int r = 0; r < gqa; ++r) {
        const float* qv = q.data() + (static_cast<size_t>(b) * hq + h * gqa + r) * d;
        for (size_t g = 0; g < KG.size(); ++g) {
          const int m = KG[g].dim;
          const std::span<const float> R = plan.rotation(h, Side::key, static_cast<int>(g));
          const std::vector<int>& ch = spec.key[g].channels;
          qr[r][g].resize(m);
          for (int j = 0; j < m; ++j) {
            if (rounding == PackedRounding::exact) {
              double acc = 0;
              for (int i = 0; i < m; ++i) acc += static_cast<double>(R[static_cast<size_t>(j) * m + i]) * qv[ch[i]];
              qr[r][g][j] = static_cast<double>(scale) * acc;
            } else {
              float acc = 0.f;
              for (int i = 0; i < m; ++i) acc = std::fma(R[static_cast<size_t>(j) * m + i], qv[ch[i]], acc);
              qr[r][g][j] = round_fp16(scale * acc);
            }
          }
        }
      }
      // Scores (already scaled: the scale is in q_rot), then softmax weights.
      std::vector<double> p(static_cast<size_t>(gqa) * T, 0.0);
#pragma omp parallel if (n_vis >= 256)
      {
        std::vector<uint8_t> codes(max_dim), hi(max_dim);
#pragma omp for schedule(static)
        for (int64_t t = t0; t < T; ++t) {
          const int32_t pg = batch.page(b, t / kPageTokens);
          const int slot = static_cast<int>(t % kPageTokens);
          for (size_t g = 0; g < KG.size(); ++g) {
            detail::read_group_codes(plan, pool, ext_pool, pg, h, Side::key, static_cast<int>(g), slot, codes, hi);
            const double n = detail::read_group_norm(L, pool, pg, h, Side::key, static_cast<int>(g), slot);
            for (int r = 0; r < gqa; ++r) {
              double dot = 0;
              for (int j = 0; j < KG[g].dim; ++j) dot += qr[r][g][j] * klv[g][codes[j]];
              p[static_cast<size_t>(r) * T + t] += n * dot;
            }
          }
        }
      }
      for (int r = 0; r < gqa; ++r) {
        double* pr = p.data() + static_cast<size_t>(r) * T;  // weights of t < t0 stay 0 (unused)
        const double mx = *std::max_element(pr + t0, pr + T);
        double l = 0;
        for (int64_t t = t0; t < T; ++t) l += (pr[t] = std::exp(pr[t] - mx));
        for (int64_t t = t0; t < T; ++t) pr[t] /= l;
      }
      // Values in each group's rotated domain: fixed token chunks (the sum
      // does not depend on the thread count), merged in chunk order.
      const int n_chunks = static_cast<int>(std::min<int64_t>(64, n_vis));
      std::vector<double> acc(static_cast<size_t>(n_chunks) * gqa * Dv, 0.0);
      if (Dv > 0) {
#pragma omp parallel if (n_vis >= 256)
        {
          std::vector<uint8_t> codes(max_dim), hi(max_dim);
#pragma omp for schedule(static)
          for (int c = 0; c < n_chunks; ++c) {
            double* a = acc.data() + static_cast<size_t>(c) * gqa * Dv;
            for (int64_t t = t0 + n_vis * c / n_chunks; t < t0 + n_vis * (c + 1) / n_chunks; ++t) {
              const int32_t pg = batch.page(b, t / kPageTokens);
              const int slot = static_cast<int>(t % kPageTokens);
              for (size_t g = 0; g < VG.size(); ++g) {
                detail::read_group_codes(plan, pool, ext_pool, pg, h, Side::value, static_cast<int>(g), slot, codes,
                                         hi);
                const double n = detail::read_group_norm(L, pool, pg, h, Side::value, static_cast<int>(g), slot);
                for (int r = 0; r < gqa; ++r) {
                  const double w = p[static_cast<size_t>(r) * T + t] * n;
                  double* ar = a + static_cast<size_t>(r) * Dv + voff[g];
                  for (int j = 0; j < VG[g].dim; ++j) ar[j] += w * vlv[g][codes[j]];
                }
              }
            }
          }
        }
      }
      // Rotate back once per row: x[c_i] = Σ_j Π[j, i] o_rot[j].
      for (int r = 0; r < gqa; ++r) {
        std::vector<double> o(Dv, 0.0);
        for (int c = 0; c < n_chunks; ++c)
          for (size_t i = 0; i < Dv; ++i) o[i] += acc[(static_cast<size_t>(c) * gqa + r) * Dv + i];
        float* dst = out.data() + (static_cast<size_t>(b) * hq + h * gqa + r) * d;
        for (size_t g = 0; g < VG.size(); ++g) {
          const int m = VG[g].dim;
          const std::span<const float> R = plan.rotation(h, Side::value, static_cast<int>(g));
          for (int i = 0; i < m; ++i) {
            double x = 0;
            for (int j = 0; j < m; ++j) x += static_cast<double>(R[static_cast<size_t>(j) * m + i]) * o[voff[g] + j];
            dst[spec.value[g].channels[i]] = static_cast<float>(x);
          }
        }
      }
    }
  }
  return out;
}

}  // namespace ratekv::ref
