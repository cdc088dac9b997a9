// FakeQuantKVCache: DenseKVCache whose stored K/V are a plan's reconstructions.
#include "ratekv/cache/fake_quant_cache.h"

#include <algorithm>
#include <cstring>

#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/common/parallel_errors.h"

namespace ratekv::cache {

FakeQuantKVCache::FakeQuantKVCache(const KVCacheShape& shape, std::shared_ptr<const PlanCodecs> codecs,
                                   FakeQuantOptions opt)
    : DenseKVCache(shape), codecs_(std::move(codecs)), opt_(opt) {
  check(codecs_ != nullptr, "FakeQuantKVCache: no plan codecs");
  const ModelConfig& c = codecs_->config();
  check(shape.n_layers == c.n_layers && shape.n_kv_heads == c.n_kv_heads && shape.head_dim == c.head_dim,
        "FakeQuantKVCache: cache shape (layers {}, KV heads {}, head_dim {}) does not match the plan's model "
        "(layers {}, KV heads {}, head_dim {})",
        shape.n_layers, shape.n_kv_heads, shape.head_dim, c.n_layers, c.n_kv_heads, c.head_dim);
  window_ = opt_.fp16_window.value_or(codecs_->plan().fp16_window);
  sink_ = opt_.sink_tokens.value_or(codecs_->plan().sink_tokens);
  check(window_ >= 0 && sink_ >= 0, "FakeQuantKVCache: fp16 window {} and sink tokens {} must be ≥ 0", window_,
        sink_);
  orig_.resize(shape.n_layers);
}

void FakeQuantKVCache::append(int layer, int64_t n, const int32_t* pos, const float* k_pre, const float* k_post,
                              const float* v) {
  DenseKVCache::append(layer, n, pos, k_pre, k_post, v);  // validates; stores the originals in layers_
  const int Hkv = shape_.n_kv_heads, d = shape_.head_dim;
  const int64_t row = int64_t{Hkv} * d;
  Layer& L = layers_[layer];
  Orig& O = orig_[layer];
  const int64_t T = static_cast<int64_t>(L.pos.size()), T0 = T - n;
  O.k.insert(O.k.end(), k_post, k_post + n * row);
  if (codecs_->layer_is_vq(layer, KVSide::key)) O.k_pre.insert(O.k_pre.end(), k_pre, k_pre + n * row);
  O.v.insert(O.v.end(), v, v + n * row);
  const int64_t end = std::max<int64_t>(sink_, T - window_);  // quantized region [sink, end)
  const int64_t prev = O.done;

  for (int s = 0; s < 2; ++s) {
    const bool on = s == 0 ? opt_.quantize_k : opt_.quantize_v;
    if (!on) continue;  // stored exactly by DenseKVCache::append
    const KVSide side = static_cast<KVSide>(s);
    const std::vector<float>& src = s == 0 ? O.k : O.v;
    std::vector<float>& dst = s == 0 ? L.k : L.v;
    // New rows outside the quantized region: sink / window, rounded to fp16.
    for (int64_t t = T0; t < T; ++t) {
      if (t >= sink_ && t < end) continue;
      float v = 0;
      const int64_t bad = round_fp16_span(src.data() + t * row, row, dst.data() + t * row, &v);
      check(bad < 0, "FakeQuantKVCache::append: layer {}: {} of token {}, KV head {}, channel {} is {}, beyond "
            "fp16 (|x| <= 65504), and this row is stored as fp16 (sink / fp16 window)", layer,
            s == 0 ? "key" : "value", t, bad / shape_.head_dim, bad % shape_.head_dim, v);
    }
    if (codecs_->layer_is_vq(layer, side)) {  // all heads at once (shared scale); keys pre-RoPE
      const int64_t a = std::max<int64_t>(sink_, prev);
      if (end <= a) continue;
      const int64_t m = end - a;
      const std::vector<float>& x = s == 0 ? O.k_pre : O.v;
      std::vector<float> buf(x.begin() + a * row, x.begin() + end * row);
      codecs_->fake_quant_layer(layer, side, buf.data(), m, buf.data());
      if (s == 0) {
        const ModelConfig& c = codecs_->config();
        for (int64_t t = 0; t < m; ++t)
          apply_rope(buf.data() + t * row, Hkv, d, L.pos[a + t], c.rope_layout, c.layer_rope_theta(layer));
      }
      std::copy(buf.begin(), buf.end(), dst.begin() + a * row);
      continue;
    }
    // A quantizer's error (an fp16 overflow of a norm or a scale) is carried out of the region: thrown inside
    // it, it would std::terminate the process.
    FirstError err;
#pragma omp parallel for schedule(static) if (Hkv > 1 && (end - prev) * d >= 4096)
    for (int h = 0; h < Hkv; ++h) err.run([&] {
      const quant::Quantizer* q = codecs_->quantizer(layer, h, side);
      int64_t a = std::max<int64_t>(sink_, prev);
      if (q && q->scope() == quant::QuantScope::per_channel_tokens) {
        const int64_t g = q->tokens_per_group();
        a = sink_ + (std::max<int64_t>(prev - sink_, 0) / g) * g;
      }
      if (end <= a) return;
      const int64_t m = end - a;
      std::vector<float> buf(m * d);
      for (int64_t t = 0; t < m; ++t)
        std::memcpy(buf.data() + t * d, src.data() + (a + t) * row + int64_t{h} * d, sizeof(float) * d);
      codecs_->fake_quant(layer, h, side, buf.data(), L.pos.data() + a, m, buf.data());
      for (int64_t t = 0; t < m; ++t)
        std::memcpy(dst.data() + (a + t) * row + int64_t{h} * d, buf.data() + t * d, sizeof(float) * d);
    });
    err.rethrow();
  }
  O.done = std::max(prev, end);
}

void FakeQuantKVCache::clear() {
  DenseKVCache::clear();
  for (auto& o : orig_) o = Orig{};
}

size_t FakeQuantKVCache::bytes() const {
  size_t b = DenseKVCache::bytes();
  for (const auto& o : orig_) b += (o.k.size() + o.k_pre.size() + o.v.size()) * sizeof(float);
  return b;
}

void fake_quant_sequence(const PlanCodecs& codecs, int layer, KVSide side, const float* x, int64_t T, int window,
                         int sink, float* out) {
  check(!(side == KVSide::key && codecs.layer_is_vq(layer, side)),
        "fake_quant_sequence: layer {} keys are vq (quantized pre-RoPE): use the overload with pre-RoPE keys and "
        "positions", layer);
  fake_quant_sequence(codecs, layer, side, x, nullptr, nullptr, T, window, sink, out);
}

void fake_quant_sequence(const PlanCodecs& codecs, int layer, KVSide side, const float* x, const float* k_pre,
                         const int32_t* pos, int64_t T, int window, int sink, float* out) {
  const ModelConfig& c = codecs.config();
  check(T >= 0 && window >= 0 && sink >= 0, "fake_quant_sequence: T {}, window {}, sink {} must be ≥ 0", T, window,
        sink);
  const int Hkv = c.n_kv_heads, d = c.head_dim;
  const int64_t row = int64_t{Hkv} * d;
  const int64_t a = std::min<int64_t>(sink, T), end = std::max<int64_t>(a, T - window);
  for (const auto& [r0, r1] : {std::pair<int64_t, int64_t>{0, a}, {end, T}}) {  // sink, then window rows: fp16
    float v = 0;
    const int64_t bad = round_fp16_span(x + r0 * row, (r1 - r0) * row, out + r0 * row, &v);
    check(bad < 0, "fake_quant_sequence: layer {}: row {}, KV head {}, channel {} is {}, beyond fp16 (|x| <= 65504), "
          "and this row is stored as fp16 (sink / fp16 window)", layer, r0 + bad / row, (bad % row) / d, bad % d, v);
  }
  const int64_t m = end - a;
  if (m <= 0) return;
  if (codecs.layer_is_vq(layer, side)) {
    const bool key = side == KVSide::key;
    check(!key || (k_pre != nullptr && pos != nullptr),
          "fake_quant_sequence: layer {} keys are vq: pre-RoPE keys and positions are needed", layer);
    const float* src = key ? k_pre : x;
    std::vector<float> buf(src + a * row, src + end * row);
    codecs.fake_quant_layer(layer, side, buf.data(), m, buf.data());
    if (key)
      for (int64_t t = 0; t < m; ++t)
        apply_rope(buf.data() + t * row, Hkv, d, pos[a + t], c.rope_layout, c.layer_rope_theta(layer));
    std::copy(buf.begin(), buf.end(), out + a * row);
    return;
  }
  std::vector<float> buf(m * d);
  for (int h = 0; h < Hkv; ++h) {
    for (int64_t t = 0; t < m; ++t) std::memcpy(buf.data() + t * d, x + (a + t) * row + int64_t{h} * d, sizeof(float) * d);
    codecs.fake_quant(layer, h, side, buf.data(), pos ? pos + a : nullptr, m, buf.data());
    for (int64_t t = 0; t < m; ++t) std::memcpy(out + (a + t) * row + int64_t{h} * d, buf.data() + t * d, sizeof(float) * d);
  }
}

}  // namespace ratekv::cache
