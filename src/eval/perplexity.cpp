// Perplexity, llama.cpp chunk convention (eval/perplexity.h).
#include "ratekv/eval/perplexity.h"

#include <cmath>
#include <limits>

#include "ratekv/error.h"
#include "ratekv/log.h"

namespace ratekv::eval {

double token_nll(const float* logits, int64_t n_vocab, int32_t target) {
  check(target >= 0 && target < n_vocab, "perplexity: target token {} outside [0, {})", target, n_vocab);
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n_vocab; ++j) mx = std::max(mx, double{logits[j]});
  double sum = 0.0;
  for (int64_t j = 0; j < n_vocab; ++j) sum += std::exp(double{logits[j]} - mx);
  return mx + std::log(sum) - logits[target];
}

PerplexityResult perplexity(Model& model, std::span<const int32_t> tokens, int64_t n_ctx, int64_t n_chunks,
                            const CacheFactory& make_cache, int32_t bos_id, const std::string& label) {
  check(n_ctx >= 4, "perplexity: context {} must be at least 4", n_ctx);
  const int64_t avail = static_cast<int64_t>(tokens.size()) / n_ctx;
  check(avail >= 1, "perplexity: {} tokens do not fill one window of {} tokens", tokens.size(), n_ctx);
  if (n_chunks == 0) n_chunks = avail;
  check(n_chunks >= 1 && n_chunks <= avail, "perplexity: {} chunks of {} tokens requested, the text has {} tokens ({} chunks)",
        n_chunks, n_ctx, tokens.size(), avail);
  const int64_t V = model.config().n_vocab, first = n_ctx / 2;
  PerplexityResult r;
  r.n_ctx = n_ctx;
  r.n_chunks = n_chunks;
  std::vector<float> logits(static_cast<size_t>(n_ctx) * V);
  std::vector<int32_t> win(n_ctx);
  double total = 0.0;
  std::unique_ptr<Progress> prog;
  if (!label.empty()) prog = std::make_unique<Progress>(label, n_chunks);
  for (int64_t c = 0; c < n_chunks; ++c) {
    std::copy(tokens.begin() + c * n_ctx, tokens.begin() + (c + 1) * n_ctx, win.begin());
    if (bos_id >= 0) win[0] = bos_id;
    std::unique_ptr<KVCache> cache = make_cache(n_ctx);
    model.forward(win, 0, *cache, logits.data(), true);
    double nll = 0.0;
    for (int64_t i = first; i < n_ctx - 1; ++i) nll += token_nll(&logits[i * V], V, tokens[c * n_ctx + i + 1]);
    const int64_t scored = n_ctx - 1 - first;
    r.chunk_nll.push_back(nll / static_cast<double>(scored));
    total += nll;
    r.n_scored += scored;
    if (prog) prog->update(c + 1);
  }
  if (prog) prog->finish();
  r.mean_nll = total / static_cast<double>(r.n_scored);
  r.ppl = std::exp(r.mean_nll);
  return r;
}

}  // namespace ratekv::eval
