// ratekv/cache/vq_codec.h — run time of the plan codec kind "vq": TaSQ keys
// and CQ keys/values (docs/design.md §5.5, §5.6).
//
// One VqCodec encodes one side (K or V) of one (layer, KV head). With head_dim
// d, G = d/g groups of g channels (the plan's group lists, in listed order),
// K = 2^bits centroids per group:
//   y_c   = a_c · x_c                 per-channel weight a = sqrt(diag Ã)
//                                     (channel_scale; all ones for CQ)
//   s_p   = fp16(RMS over all KV heads and channels of y)   (shared scale;
//                                     1 when the codec has norm "none")
//   z_G   = argmin_j ‖y[G]/s_p − C_G[j]‖²   (squared Euclidean, ties → lowest j;
//                                     fp32, Σ over the group's coordinates in
//                                     order as fma(e, e, Σ), e = y_i − c_i)
//   x̂[G]  = s_p · C̃_G[z_G],  C̃_G[j]_i = C_G[j]_i / a_{G_i}
// The inverse weighting is folded into the reconstruction codewords C̃ when
// the codec is built, so decoding is one lookup and one multiply. For keys x
// is the pre-RoPE key; the cache applies RoPE at the key's position to x̂.
//
// Stored per token: one index of `bits` bits per group (G·bits bits per head)
// and, with a shared scale, one fp16 per token per layer (16/n_kv_heads bits
// per head): Codec::effective_bits. The codebooks are a fixed per-plan cost
// (VqTensors::codebook_bytes, ratekv/format/vq_tensors.h), not per token.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ratekv/format/plan.h"
#include "ratekv/format/vq_tensors.h"

namespace ratekv::cache {

/// One vq codec (see the file comment). Immutable and thread-safe after
/// construction.
class VqCodec {
 public:
  /// `codec` must be a valid vq codec for head_dim d (Plan::validate);
  /// codebooks (G, 2^bits, g), channel_scale (d) or empty. Throws Error on a
  /// size mismatch or a non-positive channel scale.
  VqCodec(const Codec& codec, int head_dim, std::span<const float> codebooks, std::span<const float> channel_scale);

  int head_dim() const { return d_; }
  int group_size() const { return g_; }
  int n_groups() const { return n_groups_; }
  int n_centroids() const { return k_; }
  bool shared_scale() const { return shared_; }
  /// Channels of group gi, in the order of the codebook coordinates.
  const std::vector<int>& group_channels(int gi) const { return groups_[gi]; }
  /// a_c (all ones for unweighted codecs).
  const std::vector<float>& channel_scale() const { return a_; }
  /// The codebooks C in the weighted space, (G, K, g) row-major: what encode
  /// compares y = a·x/s with (the GPU encoder, cuda::VqEncodePlan, takes them).
  const std::vector<float>& codebooks() const { return c_; }

  /// Σ_c (a_c x_c)² over the head (for the shared RMS scale).
  double weighted_sq_sum(const float* x) const;
  /// Indices of one head vector x (d) at scale s (> 0): codes has n_groups().
  void encode(const float* x, float s, int32_t* codes) const;
  /// x̂ (d) = s · C̃[codes] in the original channel order.
  void decode(const int32_t* codes, float s, float* xhat) const;

 private:
  int d_ = 0, g_ = 0, n_groups_ = 0, k_ = 0;
  bool shared_ = false;
  std::vector<std::vector<int>> groups_;
  std::vector<float> a_;
  std::vector<float> c_;      // (G, K, g) VQ space
  std::vector<float> recon_;  // (G, K, g) with 1/a folded in
};

/// The shared fp16 scale of one token: fp16(sqrt(Σ_h weighted_sq_sum / (H·d))),
/// at least the smallest fp16 subnormal (so a zero key has scale 2^-24 and
/// decodes to s·C̃). Throws Error when it overflows fp16 or is not finite.
float vq_shared_scale(double weighted_sq_sum_all_heads, int n_heads, int head_dim);

/// Quantize → dequantize T tokens of one layer side: x, out (T, H, d) with
/// `heads[h]` the codec of head h (all vq; shared scale iff heads[0] has it).
/// May alias. Optional outputs: codes (T, H, G), scales (T) (1 when unshared).
void vq_fake_quant_layer(std::span<const VqCodec* const> heads, const float* x, int64_t T, float* out,
                         int32_t* codes = nullptr, float* scales = nullptr);

}  // namespace ratekv::cache
