// ratekv/engine/scheduler.h — continuous batching (engine issue 2 of 3): a
// first-come-first-served queue of generation requests driving an Executor
// (the GPU Engine through engine_executor.h; a fake in the host tests).
//
// Each iteration (one "step"):
//  1. admission: while fewer than max_batch requests run and the queue's
//     head fits (its prompt + n_predict tokens, in whole 64-token pages, at
//     most the free tokens), it gets a sequence (its pages reserved up
//     front, Engine::add_sequence) — a head that does not fit waits for
//     pages to be freed (no overtaking); a request that could never fit (past
//     the context limit, or past the whole pool with nothing running) ends
//     with an error and the queue moves on;
//  2. prefill: requests still prefilling, in arrival order, get chunks
//     (prefill_chunk tokens, or the whole prompt when 0) until
//     prefill_token_budget prompt tokens ran this step (at least one chunk);
//     a prompt's last chunk yields its first token;
//  3. decode: every request past its prefill decodes one token in one batch;
//  4. a request that produced n_predict tokens or an end-of-generation token
//     (SchedulerOptions::is_eog) frees its sequence and pages at once.
// So waiting requests prefill while others decode, and a finished sequence
// makes room for the next. Token number i of a request is drawn with
// sampling_uniform(seed, i) (ratekv/engine/sampling.h), so a request gives
// the same tokens whatever else runs beside it (up to the GPU's batch
// rounding).
//
// Host-only (no CUDA types): in the host library ratekv_engine_host.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "ratekv/engine/sampling.h"

namespace ratekv::engine {

/// What the scheduler drives. Sequence ids are the executor's.
class Executor {
 public:
  virtual ~Executor() = default;
  /// Sequences one decode step may hold.
  virtual int max_batch() const = 0;
  /// Tokens the unreserved pages hold (a multiple of 64).
  virtual int64_t free_tokens() const = 0;
  /// Tokens all pages hold.
  virtual int64_t capacity_tokens() const = 0;
  /// Longest sequence (the context limit).
  virtual int64_t context_limit() const = 0;
  /// Reserves a sequence of up to max_tokens tokens (throws Error when it
  /// does not fit).
  virtual int add_sequence(int64_t max_tokens) = 0;
  virtual void remove_sequence(int seq) = 0;
  /// Appends `tokens` (a prompt chunk) to `seq`. When `last` (the prompt's
  /// last chunk), returns the first generated token, picked from the last
  /// token's logits with `sp` and uniform `u`; else returns −1.
  virtual int32_t prefill(int seq, std::span<const int32_t> tokens, bool last, const SamplingParams& sp,
                          double u) = 0;
  /// One decode step of `seqs`: appends tokens[b] to seqs[b] and writes the
  /// next token of each to next[b] (picked with sp[b] and u[b]).
  virtual void decode(std::span<const int> seqs, std::span<const int32_t> tokens,
                      std::span<const SamplingParams> sp, std::span<const double> u, std::span<int32_t> next) = 0;
};

/// One generation request.
struct Request {
  std::vector<int32_t> prompt;  ///< ≥ 1 token
  int n_predict = 64;           ///< tokens to generate (≥ 0)
  SamplingParams sampling;
};

/// What became of a request. Times in seconds since Scheduler::run began.
struct RequestResult {
  std::vector<int32_t> tokens;  ///< generated tokens (an end-of-generation token included)
  std::string finish;           ///< "length", "eog" or "error"
  std::string error;            ///< why, for "error"
  double t_admitted = 0, t_first_token = 0, t_done = 0;
};

struct SchedulerOptions {
  int64_t prefill_chunk = 0;            ///< tokens per prefill call (a multiple of 64), 0: whole prompts
  int64_t prefill_token_budget = 4096;  ///< prompt tokens per step (at least one chunk runs)
  std::function<bool(int32_t)> is_eog;  ///< end-of-generation test (null: none)
};

/// Totals of a run.
struct SchedulerStats {
  int64_t steps = 0;            ///< iterations
  int64_t decode_steps = 0;     ///< executor decode calls
  int max_concurrent = 0;       ///< most sequences held at once
  int64_t prompt_tokens = 0, output_tokens = 0;
  double seconds = 0;           ///< wall time of run()
};

class Scheduler {
 public:
  /// Throws Error for a prefill_chunk that is not a multiple of 64 or a
  /// prefill_token_budget < 1.
  Scheduler(Executor& ex, SchedulerOptions opt);
  /// Queues a request; returns its index (results are in this order). Throws
  /// Error for an empty prompt, n_predict < 0 or invalid sampling.
  size_t submit(Request r);
  /// Runs until every queued request has finished; on_done(index, result)
  /// is called as each finishes. Returns the results in submission order.
  /// Executor errors other than a refused reservation propagate.
  std::vector<RequestResult> run(const std::function<void(size_t, const RequestResult&)>& on_done = {});
  const SchedulerStats& stats() const { return stats_; }

 private:
  Executor& ex_;
  SchedulerOptions opt_;
  std::vector<Request> reqs_;
  SchedulerStats stats_;
};

}  // namespace ratekv::engine
