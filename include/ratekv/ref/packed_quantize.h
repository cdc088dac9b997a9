// ratekv/ref/packed_quantize.h — the named CPU references of the CUDA
// quantizers: quantize-append of one decode token (cuda::packed_append,
// src/cuda/quantize_append.cu) and quantize-prefill of a prompt chunk
// (cuda::packed_prefill, src/cuda/quantize_prefill.cu). TurboQuant-MSE per
// group (docs/design.md §2), bits placed by the format's reference writer
// (packed::write_codes / write_norm, docs/packed_format.md §3–§4).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ratekv/ref/decode_batch.h"
#include "ratekv/ref/packed_plan.h"

namespace ratekv::ref {

/// One group's TurboQuant-MSE code as the GPU quantizers define it.
struct TqMseCode {
  std::vector<uint8_t> codes;  ///< (m) code of rotated coordinate j
  uint16_t norm_fp16 = 0;      ///< fp16(‖x‖) (round to nearest even)
  /// (m) |y_j − the midpoint nearest to y_j|: where this is within fp32
  /// rounding of y (the kernels sum Π x in fp32, this reference in double)
  /// a kernel's code may be one off.
  std::vector<double> margin;
};

/// Encodes one group's vector x (m values, the group's channels in
/// GroupSpec order): n = ‖x‖ (double), y = Π (x / n) (double; y = 0 when
/// n = 0), code_j = #{l : y_j > μ_l} with the fp32 midpoints
/// μ_l = 0.5f·(c_l + c_{l+1}) of the 2^b levels; norm fp16(n).
///   rotation: m × m row-major (y = Π u); levels: 2^b ascending, b = 1..8.
/// Throws Error when the sizes disagree, levels is not a power of two ≥ 2,
/// or x is not finite.
TqMseCode tq_mse_encode(std::span<const float> rotation, std::span<const float> levels, std::span<const float> x);

/// Quantize-append: for every sequence b, the token k[b], v[b] is written at
/// position seq_lens[b] (the length BEFORE the append) — slot
/// seq_lens[b] mod 64 of page page_table[b, seq_lens[b] / 64] — every KV head,
/// side and group (tq_mse_encode), through packed::write_codes / write_norm:
/// only that slot's bits change.
///   pool : n_pages · layout.page_bytes() bytes, modified in place
///   k, v : (batch, n_kv_heads, head_dim) fp32 (fp16 inputs: their exact values)
/// Throws Error on a bad batch (check_batch with 1 new token), k/v of the
/// wrong size, non-finite inputs, or a plan with 5..8-bit groups (the GPU
/// quantizers do not write extension pages; neither does this reference).
void packed_append(const PackedPlan& plan, const DecodeBatch& batch, std::span<uint8_t> pool,
                   std::span<const float> k, std::span<const float> v);

/// Quantize-prefill: for every sequence b the n_tokens vectors k[b, i],
/// v[b, i] are written at positions seq_lens[b] + i (seq_lens = lengths
/// BEFORE the prefill), as packed_append writes one.
///   k, v : (batch, n_tokens, n_kv_heads, head_dim) fp32
/// Throws Error as packed_append, and on n_tokens < 1.
void packed_prefill(const PackedPlan& plan, const DecodeBatch& batch, std::span<uint8_t> pool,
                    std::span<const float> k, std::span<const float> v, int n_tokens);

}  // namespace ratekv::ref
