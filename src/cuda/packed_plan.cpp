// PackedPlan: host tables built from packed::LayerLayout and uploaded; the
// decode workspace size and the default split count.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cuda_check_host.h"
#include "head_tables.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/ref/int8_levels.h"

namespace ratekv::cuda {

using detail::HeadTables;
using packed::Side;

namespace {
constexpr int kRotDim = detail::kMaxTiles * 16;  // row stride of rotated q / partial o

using detail::upload;
}  // namespace

bool uses_int8_levels(const PackedPlan& plan, PackedDecodeVariant variant) {
  return variant == PackedDecodeVariant::specialized && !plan.device().has_wide && plan.gqa() <= 8;
}

int detail::gqa8_instance(const PackedPlan& plan, bool int8) {
  const auto& dev = plan.device();
  return !int8                 ? kGeneralFp16
         : dev.uniform_bits > 0 ? dev.uniform_bits
         : dev.full_value       ? kGeneralInt8FullValue
                                : kGeneralInt8;
}

std::string packed_decode_kernel_name(const PackedPlan& plan, PackedDecodeVariant variant) {
  if (plan.device().has_wide) return "generic (5..8-bit groups)";
  if (plan.gqa() > 8) return "16-row fp16 (GQA > 8)";
  const int ub = detail::gqa8_instance(plan, uses_int8_levels(plan, variant));
  switch (ub) {
    case detail::kGeneralFp16: return "GQA<=8 general fp16";
    case detail::kGeneralInt8: return "GQA<=8 general int8";
    case detail::kGeneralInt8FullValue: return "GQA<=8 general int8, one value group per head";
    default: return "GQA<=8 uniform int8, " + std::to_string(ub) + " bits";
  }
}

PackedPlan::PackedPlan(const packed::LayerLayout& layout, int n_heads,
                       std::span<const float> rotations, std::span<const float> levels,
                       PrefillMatrices prefill)
    : layout_(layout), n_heads_(n_heads), prefill_(prefill), dev_(std::make_unique<Device>()) {
  build(rotations, levels);
}

PackedPlan::PackedPlan(const packed::LayerLayout& layout, const packed::LayerLayout& ext,
                       int n_heads, std::span<const float> rotations, std::span<const float> levels)
    : layout_(layout), ext_(ext), n_heads_(n_heads), dev_(std::make_unique<Device>()) {
  build(rotations, levels);
}

void PackedPlan::build(std::span<const float> rotations, std::span<const float> levels) {
  const packed::LayerLayout& layout = layout_;
  const int n_heads = n_heads_;
  const int d = layout.head_dim();
  const int hkv = layout.n_kv_heads();
  if (ext_)
    check(ext_->head_dim() == d && ext_->n_kv_heads() == hkv,
          "cuda packed plan: extension layout (head_dim {}, {} KV heads) does not match the layout "
          "(head_dim {}, {} KV heads)",
          ext_->head_dim(), ext_->n_kv_heads(), d, hkv);
  check(d == 64 || d == 128 || d == 256,
        "cuda packed plan: head_dim {} unsupported (kernels exist for 64, 128, 256)", d);
  check(n_heads > 0 && n_heads % hkv == 0,
        "cuda packed plan: n_heads {} is not a multiple of n_kv_heads {}", n_heads, hkv);
  check(n_heads / hkv <= 16, "cuda packed plan: GQA {} > 16 query heads per KV head unsupported",
        n_heads / hkv);
  const int max_tiles = detail::max_tiles_for(d);
  std::vector<float> rot, lvl;
  std::vector<int32_t> chans;
  size_t rot_used = 0, lvl_used = 0;
  int max_stage = 0;
  for (int h = 0; h < hkv; ++h) {
    HeadTables T;
    std::memset(&T, 0, sizeof(T));
    detail::WideTables W;
    std::memset(&W, 0, sizeof(W));
    const packed::HeadLayout& H = layout.head(h);
    T.block_offset = (uint32_t)H.block_offset;
    for (int s = 0; s < 2; ++s) {
      const Side side = s == 0 ? Side::key : Side::value;
      const auto& groups = H.side(side);
      const auto& specs = s == 0 ? layout.spec(h).key : layout.spec(h).value;
      // Wide groups: the e-th extension group of this side belongs to the
      // first unmatched 4-bit group with the same channel list.
      std::vector<int> wide_bits(groups.size(), 0);
      std::vector<size_t> ext_off(groups.size(), 0);
      if (ext_) {
        const auto& especs = s == 0 ? ext_->spec(h).key : ext_->spec(h).value;
        const auto& egroups = ext_->head(h).side(side);
        for (size_t e = 0; e < especs.size(); ++e) {
          size_t g = 0;
          while (g < specs.size() &&
                 (wide_bits[g] != 0 || specs[g].bits != packed::kMaxBits ||
                  specs[g].channels != especs[e].channels))
            ++g;
          check(g < specs.size(),
                "cuda packed plan: extension group {} of KV head {} {} has no 4-bit group with the "
                "same channels in the layout",
                e, h, s == 0 ? "key" : "value");
          check(especs[e].bits <= 8 - packed::kMaxBits,
                "cuda packed plan: extension group {} of KV head {} {} has {} bits (at most {})", e,
                h, s == 0 ? "key" : "value", especs[e].bits, 8 - packed::kMaxBits);
          wide_bits[g] = packed::kMaxBits + especs[e].bits;
          ext_off[g] = ext_->head(h).block_offset + egroups[e].code_offset;
          dev_->has_wide = true;
        }
      }
      T.n_groups[s] = (int)groups.size();
      int tile = 0;
      for (size_t g = 0; g < groups.size(); ++g) {
        const packed::GroupLayout& G = groups[g];
        const int nct = G.dim_pad / 16;
        check(tile + nct <= max_tiles,
              "cuda packed plan: KV head {} {} groups need {} padded 16-channel tiles; kernels for "
              "head_dim {} hold at most {}",
              h, s == 0 ? "key" : "value", tile + nct, d, max_tiles);
        T.dim[s][g] = G.dim;
        T.dim_pad[s][g] = G.dim_pad;
        T.tile_begin[s][g] = tile;
        T.bits[s][g] = (int8_t)G.bits;
        T.code_offset[s][g] = (int32_t)G.code_offset;
        T.norm_offset[s][g] = (int32_t)G.norm_offset;
        W.wide_bits[s][g] = (int8_t)wide_bits[g];
        W.ext_code_offset[s][g] = (int32_t)ext_off[g];
        const int eff_bits = wide_bits[g] ? wide_bits[g] : G.bits;
        for (int k = 0; k < nct; ++k) {
          T.tile_src[s][tile + k] =
              (int32_t)(G.code_offset + (size_t)k * G.bits * packed::kLaneRowBytes);
          T.tile_group[s][tile + k] = (int8_t)g;
          T.tile_last[s][tile + k] = (int8_t)(k == nct - 1);
        }
        tile += nct;
        // rotation, codebook, channels
        const size_t rn = (size_t)G.dim * G.dim, ln = (size_t)1 << eff_bits;
        check(rot_used + rn <= rotations.size(),
              "cuda packed plan: rotations has {} floats, layout needs more (KV head {} {} group {})",
              rotations.size(), h, s == 0 ? "key" : "value", g);
        check(lvl_used + ln <= levels.size(),
              "cuda packed plan: levels has {} floats, layout needs more (KV head {} {} group {})",
              levels.size(), h, s == 0 ? "key" : "value", g);
        T.rot_offset[s][g] = (int32_t)rot.size();
        rot.insert(rot.end(), rotations.begin() + rot_used, rotations.begin() + rot_used + rn);
        rot_used += rn;
        T.lvl_offset[s][g] = (int32_t)lvl.size();
        for (size_t i = 0; i < ln; ++i) {
          const float v = levels[lvl_used + i];
          check(std::isfinite(v) && (i == 0 || v > levels[lvl_used + i - 1]),
                "cuda packed plan: levels of KV head {} {} group {} are not finite and strictly "
                "ascending",
                h, s == 0 ? "key" : "value", g);
          if (i < 16) {  // register codebooks of the tensor-core kernels (≤ 4 bits)
            T.levels[s][g][i] = fp32_to_fp16(v);
            T.ptab[s][g][i / 4] |= (uint32_t)(T.levels[s][g][i] & 0xffu) << (8 * (i % 4));
            T.ptab[s][g][4 + i / 4] |= (uint32_t)(T.levels[s][g][i] >> 8) << (8 * (i % 4));
          }
          lvl.push_back(v);
        }
        if (ln <= 16) {  // int8 codebook (integer kernels; 1..4-bit groups)
          float sc = 0.f;
          const std::vector<float> q8 =
              ref::int8_levels(std::span<const float>(levels).subspan(lvl_used, ln), &sc);
          T.i8scale[s][g] = sc;
          for (size_t i = 0; i < ln; ++i)
            T.i8tab[s][g][i / 4] |= (uint32_t)(uint8_t)(int8_t)std::lrint(q8[i] / sc) << (8 * (i % 4));
        }
        lvl_used += ln;
        T.chan_offset[s][g] = (int32_t)chans.size();
        chans.insert(chans.end(), specs[g].channels.begin(), specs[g].channels.end());
      }
      T.n_tiles[s] = tile;
      if (s == 0) {
        T.i8kmax = 0.f;
        for (size_t g = 0; g < groups.size(); ++g) T.i8kmax = std::max(T.i8kmax, T.i8scale[0][g]);
        if (!(T.i8kmax > 0.f)) T.i8kmax = 1.f;
      }
      dev_->max_tiles[s] = std::max(dev_->max_tiles[s], tile);
    }
    T.stage_bytes = (int32_t)H.block_bytes;
    max_stage = std::max(max_stage, T.stage_bytes);
    dev_->host_heads.push_back(T);
    dev_->host_wide.push_back(W);
  }
  check(rot_used == rotations.size(), "cuda packed plan: rotations has {} floats, layout uses {}",
        rotations.size(), rot_used);
  check(lvl_used == levels.size(), "cuda packed plan: levels has {} floats, layout uses {}",
        levels.size(), lvl_used);
  dev_->max_stage_bytes = max_stage;
  // The uniform instance's width (every head one key and one value group of
  // the same 1..4-bit width, 0 otherwise) and the full-value instance's
  // condition (every head one 1..4-bit value group over all d channels).
  int ub = -1;
  bool full_value = true;
  for (size_t h = 0; h < dev_->host_heads.size(); ++h) {
    const HeadTables& T = dev_->host_heads[h];
    const detail::WideTables& W = dev_->host_wide[h];
    const bool u = T.n_groups[0] == 1 && T.n_groups[1] == 1 && T.dim[0][0] == d &&
                   T.dim[1][0] == d && T.bits[0][0] == T.bits[1][0] && W.wide_bits[0][0] == 0 &&
                   W.wide_bits[1][0] == 0;
    const int b = u ? T.bits[0][0] : 0;
    ub = ub < 0 ? b : (ub == b ? ub : 0);
    full_value = full_value && T.n_groups[1] == 1 && T.dim[1][0] == d && T.bits[1][0] >= 1 &&
                 T.bits[1][0] <= 4 && W.wide_bits[1][0] == 0;
  }
  dev_->uniform_bits = std::max(ub, 0);
  dev_->full_value = full_value;
  dev_->heads = upload(dev_->host_heads, device_bytes_);
  dev_->wide = upload(dev_->host_wide, device_bytes_);
  dev_->rotations = upload(rot, device_bytes_);
  dev_->channels = upload(chans, device_bytes_);
  dev_->levels = upload(lvl, device_bytes_);
  if (!dev_->has_wide && prefill_ != PrefillMatrices::none) {
    // Dense per-(side, head) rotation for the prefill GEMM (head_tables.h).
    std::vector<float> m32((size_t)2 * hkv * d * d, 0.f);
    for (int s = 0; s < 2; ++s)
      for (int h = 0; h < hkv; ++h) {
        const HeadTables& T = dev_->host_heads[h];
        float* M = m32.data() + ((size_t)s * hkv + h) * d * d;
        int off = 0;
        for (int g = 0; g < T.n_groups[s]; ++g) {
          const int m = T.dim[s][g];
          const float* R = rot.data() + T.rot_offset[s][g];
          const int32_t* ch = chans.data() + T.chan_offset[s][g];
          for (int i = 0; i < m; ++i)
            for (int j = 0; j < m; ++j) M[(size_t)ch[i] * d + off + j] = R[(size_t)j * m + i];
          off += m;
        }
      }
    if (prefill_ == PrefillMatrices::both || prefill_ == PrefillMatrices::f16) {
      std::vector<uint16_t> m16(m32.size());
      for (size_t i = 0; i < m32.size(); ++i) m16[i] = fp32_to_fp16(m32[i]);
      dev_->prefill_m16 = upload(m16, device_bytes_);
    }
    if (prefill_ == PrefillMatrices::both || prefill_ == PrefillMatrices::f32)
      dev_->prefill_m32 = upload(m32, device_bytes_);
  }
}

size_t packed_plan_device_bytes(const packed::LayerLayout& layout, PrefillMatrices prefill) {
  const size_t hkv = (size_t)layout.n_kv_heads(), d = (size_t)layout.head_dim();
  size_t rot = 0, chans = 0, lvl = 0;  // element counts, as build() gathers them
  for (size_t h = 0; h < hkv; ++h)
    for (Side side : {Side::key, Side::value})
      for (const packed::GroupLayout& G : layout.head((int)h).side(side)) {
        rot += (size_t)G.dim * G.dim;
        chans += (size_t)G.dim;
        lvl += size_t{1} << G.bits;
      }
  size_t b = hkv * (sizeof(HeadTables) + sizeof(detail::WideTables)) + 4 * rot + 4 * chans + 4 * lvl;
  const size_t m = 2 * hkv * d * d;
  if (prefill == PrefillMatrices::both || prefill == PrefillMatrices::f16) b += 2 * m;
  if (prefill == PrefillMatrices::both || prefill == PrefillMatrices::f32) b += 4 * m;
  return b;
}

PackedPlan::~PackedPlan() {
  cudaFree(dev_->heads);
  cudaFree(dev_->wide);
  cudaFree(dev_->rotations);
  cudaFree(dev_->channels);
  cudaFree(dev_->levels);
  cudaFree(dev_->prefill_m16);
  cudaFree(dev_->prefill_m32);
}

size_t decode_workspace_bytes(int batch, int n_heads, int /*head_dim*/, int n_splits) {
  const size_t rows = (size_t)batch * n_heads;
  return rows * kRotDim * sizeof(uint16_t) + rows * n_splits * (kRotDim + 2) * sizeof(float) +
         rows * sizeof(int32_t) + 256;
}

int detail::sm_count() {
  int sms = 132;
  int dev = 0;
  if (cudaGetDevice(&dev) == cudaSuccess) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && n > 0)
      sms = n;
  }
  return sms;
}

