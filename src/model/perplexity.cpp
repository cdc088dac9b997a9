// Perplexity, llama-perplexity convention (see ratekv/model/perplexity.h).
#include "ratekv/model/perplexity.h"

#include <algorithm>
#include <cmath>

#include "ratekv/common/error.h"

namespace ratekv {

double token_nll(const float* logits, int n_vocab, int32_t target) {
  float mx = logits[0];
  for (int v = 1; v < n_vocab; ++v) mx = std::max(mx, logits[v]);
  double sum = 0;
  for (int v = 0; v < n_vocab; ++v) sum += std::exp(double{logits[v]} - mx);
  return std::log(sum) - (double{logits[target]} - mx);
}

PerplexityScorer::PerplexityScorer(const char* who, std::span<const int32_t> tokens, int64_t n_ctx,
                                   int64_t max_chunks, bool add_bos, int32_t bos_id)
    : tokens_(tokens), add_bos_(add_bos), bos_id_(bos_id) {
  check(n_ctx >= 4, "{}: context {} is too small (need >= 4)", who, n_ctx);
  check(static_cast<int64_t>(tokens.size()) >= 2 * n_ctx,
        "{}: the text has {} tokens; need at least 2·n_ctx = {} (llama-perplexity's requirement)", who,
        tokens.size(), 2 * n_ctx);
  check(!add_bos || bos_id >= 0, "{}: add_bos is set but the model has no BOS token", who);
  const int64_t all = static_cast<int64_t>(tokens.size()) / n_ctx;
  r_.n_ctx = n_ctx;
  r_.n_chunks = max_chunks > 0 ? std::min(max_chunks, all) : all;
}

std::vector<int32_t> PerplexityScorer::chunk_tokens(int64_t c) const {
  const auto start = tokens_.begin() + c * r_.n_ctx;
  std::vector<int32_t> chunk(start, start + r_.n_ctx);
  if (add_bos_) chunk[0] = bos_id_;
  return chunk;
}

void PerplexityScorer::add_chunk(int64_t c, const float* logits, int n_vocab) {
  const int64_t n_ctx = r_.n_ctx, start = c * n_ctx, first = n_ctx / 2;
  double cn = 0;
  for (int64_t j = first; j < n_ctx - 1; ++j) {
    const double l = token_nll(logits + j * n_vocab, n_vocab, tokens_[start + j + 1]);
    nll_ += l;
    nll2_ += l * l;
    cn += l;
    ++r_.n_scored;
  }
  r_.chunk_ppl.push_back(std::exp(cn / static_cast<double>(n_ctx - 1 - first)));
  r_.mean_nll = nll_ / r_.n_scored;
  r_.ppl = std::exp(r_.mean_nll);
  const double var = nll2_ / r_.n_scored - r_.mean_nll * r_.mean_nll;
  r_.ppl_err = var > 0 && r_.n_scored > 1 ? r_.ppl * std::sqrt(var / (r_.n_scored - 1)) : 0.0;
}

PerplexityResult perplexity(Model& model, KVCache& cache, std::span<const int32_t> tokens, int64_t n_ctx,
                            int64_t max_chunks, bool add_bos, int32_t bos_id,
                            const std::function<void(int64_t, const PerplexityResult&)>& on_chunk) {
  PerplexityScorer scorer("perplexity", tokens, n_ctx, max_chunks, add_bos, bos_id);
  check(cache.shape().n_ctx >= n_ctx, "perplexity: cache capacity {} < context {}", cache.shape().n_ctx, n_ctx);
  const int V = model.config().n_vocab;
  std::vector<float> logits(static_cast<size_t>(n_ctx) * V);
  for (int64_t c = 0; c < scorer.result().n_chunks; ++c) {
    cache.clear();
    model.forward(scorer.chunk_tokens(c), 0, cache, logits.data(), /*all_logits=*/true);
    scorer.add_chunk(c, logits.data(), V);
    if (on_chunk) on_chunk(c + 1, scorer.result());
  }
  return scorer.result();
}

}  // namespace ratekv
