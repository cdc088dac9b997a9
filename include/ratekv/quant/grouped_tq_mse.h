// ratekv/quant/grouped_tq_mse.h — TQ-MSE over channel subsets of a head
// vector: the Block-GTQ key codec (docs/design.md §3.3).
//
// A head vector of dim d is split into groups {channels, bits, seed}; each
// group is one TQ-MSE encoder of dimension |channels| over x[channels] (in the
// listed order), with its own rotation seed and one stored norm. For Block-GTQ
// a group is the union of the RoPE blocks given the same bit width, so
// |channels| = 2|G_b|. Channels in no group, and groups with bits = 0, are
// dropped (reconstructed as 0, no bits). Effective bits per element
//   = (Σ_groups |G|·b_G + norm_bits·#{groups with b_G > 0}) / d.
// A group of a single channel is rejected (TQ-MSE needs m ≥ 2).
// JSON: {"kind":"grouped_tq_mse","dim":d,"rotation":"haar","norm":"fp16",
//        "norm_correction":false,
//        "groups":[{"channels":[0,1,8,9],"bits":3,"seed":11}, ...]}
#pragma once

#include <vector>

#include "ratekv/quant/tq_mse.h"

namespace ratekv::quant {

/// One channel group: the channel indices (into the head vector), code bits, rotation seed.
struct ChannelGroup {
  std::vector<int> channels;
  int bits = 0;
  uint64_t seed = 0;
};

struct GroupedTQMSEConfig {
  int dim = 0;  // head_dim d
  std::vector<ChannelGroup> groups;
  RotationKind rotation = RotationKind::haar;
  NormCoding norm = NormCoding::fp16;
  bool norm_correction = false;
};

class GroupedTQMSE final : public Quantizer {
 public:
  /// Throws Error on dim < 1, a channel outside [0, dim), a channel in two
  /// groups, a group of < 2 channels, or bits ∉ [0, 8].
  explicit GroupedTQMSE(const GroupedTQMSEConfig& cfg);
  static GroupedTQMSEConfig config_from_json(const nlohmann::json& j);
  const GroupedTQMSEConfig& config() const { return cfg_; }
  /// The per-group TQ-MSE codecs, in config().groups order.
  const std::vector<TQMSE>& codecs() const { return codecs_; }

  /// Encodes a head vector x (dim): for group g, gathers x[channels_g] and
  /// writes its codes to idx + offset(g) and its stored norm to norms[g].
  /// idx: (Σ|G|) bytes, norms: (#groups). Dropped groups write nothing.
  void encode(const float* x, uint8_t* idx, float* norms) const;
  /// Inverse of encode; channels in no group get 0. x: (dim).
  void decode(const uint8_t* idx, const float* norms, float* x) const;
  /// Start of group g's codes in the idx array of encode().
  size_t code_offset(size_t g) const { return offsets_[g]; }
  size_t total_codes() const { return offsets_.back(); }

  QuantKind kind() const override { return QuantKind::grouped_tq_mse; }
  QuantScope scope() const override { return QuantScope::per_vector; }
  int dim() const override { return cfg_.dim; }
  double code_bits_per_element() const override;
  double bits_per_element(int64_t T) const override;
  using Quantizer::bits_per_element;  // the steady-state overload
  nlohmann::json to_json() const override;
  void fake_quant(const float* x, int64_t T, float* xhat) const override;

 private:
  GroupedTQMSEConfig cfg_;
  std::vector<TQMSE> codecs_;
  std::vector<size_t> offsets_;  // (#groups + 1)
};

}  // namespace ratekv::quant
