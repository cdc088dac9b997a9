// Needle-in-a-haystack on the GPU engine (include/ratekv/engine/niah.h).
#include "ratekv/engine/niah.h"


#include "ratekv/common/error.h"

namespace ratekv::engine {

EngineNiahAnswerer::EngineNiahAnswerer(Engine& eng, PrefillMode mode, int64_t chunk,
                                       std::vector<float>* answer_logits)
    : eng_(eng), mode_(mode), chunk_(chunk), answer_logits_(answer_logits) {
  check(chunk == 0 || (chunk >= 64 && chunk % 64 == 0 && chunk <= eng.options().max_prefill_tokens),
        "niah (GPU): chunk {} must be 0 or a multiple of 64 up to the engine's max_prefill_tokens {}", chunk,
        eng.options().max_prefill_tokens);
}

int64_t EngineNiahAnswerer::position_limit() const { return eng_.context_limit(); }

double EngineNiahAnswerer::cache_bytes_per_token() const { return eng_.format().bytes_per_token(); }

std::vector<int32_t> EngineNiahAnswerer::answer(int, int, const eval::NiahPrompt& P, int max_new,
                                                const std::function<bool(int32_t)>& is_eog) {
  check(max_new >= 1, "niah (GPU): max_new {} must be ≥ 1", max_new);
  const int V = eng_.config().n_vocab;
  const int64_t n = static_cast<int64_t>(P.tokens.size());
  check(chunk_ > 0 || n <= eng_.options().max_prefill_tokens,
        "niah (GPU): prompt of {} tokens exceeds the engine's max_prefill_tokens {} (give a chunk)", n,
        eng_.options().max_prefill_tokens);
  const int seq = eng_.add_sequence(n + max_new);
  std::vector<int32_t> out;
  if (answer_logits_) answer_logits_->clear();  // a failed prefill leaves no stale logits of the last trial
  try {
    std::vector<float> logits(V);
    if (chunk_ > 0)
      eng_.prefill_chunked(seq, P.tokens, chunk_, mode_, logits);
    else
      eng_.prefill(seq, P.tokens, mode_, logits);
    out = greedy_answer(logits, max_new, is_eog, answer_logits_, [&](int32_t next, int) {
      int32_t picked = 0;
      eng_.decode(std::span<const int>(&seq, 1), std::span<const int32_t>(&next, 1), 1,
                  std::span<int32_t>(&picked, 1), logits);
    });
  } catch (...) {
    eng_.remove_sequence(seq);
    throw;
  }
  eng_.remove_sequence(seq);
  return out;
}

}  // namespace ratekv::engine
