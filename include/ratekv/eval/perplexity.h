// ratekv/eval/perplexity.h — perplexity with llama.cpp's chunk convention
// (llama-perplexity, tools/perplexity/perplexity.cpp), so numbers are
// comparable with tests/fixtures/smollm2/perplexity.json.
//
// The token sequence is cut into n_chunks consecutive windows of n_ctx
// tokens; each window runs from an empty cache at positions 0..n_ctx−1 (its
// first token replaced by BOS when the model adds one), and only the
// predictions of tokens first+1 .. n_ctx−1 with first = n_ctx/2 are scored,
// i.e. n_ctx − 1 − n_ctx/2 per window. PPL = exp(mean NLL over all scored
// tokens). Log-softmax in double.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ratekv/kv_cache.h"
#include "ratekv/model.h"

namespace ratekv::eval {

struct PerplexityResult {
  double ppl = 0.0;
  double mean_nll = 0.0;         ///< nats per scored token
  int64_t n_ctx = 0;
  int64_t n_chunks = 0;
  int64_t n_scored = 0;          ///< scored tokens over all chunks
  std::vector<double> chunk_nll; ///< mean NLL of each chunk
};

/// Builds a fresh cache of capacity n_ctx for one window.
using CacheFactory = std::function<std::unique_ptr<KVCache>(int64_t n_ctx)>;

/// Perplexity of `model` on `tokens` (see file comment). n_chunks = 0 uses
/// every full window (tokens.size() / n_ctx). bos_id ≥ 0 replaces each
/// window's first token (llama.cpp with add_bos), −1 leaves it. A label
/// non-empty shows progress on stderr. Throws Error when n_ctx < 4, the
/// tokens do not fill one window, or n_chunks asks for more windows than the
/// tokens hold.
PerplexityResult perplexity(Model& model, std::span<const int32_t> tokens, int64_t n_ctx, int64_t n_chunks,
                            const CacheFactory& make_cache, int32_t bos_id = -1, const std::string& label = "");

/// NLL −log softmax(logits)[target] in nats, in double. logits: (n_vocab).
double token_nll(const float* logits, int64_t n_vocab, int32_t target);

}  // namespace ratekv::eval
