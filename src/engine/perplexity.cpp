// Perplexity on the GPU engine (ratekv/engine/perplexity.h).
#include "ratekv/engine/perplexity.h"

#include <algorithm>
#include <cmath>

#include "ratekv/common/error.h"

namespace ratekv::engine {

PerplexityResult gpu_perplexity(Engine& eng, std::span<const int32_t> tokens, int64_t n_ctx, int64_t max_chunks,
                                bool add_bos, int32_t bos_id, PrefillMode mode,
                                const std::function<void(int64_t, const PerplexityResult&)>& on_chunk,
                                int64_t prefill_chunk) {
  check(n_ctx >= 4, "gpu_perplexity: context {} is too small (need >= 4)", n_ctx);
  check(static_cast<int64_t>(tokens.size()) >= 2 * n_ctx,
        "gpu_perplexity: the text has {} tokens; need at least 2·n_ctx = {} (llama-perplexity's requirement)",
        tokens.size(), 2 * n_ctx);
  check(!add_bos || bos_id >= 0, "gpu_perplexity: add_bos is set but the model has no BOS token");
  check(prefill_chunk > 0 || n_ctx <= eng.options().max_prefill_tokens,
        "gpu_perplexity: context {} exceeds the engine's max_prefill_tokens {}", n_ctx,
        eng.options().max_prefill_tokens);
  const int64_t all = static_cast<int64_t>(tokens.size()) / n_ctx;
  PerplexityResult r;
  r.n_ctx = n_ctx;
  r.n_chunks = max_chunks > 0 ? std::min(max_chunks, all) : all;
  const int64_t first = n_ctx / 2;
  const int V = eng.config().n_vocab;
  std::vector<float> logits(static_cast<size_t>(n_ctx) * V);
  double nll = 0, nll2 = 0;
  for (int64_t c = 0; c < r.n_chunks; ++c) {
    const int64_t start = c * n_ctx;
    std::vector<int32_t> chunk(tokens.begin() + start, tokens.begin() + start + n_ctx);
    if (add_bos) chunk[0] = bos_id;
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
    double cn = 0;
    for (int64_t j = first; j < n_ctx - 1; ++j) {
      const double l = token_nll(logits.data() + j * V, V, tokens[start + j + 1]);
      nll += l;
      nll2 += l * l;
      cn += l;
      ++r.n_scored;
    }
    r.chunk_ppl.push_back(std::exp(cn / static_cast<double>(n_ctx - 1 - first)));
    r.mean_nll = nll / r.n_scored;
    r.ppl = std::exp(r.mean_nll);
    const double var = nll2 / r.n_scored - r.mean_nll * r.mean_nll;
    r.ppl_err = var > 0 && r.n_scored > 1 ? r.ppl * std::sqrt(var / (r.n_scored - 1)) : 0.0;
    if (on_chunk) on_chunk(c + 1, r);
  }
  return r;
}

}  // namespace ratekv::engine
