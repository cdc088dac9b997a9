// ratekv/ref/vq_decode_attention.h — the named CPU reference of the CUDA vq
// decode attention (cuda::vq_decode_attention, src/cuda/decode_attention_vq.cu):
// TaSQ / CQ sides (codebook lookup × shared fp16 scale; keys pre-RoPE, rotated
// at the key's position), fp16 sides and a scalar TQ-MSE value side. Same
// inputs as the kernel; sums in double (the kernel computes in fp32 and does
// not round the query). Pages: docs/packed_format.md §7.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ratekv/ref/decode_batch.h"
#include "ratekv/ref/vq_plan.h"

namespace ratekv::ref {

/// Decode attention of one query per sequence at positions t = 0 …
/// seq_lens[b] − 1 (the key's position is its token index):
///   k̂_t = RoPE_t(s_t · C̃[z_t]) (vq keys; fp16 keys are stored post-RoPE),
///   v̂_t = s_t · C̃[z_t], the fp16 row, or (scalar values) Σ_g Π_gᵀ n_g c_g[idx]
///         with fp32 levels and the stored fp16 norms,
///   out[b, q] = Σ_t softmax_t(scale · q·k̂_t) v̂_t,
/// s_t the slot's shared fp16 scale (1 without one); channels in no scalar
/// value group are 0.
///   pool        : n_pages · layout().page_bytes() bytes (vq pages)
///   scalar_pool : the scalar pages (n_pages · scalar layout page_bytes()) when
///                 the values are scalar, else ignored (may be empty)
///   q           : (batch, n_heads, head_dim) fp32 (fp16 queries: their exact values)
///   returns     : (batch, n_heads, head_dim) fp32
/// Throws Error on a bad batch (check_batch), q of the wrong size, pools that
/// are not whole pages or of different page counts, or a sliding window
/// (batch.window ≠ 0: not implemented, like cuda::vq_decode_attention).
std::vector<float> vq_decode_attention(const VqPlan& plan, const DecodeBatch& batch, std::span<const uint8_t> pool,
                                       std::span<const uint8_t> scalar_pool, std::span<const float> q, float scale);

}  // namespace ratekv::ref
