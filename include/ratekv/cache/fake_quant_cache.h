// ratekv/cache/fake_quant_cache.h — a KV cache that stores what a plan's
// codecs would reconstruct (quantize → dequantize at append time) and
// attends over it in fp32 exactly like DenseKVCache (docs/design.md §6, §9.2).
//
// Keys are quantized post-RoPE (the layout the model appends), except vq
// (TaSQ / CQ) key layers: quantized pre-RoPE, then RoPE at each key's position
// is applied to the reconstruction (docs/design.md §5.5); Block-GTQ
// groups select RoPE blocks through rope_pairs() (cache/plan_codecs.h).
//
// Token regions of one layer holding T tokens, with S sink tokens and an fp16
// window of W recent tokens (plan.sink_tokens / plan.fp16_window unless
// overridden; both 0 by default = "no buffer", docs/design.md §9.2):
//   [0, S)           sink: stored rounded to fp16
//   [S, max(S,T−W))  quantized: fake_quant of the original values
//   [max(S,T−W), T)  window: stored rounded to fp16 until it leaves the window
// The state after an append is what every query of that forward chunk sees
// (chunked-prefill semantics; with W = S = 0 this is exact per token, since
// each token's quantized value does not depend on later tokens for
// per-vector codecs). Per-channel-token codecs (KIVI keys) are re-run from the
// start of the last incomplete token group (group-aligned from S) over the
// original values, so a group's rows are requantized together once it fills;
// until then the quantizer keeps them fp16 (its own window).
// A side that is not quantized (quantize_k / quantize_v false) is stored
// exactly (fp32), as DenseKVCache does.
#pragma once

#include <memory>
#include <optional>
#include <span>

#include "ratekv/cache/plan_codecs.h"
#include "ratekv/model/kv_cache.h"

namespace ratekv::cache {

struct FakeQuantOptions {
  bool quantize_k = true;
  bool quantize_v = true;
  std::optional<int> fp16_window;  ///< overrides plan.fp16_window (≥ 0)
  std::optional<int> sink_tokens;  ///< overrides plan.sink_tokens (≥ 0)
};

class FakeQuantKVCache final : public DenseKVCache {
 public:
  /// Throws Error when `shape` (layers, KV heads, head_dim) differs from the
  /// codecs' model, or a window/sink override is negative.
  FakeQuantKVCache(const KVCacheShape& shape, std::shared_ptr<const PlanCodecs> codecs, FakeQuantOptions opt = {});

  void append(int layer, int64_t n, const int32_t* pos, const float* k_pre, const float* k_post,
              const float* v) override;
  void clear() override;
  /// Bytes held, including the original values kept for the window and
  /// per-channel-token requantization (this is an evaluation cache, not the
  /// packed one; its size says nothing about the compressed size).
  size_t bytes() const override;

  const PlanCodecs& codecs() const { return *codecs_; }
  /// What attention reads for `layer`: (n_tokens, n_kv_heads, head_dim).
  std::span<const float> keys(int layer) const { return layers_.at(layer).k; }
  std::span<const float> values(int layer) const { return layers_.at(layer).v; }
  int fp16_window() const { return window_; }
  int sink_tokens() const { return sink_; }

 private:
  std::shared_ptr<const PlanCodecs> codecs_;
  FakeQuantOptions opt_;
  int window_ = 0, sink_ = 0;
  struct Orig {
    std::vector<float> k, v;  // (T, n_kv_heads, head_dim) as appended (k post-RoPE)
    std::vector<float> k_pre; // (T, n_kv_heads, head_dim) pre-RoPE keys, kept for vq-key layers only
    int64_t done = 0;         // quantized region end after the last append
  };
  std::vector<Orig> orig_;
};

/// What a FakeQuantKVCache stores for one side of one layer after a single
/// append of all T tokens: x, out (T, n_kv_heads, head_dim), may not alias;
/// sink/window rows rounded to fp16, the rest fake-quantized per head (see
/// the file comment). Used by the evaluation to get k̂ without a cache.
/// Throws Error for a layer whose keys are vq or have an offset (they need the
/// overload below).
void fake_quant_sequence(const PlanCodecs& codecs, int layer, KVSide side, const float* x, int64_t T, int window,
                         int sink, float* out);
/// As above; for vq key layers (quantized pre-RoPE, docs/design.md §5.5) the
/// quantized rows are reconstructed from k_pre (T, n_kv_heads, head_dim) and
/// rotated with RoPE at pos[t]; x holds the post-RoPE keys (for the sink and
/// window rows). Keys with an offset (format/plan.h) need pos too (the offset
/// is rotated to each row's position). k_pre/pos may be null for other
/// layers and for values.
void fake_quant_sequence(const PlanCodecs& codecs, int layer, KVSide side, const float* x, const float* k_pre,
                         const int32_t* pos, int64_t T, int window, int sink, float* out);

}  // namespace ratekv::cache
