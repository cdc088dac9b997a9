// ratekv/format/vq_tensors.h — the tensor side file of a plan with vq codecs
// (TaSQ / CQ, docs/plan_format.md): the k-means codebooks and the TaSQ
// per-channel weights of every vq (layer, KV head, side), and the digest that
// ties a side file to the plan layout it was written for. The codec that
// encodes and decodes with these tensors is cache::VqCodec
// (ratekv/cache/vq_codec.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ratekv/format/plan.h"

namespace ratekv {

/// The side file of a plan with vq codecs (plan "tensors"; safetensors,
/// format "ratekv-vq-tensors" version 1, docs/plan_format.md). Tensors, F16
/// (the cost the plan reports: format/stored_bytes.h plan_codebook_bytes),
/// for every (layer l, KV head h, side ∈ {key, value}) whose codec is vq:
///   l{l}.h{h}.{side}.codebooks      (G, K, g)  centroids C in the VQ space
///                                              (after weighting and scale),
///                                              channels in group list order
///   l{l}.h{h}.{side}.channel_scale  (d)        a_c > 0; absent = all ones
struct VqTensors {
  static constexpr int kFormatVersion = 1;
  static constexpr const char* kFormat = "ratekv-vq-tensors";

  struct Entry {
    bool present = false;
    std::vector<float> codebooks;      ///< (G, K, g)
    std::vector<float> channel_scale;  ///< (d) or empty (all ones)
  };
  PlanTarget model;            ///< arch, n_layers, n_kv_heads, head_dim, rope layout
  std::vector<Entry> entries;  ///< ((l · n_kv_heads + h) · 2 + side)

  /// An empty set for `plan`'s model (entries sized, none present).
  static VqTensors for_plan(const Plan& plan);
  Entry& at(int layer, int head, int side);
  const Entry& at(int layer, int head, int side) const;

  /// Checks that every vq codec of `plan` has an entry of the right shape
  /// (G, 2^bits, group_size), finite values, positive finite channel scales,
  /// that no other codec has one, and that the model matches. Throws Error
  /// naming `name` and the tensor.
  void validate_against(const Plan& plan, const std::string& name) const;
  /// Bytes of the codebooks as stored, fp16 (Σ G·K·g·2) — the fixed cost.
  int64_t codebook_bytes() const;
  /// Bytes the side file stores per plan: codebooks and channel scales, fp16.
  int64_t stored_bytes() const;

  /// Writes the safetensors file, every value as F16. Throws Error on I/O
  /// failure or a value that is not an fp16 number (naming the tensor and
  /// index; the fitter rounds codebooks and channel scales to fp16).
  void save(const std::string& path) const;
  /// Same, and records vq_layout_digest(plan) (__metadata__ "layout_sha256")
  /// so that load() can reject this file when it is paired with another plan
  /// (same tensor sizes but another channel grouping or width would decode
  /// silently wrong). Throws Error if the tensors do not fit `plan`.
  void save(const std::string& path, const Plan& plan) const;
  /// Reads a side file and validates it against `plan`. Throws Error naming
  /// the file for tensors not stored as F16, a wrong format/version/model, a recorded layout digest that
  /// differs from vq_layout_digest(plan) (side file of another plan), a
  /// missing or misshapen tensor, or non-finite values.
  static VqTensors load(const std::string& path, const Plan& plan);

 private:
  void write(const std::string& path, const std::string& layout_digest) const;
};

/// Hex SHA-256 of the layout of `plan`'s vq codecs: for every (layer, KV
/// head, side) whose codec is vq, its group size, norm, scale_heads and each
/// group's width and channel list, in order. Two plans with the same digest
/// read a side file the same way.
std::string vq_layout_digest(const Plan& plan);

}  // namespace ratekv
