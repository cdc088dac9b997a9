// ratekv/eval/reference_cache.h — the reference passes of one evaluation
// window, kept on disk so that evaluating one more plan on the same model,
// text and windows costs only that plan's passes (docs/eval_report.md,
// "Reference cache"; used by eval::evaluate_plans, eval/plan_eval.h).
//
// Per window c of ctx tokens (positions 0..ctx−1, scored positions
// first = ctx/2 .. ctx−2, per_window = ctx − 1 − first of them):
//   * ref_logits  (per_window, n_vocab) F32: the fp16-cache model's next-token
//                 logits at the scored positions (present when the window was
//                 run with perplexity);
//   * fp_kld, fp_delta_p (per_window) F32 and fp_top1 (per_window) U8: the
//                 fp32 cache's next-token comparison with them (next_token_kld.h);
//   * pos (ctx) I32 and, per layer l, q_post.l (ctx, n_heads, head_dim),
//     k_pre.l, k_post.l, v.l (ctx, n_kv_heads, head_dim) F32: the fp32 pass's
//     activations (model.h LayerActivations), replayed into the MAE/KL hooks;
//   * metadata "ratekv": {"format": "ratekv-eval-reference", "version": 1,
//     "key", "window", "ctx", "n_vocab", "n_layers", "n_heads", "n_kv_heads",
//     "head_dim", "perplexity", "fp_nll"} — fp_nll is the fp32 pass's summed
//     next-token NLL over the scored positions (nats, a JSON double).
// One safetensors file per window, `<dir>/window<c>.safetensors`, written
// atomically. The key names what the window depends on (model file, tokens,
// window length, BOS rule); the caller computes it (reference_key).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ratekv/eval/next_token_kld.h"

namespace ratekv::eval {

/// The shapes a cached window must have.
struct ReferenceShape {
  int64_t ctx = 0;
  int64_t n_vocab = 0;
  int n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
};

/// Everything the reference passes of one window produce (see the file comment).
struct WindowReference {
  bool perplexity = false;               ///< ref_logits and the fp32 comparisons are present
  std::vector<float> ref_logits;         ///< (per_window, n_vocab) or empty
  double fp_nll = 0.0;                   ///< Σ NLL of the fp32 pass over the scored positions
  std::vector<TokenComparison> fp_vs_ref;  ///< per scored position (perplexity only)
  std::vector<int32_t> pos;              ///< (ctx)
  struct Layer {
    std::vector<float> q_post, k_pre, k_post, v;
  };
  std::vector<Layer> layers;             ///< n_layers
};

/// Key of a window set: SHA-256 hex of "model_sha256|ctx|bos|token ids" (the
/// tokens of all windows); equal keys mean equal reference passes.
std::string reference_key(const std::string& model_sha256, int64_t ctx, int32_t bos_id,
                          std::span<const int32_t> tokens);

/// A directory of cached windows for one key.
class ReferenceCache {
 public:
  /// Creates `dir` if needed. Throws Error naming the directory when it cannot.
  ReferenceCache(std::string dir, std::string key, ReferenceShape shape);

  /// The cached window c, or nullopt when its file is absent or lacks the
  /// logits a run with perplexity needs. Throws Error naming the file when it
  /// exists but is unreadable, of another key, or of another shape.
  std::optional<WindowReference> load(int64_t window, bool need_perplexity) const;
  /// Writes window c (atomically). Throws Error naming the file on I/O failure
  /// or when `w` does not have the shape.
  void save(int64_t window, const WindowReference& w) const;
  /// `<dir>/window<c>.safetensors`.
  std::string path(int64_t window) const;

 private:
  std::string dir_, key_;
  ReferenceShape shape_;
};

}  // namespace ratekv::eval
