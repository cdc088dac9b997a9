// ratekv/model/perplexity.h — perplexity with llama.cpp's llama-perplexity convention.
//
// Given the token ids of a whole text (BOS already prepended iff the model
// declares tokenizer.ggml.add_bos_token):
//   - split into non-overlapping chunks of n_ctx tokens (a tail shorter than
//     n_ctx is dropped); when add_bos, the first token of each chunk is
//     replaced by BOS;
//   - evaluate each chunk from an empty cache (positions 0..n_ctx-1);
//   - score the second half only: the logits at positions n_ctx/2 .. n_ctx-2
//     predicting the original tokens n_ctx/2+1 .. n_ctx-1 of the chunk
//     (n_ctx − 1 − n_ctx/2 tokens per chunk);
//   - PPL = exp(mean NLL), ± = PPL · sqrt((E[nll²] − E[nll]²) / (count − 1)).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "ratekv/model/kv_cache.h"
#include "ratekv/model/model.h"

namespace ratekv {

struct PerplexityResult {
  double ppl = 0, ppl_err = 0, mean_nll = 0;
  int64_t n_ctx = 0, n_chunks = 0, n_scored = 0;
  std::vector<double> chunk_ppl;  ///< exp(mean NLL) of each chunk's scored tokens
};

/// Runs the protocol above on `tokens` with `cache` (cleared before every
/// chunk; capacity >= n_ctx). max_chunks <= 0: all full chunks. on_chunk, if
/// set, is called after each chunk with (chunks done, running result).
/// Throws Error when tokens.size() < 2·n_ctx (llama-perplexity's requirement),
/// n_ctx < 4, add_bos without a BOS id, or any forward error.
PerplexityResult perplexity(Model& model, KVCache& cache, std::span<const int32_t> tokens, int64_t n_ctx,
                            int64_t max_chunks, bool add_bos, int32_t bos_id,
                            const std::function<void(int64_t, const PerplexityResult&)>& on_chunk = {});

/// −log softmax(logits)[target] over n_vocab logits, in double with the max
/// subtracted. target must be in [0, n_vocab).
double token_nll(const float* logits, int n_vocab, int32_t target);

/// The protocol above, less the forward passes: checks the arguments, then scores chunk after chunk
/// from their logits. Shared by perplexity() (CPU runtime) and engine::gpu_perplexity() (GPU engine),
/// so that both score the same tokens and report the same statistics.
class PerplexityScorer {
 public:
  /// `who` prefixes the messages ("perplexity", "gpu_perplexity"). Throws Error when n_ctx < 4,
  /// tokens.size() < 2·n_ctx or add_bos without a BOS id (bos_id < 0). max_chunks <= 0: all full chunks.
  PerplexityScorer(const char* who, std::span<const int32_t> tokens, int64_t n_ctx, int64_t max_chunks,
                   bool add_bos, int32_t bos_id);

  /// Chunk c's n_ctx input tokens (BOS in front when add_bos), to be evaluated from an empty cache.
  std::vector<int32_t> chunk_tokens(int64_t c) const;

  /// Scores chunk c from its logits ([n_ctx, n_vocab] row-major, fp32; row j predicts token j + 1 of
  /// the chunk's original text) and updates result().
  void add_chunk(int64_t c, const float* logits, int n_vocab);

  const PerplexityResult& result() const { return r_; }

 private:
  std::span<const int32_t> tokens_;
  bool add_bos_;
  int32_t bos_id_;
  double nll_ = 0, nll2_ = 0;
  PerplexityResult r_;
};

}  // namespace ratekv