namespace {
using detail::sm_count;
// Rounds a split count ≥ one CTA down to whole CTAs of kPackedWarpsPerCta warps.
int whole_ctas(int want) {
  const int cta = detail::kPackedWarpsPerCta;
  if (want >= cta) want = want / cta * cta;
  return std::max(want, 1);
}
}  // namespace

int default_splits(int batch, int n_kv_heads, int max_seq_len) {
  // Splits are ranges of 64-token pages, one warp each. Aim at one full wave
  // (~16 resident warps per SM), so every warp streams a long run of pages and
  // none waits for a second wave; at least 2 pages per split.
  const int pages = (max_seq_len + packed::kPageTokens - 1) / packed::kPageTokens;
  const int rows = batch * n_kv_heads;
  const int want = std::max(1, sm_count() * 16 / rows);
  return whole_ctas(std::min(want, (pages + 1) / 2));
}

namespace {
int packed_default_splits(int gqa, int head_dim, int n_kv_heads, bool has_wide, int batch,
                          int max_seq_len);
}  // namespace

int default_splits(const PackedPlan& plan, int batch, int max_seq_len) {
  return packed_default_splits(plan.gqa(), plan.head_dim(), plan.layout().n_kv_heads(),
                               plan.device().has_wide, batch, max_seq_len);
}

