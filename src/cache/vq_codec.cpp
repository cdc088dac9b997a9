// VqCodec and vq_fake_quant_layer (ratekv/cache/vq_codec.h).
#include "ratekv/cache/vq_codec.h"

#include <cmath>
#include <limits>

#include <fmt/ranges.h>

#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"

namespace ratekv::cache {

// ---------------------------------------------------------------------------
// VqCodec
// ---------------------------------------------------------------------------

VqCodec::VqCodec(const Codec& codec, int head_dim, std::span<const float> codebooks,
                 std::span<const float> channel_scale)
    : d_(head_dim), g_(codec.group_size), n_groups_(static_cast<int>(codec.groups.size())) {
  check(codec.kind == CodecKind::Vq && g_ >= 1 && n_groups_ * g_ == d_ && !codec.groups.empty(),
        "VqCodec: not a valid vq codec for head_dim {}", head_dim);
  const int bits = codec.groups[0].bits;
  check(bits >= 1 && bits <= 16, "VqCodec: index width {} outside 1..16", bits);
  k_ = 1 << bits;
  shared_ = codec.norm == NormStorage::SharedFP16;
  check(codebooks.size() == static_cast<size_t>(n_groups_) * k_ * g_, "VqCodec: {} codebook values, expected {}",
        codebooks.size(), static_cast<size_t>(n_groups_) * k_ * g_);
  check(channel_scale.empty() || static_cast<int>(channel_scale.size()) == d_,
        "VqCodec: {} channel scales, expected {}", channel_scale.size(), d_);
  a_.assign(d_, 1.0f);
  for (size_t c = 0; c < channel_scale.size(); ++c) {
    check(std::isfinite(channel_scale[c]) && channel_scale[c] > 0.0f, "VqCodec: channel scale {} = {} must be > 0",
          c, channel_scale[c]);
    a_[c] = channel_scale[c];
  }
  for (const auto& g : codec.groups) {
    groups_.push_back(g.channels);
    for (int ch : g.channels) check(ch >= 0 && ch < d_, "VqCodec: channel {} outside 0..{}", ch, d_ - 1);
  }
  c_.assign(codebooks.begin(), codebooks.end());
  recon_.resize(c_.size());
  for (int gi = 0; gi < n_groups_; ++gi)
    for (int j = 0; j < k_; ++j)
      for (int i = 0; i < g_; ++i) {
        const size_t o = (static_cast<size_t>(gi) * k_ + j) * g_ + i;
        recon_[o] = c_[o] / a_[groups_[gi][i]];
      }
}

double VqCodec::weighted_sq_sum(const float* x) const {
  double s = 0.0;
  for (int c = 0; c < d_; ++c) {
    const double y = static_cast<double>(a_[c]) * x[c];
    s += y * y;
  }
  return s;
}

void VqCodec::encode(const float* x, float s, int32_t* codes) const {
  float y[64 * 4];
  std::vector<float> big;
  float* yp = y;
  if (g_ > static_cast<int>(sizeof(y) / sizeof(float))) {
    big.resize(g_);
    yp = big.data();
  }
  const float inv = 1.0f / s;
  for (int gi = 0; gi < n_groups_; ++gi) {
    const std::vector<int>& ch = groups_[gi];
    for (int i = 0; i < g_; ++i) yp[i] = a_[ch[i]] * x[ch[i]] * inv;
    const float* cb = c_.data() + static_cast<size_t>(gi) * k_ * g_;
    float best = std::numeric_limits<float>::infinity();
    int32_t arg = 0;
    for (int j = 0; j < k_; ++j) {
      const float* c = cb + static_cast<size_t>(j) * g_;
      // dist = fma(e, e, dist) explicitly: the same bits whether or not the
      // compiler contracts (GCC does for C++ on FMA targets, -march=native)
      // and on the GPU encoder (cuda::vq_append, __fmaf_rn).
      float dist = 0.0f;
      for (int i = 0; i < g_; ++i) {
        const float e = yp[i] - c[i];
        dist = std::fma(e, e, dist);
      }
      if (dist < best) {
        best = dist;
        arg = j;
      }
    }
    codes[gi] = arg;
  }
}

void VqCodec::decode(const int32_t* codes, float s, float* xhat) const {
  for (int gi = 0; gi < n_groups_; ++gi) {
    check(codes[gi] >= 0 && codes[gi] < k_, "VqCodec::decode: code {} of group {} outside 0..{}", codes[gi], gi,
          k_ - 1);
    const float* r = recon_.data() + (static_cast<size_t>(gi) * k_ + codes[gi]) * g_;
    const std::vector<int>& ch = groups_[gi];
    for (int i = 0; i < g_; ++i) xhat[ch[i]] = s * r[i];
  }
}

float vq_shared_scale(double sq_sum, int n_heads, int head_dim) {
  const double rms = std::sqrt(sq_sum / (static_cast<double>(n_heads) * head_dim));
  check(std::isfinite(rms) && rms <= 65504.0, "vq shared scale: RMS {} of the weighted key is not a finite fp16 value",
        rms);
  const float s = round_fp16(static_cast<float>(rms));
  return s > 0.0f ? s : fp16_to_fp32(0x0001);  // smallest subnormal: a zero key still has a usable scale
}

void vq_fake_quant_layer(std::span<const VqCodec* const> heads, const float* x, int64_t T, float* out,
                         int32_t* codes, float* scales) {
  check(!heads.empty() && heads[0] != nullptr, "vq_fake_quant_layer: no codecs");
  const int H = static_cast<int>(heads.size()), d = heads[0]->head_dim();
  const bool shared = heads[0]->shared_scale();
  int G = 0;
  for (const VqCodec* c : heads) {
    check(c != nullptr && c->head_dim() == d && c->shared_scale() == shared,
          "vq_fake_quant_layer: every head needs a vq codec of the same head_dim and scale kind");
    G = std::max(G, c->n_groups());
  }
  // Scales first (serially: an fp16 overflow throws, which must not happen
  // inside the parallel region).
  std::vector<float> sc(T, 1.0f);
  if (shared)
    for (int64_t t = 0; t < T; ++t) {
      const float* xt = x + t * H * d;
      double acc = 0.0;
      for (int h = 0; h < H; ++h) acc += heads[h]->weighted_sq_sum(xt + static_cast<size_t>(h) * d);
      sc[t] = vq_shared_scale(acc, H, d);
    }
#pragma omp parallel for schedule(static) if (T * H * d >= 8192)
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * H * d;
    const float s = sc[t];
    std::vector<int32_t> z(G);
    std::vector<float> xh(d);
    for (int h = 0; h < H; ++h) {
      heads[h]->encode(xt + static_cast<size_t>(h) * d, s, z.data());
      heads[h]->decode(z.data(), s, xh.data());  // codes from encode(): always in range
      if (codes)
        for (int gi = 0; gi < heads[h]->n_groups(); ++gi) codes[(t * H + h) * G + gi] = z[gi];
      std::copy(xh.begin(), xh.end(), out + t * H * d + static_cast<size_t>(h) * d);
    }
    if (scales) scales[t] = s;
  }
}

}  // namespace ratekv::cache
