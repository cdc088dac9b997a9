// ratekv/ref/fp16_decode_attention.h — the named CPU reference of the CUDA
// fp16 decode attention (cuda::fp16_decode_attention, the baseline kernel of
// src/cuda/decode_attention_fp16.cu): same page structure, same inputs, the
// kernel's query rounding, sums in double.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ratekv/ref/decode_batch.h"

namespace ratekv::ref {

/// Decode attention of one query per sequence over an fp16 cache paged like
/// the packed one (64-token pages, docs/packed_format.md §2): per (page, KV
/// head) K (64, head_dim) then V (64, head_dim) fp16, so a page is
/// n_kv_heads · 2 · 64 · head_dim values. With q̃ = fp16(scale · q) (the
/// kernel's rounding),
///   out[b, q] = Σ_t softmax_t(q̃ · K_t) V_t   over t0_b ≤ t < seq_lens[b],
/// query head q reading KV head q / (n_heads / n_kv_heads); t0_b = 0, or with
/// a sliding window batch.window = W > 0, t0_b = first_visible_key(seq_lens[b]
/// − 1, W) (model/sliding_window.h: the CPU runtime's AttnParams::sliding_window).
///   pool    : n_pages · n_kv_heads · 2 · 64 · head_dim fp16 bit patterns
///   q       : (batch, n_heads, head_dim) fp32 (fp16 queries: their exact values)
///   returns : (batch, n_heads, head_dim) fp32
/// Throws Error when head_dim, n_kv_heads or n_heads is not positive,
/// n_heads is not a multiple of n_kv_heads, the pool is not whole pages, q
/// has the wrong size, or on a bad batch (check_batch; window < 0).
std::vector<float> fp16_decode_attention(int n_heads, int n_kv_heads, int head_dim, const DecodeBatch& batch,
                                         std::span<const uint16_t> pool, std::span<const float> q, float scale);

}  // namespace ratekv::ref
