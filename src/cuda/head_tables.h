// Host-visible tables of a PackedPlan (plain C++: built by packed_plan.cpp,
// read by the kernels), the kernels' compile-time limits and the host helpers
// the CUDA translation units share (errors, batch checks, the SM count).
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "ratekv/cuda/decode_attention.h"

namespace ratekv::cuda::detail {

inline constexpr int kWarpsPerCta = 4;        // fp16 kernel
inline constexpr int kPackedWarpsPerCta = 8;  // packed kernel

/// Throws ratekv::Error(msg). The CUDA translation units use this instead of
/// ratekv::check/fail: nvcc cannot compile fmt's compile-time format strings.
[[noreturn]] void throw_error(const std::string& msg);
template <typename... A>
std::string cat(const A&... a) {
  std::ostringstream s;
  (s << ... << a);
  return s.str();
}
template <typename... A>
void require(bool cond, const A&... a) {
  if (!cond) throw_error(cat(a...));
}
/// Validates a DecodeBatch (names `what` in the message).
void check_batch(const DecodeBatch& batch, const char* what);
/// Streaming multiprocessors of the current device (132 when it cannot be
/// queried: the H200 the defaults were tuned on). Sizes grids to one wave.
int sm_count();
/// Instances of the GQA ≤ 8 kernel (decode_attention_gqa8.cu) besides the
/// uniform widths 1..4: the general int8 ones — any value side, or one value
/// group over every head's head_dim channels — and the general fp16 one.
inline constexpr int kGeneralInt8 = -1, kGeneralInt8FullValue = -2, kGeneralFp16 = 0;
/// The GQA ≤ 8 kernel's instance for `plan`: with int8 (cuda::uses_int8_levels)
/// the uniform width (plan.device().uniform_bits > 0), else
/// kGeneralInt8FullValue (plan.device().full_value), else kGeneralInt8;
/// without, kGeneralFp16.
int gqa8_instance(const PackedPlan& plan, bool int8);
/// Most 16-channel tiles one side of one head may need (padded groups).
inline constexpr int kMaxTiles = 18;
inline constexpr int max_tiles_for(int head_dim) { return head_dim <= 128 ? head_dim / 16 + 2 : 16; }

/// Per-KV-head tables the packed kernels read (built on the host from
/// packed::LayerLayout; see packed_plan.cpp).
struct HeadTables {
  uint32_t block_offset;          // bytes from the page start
  int32_t stage_bytes;            // bytes of the head block (staged whole per page)
  int32_t n_tiles[2];             // rotated 16-channel tiles per side
  int32_t n_groups[2];
  // Per rotated tile of each side: head-block offset of its first lane-word
  // row, its group, last-of-group flag.
  int32_t tile_src[2][kMaxTiles];
  int8_t tile_group[2][kMaxTiles];
  int8_t tile_last[2][kMaxTiles];
  int8_t bits[2][8];
  uint16_t levels[2][8][16];      // fp16 bits of the Lloyd–Max levels, unused entries 0
  // Byte-permute codebooks: ptab[s][g][w] byte k = low byte of fp16 level 4w+k
  // (w = 0..3), ptab[s][g][4+w] the high bytes.
  uint32_t ptab[2][8][8];
  // Codebooks as int8 (the integer kernels' Q·Kᵀ and P·V products),
  // per side s and group g: i8tab[s][g][w] byte k = round(level(4w + k) /
  // i8scale[s][g]) (ref::int8_levels), levels ≥ 2^bits 0.
  uint32_t i8tab[2][8][4];
  float i8scale[2][8];
  // The largest i8scale of the key groups (1 without key groups): the general
  // int8 kernels split key group g's query tiles as q̃·i8scale[0][g]/i8kmax
  // and put i8kmax into the softmax exponent (decode_attention_gqa8.cu).
  float i8kmax;
  // Rotations / channels (append and the rotate kernels): offsets into flat arrays.
  int32_t dim[2][8];
  int32_t dim_pad[2][8];
  int32_t tile_begin[2][8];
  int32_t rot_offset[2][8];       // floats into PackedPlan::Device::rotations
  int32_t chan_offset[2][8];      // ints into PackedPlan::Device::channels
  int32_t code_offset[2][8];      // bytes from the head block start
  int32_t norm_offset[2][8];
  int32_t lvl_offset[2][8];       // floats into PackedPlan::Device::levels
};

/// Groups of 5..8 bits of one KV head (docs/packed_format.md §5), read only
/// by the generic kernel (kept out of HeadTables, which the tensor-core
/// kernels copy into shared memory per CTA): wide_bits = b (0 for b ≤ 4;
/// then HeadTables::bits = 4, the low nibble in the main pages); the high
/// b − 4 bits at ext_code_offset bytes from the extension page start.
struct WideTables {
  int8_t wide_bits[2][8];
  int32_t ext_code_offset[2][8];
};

}  // namespace ratekv::cuda::detail

namespace ratekv::cuda {
/// Device-side tables of a PackedPlan.
struct PackedPlan::Device {
  detail::HeadTables* heads = nullptr;  // (n_kv_heads), device
  float* rotations = nullptr;
  int32_t* channels = nullptr;
  float* levels = nullptr;
  std::vector<detail::HeadTables> host_heads;
  int max_stage_bytes = 0;
  int uniform_bits = 0;  ///< b when every head is one b-bit key and one b-bit value group over the head, else 0
  /// Every head's value side is one group of 1..4 bits over all head_dim
  /// channels (the GQA ≤ 8 kernel's general int8 instance then takes the
  /// value tiles at compile time).
  bool full_value = false;
  int max_tiles[2] = {0, 0};
  bool has_wide = false;  ///< some group has 5..8 bits (extension pages; generic kernel only)
  detail::WideTables* wide = nullptr;  ///< (n_kv_heads), device
  std::vector<detail::WideTables> host_wide;
  /// The prefill's rotation as one dense matrix per (side, KV head), the GEMM
  /// operand of packed_prefill's tensor-core variant: M[s][h] is (head_dim
  /// input channels) × (head_dim outputs), row-major; group g's rotated
  /// coordinate j is output column off_g + j (off_g = Σ dims of the side's
  /// groups before g), M[ch_g[i]][off_g + j] = Π_g[j][i], zeros elsewhere.
  /// fp16 (fp16 inputs) and fp32 (fp32 inputs, TF32 GEMM); null for plans
  /// with 5..8-bit groups (the GPU quantizers reject them).
  uint16_t* prefill_m16 = nullptr;  ///< (2, n_kv_heads, head_dim, head_dim), device
  float* prefill_m32 = nullptr;     ///< same, fp32
};
}  // namespace ratekv::cuda
