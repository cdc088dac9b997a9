// src/engine/buffer_sizes.h — the engine's device buffers, counted once for
// both the memory plan (memory_plan.cpp) and the allocation (engine.cpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "ratekv/engine/engine.h"
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

/// Decode-only bytes per batch row outside activations (attention q/out
/// copies, lengths, history).
inline size_t decode_bytes(const Dims& m, int B) {
  return static_cast<size_t>(B) * (4 * m.qd + 16 + 4 * kHistorySteps) + 64;
}

}  // namespace ratekv::engine::detail
