// ref::fp16_decode_attention (include/ratekv/ref/fp16_decode_attention.h).
#include "ratekv/ref/fp16_decode_attention.h"

#include <algorithm>
#include <cmath>

#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/format/packed_format.h"
#include "ratekv/model/sliding_window.h"

namespace ratekv::ref {

using packed::kPageTokens;

std::vector<float> fp16_decode_attention(int n_heads, int n_kv_heads, int head_dim, const DecodeBatch& batch,
                                         std::span<const uint16_t> pool, std::span<const float> q, float scale) {
  constexpr const char* what = "ref::fp16_decode_attention";
  check(head_dim > 0 && n_kv_heads > 0 && n_heads > 0 && n_heads % n_kv_heads == 0,
        "{}: n_heads {} must be a positive multiple of n_kv_heads {}, head_dim {} positive", what, n_heads,
        n_kv_heads, head_dim);
  const size_t page_elems = static_cast<size_t>(n_kv_heads) * 2 * kPageTokens * head_dim;
  check(pool.size() % page_elems == 0, "{}: pool has {} values, not a whole number of {}-value pages", what,
        pool.size(), page_elems);
  check_batch(batch, pool.size() / page_elems, 0, what);
  const int nb = batch.batch(), d = head_dim, gqa = n_heads / n_kv_heads;
  check(q.size() == static_cast<size_t>(nb) * n_heads * d,
        "{}: q has {} floats, expected batch {} x n_heads {} x head_dim {}", what, q.size(), nb, n_heads, d);
  std::vector<float> out(q.size());
  for (int b = 0; b < nb; ++b) {
    const int64_t T = batch.seq_lens[b];
    const int64_t t0 = first_visible_key(T - 1, batch.window);  // 0 without a window
    // Row of side s (0 = K, 1 = V) of token t of KV head h.
    auto row = [&](int64_t t, int h, int s) {
      return pool.data() + static_cast<size_t>(batch.page(b, t / kPageTokens)) * page_elems +
             (static_cast<size_t>(h) * 2 + s) * kPageTokens * d + static_cast<size_t>(t % kPageTokens) * d;
    };
#pragma omp parallel for schedule(dynamic) if (T * n_heads >= 4096)
    for (int qh = 0; qh < n_heads; ++qh) {
      const int h = qh / gqa;
      const float* qv = q.data() + (static_cast<size_t>(b) * n_heads + qh) * d;
      std::vector<double> qs(d), p(T, 0.0), o(d, 0.0);
      for (int i = 0; i < d; ++i) qs[i] = round_fp16(scale * qv[i]);
      double mx = -INFINITY;
      for (int64_t t = t0; t < T; ++t) {
        const uint16_t* k = row(t, h, 0);
        double s = 0;
        for (int i = 0; i < d; ++i) s += qs[i] * fp16_to_fp32(k[i]);
        mx = std::max(mx, p[t] = s);
      }
      double l = 0;
      for (int64_t t = t0; t < T; ++t) l += (p[t] = std::exp(p[t] - mx));
      for (int64_t t = t0; t < T; ++t) {
        const uint16_t* v = row(t, h, 1);
        for (int i = 0; i < d; ++i) o[i] += p[t] * fp16_to_fp32(v[i]);
      }
      float* dst = out.data() + (static_cast<size_t>(b) * n_heads + qh) * d;
      for (int i = 0; i < d; ++i) dst[i] = static_cast<float>(o[i] / l);
    }
  }
  return out;
}

}  // namespace ratekv::ref
