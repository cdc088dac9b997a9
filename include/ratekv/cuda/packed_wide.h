// ratekv/cuda/packed_wide.h — the GPU writer and reader of plans with 5..8-bit
// groups (RateQuant can give a head 5..8 bits): such a group is stored as in
// the CPU packed cache (docs/packed_format.md §5) — its low 4 bits as a 4-bit
// group of the layer's pages, its high b − 4 bits as a group of the layer's
// extension pages (PackedPlan(layout, ext, …), same page table). Correctness
// path (fp32 CUDA cores, one CTA per token, head and side; no speed target);
// decode attention over such plans is packed_decode_attention's generic
// kernel (decode_attention.h, with ext_pool).
//
// Reference: the CPU packed cache's writer (TurboQuant-MSE of docs/design.md
// §2 per group, bits through packed::write_codes) as ref::tq_mse_encode
// states it: n = ‖x_g‖, y = Π_g (x_g / n), code_j = #{fp32 midpoints
// ½(c_l + c_{l+1}) of the 2^b levels strictly below y_j}, norm fp16(n). The
// kernel sums Π x in fp32 (the reference in double), so a code can differ by
// one level where y_j lies within fp32 rounding of a midpoint (tests/cuda/
// test_packed_wide.cpp bounds it by the reference's margin).
// Device pointers, asynchronous on `stream` (a cudaStream_t as void*).
#pragma once

#include <cstdint>

#include "ratekv/cuda/decode_attention.h"

namespace ratekv::cuda {

/// Writes n_tokens tokens of every sequence b of `batch` (positions
/// seq_lens[b] + i, seq_lens = lengths BEFORE the write; decode append is
/// n_tokens = 1) of every KV head, side and group of a plan with 5..8-bit
/// groups: codes ≤ 4 bits and the low nibble of wider ones, and the norms, into
/// `pool` (plan.layout().page_bytes() per page), the high bits of the wide
/// groups into `ext_pool` (plan.ext_layout()->page_bytes() per page). Only the
/// written tokens' bits change (bitwise atomics).
///   k, v : (batch, n_tokens, n_kv_heads, head_dim) fp32 (keys post-RoPE)
/// Throws Error for a plan without 5..8-bit groups (packed_append /
/// packed_prefill write those), n_tokens < 1, head_dim > 256 or null pointers.
void packed_write_wide(const PackedPlan& plan, const DecodeBatch& batch, uint8_t* pool, uint8_t* ext_pool,
                       const float* k, const float* v, int n_tokens, void* stream);

/// packed_dequantize for a plan with 5..8-bit groups: the reconstructions
/// x̂ = n·Πᵀ c[code] (code = low nibble | high bits << 4 for wide groups) of
/// positions 0 .. n_tokens−1 of one sequence's pages (page_table: its row,
/// both pools under it), as fp16 k16, v16 (n_tokens, Hkv, hd); channels in no
/// group 0. fp32 (levels, norms as stored), rounded to fp16 once. Throws Error
/// for a plan without wide groups, n_tokens < 1 or null pointers.
void packed_dequantize_wide(const PackedPlan& plan, const uint8_t* pool, const uint8_t* ext_pool,
                            const int32_t* page_table, int n_tokens, uint16_t* k16, uint16_t* v16, void* stream);

}  // namespace ratekv::cuda
