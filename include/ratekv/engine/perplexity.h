// ratekv/engine/perplexity.h — perplexity on the GPU engine with llama.cpp's
// llama-perplexity convention (the CPU's ratekv/model/perplexity.h: chunks of
// n_ctx tokens, BOS in front of each when the model declares it, the second
// half of each chunk scored), each chunk one prefill of a fresh sequence in
// `mode` (evaluation: every K/V quantized before attention reads it, the CPU
// packed cache's protocol; serving: the prompt attends to its own fp16 K/V).
#pragma once

#include <functional>
#include <span>

#include "ratekv/engine/engine.h"
#include "ratekv/model/perplexity.h"

namespace ratekv::engine {

/// Runs the protocol on `eng` (which needs max_prefill_tokens ≥ n_ctx, or ≥
/// prefill_chunk when prefill_chunk > 0: each window through
/// Engine::prefill_chunked in chunks of that many tokens; and n_ctx free
/// tokens). max_chunks ≤ 0: all full chunks. Throws Error as
/// ratekv::perplexity does (too few tokens, n_ctx < 4, add_bos without BOS)
/// and when n_ctx exceeds max_prefill_tokens or the free pool.
PerplexityResult gpu_perplexity(Engine& eng, std::span<const int32_t> tokens, int64_t n_ctx, int64_t max_chunks,
                                bool add_bos, int32_t bos_id, PrefillMode mode,
                                const std::function<void(int64_t, const PerplexityResult&)>& on_chunk = {},
                                int64_t prefill_chunk = 0);

}  // namespace ratekv::engine
