// src/engine/buffer_sizes.h — the engine's device buffers, counted once for
// both the memory plan (memory_plan.cpp) and the allocation (engine.cpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "ratekv/engine/engine.h"
#include "ratekv/format/packed_format.h"
#include "ratekv/format/packed_vq_format.h"
#include "ratekv/model/synthetic.h"

namespace ratekv::engine::detail {

/// Decode steps whose argmax tokens one graph replay sequence records.
inline constexpr int kHistorySteps = 4096;
/// cuBLAS workspace (set explicitly so graph capture allocates nothing).
inline constexpr size_t kCublasWorkspace = size_t{64} << 20;

struct Dims {
  int64_t d, qd, kvd, qkvd, dff, V, hd, H, Hkv, L;
  explicit Dims(const ModelConfig& c)
      : d(c.d_model),
        qd(int64_t{c.n_heads} * c.head_dim),
        kvd(int64_t{c.n_kv_heads} * c.head_dim),
        qkvd(int64_t{c.n_heads + 2 * c.n_kv_heads} * c.head_dim),
        dff(c.d_ff),
        V(c.n_vocab),
        hd(c.head_dim),
        H(c.n_heads),
        Hkv(c.n_kv_heads),
        L(c.n_layers) {}
};

/// Rows of the activation buffers (prefill rows and decode rows share them).
inline int64_t activation_rows(const EngineOptions& o) {
  return std::max<int64_t>(o.max_prefill_tokens, o.max_batch);
}
/// LM-head rows per launch.
inline int64_t logit_rows(const EngineOptions& o) {
  return o.max_logit_rows > 0 ? std::max(o.max_logit_rows, o.max_batch) : std::max(o.max_batch, 512);
}

/// Keys per tile of chunked prefill's attention (Engine::prefill_chunk): as
/// many as the score buffer (fp32 scores + fp16 probabilities, 6 bytes per
/// entry) holds for a whole max_prefill_tokens chunk of every query head,
/// whole pages, at least one page.
inline int64_t key_tile_tokens(const ModelConfig& c, const EngineOptions& o) {
  const int64_t per_key = 6 * int64_t{c.n_heads} * o.max_prefill_tokens;
  const int64_t t = static_cast<int64_t>(o.prefill_score_bytes) / per_key / 64 * 64;
  return std::max<int64_t>(64, t);
}
/// Chunked prefill's scratch: a key tile of K and V (fp16) and the online
/// softmax state (m, l fp32) of a chunk's rows.
inline size_t chunk_scratch_bytes(const ModelConfig& c, const EngineOptions& o) {
  const Dims m(c);
  return static_cast<size_t>(4 * key_tile_tokens(c, o) * m.kvd + 8 * activation_rows(o) * m.H);
}

/// Bytes of one activation row (every per-token buffer: x, xn, qkv, q16,
/// k32/v32, k16/v16, o32, att16, tmp, gate/up, SwiGLU out, token, position).
inline size_t activation_row_bytes(const Dims& m) {
  return static_cast<size_t>(4 * m.d + 2 * m.d + 4 * m.qkvd + 2 * m.qd + 8 * m.kvd + 4 * m.kvd + 4 * m.qd + 4 * m.qd +
                             2 * m.qd + 4 * m.d + 8 * m.dff + 2 * m.dff + 8);
}

inline size_t weight_bytes(const ModelConfig& c, bool untied) {
  const Dims m(c);
  const size_t mats = static_cast<size_t>(m.qkvd * m.d + m.d * m.qd + 2 * m.dff * m.d + m.d * m.dff);
  size_t b = 2 * static_cast<size_t>(m.V * m.d) * (untied ? 2 : 1) + 2 * mats * m.L;
  b += 4 * static_cast<size_t>(2 * m.d * m.L + m.d);                        // norms
  if (c.qkv_bias) b += 4 * static_cast<size_t>(m.qkvd * m.L);  // biases
  if (c.qk_norm) b += 4 * static_cast<size_t>(2 * m.hd * m.L);    // Gemma 3: QK-norm weights
  if (c.post_norms) b += 4 * static_cast<size_t>(2 * m.d * m.L);  // Gemma 3: post-norm weights
  return b;
}

/// The context limit (tokens): EngineOptions::context_limit, else the
/// model's trained context.
inline int64_t context_limit(const ModelConfig& c, const EngineOptions& o) {
  return o.context_limit > 0 ? o.context_limit : c.n_ctx_train;
}
/// Page-table row length: ⌈context limit / 64⌉ pages.
inline int64_t max_seq_pages(const ModelConfig& c, const EngineOptions& o) {
  return (context_limit(c, o) + packed::kPageTokens - 1) / packed::kPageTokens;
}

/// Decode and page-table state: per batch row the position, the length, the
/// argmax history (kHistorySteps int32), temperature, top-k, top-p (4 bytes
/// each) and the uniform (8); the step counter, a zero and a start position
/// (4 bytes each); the decode page tables (max_batch rows) and the prefill's
/// page-table row (int32 per page).
inline size_t decode_state_bytes(int B, int64_t max_pages) {
  return static_cast<size_t>(B) * (4 + 4 + 4 * kHistorySteps + 4 + 4 + 4 + 8) + 3 * 4 +
         4 * static_cast<size_t>(B) * max_pages + 4 * static_cast<size_t>(max_pages);
}

/// Prefill attention's score (fp32) and probability (fp16) buffers: one
/// entry each per 6 bytes of EngineOptions::prefill_score_bytes.
inline size_t score_bytes(const EngineOptions& o) { return o.prefill_score_bytes / 6 * 4; }
inline size_t prob_bytes(const EngineOptions& o) { return o.prefill_score_bytes / 6 * 2; }

/// Whether any layer is a sliding-window layer (Gemma 3).
inline bool any_sliding(const ModelConfig& c) {
  for (int l = 0; l < c.n_layers; ++l)
    if (c.is_sliding(l)) return true;
  return false;
}

/// Whether layer l of a packed format has a cuda::PackedPlan: every layer
/// without vq pages, and a vq layer whose values are tq-mse (in its scalar
/// pages); a vq layer with vq or fp16 values has none.
inline bool has_packed_plan(const CacheFormat& f, int l) {
  const CacheFormat::VqLayer* vq = f.vq(l);
  return !f.is_fp16() && (!vq || vq->layout.side(packed::Side::value).kind == packed::VqSideKind::none);
}

/// Decode attention's split-K workspace (memory_plan.cpp): the largest
/// cuda::decode_workspace_bytes over batch sizes 1..max_batch with the split
/// count of every kernel the engine may run (both fp16 kernels; each
/// layer's packed or vq instance) at the context limit and at the short lengths
/// 64, 256, 1024, 4096 (splits grow as lengths shrink), plus 8 splits.
size_t decode_workspace_bytes(const ModelConfig& c, const CacheFormat& f, const EngineOptions& o);

/// Device tables: every layer's cuda::PackedPlan (packed formats, with the
/// fp32 prefill matrices: the engine's K/V are fp32), VqPlan and VqEncodePlan
/// (layers with vq pages), the RoPE inverse
/// frequencies (fp64; twice with sliding layers: their local base) and the
/// read probe's sink (memory_plan.cpp).
size_t table_bytes(const ModelConfig& c, const CacheFormat& f);

/// Packed prefill's rotated-row buffer (cuda::PrefillScratch) for a
/// max_prefill_tokens prompt (capped at its 64 MiB chunk; fill_synthetic's
/// longer runs go in chunks); 0 for the fp16 cache and for formats without a
/// PackedPlan (memory_plan.cpp).
size_t prefill_rotation_bytes(const ModelConfig& c, const CacheFormat& f, const EngineOptions& o);

}  // namespace ratekv::engine::detail
