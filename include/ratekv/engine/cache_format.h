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
// Served on the GPU: tq-mse and tq-mse-grouped codecs — uniform TQ-MSE,
// Block-GTQ, RateQuant — with groups of 0..8 bits (a 5..8-bit group keeps its
// low 4 bits in the layer's pages and its high bits in the layer's extension
// pages, docs/packed_format.md §5: a page is then the layer's page followed
// by its extension page, and in the pool the extension pages follow the
// layer's pages), and
// (issue 18) TaSQ / CQ layers: a layer whose key side is vq (or fp16, every
// KV head) keeps that side — and a vq / fp16 value side — in the layer's vq
// pages (docs/packed_format.md §7), a tq-mse value side in its scalar pages;
// no fp16 window, no sink tokens, head_dim 64/128/256, GQA ≤ 16. A vq layer's
// page (page_bytes) is its scalar page followed by its vq page; in the pool
// the scalar pages of a layer come first (pages · scalar_page_bytes bytes),
// then its vq pages (vq_pool_offset). Everything else is refused when the
// format is built (before any GPU work), naming the plan field and why: fp16
// or vq value sides under tq-mse keys, fp16 sides on only some KV heads,
// 5..8-bit groups in a layer with vq sides, kivi / quarot / q8_0 / q4_0 (no
// packed storage), key offsets, other norm codings.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ratekv/cache/plan_codecs.h"
#include "ratekv/format/packed_format.h"
#include "ratekv/format/packed_vq_format.h"
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
  /// Packed only (Error for fp16): the layer's scalar layout (a vq layer:
  /// its tq-mse value groups, or none), rotations and levels (the order of
  /// cuda::PackedPlan).
  const packed::LayerLayout& layout(int layer) const;
  std::span<const float> rotations(int layer) const;
  std::span<const float> levels(int layer) const;

  /// The vq pages of a layer (docs/packed_format.md §7) and the tables the
  /// CUDA vq kernels take (cuda::VqPlan: reconstruction codewords C̃ and
  /// channel lists; cuda::VqEncodePlan: weighted-space codebooks C, channel
  /// weights a, channel lists), per (KV head, side) whose codec is vq.
  struct VqLayer {
    packed::VqLayerLayout layout;
    std::vector<float> codewords, codebooks, channel_scale;
    std::vector<int32_t> channels;
  };
  /// The layer's vq pages, or nullptr when it has none (every layer of an
  /// fp16 format or of a scalar plan).
  const VqLayer* vq(int layer) const;
  /// Whether any layer has vq pages.
  bool has_vq() const;
  /// Bytes of one scalar page of the layer with its extension page
  /// (page_bytes minus its vq page).
  size_t scalar_page_bytes(int layer) const;
  /// The layer's extension layout (high bits of its 5..8-bit groups), or
  /// nullptr when it has none.
  const packed::LayerLayout* ext_layout(int layer) const;
  /// The plan (null for fp16).
  const std::shared_ptr<const cache::PlanCodecs>& codecs() const { return codecs_; }

 private:
  bool fp16_ = true;
  std::string label_;
  int n_layers_ = 0, head_dim_ = 0, n_kv_heads_ = 0;
  std::vector<size_t> page_bytes_;
  std::vector<packed::LayerLayout> layouts_;
  std::vector<std::vector<float>> rotations_, levels_;
  std::vector<std::optional<VqLayer>> vq_;
  std::vector<std::optional<packed::LayerLayout>> ext_;
  std::shared_ptr<const cache::PlanCodecs> codecs_;
};

}  // namespace ratekv::engine
