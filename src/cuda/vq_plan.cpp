// VqPlan: the vq pages' layout, codewords, channel lists and RoPE frequencies
// uploaded for vq_decode_attention; its default split count.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "ratekv/common/error.h"
#include "ratekv/format/packed_vq_format.h"
#include "cuda_check_host.h"
#include "head_tables.h"
#include "vq_tables.h"

namespace ratekv::cuda {

static_assert(detail::kVqKindVq == (int)packed::VqSideKind::vq && detail::kVqKindFp16 == (int)packed::VqSideKind::fp16,
              "vq_tables.h mirrors packed::VqSideKind");

using packed::Side;
using packed::VqSideKind;

namespace {
using detail::upload;
const char* side_name(int s) { return s == 0 ? "key" : "value"; }
}  // namespace

VqPlan::VqPlan(const packed::VqLayerLayout& layout, int n_heads, std::span<const float> codewords,
               std::span<const int32_t> channels, VqRope rope, const PackedPlan* scalar_values)
    : layout_(std::make_unique<packed::VqLayerLayout>(layout)),
      scalar_(scalar_values),
      n_heads_(n_heads),
      head_dim_(layout.head_dim()),
      n_kv_heads_(layout.n_kv_heads()),
      dev_(std::make_unique<Device>()) {
  const int d = head_dim_, hkv = n_kv_heads_;
  check(d % 2 == 0 && d <= detail::kVqMaxHeadDim,
        "cuda vq plan: head_dim {} unsupported (even, at most {})", d, detail::kVqMaxHeadDim);
  check(n_heads > 0 && n_heads % hkv == 0, "cuda vq plan: n_heads {} is not a multiple of n_kv_heads {}",
        n_heads, hkv);
  check(n_heads / hkv <= detail::kVqMaxGqa, "cuda vq plan: GQA {} > {} unsupported", n_heads / hkv,
        detail::kVqMaxGqa);
  check(std::isfinite(rope.theta) && rope.theta > 0, "cuda vq plan: RoPE base {} must be positive and finite",
        rope.theta);
  detail::VqTables& T = dev_->t;
  T.head_dim = d;
  T.page_bytes = (int64_t)layout.page_bytes();
  T.neox = rope.neox ? 1 : 0;
  std::vector<float> cw;
  std::vector<int32_t> ch;
  std::vector<int64_t> offs((size_t)hkv * 2 * 2, 0);  // cw_offset (hkv·2) then ch_offset (hkv·2)
  size_t cw_used = 0, ch_used = 0;
  const bool scalar_v = layout.side(Side::value).kind == VqSideKind::none;
  check(!scalar_v || scalar_values != nullptr,
        "cuda vq plan: the value side is not in the vq pages: pass its scalar TQ-MSE PackedPlan");
  check(scalar_v || scalar_values == nullptr,
        "cuda vq plan: a scalar value plan was given but the value side is in the vq pages");
  if (scalar_v) {
    const packed::LayerLayout& S = scalar_values->layout();
    check(S.head_dim() == d && S.n_kv_heads() == hkv && scalar_values->n_heads() == n_heads,
          "cuda vq plan: scalar value plan (head_dim {}, {} KV heads, {} query heads) does not match "
          "(head_dim {}, {} KV heads, {} query heads)",
          S.head_dim(), S.n_kv_heads(), scalar_values->n_heads(), d, hkv, n_heads);
    check(scalar_values->ext_layout() == nullptr,
          "cuda vq plan: scalar value plans with 5..8-bit groups are not served with vq keys");
    for (int h = 0; h < hkv; ++h)
      check(S.head(h).key.empty(), "cuda vq plan: the scalar value plan has key groups (KV head {})", h);
    T.scalar_values = 1;
    T.heads = scalar_values->device().heads;
    T.levels = scalar_values->device().levels;
    T.scalar_page_bytes = (int64_t)S.page_bytes();
  }
  for (int s = 0; s < 2; ++s) {
    const packed::VqSideSpec& sp = layout.side(s == 0 ? Side::key : Side::value);
    if (s == 1 && scalar_v) continue;
    check(sp.kind == VqSideKind::vq || sp.kind == VqSideKind::fp16,
          "cuda vq plan: the {} side is not in the vq pages", side_name(s));
    T.kind[s] = (int)sp.kind;
    T.seg_offset[s] = (int64_t)layout.segment_offset(0, s == 0 ? Side::key : Side::value);
    if (sp.kind != VqSideKind::vq) continue;
    check(d % sp.n_groups == 0, "cuda vq plan: {} groups do not divide head_dim {}", sp.n_groups, d);
    T.n_groups[s] = sp.n_groups;
    T.bits[s] = sp.bits;
    T.group_size[s] = d / sp.n_groups;
    T.shared[s] = sp.shared_scale ? 1 : 0;
    if (sp.shared_scale) T.scale_offset[s] = (int64_t)layout.scale_offset(s == 0 ? Side::key : Side::value);
  }
  T.head_bytes = hkv > 1 ? (int64_t)(layout.segment_offset(1, Side::key) - layout.segment_offset(0, Side::key)) : 0;
  for (int h = 0; h < hkv; ++h)
    for (int s = 0; s < 2; ++s) {
      const Side side = s == 0 ? Side::key : Side::value;
      if (T.kind[s] == 0) continue;  // scalar value side: not in the vq pages
      check((int64_t)layout.segment_offset(h, side) == h * T.head_bytes + T.seg_offset[s],
            "cuda vq plan: segment of KV head {} {} is not at h * head bytes", h, side_name(s));
      if (T.kind[s] != (int)VqSideKind::vq) continue;
      const int G = T.n_groups[s], g = T.group_size[s];
      const size_t ncw = (size_t)G * ((size_t)1 << T.bits[s]) * g, nch = (size_t)G * g;
      check(cw_used + ncw <= codewords.size(),
            "cuda vq plan: codewords has {} floats, layout needs more (KV head {} {})", codewords.size(), h,
            side_name(s));
      check(ch_used + nch <= channels.size(),
            "cuda vq plan: channels has {} ints, layout needs more (KV head {} {})", channels.size(), h,
            side_name(s));
      offs[(size_t)h * 2 + s] = (int64_t)cw.size();
      for (size_t i = 0; i < ncw; ++i) {
        const float v = codewords[cw_used + i];
        check(std::isfinite(v), "cuda vq plan: codeword value {} of KV head {} {} is not finite", i, h,
              side_name(s));
        cw.push_back(v);
      }
      cw_used += ncw;
      offs[(size_t)hkv * 2 + (size_t)h * 2 + s] = (int64_t)ch.size();
      std::vector<int> seen(d, 0);
      for (size_t i = 0; i < nch; ++i) {
        const int32_t c = channels[ch_used + i];
        check(c >= 0 && c < d && !seen[c]++,
              "cuda vq plan: channel lists of KV head {} {} are not a permutation of 0..{} (entry {} = {})",
              h, side_name(s), d - 1, i, c);
        ch.push_back(c);
      }
      ch_used += nch;
    }
  check(cw_used == codewords.size(), "cuda vq plan: codewords has {} floats, layout uses {}", codewords.size(),
        cw_used);
  check(ch_used == channels.size(), "cuda vq plan: channels has {} ints, layout uses {}", channels.size(),
        ch_used);
  std::vector<double> freq(d / 2);
  for (int i = 0; i < d / 2; ++i) freq[i] = std::pow(rope.theta, -2.0 * i / d);  // as ratekv::rope_frequency
  dev_->codewords = upload(cw, device_bytes_);
  dev_->channels = upload(ch, device_bytes_);
  dev_->offsets = upload(offs, device_bytes_);
  dev_->freq = upload(freq, device_bytes_);
  T.codewords = dev_->codewords;
  T.channels = dev_->channels;
  T.cw_offset = dev_->offsets;
  T.ch_offset = dev_->offsets + (size_t)hkv * 2;
  T.freq = dev_->freq;
}

VqPlan::~VqPlan() {
  cudaFree(dev_->codewords);
  cudaFree(dev_->channels);
  cudaFree(dev_->offsets);
  cudaFree(dev_->freq);
}

size_t vq_plan_device_bytes(int n_kv_heads, int head_dim, size_t n_codewords, size_t n_channels) {
  return 4 * n_codewords + 4 * n_channels + 8 * (size_t)4 * n_kv_heads + 8 * (size_t)(head_dim / 2);
}

int default_splits(const VqPlan& plan, int batch, int max_seq_len) {
  return vq_default_splits(plan.n_kv_heads(), batch, max_seq_len);
}

int vq_default_splits(int n_kv_heads, int batch, int max_seq_len) {
  // One CTA per split; enough CTAs to cover the GPU at small batch, ≥ 1 page each.
  const int pages = (max_seq_len + packed::kPageTokens - 1) / packed::kPageTokens;
  const int rows = std::max(1, batch * n_kv_heads);
  return std::max(1, std::min(pages, (1024 + rows - 1) / rows));
}

}  // namespace ratekv::cuda
