// ref::tq_mse_encode, ref::packed_append, ref::packed_prefill
// (include/ratekv/ref/packed_quantize.h).
#include "ratekv/ref/packed_quantize.h"

#include <cmath>

#include "packed_pages.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"

namespace ratekv::ref {

using packed::kPageTokens;
using packed::Side;

TqMseCode tq_mse_encode(std::span<const float> rotation, std::span<const float> levels, std::span<const float> x) {
  const size_t m = x.size();
  check(m >= 1 && rotation.size() == m * m, "ref::tq_mse_encode: rotation has {} floats for a {}-channel group", rotation.size(), m);
  const size_t nl = levels.size();
  check(nl >= 2 && nl <= 256 && (nl & (nl - 1)) == 0, "ref::tq_mse_encode: {} levels (expected 2^b, b = 1..8)", nl);
  double nn = 0;
  for (float xi : x) {
    check(std::isfinite(xi), "ref::tq_mse_encode: input value {} is not finite", xi);
    nn += static_cast<double>(xi) * xi;
  }
  nn = std::sqrt(nn);
  std::vector<float> mid(nl - 1);
  for (size_t l = 0; l + 1 < nl; ++l) mid[l] = 0.5f * (levels[l] + levels[l + 1]);
  TqMseCode c;
  c.codes.resize(m);
  c.margin.resize(m);
  c.norm_fp16 = fp32_to_fp16(static_cast<float>(nn));
  for (size_t j = 0; j < m; ++j) {
    double y = 0;
    if (nn > 0) {
      for (size_t i = 0; i < m; ++i) y += static_cast<double>(rotation[j * m + i]) * x[i];
      y /= nn;
    }
    int code = 0;
    double margin = INFINITY;
    for (float mu : mid) {
      code += y > mu;
      margin = std::min(margin, std::abs(y - mu));
    }
    c.codes[j] = static_cast<uint8_t>(code);
    c.margin[j] = margin;
  }
  return c;
}

namespace {

void quantize_tokens(const PackedPlan& plan, const DecodeBatch& batch, std::span<uint8_t> pool,
                     std::span<const float> k, std::span<const float> v, int n_tokens, const char* what) {
  check(n_tokens >= 1, "{}: n_tokens {} must be at least 1", what, n_tokens);
  check(!plan.has_wide(),
        "{}: the plan has 5..8-bit groups (extension pages); the GPU quantizers and this reference do not write them",
        what);
  const packed::LayerLayout& L = plan.layout();
  const size_t n_pages = detail::pool_pages(pool.size(), L.page_bytes(), what, "pool");
  check_batch(batch, n_pages, n_tokens, what);
  const int nb = batch.batch(), hkv = L.n_kv_heads(), d = L.head_dim();
  const size_t n_el = static_cast<size_t>(nb) * n_tokens * hkv * d;
  check(k.size() == n_el && v.size() == n_el,
        "{}: k and v have {} and {} floats, expected batch {} x n_tokens {} x n_kv_heads {} x head_dim {}", what,
        k.size(), v.size(), nb, n_tokens, hkv, d);
  for (size_t i = 0; i < n_el; ++i)
    check(std::isfinite(k[i]) && std::isfinite(v[i]), "{}: k or v value {} is not finite", what, i);
  // KV heads own disjoint head blocks of every page: one thread per KV head.
#pragma omp parallel for schedule(dynamic) if (hkv > 1 && n_el >= 4096)
  for (int h = 0; h < hkv; ++h) {
    std::vector<float> xg(d);
    for (int b = 0; b < nb; ++b)
      for (int i = 0; i < n_tokens; ++i) {
        const int64_t pos = int64_t{batch.seq_lens[b]} + i;
        const std::span<uint8_t> page =
            pool.subspan(static_cast<size_t>(batch.page(b, pos / kPageTokens)) * L.page_bytes(), L.page_bytes());
        const int slot = static_cast<int>(pos % kPageTokens);
        for (int s = 0; s < 2; ++s) {
          const Side side = s == 0 ? Side::key : Side::value;
          const float* x = (s == 0 ? k : v).data() + ((static_cast<size_t>(b) * n_tokens + i) * hkv + h) * d;
          const auto& specs = s == 0 ? L.spec(h).key : L.spec(h).value;
          for (size_t g = 0; g < specs.size(); ++g) {
            const std::vector<int>& ch = specs[g].channels;
            for (size_t j = 0; j < ch.size(); ++j) xg[j] = x[ch[j]];
            const TqMseCode c =
                tq_mse_encode(plan.rotation(h, side, static_cast<int>(g)), plan.levels(h, side, static_cast<int>(g)),
                              std::span<const float>(xg.data(), ch.size()));
            packed::write_codes(L, page, h, side, static_cast<int>(g), slot, c.codes);
            packed::write_norm(L, page, h, side, static_cast<int>(g), slot, c.norm_fp16);
          }
        }
      }
  }
}

}  // namespace

void packed_prefill(const PackedPlan& plan, const DecodeBatch& batch, std::span<uint8_t> pool,
                    std::span<const float> k, std::span<const float> v, int n_tokens) {
  quantize_tokens(plan, batch, pool, k, v, n_tokens, "ref::packed_prefill");
}

void packed_append(const PackedPlan& plan, const DecodeBatch& batch, std::span<uint8_t> pool,
                   std::span<const float> k, std::span<const float> v) {
  quantize_tokens(plan, batch, pool, k, v, 1, "ref::packed_append");
}

}  // namespace ratekv::ref
