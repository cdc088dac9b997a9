// The GPU Engine as the scheduler's Executor (ratekv/engine/engine_executor.h).
#include "ratekv/engine/engine_executor.h"

#include <algorithm>

namespace ratekv::engine {

EngineExecutor::EngineExecutor(Engine& eng, PrefillMode mode, bool chunked)
    : eng_(eng), mode_(mode), chunked_(chunked), logits_(static_cast<size_t>(eng.config().n_vocab)) {}

int EngineExecutor::max_batch() const { return eng_.options().max_batch; }
int64_t EngineExecutor::free_tokens() const { return eng_.free_tokens(); }
int64_t EngineExecutor::capacity_tokens() const { return eng_.memory().capacity_tokens; }
int64_t EngineExecutor::context_limit() const { return eng_.context_limit(); }
int EngineExecutor::add_sequence(int64_t max_tokens) { return eng_.add_sequence(max_tokens); }
void EngineExecutor::remove_sequence(int seq) { eng_.remove_sequence(seq); }

int32_t EngineExecutor::prefill(int seq, std::span<const int32_t> tokens, bool last, const SamplingParams& sp,
                                double u) {
  const std::span<float> lg = last ? std::span<float>(logits_) : std::span<float>();
  if (chunked_)
    eng_.prefill_chunk(seq, tokens, mode_, lg);
  else
    eng_.prefill(seq, tokens, mode_, lg);
  return last ? sample_reference(logits_.data(), static_cast<int>(logits_.size()), sp, u) : -1;
}

void EngineExecutor::decode(std::span<const int> seqs, std::span<const int32_t> tokens,
                            std::span<const SamplingParams> sp, std::span<const double> u, std::span<int32_t> next) {
  if (std::all_of(sp.begin(), sp.end(), [](const SamplingParams& s) { return s.greedy(); }))
    eng_.decode(seqs, tokens, 1, next);
  else
    eng_.decode_sample(seqs, tokens, sp, u, next);
}

}  // namespace ratekv::engine
