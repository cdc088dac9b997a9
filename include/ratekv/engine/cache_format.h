// ratekv/engine/cache_format.h — what the GPU engine's page pool stores per
// layer: fp16 K/V (the baseline) or a plan's packed codes
// (docs/packed_format.md), with the tables the CUDA kernels need.
//
// fp16 pages: per (page, KV head) K (64, head_dim) then V (64, head_dim) fp16,
// 4·64·head_dim·n_kv_heads bytes a page (cuda::fp16_decode_attention).
// Packed pages: packed::LayerLayout of the layer's groups; the rotations Π_g
// (y = Π_g u, dim×dim fp32 row-major) and Lloyd–Max levels of every group in
// the order cuda::PackedPlan takes them (KV head, side, group).
//
// Served on the GPU (issue 17): tq-mse and tq-mse-grouped codecs — uniform
// TQ-MSE, Block-GTQ, RateQuant — with every group at 1..4 bits, no fp16
// window, no sink tokens, head_dim 64/128/256, GQA ≤ 16. Everything else is
// refused when the format is built (before any GPU work), naming the plan
// field and why: fp16 sides mixed with packed ones, vq (TaSQ/CQ) sides, kivi /
// quarot / q8_0 / q4_0 (no packed storage), 0-bit and 5..8-bit groups
// (engine issue 2 of 3).
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ratekv/cache/plan_codecs.h"
#include "ratekv/format/packed_format.h"
#include "ratekv/model/model.h"

namespace ratekv::engine {

class CacheFormat {
 public:
  /// fp16 pages for `cfg` (label "fp16").
  static CacheFormat fp16(const ModelConfig& cfg);
  /// The packed pages of `codecs` (label: `label`, or "K<b>V<b>" for a plan
  /// with one uniform width per side, else "plan:<method>"). Throws Error as
  /// the file comment says; the message starts "GPU engine: plan: layers[l]…".
  static CacheFormat packed(std::shared_ptr<const cache::PlanCodecs> codecs, std::string label = "");
  /// Whether `codecs` can be served (empty string) or why not (the message
  /// packed() would throw).
  static std::string unsupported_reason(const cache::PlanCodecs& codecs);

  bool is_fp16() const { return fp16_; }
  const std::string& label() const { return label_; }
  int n_layers() const { return n_layers_; }
  int head_dim() const { return head_dim_; }
  int n_kv_heads() const { return n_kv_heads_; }
  /// Bytes of one page (64 tokens, all KV heads) of `layer`.
  size_t page_bytes(int layer) const { return page_bytes_.at(layer); }
  /// Σ over layers of page_bytes: one page of every layer.
  size_t page_bytes_all_layers() const;
  /// Stored bytes per token over all layers (page_bytes_all_layers / 64).
  double bytes_per_token() const { return static_cast<double>(page_bytes_all_layers()) / packed::kPageTokens; }
  /// Packed only (Error for fp16): the layer's layout, rotations and levels.
  const packed::LayerLayout& layout(int layer) const;
  std::span<const float> rotations(int layer) const;
  std::span<const float> levels(int layer) const;
  /// The plan (null for fp16).
  const std::shared_ptr<const cache::PlanCodecs>& codecs() const { return codecs_; }

 private:
  bool fp16_ = true;
  std::string label_;
  int n_layers_ = 0, head_dim_ = 0, n_kv_heads_ = 0;
  std::vector<size_t> page_bytes_;
  std::vector<packed::LayerLayout> layouts_;
  std::vector<std::vector<float>> rotations_, levels_;
  std::shared_ptr<const cache::PlanCodecs> codecs_;
};

}  // namespace ratekv::engine
