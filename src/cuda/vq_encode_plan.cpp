// VqEncodePlan: the vq pages' layout, codebooks (weighted space), channel
// weights and channel lists uploaded for vq_append (ratekv/cuda/vq_encode.h).
#include <cuda_runtime.h>

#include <cmath>
#include <vector>

#include "ratekv/common/error.h"
#include "ratekv/cuda/vq_encode.h"
#include "ratekv/format/packed_vq_format.h"
#include "cuda_check_host.h"
#include "vq_encode_tables.h"

namespace ratekv::cuda {

using packed::Side;
using packed::VqSideKind;

namespace {
using detail::upload;
const char* side_name(int s) { return s == 0 ? "key" : "value"; }
}  // namespace

VqEncodePlan::VqEncodePlan(const packed::VqLayerLayout& layout, std::span<const float> codebooks,
                           std::span<const float> channel_scale, std::span<const int32_t> channels)
    : layout_(std::make_unique<packed::VqLayerLayout>(layout)),
      head_dim_(layout.head_dim()),
      n_kv_heads_(layout.n_kv_heads()),
      dev_(std::make_unique<Device>()) {
  const int d = head_dim_, hkv = n_kv_heads_;
  check(d <= detail::kVqEncodeMaxHeadDim, "cuda vq encode plan: head_dim {} > {}", d, detail::kVqEncodeMaxHeadDim);
  check((int64_t)d * hkv <= detail::kVqEncodeMaxRow,
        "cuda vq encode plan: n_kv_heads · head_dim = {} · {} > {} (one token's row in shared memory)", hkv, d,
        detail::kVqEncodeMaxRow);
  detail::VqEncodeTables& T = dev_->t;
  T.head_dim = d;
  T.n_kv_heads = hkv;
  T.page_bytes = (int64_t)layout.page_bytes();
  for (int s = 0; s < 2; ++s) {
    const Side side = s == 0 ? Side::key : Side::value;
    const packed::VqSideSpec& sp = layout.side(side);
    T.kind[s] = (int)sp.kind;
    if (sp.kind == VqSideKind::none) continue;
    T.seg_offset[s] = (int64_t)layout.segment_offset(0, side);
    if (sp.kind != VqSideKind::vq) continue;
    check(d % sp.n_groups == 0, "cuda vq encode plan: {} {} groups do not divide head_dim {}", sp.n_groups,
          side_name(s), d);
    T.n_groups[s] = sp.n_groups;
    T.bits[s] = sp.bits;
    T.group_size[s] = d / sp.n_groups;
    T.shared[s] = sp.shared_scale ? 1 : 0;
    if (sp.shared_scale) T.scale_offset[s] = (int64_t)layout.scale_offset(side);
  }
  T.head_bytes = hkv > 1 ? (int64_t)(layout.segment_offset(1, Side::key) - layout.segment_offset(0, Side::key)) : 0;
  std::vector<float> cb, a((size_t)hkv * 2 * d, 1.0f);
  std::vector<int32_t> ch((size_t)hkv * 2 * d, 0);
  std::vector<int64_t> cb_off((size_t)hkv * 2, 0);
  size_t cb_used = 0, a_used = 0, ch_used = 0;
  for (int h = 0; h < hkv; ++h)
    for (int s = 0; s < 2; ++s) {
      const Side side = s == 0 ? Side::key : Side::value;
      if (T.kind[s] == 0) continue;
      check((int64_t)layout.segment_offset(h, side) == h * T.head_bytes + T.seg_offset[s],
            "cuda vq encode plan: segment of KV head {} {} is not at h · head bytes", h, side_name(s));
      if (T.kind[s] != (int)VqSideKind::vq) continue;
      const int G = T.n_groups[s], g = T.group_size[s];
      const size_t ncb = (size_t)G * ((size_t)1 << T.bits[s]) * g;
      check(cb_used + ncb <= codebooks.size(),
            "cuda vq encode plan: codebooks has {} floats, the layout needs more (KV head {} {})", codebooks.size(),
            h, side_name(s));
      check(a_used + d <= channel_scale.size(),
            "cuda vq encode plan: channel_scale has {} floats, the layout needs more (KV head {} {})",
            channel_scale.size(), h, side_name(s));
      check(ch_used + d <= channels.size(),
            "cuda vq encode plan: channels has {} ints, the layout needs more (KV head {} {})", channels.size(), h,
            side_name(s));
      cb_off[(size_t)h * 2 + s] = (int64_t)cb.size();
      for (size_t i = 0; i < ncb; ++i) {
        const float v = codebooks[cb_used + i];
        check(std::isfinite(v), "cuda vq encode plan: codebook value {} of KV head {} {} is not finite", i, h,
              side_name(s));
        cb.push_back(v);
      }
      cb_used += ncb;
      const size_t base = ((size_t)h * 2 + s) * d;
      std::vector<int> seen(d, 0);
      for (int i = 0; i < d; ++i) {
        const float w = channel_scale[a_used + i];
        check(std::isfinite(w) && w > 0.0f, "cuda vq encode plan: channel scale {} of KV head {} {} = {} must be > 0",
              i, h, side_name(s), w);
        a[base + i] = w;
        const int32_t c = channels[ch_used + i];
        check(c >= 0 && c < d && !seen[c]++,
              "cuda vq encode plan: channel lists of KV head {} {} are not a permutation of 0..{} (entry {} = {})", h,
              side_name(s), d - 1, i, c);
        ch[base + i] = c;
      }
      a_used += d;
      ch_used += d;
    }
  check(cb_used == codebooks.size(), "cuda vq encode plan: codebooks has {} floats, the layout uses {}",
        codebooks.size(), cb_used);
  check(a_used == channel_scale.size(), "cuda vq encode plan: channel_scale has {} floats, the layout uses {}",
        channel_scale.size(), a_used);
  check(ch_used == channels.size(), "cuda vq encode plan: channels has {} ints, the layout uses {}", channels.size(),
        ch_used);
  dev_->codebooks = upload(cb, device_bytes_);
  dev_->channel_scale = upload(a, device_bytes_);
  dev_->channels = upload(ch, device_bytes_);
  dev_->cb_offset = upload(cb_off, device_bytes_);
  RATEKV_CUDA_CHECK(cudaMalloc(&dev_->status, sizeof(int)));
  device_bytes_ += sizeof(int);
  RATEKV_CUDA_CHECK(cudaMemset(dev_->status, 0, sizeof(int)));
  T.codebooks = dev_->codebooks;
  T.cb_offset = dev_->cb_offset;
  T.channel_scale = dev_->channel_scale;
  T.channels = dev_->channels;
  T.status = dev_->status;
}

size_t vq_encode_plan_device_bytes(int n_kv_heads, int head_dim, size_t n_codebook) {
  const size_t per_side = (size_t)n_kv_heads * 2;
  return 4 * n_codebook + 4 * per_side * head_dim + 4 * per_side * head_dim + 8 * per_side + sizeof(int);
}

VqEncodePlan::Device::~Device() {
  cudaFree(codebooks);
  cudaFree(channel_scale);
  cudaFree(channels);
  cudaFree(cb_offset);
  cudaFree(status);
}

VqEncodePlan::~VqEncodePlan() = default;

void vq_check_status(const VqEncodePlan& plan, void* stream, const char* what) {
  auto st = static_cast<cudaStream_t>(stream);
  int flag = 0;
  RATEKV_CUDA_CHECK(cudaMemcpyAsync(&flag, plan.device().status, sizeof(int), cudaMemcpyDeviceToHost, st));
  RATEKV_CUDA_CHECK(cudaStreamSynchronize(st));
  if (flag == 0) return;
  RATEKV_CUDA_CHECK(cudaMemsetAsync(plan.device().status, 0, sizeof(int), st));
  RATEKV_CUDA_CHECK(cudaStreamSynchronize(st));
  fail("{}: vq key encode: a token's shared scale (RMS of the weighted key over all KV heads) is not a finite fp16 "
       "value (the CPU packed cache refuses it too); the token was stored with scale 65504",
       what);
}

}  // namespace ratekv::cuda