int default_splits(const packed::LayerLayout& layout, int n_heads, int batch, int max_seq_len) {
  check(layout.n_kv_heads() > 0 && n_heads % layout.n_kv_heads() == 0,
        "default_splits: n_heads {} is not a multiple of n_kv_heads {}", n_heads, layout.n_kv_heads());
  return packed_default_splits(n_heads / layout.n_kv_heads(), layout.head_dim(), layout.n_kv_heads(),
                               false, batch, max_seq_len);
}

namespace {
int packed_default_splits(int gqa, int head_dim, int n_kv_heads, bool has_wide, int batch,
                          int max_seq_len) {
  // Measured on the H200 (docs/cuda_results.md, split sweeps of device runs 3
  // and 9): a warp's fixed cost (head tables, query fragments, first page in
  // flight, partial state) wants ≥ 2 pages per split (with the programmatic
  // launch overlapping the prologue; ≥ 4 without it), except that small grids
  // (< 1024 warps) prefer one page per split; never more than one full wave
  // (warps per SM of the instance: 16 for GQA ≤ 8 at head_dim ≤ 128, 12 for
  // the 16-row general instance, fewer at head_dim 256).
  const bool r8 = gqa <= 8, wide = head_dim > 128;
  const int warps = r8 ? (wide ? 8 : 16) : (wide ? 4 : 12);
  const int pages = (max_seq_len + packed::kPageTokens - 1) / packed::kPageTokens;
  const int rows = batch * n_kv_heads;
  // 5..8-bit plans run on the generic kernel (one CTA per split): one page
  // per split, at most 2048 splits.
  if (has_wide) return std::max(1, std::min(pages, 2048));
  const int wave = std::max(1, sm_count() * warps / rows);
  const int small_grid = std::min(pages, (1024 + rows - 1) / rows);
  const int want = std::max((pages + 1) / 2, small_grid);
  int splits = std::max(1, std::min(wave, want));
  // GQA ≤ 8: a CTA is one (sequence, KV head) under 8 splits (4 at head_dim
  // 256), and its warps without a split idle: past one wave (wave < CTA) the
  // bound above left 6 of 8 warps idle at B = 109, T = 512 (issue 18). Fill
  // the CTA instead (at most one split per page): the CTA count is the same,
  // each CTA streams its pages with all its warps, and it merges its splits
  // itself (decode_attention_gqa8.cu, no merge launch). Split counts of a CTA
  // or more (long contexts, small batches) are as before.
  const int cta = wide ? 4 : 8;
  if (r8 && splits < cta) splits = std::min(cta, pages);
  return whole_ctas(splits);
}
}  // namespace

namespace detail {

void throw_error(const std::string& msg) { throw Error(msg); }

void check_batch(const DecodeBatch& batch, const char* what) {
  check(batch.batch > 0, "{}: batch {} must be positive", what, batch.batch);
  check(batch.page_table && batch.seq_lens, "{}: page_table and seq_lens must be device pointers",
        what);
  check(batch.max_seq_len >= 1, "{}: max_seq_len {} must be at least 1", what, batch.max_seq_len);
  check((int64_t)batch.max_pages * packed::kPageTokens >= batch.max_seq_len,
        "{}: max_pages {} x {} tokens < max_seq_len {}", what, batch.max_pages,
        packed::kPageTokens, batch.max_seq_len);
  check(batch.window >= 0, "{}: window {} must be >= 0 (0 = no sliding window)", what, batch.window);
}

}  // namespace detail
}  // namespace ratekv::cuda
