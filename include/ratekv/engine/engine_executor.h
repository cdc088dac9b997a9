// ratekv/engine/engine_executor.h — the GPU Engine as the continuous-batching
// scheduler's Executor (ratekv/engine/scheduler.h).
//
// prefill: Engine::prefill_chunk when built with chunked = true (the
// scheduler's prefill_chunk > 0), else Engine::prefill of the whole prompt;
// the first token is picked from the last token's logits on the host with
// engine::sample_reference (the same definition as the GPU sampler; one
// token per request). decode: Engine::decode (the step's own argmax) when
// every row is greedy, else Engine::decode_sample (sampling on the GPU).
#pragma once

#include "ratekv/engine/engine.h"
#include "ratekv/engine/scheduler.h"

namespace ratekv::engine {

class EngineExecutor : public Executor {
 public:
  /// `eng` must outlive the executor.
  EngineExecutor(Engine& eng, PrefillMode mode, bool chunked);
  int max_batch() const override;
  int64_t free_tokens() const override;
  int64_t capacity_tokens() const override;
  int64_t context_limit() const override;
  int add_sequence(int64_t max_tokens) override;
  void remove_sequence(int seq) override;
  int32_t prefill(int seq, std::span<const int32_t> tokens, bool last, const SamplingParams& sp, double u) override;
  void decode(std::span<const int> seqs, std::span<const int32_t> tokens, std::span<const SamplingParams> sp,
              std::span<const double> u, std::span<int32_t> next) override;

 private:
  Engine& eng_;
  PrefillMode mode_;
  bool chunked_;
  std::vector<float> logits_;
};

}  // namespace ratekv::engine
