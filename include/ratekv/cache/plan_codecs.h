// ratekv/cache/plan_codecs.h — the quantizers a plan prescribes, built once
// per (layer, KV head, side) and checked against the model (docs/design.md §1).
//
// Plan codec kind → quantizer (quant/*.h), head_dim d, RoPE pairs of the
// model's layout:
//   fp16            none: values are stored rounded to fp16
//   tq-mse          tq_mse {dim d, bits, seed, norm fp16}
//   tq-mse-grouped  grouped_tq_mse: group g takes the channels
//                   rope_pairs(layout)[i] of its blocks i, in listed order
//                   (a_i, b_i per block), with its bits and seed; bits 0 drops them
//   kivi            keys: kivi_key {bits, group_size = tokens per group}
//                   (per_channel_tokens scope); values: kivi_value {bits,
//                   group_size = channels per group}; both an fp16 scale and
//                   zero per group, so 32/group_size metadata bits per element
//   quarot          quarot {bits, seed, asymmetric (scale + zero), group_size,
//                   rotation hadamard}
//   q8_0, q4_0      ggml blocks of 32
//   vq              VqCodec (cache/vq_codec.h) from the plan's side file; a
//                   layer's K (or V) codecs are all vq or none; vq keys are
//                   quantized pre-RoPE (the cache re-applies RoPE)
// Whole-head kinds must list the channels 0..d−1 in order (Error otherwise).
// Codec options (format/plan.h): "norm_correction" is passed to the TQ-MSE
// quantizers; a key "offset" μ (pre-RoPE) makes fake_quant quantize
// k − R_p μ and add R_p μ back, R_p = RoPE at the row's position p with the
// layer's base and the model's layout (docs/design.md §2.5).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ratekv/model/model.h"
#include "ratekv/cache/vq_codec.h"
#include "ratekv/format/plan.h"
#include "ratekv/quant/quantizer.h"

namespace ratekv::cache {

/// Which half of the cache a codec encodes.
enum class KVSide { key = 0, value = 1 };

/// Quantizers of every (layer, KV head, side) of a plan. Immutable; the
/// quantizers are thread-safe.
class PlanCodecs {
 public:
  /// Validates the plan (Plan::validate) and that it matches the model
  /// (arch, n_layers, n_kv_heads, head_dim, RoPE layout; Error listing each
  /// mismatch), then builds the quantizers. `name` (file name) prefixes errors.
  /// Plans with vq codecs load their side file (plan.tensors_file, relative
  /// to plan.source_dir) and validate it against the plan.
  PlanCodecs(Plan plan, const ModelConfig& cfg, const std::string& name = "plan");
  /// As above with the vq side file given in memory (nullptr: load it).
  PlanCodecs(Plan plan, const ModelConfig& cfg, const std::string& name, std::shared_ptr<const VqTensors> vq_tensors);

  const Plan& plan() const { return plan_; }
  const ModelConfig& config() const { return cfg_; }
  /// The quantizer of (layer, head, side); nullptr for an fp16 codec.
  const quant::Quantizer* quantizer(int layer, int head, KVSide side) const;
  /// The vq codec of (layer, head, side), nullptr when the codec is not vq.
  const VqCodec* vq(int layer, int head, KVSide side) const;
  /// True when the layer's codecs of `side` are vq (then all of its heads are).
  bool layer_is_vq(int layer, KVSide side) const { return vq(layer, 0, side) != nullptr; }
  /// Quantize → dequantize T tokens of all KV heads of a vq layer side:
  /// x, out (T, n_kv_heads, head_dim), may alias; keys pre-RoPE. Throws
  /// Error when the layer side is not vq.
  void fake_quant_layer(int layer, KVSide side, const float* x, int64_t T, float* out) const;

  /// Quantize → dequantize T rows of one head (not for vq codecs: Error;
  /// use fake_quant_layer). x, xhat: (T, head_dim)
  /// contiguous, may alias. fp16 codecs round to fp16. For per_channel_tokens
  /// codecs (KIVI keys) row 0 must start a token group; rows past the last
  /// full group come back fp16-rounded (the quantizer's window).
  /// Throws Error when the codec has a key offset (it needs positions: the
  /// overload below).
  void fake_quant(int layer, int head, KVSide side, const float* x, int64_t T, float* xhat) const;
  /// As above with the rows' positions pos (T; keys are post-RoPE at them):
  /// a key offset μ is subtracted as R_pos μ before quantizing and added back.
  /// pos may be null when the codec has no offset.
  void fake_quant(int layer, int head, KVSide side, const float* x, const int32_t* pos, int64_t T,
                  float* xhat) const;
  /// The key offset of (layer, head) (head_dim values, pre-RoPE), or nullptr.
  const float* key_offset(int layer, int head) const;
  /// True when any key codec of the plan has an offset.
  bool has_key_offsets() const;

  /// The quantizer JSON description of a plan codec (see file comment).
  /// Throws Error naming `field` for unsupported kinds or channel lists.
  static nlohmann::json quantizer_json(const Codec& c, KVSide side, int head_dim, RopeLayout layout,
                                       const std::string& field);

 private:
  // The codec's quantizer on T rows as they are (no offset).
  void fake_quant_rows(int layer, int head, KVSide side, const float* x, int64_t T, float* xhat) const;
  Plan plan_;
  ModelConfig cfg_;
  std::vector<std::unique_ptr<quant::Quantizer>> q_;  // ((layer · n_kv_heads + head) · 2 + side)
  std::shared_ptr<const VqTensors> vq_tensors_;
  std::vector<std::unique_ptr<VqCodec>> vq_;         // same index; null when not vq
};

/// A copy of `plan` whose every rotation seed (TQ kinds, quarot) is replaced
/// by a deterministic mix of the stored seed and `run_seed` (SplitMix64);
/// run_seed 0 returns the plan unchanged. Used to repeat an evaluation over
/// independent rotations (docs/design.md §9.3).
Plan reseeded_plan(const Plan& plan, uint64_t run_seed);

/// The PlanTarget of a model config (arch, shape, RoPE layout name).
PlanTarget plan_target(const ModelConfig& cfg);

}  // namespace ratekv::cache
