// ratekv/engine/niah.h — needle-in-a-haystack (ratekv/eval/niah.h, docs/design.md
// §9.3) on the GPU engine: the grid, prompts, needles and scoring of
// eval::run_niah, with each trial's prompt prefilled on the GPU (one piece or
// chunked) into a fresh sequence and the answer decoded greedily there.
#pragma once

#include <cstdint>
#include <vector>

#include "ratekv/engine/engine.h"
#include "ratekv/eval/niah.h"

namespace ratekv::engine {

/// eval::NiahAnswerer on `eng`. Each answer(): add_sequence(prompt + max_new),
/// Engine::prefill (chunk 0) or Engine::prefill_chunked (chunk > 0: a
/// multiple of 64, ≤ max_prefill_tokens) in `mode`, then one Engine::decode
/// step per answer token; the next token is the first index of the largest
/// logit (host, the CPU answerer's rule); the sequence is freed after (also on
/// an error). The engine needs max_prefill_tokens ≥ the prompt (chunk 0) and
/// prompt + max_new free tokens. When `answer_logits` is set, each answer()
/// leaves there the logits (n_answer, n_vocab) its tokens were picked from.
/// cache_bytes_per_token: the format's stored bytes per token
/// (CacheFormat::bytes_per_token; fp16: 2 bytes per K/V element).
class EngineNiahAnswerer : public eval::NiahAnswerer {
 public:
  EngineNiahAnswerer(Engine& eng, PrefillMode mode, int64_t chunk, std::vector<float>* answer_logits = nullptr);
  int64_t position_limit() const override;
  std::vector<int32_t> answer(int depth, int trial, const eval::NiahPrompt& prompt, int max_new,
                              const std::function<bool(int32_t)>& is_eog) override;
  double cache_bytes_per_token() const override;

 private:
  Engine& eng_;
  PrefillMode mode_;
  int64_t chunk_;
  std::vector<float>* answer_logits_;
};

}  // namespace ratekv::engine
