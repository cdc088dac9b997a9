// Perplexity on the GPU engine (ratekv/engine/perplexity.h).
#include "ratekv/engine/perplexity.h"

#include "ratekv/common/error.h"

namespace ratekv::engine {

PerplexityResult gpu_perplexity(Engine& eng, std::span<const int32_t> tokens, int64_t n_ctx, int64_t max_chunks,
                                bool add_bos, int32_t bos_id, PrefillMode mode,
                                const std::function<void(int64_t, const PerplexityResult&)>& on_chunk,
                                int64_t prefill_chunk) {
  PerplexityScorer scorer("gpu_perplexity", tokens, n_ctx, max_chunks, add_bos, bos_id);
  check(prefill_chunk > 0 || n_ctx <= eng.options().max_prefill_tokens,
        "gpu_perplexity: context {} exceeds the engine's max_prefill_tokens {}", n_ctx,
        eng.options().max_prefill_tokens);
  const int V = eng.config().n_vocab;
  std::vector<float> logits(static_cast<size_t>(n_ctx) * V);
  for (int64_t c = 0; c < scorer.result().n_chunks; ++c) {
    const std::vector<int32_t> chunk = scorer.chunk_tokens(c);
    const int seq = eng.add_sequence(n_ctx);
    try {
      if (prefill_chunk > 0)
        eng.prefill_chunked(seq, chunk, prefill_chunk, mode, logits);
      else
        eng.prefill(seq, chunk, mode, logits);
    } catch (...) {
      eng.remove_sequence(seq);
      throw;
    }
    eng.remove_sequence(seq);
    scorer.add_chunk(c, logits.data(), V);
    if (on_chunk) on_chunk(c + 1, scorer.result());
  }
  return scorer.result();
}

}  // namespace ratekv::engine
