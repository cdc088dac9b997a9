// ratekv/ref/packed_decode_attention.h — the named CPU reference of the CUDA
// packed decode attention (cuda::packed_decode_attention, kernels in
// src/cuda/decode_attention_{gqa8,packed,generic}.cu): the same inputs, the
// same math, the kernel's rounding (PackedRounding), every sum in double.
// Format: docs/packed_format.md; method: docs/design.md §6.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ratekv/ref/decode_batch.h"
#include "ratekv/ref/packed_plan.h"

namespace ratekv::ref {

/// Which rounding the reference applies (the kernel it stands for):
enum class PackedRounding {
  /// None: the rotated query Π_g (scale·q) in double, fp32 levels (the CPU
  /// packed cache's math without its fp32 sums).
  exact,
  /// The fp16 tensor-core kernels (PackedDecodeVariant::runtime_tables, the
  /// specialized variant at GQA > 8) and the generic 5..8-bit kernel: q_rot[j] = fp16(scale · Σ_i Π_g[j,i] q[c_i]) with the sum an
  /// fp32 fma chain in i order; every key and value level rounded to fp16.
  /// (P is not rounded: the kernels' fp16 P·n^V is within their tolerance.)
  fp16,
  /// The integer kernels (PackedDecodeVariant::specialized where
  /// cuda::uses_int8_levels: uniform and general int8 instances): as fp16,
  /// but the key and value levels are
  /// int8_levels(levels) (ref/int8_levels.h). Its int8 splits of the query
  /// (error ≤ 1.6e-5·max|q|) and of P·n^V (per row, 64-token page and value group,
  /// x = P·n^V·127/(max p·max|n^V|) rounded to fp16 and split into
  /// hi + lo/254: the page's largest terms keep fp16's relative precision,
  /// smaller ones an absolute step of max p·max|n^V|/(127·254)) are not
  /// modelled. Groups of ≤ 4 bits.
  int8_levels,
};

/// Decode attention of one query per sequence over its cached tokens
/// [t0_b, seq_lens[b]) in the packed pages — t0_b = 0, or with a sliding
/// window batch.window = W > 0, t0_b = first_visible_key(seq_lens[b] − 1, W)
/// (model/sliding_window.h: the CPU runtime's AttnParams::sliding_window):
///   s_t   = Σ_g n^K_{g,t} (Π_g q_g)·ĉ^K_g[idx^K_{g,t}]   (key groups of q's KV head)
///   p_t   = softmax_t(scale · s_t)
///   out   = Σ_g Π_gᵀ Σ_t p_t n^V_{g,t} ĉ^V_g[idx^V_{g,t}] on the value group's channels
/// with ĉ the levels as `rounding` says and n the stored fp16 norms. Query
/// head q reads KV head q / plan.gqa(). A KV head with no key groups scores
/// every token 0 (uniform p); channels in no value group are 0 (docs/packed_format.md §6). Codes of
/// a 5..8-bit group are low | high << 4 (high from ext_pool under the same
/// page table, docs/packed_format.md §5).
///   pool     : n_pages · layout.page_bytes() bytes
///   ext_pool : n_pages · ext_layout.page_bytes() bytes (plans with 5..8-bit
///              groups; else ignored, may be empty)
///   q        : (batch, n_heads, head_dim) fp32 post-RoPE (fp16 queries: pass
///              their exact fp32 values)
///   returns  : (batch, n_heads, head_dim) fp32
/// Throws Error on a bad batch (check_batch; window < 0), q of the wrong size, a pool
/// that is not whole pages (or an ext_pool of another page count), or
/// int8_levels with a key or value group wider than 4 bits.
std::vector<float> packed_decode_attention(const PackedPlan& plan, const DecodeBatch& batch,
                                           std::span<const uint8_t> pool, std::span<const uint8_t> ext_pool,
                                           std::span<const float> q, float scale, PackedRounding rounding);

}  // namespace ratekv::ref
