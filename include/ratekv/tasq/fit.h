// ratekv/tasq/fit.h — fitting TaSQ and CQ plans (docs/design.md §5; the library
// side of `ratekv plan --method tasq|cq`).
//
// 1. capture_for_fit runs the model over calibration windows (each from a
//    fresh cache at position 0), streaming: per window it accumulates the
//    query-guided weights (tasq/channel_weights.h) and keeps the pre-RoPE keys
//    (and values) of every layer — the k-means needs every token.
// 2. fit_vq_plan, per layer l and KV head h (keys):
//    a_h = sqrt(w_h), w_h = diag(Ã_h) normalized to unit mean per head
//          (weighting off: a = 1);
//    s_t = fp16 RMS over all KV heads of a ⊙ k_t (normalization off: s = 1);
//    z_t = a ⊙ k_t / s_t; Σ_h = Cov(z) over the N tokens;
//    groups: hierarchical matching of RoPE pairs on log det Σ (grouping off:
//          contiguous RoPE pairs; if the matched partition costs more than the
//          contiguous one, the contiguous one is kept and counted);
//    codebooks: k-means (tasq/kmeans.h) of z[G] per group, 2^bits centroids.
//    CQ: contiguous channel groups, a = 1, s = 1, plain k-means.
//    Values: CQ (contiguous channel groups) or fp16.
//    k-means weights (FitOptions::fisher, docs/design.md §5.4): by the chain rule
//    through z = a ⊙ k / s, token t of group G weighs
//      F_t = s_t² Σ_{i∈G} g_{t,i}² / a_i²,  g = ∂L/∂k_pre (ratekv/model/backward.h),
//    floored at 1e-6 × the group's mean F (the last token of each window has
//    g = 0 exactly). Without it k-means is unweighted; the plan's "fit"
//    record says which ("kmeans").
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ratekv/cache/vq_codec.h"
#include "ratekv/model/model.h"
#include "ratekv/format/plan.h"
#include "ratekv/tasq/kmeans.h"

namespace ratekv::tasq {

/// What the fit needs from the calibration text.
struct FitCaptures {
  ModelConfig cfg;
  int64_t n_tokens = 0;
  int64_t ctx = 0;
  std::vector<std::vector<float>> k_pre;  ///< [layer] (N, n_kv_heads, head_dim), pre-RoPE
  std::vector<std::vector<float>> v;      ///< [layer] (N, n_kv_heads, head_dim); empty unless kept
  std::vector<double> query_weights;      ///< (L, n_kv_heads, head_dim) diag(Ã), not normalized
  /// [layer] (N, n_kv_heads, head_dim) (∂L/∂k_pre)² of each window's causal
  /// LM loss; empty unless captured with fisher.
  std::vector<std::vector<float>> k_grad_sq;
};

/// Runs `model` over `tokens` in windows of `ctx` tokens (last one shorter),
/// with progress on stderr; with `fisher` a backward pass per window instead
/// (any architecture ModelBackward serves) whose forward pass feeds the captures (through
/// ModelBackward::backward's hooks: keys equal Model::forward's up to float
/// summation order, ≤ 1e-4) and whose reverse pass gives k_grad_sq. Throws Error for empty tokens,
/// ParamError "capture_for_fit.ctx" for ctx < 1 or past the model's position limit.
FitCaptures capture_for_fit(Model& model, std::span<const int32_t> tokens, int64_t ctx, bool keep_values,
                            bool fisher = false);

struct FitOptions {
  std::string method = "tasq";  ///< "tasq" | "cq"
  int group = 8;                ///< channels per key group g (tasq: 2·2^k)
  int centroids = 1024;         ///< K per key group (a power of two)
  bool weighting = true;        ///< tasq: query-guided channel weights
  bool normalization = true;    ///< tasq: shared per-token fp16 scale
  bool grouping = true;         ///< tasq: matching (else contiguous RoPE pairs)
  bool fisher = false;          ///< Fisher-weighted k-means for keys (needs k_grad_sq)
  std::string values = "cq";    ///< "cq" | "fp16"
  int value_group = 8;          ///< channels per value group
  int value_centroids = 1024;   ///< K per value group
  int kmeans_iters = 20;
  uint64_t seed = 0;            ///< k-means seeds derive from it per (layer, head, side, group)
};

struct FitResult {
  Plan plan;                 ///< tensors_file = "<method>.tensors.safetensors"; the caller renames it
  VqTensors tensors;  ///< codebooks and channel scales
  /// Per (layer, head): log-det cost of the chosen partition, of contiguous
  /// RoPE pairs, of contiguous channels; whether the contiguous fallback was
  /// taken; timings.
  nlohmann::json diagnostics;
};

/// The option checks of fit_vq_plan that need only the model config and the
/// number of calibration tokens (n_tokens), so a caller can run them before
/// the (long) capture: group size not dividing head_dim, tasq group not
/// 2·2^k, centroids not a power of two in 2..65536 or more than n_tokens,
/// k-means iterations outside 1..1000, bad value group/centroids. Throws
/// ParamError naming the FitOptions field ("FitOptions.group", …).
void validate_fit_options(const ModelConfig& cfg, int64_t n_tokens, const FitOptions& opt);

/// Fits a plan (see the file comment). Throws ParamError naming the FitOptions
/// field for bad options (those of validate_fit_options, and values "cq"
/// without captured values) and Error when Fisher weighting lacks gradients or
/// a group's Fisher weights are not finite. A key group whose gradients are all
/// exactly 0 (channels no query reads) is fitted unweighted and counted in the
/// plan's fit record ("fisher_zero_groups"; docs/design.md §5.4).
FitResult fit_vq_plan(const FitCaptures& cap, const FitOptions& opt);

}  // namespace ratekv::tasq
