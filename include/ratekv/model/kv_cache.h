// ratekv/model/kv_cache.h — the KV cache interface the model runtime attends through.
//
// One cache holds one sequence for every layer. The model calls, per layer and
// per forward chunk of n new tokens (prefill: the whole prompt chunk; decode:
// n = 1):
//   1. append(layer, n, pos, k_pre, k_post, v)  — store the new tokens;
//   2. attend(layer, n, pos, q, out, params)    — causal attention of the n
//      new queries over everything cached for that layer (including the new
//      tokens themselves).
// The cache decides how K/V are stored (fp32, fake-quant, packed codes) and how
// attention is computed from what it stored. Keys arrive both pre-RoPE and
// post-RoPE so caches that quantize pre-RoPE keys (TaSQ) can re-apply RoPE.
//
// Layouts (row-major, innermost last):
//   k_pre, k_post, v : (n, n_kv_heads, head_dim)
//   q (post-RoPE)    : (n, n_heads, head_dim)
//   out              : (n, n_heads, head_dim)
//   pos              : (n) absolute positions, strictly increasing per layer
// GQA: query head g reads KV head g / (n_heads / n_kv_heads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace ratekv {

/// Shape of the cache for one model (from the model config).
struct KVCacheShape {
  int n_layers = 0;
  int n_heads = 0;      // query heads
  int n_kv_heads = 0;
  int head_dim = 0;
  int64_t n_ctx = 0;    // capacity in tokens; append past it throws Error

  /// Checks what every cache needs: positive sizes, n_kv_heads dividing
  /// n_heads, n_ctx within int32 positions. Throws Error prefixed by `who`.
  void validate(const char* who) const;
};

/// Per-layer attention rules.
struct AttnParams {
  float scale = 0.0f;         // logit scale, usually 1/sqrt(head_dim)
  int64_t sliding_window = 0; // 0 = full causal; else a query at p sees keys at > p - window
  float softcap = 0.0f;       // 0 = off; else logits = softcap * tanh(logits / softcap)
};

/// Abstract cache. Implementations: DenseKVCache (fp32 reference) here;
/// fake-quant and packed caches in src/cache/.
class KVCache {
 public:
  virtual ~KVCache() = default;
  virtual const KVCacheShape& shape() const = 0;
  /// Stores n tokens for `layer`. Throws Error past capacity or on
  /// non-increasing positions.
  virtual void append(int layer, int64_t n, const int32_t* pos, const float* k_pre,
                      const float* k_post, const float* v) = 0;
  /// Causal attention of n queries (positions `pos`) over the cached tokens of
  /// `layer`; writes softmax(scale·q·Kᵀ)·V to out.
  virtual void attend(int layer, int64_t n, const int32_t* pos, const float* q, float* out,
                      const AttnParams& params) = 0;
  /// Tokens currently cached (for layer 0).
  virtual int64_t n_tokens() const = 0;
  /// Drops everything (all layers).
  virtual void clear() = 0;
  /// Bytes of K/V storage currently held (codes + metadata; measured from the
  /// allocations, not computed from a formula).
  virtual size_t bytes() const = 0;
};

/// The fp32 reference cache: stores post-RoPE K and V as given, attention in
/// fp32 with a numerically stable softmax. OpenMP over heads.
class DenseKVCache : public KVCache {
 public:
  explicit DenseKVCache(const KVCacheShape& shape);
  const KVCacheShape& shape() const override { return shape_; }
  void append(int layer, int64_t n, const int32_t* pos, const float* k_pre, const float* k_post,
              const float* v) override;
  void attend(int layer, int64_t n, const int32_t* pos, const float* q, float* out,
              const AttnParams& params) override;
  int64_t n_tokens() const override;
  void clear() override;
  size_t bytes() const override;

 protected:
  /// Hook for subclasses (fake-quant): rewrite the n new tokens' K (post-RoPE,
  /// and pre-RoPE if needed) and V in place before they are stored.
  /// Layouts as in append(). Default: no change.
  virtual void transform(int layer, int64_t n, const int32_t* pos, float* k_pre, float* k_post,
                         float* v) {
    (void)layer; (void)n; (void)pos; (void)k_pre; (void)k_post; (void)v;
  }

  KVCacheShape shape_;
  struct Layer {
    std::vector<float> k;    // (T, n_kv_heads, head_dim) post-RoPE
    std::vector<float> v;    // (T, n_kv_heads, head_dim)
    std::vector<int32_t> pos;
  };
  std::vector<Layer> layers_;
};

}  // namespace ratekv
