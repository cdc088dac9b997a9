// DenseKVCache: the fp32 reference KV cache and its causal GQA attention.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <omp.h>

#include "ratekv/common/error.h"
#include "ratekv/model/attention_state.h"
#include "ratekv/model/kv_cache.h"

namespace ratekv {

namespace {

// Turns raw dot products s[0..len) into softmax probabilities in place
// (attention_logit, max-subtracted exp): the whole row at once, the reference
// the packed cache's online states (SoftmaxState) must match. len > 0.
inline void softmax_row(float* s, int64_t len, const AttnParams& p) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < len; ++j) {
    s[j] = attention_logit(s[j], p);
    mx = std::max(mx, s[j]);
  }
  float sum = 0;
  for (int64_t j = 0; j < len; ++j) {
    s[j] = std::exp(s[j] - mx);
    sum += s[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < len; ++j) s[j] *= inv;
}

}  // namespace

void KVCacheShape::validate(const char* who) const {
  check(n_layers > 0 && n_heads > 0 && n_kv_heads > 0 && head_dim > 0 && n_ctx > 0,
        "{}: shape must be positive (n_layers {}, n_heads {}, n_kv_heads {}, head_dim {}, n_ctx {})", who, n_layers,
        n_heads, n_kv_heads, head_dim, n_ctx);
  check(n_heads % n_kv_heads == 0, "{}: n_kv_heads {} must divide n_heads {}", who, n_kv_heads, n_heads);
  check(n_ctx <= std::numeric_limits<int32_t>::max(), "{}: n_ctx {} exceeds int32 positions", who, n_ctx);
}

DenseKVCache::DenseKVCache(const KVCacheShape& shape) : shape_(shape) {
  shape.validate("DenseKVCache");
  layers_.resize(shape.n_layers);
}

void DenseKVCache::append(int layer, int64_t n, const int32_t* pos, const float* k_pre, const float* k_post,
                          const float* v) {
  check(layer >= 0 && layer < shape_.n_layers, "DenseKVCache::append: layer {} out of range [0, {})", layer,
        shape_.n_layers);
  check(n > 0, "DenseKVCache::append: n = {} must be positive", n);
  Layer& L = layers_[layer];
  const int64_t T = static_cast<int64_t>(L.pos.size());
  check(T + n <= shape_.n_ctx, "DenseKVCache::append: layer {}: {} cached + {} new tokens exceed capacity n_ctx = {}",
        layer, T, n, shape_.n_ctx);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t prev = (i == 0) ? (T > 0 ? L.pos.back() : -1) : pos[i - 1];
    check(pos[i] > prev, "DenseKVCache::append: layer {}: position {} is not greater than the previous {}", layer,
          pos[i], prev);
  }
  const int64_t row = int64_t{shape_.n_kv_heads} * shape_.head_dim;
  L.k.resize((T + n) * row);
  L.v.resize((T + n) * row);
  float* kd = L.k.data() + T * row;
  float* vd = L.v.data() + T * row;
  std::memcpy(kd, k_post, sizeof(float) * n * row);
  std::memcpy(vd, v, sizeof(float) * n * row);
  std::vector<float> kp(k_pre, k_pre + n * row);
  transform(layer, n, pos, kp.data(), kd, vd);
  L.pos.insert(L.pos.end(), pos, pos + n);
}

void DenseKVCache::attend(int layer, int64_t n, const int32_t* pos, const float* q, float* out,
                          const AttnParams& params) {
  check_attend_args("DenseKVCache::attend", layer, shape_.n_layers, n, params);
  const Layer& L = layers_[layer];
  const int64_t T = static_cast<int64_t>(L.pos.size());
  const int H = shape_.n_heads, Hkv = shape_.n_kv_heads, d = shape_.head_dim, ratio = H / Hkv;
  const int64_t qrow = int64_t{H} * d, kvrow = int64_t{Hkv} * d;
  std::vector<int64_t> lo, hi;
  query_key_ranges("DenseKVCache::attend", layer, L.pos, n, pos, params.sliding_window, lo, hi);

  // One row (query i, head h) per iteration, OpenMP across rows (only when
  // there is enough work to pay for waking the threads). Dot products and the
  // P·V accumulation are SIMD loops over head_dim.
  const bool par = n * H * T * d >= (int64_t{1} << 16);
#pragma omp parallel if (par)
  {
    std::vector<float> s(T);
#pragma omp for schedule(dynamic, 4)
    for (int64_t r = 0; r < n * H; ++r) {
      const int64_t i = r / H;
      const int h = static_cast<int>(r % H), hk = h / ratio;
      const float* qv = q + i * qrow + int64_t{h} * d;
      const int64_t len = hi[i] - lo[i];
      const float* kb = L.k.data() + lo[i] * kvrow + int64_t{hk} * d;
      for (int64_t j = 0; j < len; ++j) {
        const float* kv = kb + j * kvrow;
        float acc = 0;
#pragma omp simd reduction(+ : acc)
        for (int c = 0; c < d; ++c) acc += qv[c] * kv[c];
        s[j] = acc;
      }
      softmax_row(s.data(), len, params);
      float* o = out + i * qrow + int64_t{h} * d;
      std::fill(o, o + d, 0.0f);
      const float* vb = L.v.data() + lo[i] * kvrow + int64_t{hk} * d;
      for (int64_t j = 0; j < len; ++j) {
        const float* vv = vb + j * kvrow;
        const float p = s[j];
#pragma omp simd
        for (int c = 0; c < d; ++c) o[c] += p * vv[c];
      }
    }
  }
}

int64_t DenseKVCache::n_tokens() const { return static_cast<int64_t>(layers_[0].pos.size()); }

void DenseKVCache::clear() {
  for (auto& L : layers_) {
    L.k.clear();
    L.v.clear();
    L.pos.clear();
  }
}

size_t DenseKVCache::bytes() const {
  size_t b = 0;
  for (const auto& L : layers_) {
    b += L.k.size() * sizeof(float) + L.v.size() * sizeof(float) + L.pos.size() * sizeof(int32_t);
  }
  return b;
}

}  // namespace ratekv
