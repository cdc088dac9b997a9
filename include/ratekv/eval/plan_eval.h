// ratekv/eval/plan_eval.h — evaluate KV-cache plans on a model and a text
// against the fp32 cache and each other (the library side of `ratekv eval`;
// docs/design.md §3.5 metric, §9 protocol; report: docs/eval_report.md).
//
// For tokens cut into n_chunks = ⌊N/ctx⌋ windows of ctx tokens (llama.cpp's
// perplexity windows; each from a fresh cache), window by window:
//  * with perplexity, a reference pass with the fp16 cache (K and V rounded to
//    fp16, llama.cpp's f16 cache) whose next-token logits on the scored
//    positions every other pass is compared with (eval/next_token_kld.h);
//  * one fp32 pass gives the reference perplexity and, through ForwardHooks,
//    every layer's post-RoPE q and k; each plan's keys k̂ are the fake-quant
//    cache's reconstruction of the whole window (fake_quant_sequence), and
//    RoPE-logit MAE and attention KL (eval/logit_error.h; K-only, V exact)
//    are accumulated per layer, and the attention-logit NMSE per bucket of
//    query positions over all layers (reported with the calibration window
//    length "fit_ctx" of fitted plans, so positions past it stand out); the
//    first window's K/V also fill a PackedKVCache per plan (when it serves
//    the plan) whose page bytes are reported beside the planned stored bytes
//    (format/stored_bytes.h);
//  * per plan and run seed, perplexity (llama.cpp's convention, as
//    ratekv/model/perplexity.h) and next-token KLD / top-1 / Δp against the
//    fp16-cache reference, with a FakeQuantKVCache quantizing K only and K+V.
// With a reference cache (EvalOptions::reference_cache, eval/reference_cache.h)
// the fp16-reference logits, the fp32 pass's perplexity terms and its
// activations of a window are read from disk when present (and written when
// not), so another plan on the same windows costs only its own passes.
// Run seeds 0..n_seeds−1: seed 0 is the plan as stored, seed r > 0 the plan
// with every rotation seed re-mixed with r (cache/plan_codecs.h
// reseeded_plan). Plans without rotations (fp16, kivi, q8_0, q4_0) are
// deterministic and run once; their spread is 0.
// Report JSON (format "ratekv-eval", version 1): see docs/eval_report.md.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ratekv/model/model.h"
#include "ratekv/format/plan.h"

namespace ratekv::eval {

/// One plan to evaluate; `name` labels its rows (unique).
struct PlanEntry {
  std::string name;
  std::string file;
  Plan plan;
};

struct EvalOptions {
  int64_t ctx = 512;          ///< window length (tokens)
  int n_seeds = 1;            ///< run seeds (≥ 1)
  int64_t query_stride = 1;   ///< MAE/KL over query rows i ≡ 0 mod stride (all causal keys)
  bool perplexity = true;     ///< run the quantized perplexity passes
  bool perplexity_k = true;   ///< with perplexity: the K-only pass (off: no "ppl_k" / next_token "k" in the report)
  bool perplexity_kv = true;  ///< with perplexity: also the K+V pass (off: K-only, no "ppl_kv" in the report)
  /// Directory of the reference cache (eval/reference_cache.h): windows found there skip the
  /// fp16-reference and fp32 passes, windows not found are run and written. "" = no cache.
  std::string reference_cache;
  /// The cache's key (reference_key of the model file, tokens, ctx, BOS rule); required with a cache.
  std::string reference_key;
  int32_t bos_id = -1;        ///< ≥ 0: first token of each window replaced (llama.cpp add_bos)
  double pair_tolerance = 0.02;  ///< plans whose stored K bits differ less (or with the same K budget) are compared
};

/// Runs the evaluation and returns the report. Throws Error for duplicate
/// names or plans that do not match the model; ParamError naming the
/// EvalOptions field ("EvalOptions.ctx", …) for bad options or too few tokens
/// for one window (two with perplexity).
nlohmann::json evaluate_plans(Model& model, std::span<const int32_t> tokens, const std::vector<PlanEntry>& plans,
                              const EvalOptions& opt);

/// A readable text rendering of a report: summary rows (bits, MAE, KL, PPL
/// with spreads), pairwise comparisons, and the per-layer MAE table.
std::string format_eval_report(const nlohmann::json& report);

}  // namespace ratekv::eval
