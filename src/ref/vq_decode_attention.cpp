// ref::vq_decode_attention (include/ratekv/ref/vq_decode_attention.h).
#include "ratekv/ref/vq_decode_attention.h"

#include <algorithm>
#include <cmath>

#include "packed_pages.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"

namespace ratekv::ref {

using packed::kPageTokens;
using packed::Side;
using packed::VqSideKind;

namespace {

// Side s of token t of KV head h (vq or fp16 kind) into x (head_dim), keys
// with RoPE at position t when vq.
void decode_row(const VqPlan& plan, std::span<const uint8_t> page, int h, Side s, int slot, int64_t t,
                std::vector<int32_t>& z, std::vector<uint16_t>& row, double* x) {
  const packed::VqLayerLayout& L = plan.layout();
  const packed::VqSideSpec& sp = L.side(s);
  const int d = L.head_dim();
  if (sp.kind == VqSideKind::fp16) {
    packed::read_fp16_row(L, page, h, s, slot, row);
    for (int c = 0; c < d; ++c) x[c] = fp16_to_fp32(row[c]);
    return;
  }
  const int G = sp.n_groups, g = d / G;
  const size_t K = size_t{1} << sp.bits;
  packed::read_vq_indices(L, page, h, s, slot, std::span<int32_t>(z.data(), G));
  const double sc = sp.shared_scale ? fp16_to_fp32(packed::read_vq_scale(L, page, s, slot)) : 1.0;
  const std::span<const float> cw = plan.codewords(h, s);
  const std::span<const int32_t> ch = plan.channels(h, s);
  for (int gi = 0; gi < G; ++gi)
    for (int j = 0; j < g; ++j)
      x[ch[static_cast<size_t>(gi) * g + j]] = sc * cw[(static_cast<size_t>(gi) * K + z[gi]) * g + j];
  if (s != Side::key) return;
  const int half = d / 2, step = plan.rope().neox ? 1 : 2, off = plan.rope().neox ? half : 1;
  for (int i = 0; i < half; ++i) {
    const double angle = static_cast<double>(t) * std::pow(plan.rope().theta, -2.0 * i / d);
    const double c = static_cast<float>(std::cos(angle)), sn = static_cast<float>(std::sin(angle));
    double& a = x[i * step];
    double& b = x[i * step + off];
    const double a0 = a, b0 = b;
    a = a0 * c - b0 * sn;
    b = a0 * sn + b0 * c;
  }
}

}  // namespace

std::vector<float> vq_decode_attention(const VqPlan& plan, const DecodeBatch& batch, std::span<const uint8_t> pool,
                                       std::span<const uint8_t> scalar_pool, std::span<const float> q, float scale) {
  constexpr const char* what = "ref::vq_decode_attention";
  const packed::VqLayerLayout& L = plan.layout();
  const PackedPlan* sv = plan.scalar_values();
  const size_t n_pages = detail::pool_pages(pool.size(), L.page_bytes(), what, "pool");
  size_t n_scalar = n_pages;
  if (sv) {
    n_scalar = detail::pool_pages(scalar_pool.size(), sv->layout().page_bytes(), what, "scalar_pool");
    check(n_scalar == n_pages, "{}: scalar_pool has {} pages, pool {}", what, n_scalar, n_pages);
  }
  check_batch(batch, n_pages, 0, what);
  check(batch.window == 0, "{}: window {} (sliding-window attention) is not implemented (as in cuda::vq_decode_attention)",
        what, batch.window);
  const int nb = batch.batch(), hq = plan.n_heads(), d = plan.head_dim(), gqa = plan.gqa();
  check(q.size() == static_cast<size_t>(nb) * hq * d, "{}: q has {} floats, expected batch {} x n_heads {} x head_dim {}",
        what, q.size(), nb, hq, d);
  std::vector<float> out(q.size(), 0.0f);
  for (int b = 0; b < nb; ++b) {
    const int64_t T = batch.seq_lens[b];
    for (int h = 0; h < plan.n_kv_heads(); ++h) {
      std::vector<double> qs(static_cast<size_t>(gqa) * d);
      for (int r = 0; r < gqa; ++r)
        for (int c = 0; c < d; ++c)
          qs[static_cast<size_t>(r) * d + c] = scale * q[(static_cast<size_t>(b) * hq + h * gqa + r) * d + c];
      // Scores, then softmax weights.
      std::vector<double> p(static_cast<size_t>(gqa) * T);
#pragma omp parallel if (T >= 256)
      {
        std::vector<int32_t> z(d);
        std::vector<uint16_t> row(d);
        std::vector<double> x(d);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; ++t) {
          const std::span<const uint8_t> page = detail::pool_page(pool, L.page_bytes(), batch.page(b, t / kPageTokens));
          decode_row(plan, page, h, Side::key, static_cast<int>(t % kPageTokens), t, z, row, x.data());
          for (int r = 0; r < gqa; ++r) {
            double s = 0;
            for (int c = 0; c < d; ++c) s += qs[static_cast<size_t>(r) * d + c] * x[c];
            p[static_cast<size_t>(r) * T + t] = s;
          }
        }
      }
      for (int r = 0; r < gqa; ++r) {
        double* pr = p.data() + static_cast<size_t>(r) * T;
        const double mx = *std::max_element(pr, pr + T);
        double l = 0;
        for (int64_t t = 0; t < T; ++t) l += (pr[t] = std::exp(pr[t] - mx));
        for (int64_t t = 0; t < T; ++t) pr[t] /= l;
      }
      // Values: vq / fp16 rows in channel order, or the scalar groups in
      // their rotated domains (rotated back below). Fixed token chunks, merged
      // in order (independent of the thread count).
      std::vector<size_t> voff(1, 0);
      if (sv)
        for (const packed::GroupLayout& G : sv->layout().head(h).value) voff.push_back(voff.back() + G.dim);
      const size_t width = sv ? voff.back() : static_cast<size_t>(d);
      const int n_chunks = static_cast<int>(std::min<int64_t>(64, T));
      std::vector<double> acc(static_cast<size_t>(n_chunks) * gqa * width, 0.0);
#pragma omp parallel if (T >= 256)
      {
        std::vector<int32_t> z(d);
        std::vector<uint16_t> row(d);
        std::vector<uint8_t> codes(d), hi(d);
        std::vector<double> x(d);
#pragma omp for schedule(static)
        for (int c = 0; c < n_chunks; ++c) {
          double* a = acc.data() + static_cast<size_t>(c) * gqa * width;
          for (int64_t t = T * c / n_chunks; t < T * (c + 1) / n_chunks; ++t) {
            const int32_t pg = batch.page(b, t / kPageTokens);
            const int slot = static_cast<int>(t % kPageTokens);
            if (sv) {
              const auto& VG = sv->layout().head(h).value;
              for (size_t g = 0; g < VG.size(); ++g) {
                detail::read_group_codes(*sv, scalar_pool, {}, pg, h, Side::value, static_cast<int>(g), slot, codes,
                                         hi);
                const double n = detail::read_group_norm(sv->layout(), scalar_pool, pg, h, Side::value,
                                                         static_cast<int>(g), slot);
                const std::span<const float> lv = sv->levels(h, Side::value, static_cast<int>(g));
                for (int j = 0; j < VG[g].dim; ++j) x[voff[g] + j] = n * lv[codes[j]];
              }
            } else {
              decode_row(plan, detail::pool_page(pool, L.page_bytes(), pg), h, Side::value, slot, t, z, row, x.data());
            }
            for (int r = 0; r < gqa; ++r) {
              const double w = p[static_cast<size_t>(r) * T + t];
              double* ar = a + static_cast<size_t>(r) * width;
              for (size_t i = 0; i < width; ++i) ar[i] += w * x[i];
            }
          }
        }
      }
      for (int r = 0; r < gqa; ++r) {
        std::vector<double> o(width, 0.0);
        for (int c = 0; c < n_chunks; ++c)
          for (size_t i = 0; i < width; ++i) o[i] += acc[(static_cast<size_t>(c) * gqa + r) * width + i];
        float* dst = out.data() + (static_cast<size_t>(b) * hq + h * gqa + r) * d;
        if (!sv) {
          for (int c = 0; c < d; ++c) dst[c] = static_cast<float>(o[c]);
          continue;
        }
        const auto& VG = sv->layout().head(h).value;
        for (size_t g = 0; g < VG.size(); ++g) {
          const int m = VG[g].dim;
          const std::span<const float> R = sv->rotation(h, Side::value, static_cast<int>(g));
          const std::vector<int>& ch = sv->layout().spec(h).value[g].channels;
          for (int i = 0; i < m; ++i) {
            double y = 0;
            for (int j = 0; j < m; ++j) y += static_cast<double>(R[static_cast<size_t>(j) * m + i]) * o[voff[g] + j];
            dst[ch[i]] = static_cast<float>(y);
          }
        }
      }
    }
  }
  return out;
}

}  // namespace ratekv::ref
