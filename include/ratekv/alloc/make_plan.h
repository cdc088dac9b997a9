// ratekv/alloc/make_plan.h — build a plan from calibration statistics with one
// of the allocators (the library side of `ratekv plan`).
//
// Methods and what the budgets mean (budgets are bits per element; unit
// "effective" = STORED bits per element, everything the cache holds per token
// (format/stored_bytes.h: codes, norms, scales, tile padding, extension norms);
// unit "code" = the code bits of a uniform codec, i.e. its stored bits):
//   uniform              K and V: whole-head `quantizer` (V: `v_quantizer`
//                        if set) at the largest b whose codec stores ≤ budget
//                        (effective) or b = budget (code, must be an
//                        integer). q8_0 / q4_0 / fp16 have fixed widths (8.5,
//                        4.5, 16 stored bits): the budget must admit them
//                        (code unit: equal 8 / 4 / 16). With `avg_bits` set it is the
//                        RateQuant baseline instead: the better of
//                        K⌈b⌉V⌊b⌋ / K⌊b⌋V⌈b⌉ under the fitted curves (widths
//                        within the curves' fitted range; effective: the
//                        split must store ≤ avg_bits).
//   block-gtq            K: Block-GTQ over RoPE blocks (alloc/block_gtq.h)
//                        priced as the packed format stores it, within
//                        ⌊budget·d⌋ stored bits per head (code unit: exactly
//                        what uniform TQ-MSE at b code bits stores,
//                        scalar_group_stored_bits(d, b); b a whole number);
//                        V: uniform TQ-MSE.
//   ratequant            2N components, codec kind `quantizer`, curves
//                        `curves_from` (default: `quantizer`), sensitivity
//                        `sensitivity`; widths within the curves' fitted range
//                        (DistortionCurves::bits; explicit bounds outside it
//                        are an error). Code unit: Σ b_i = avg_bits (default
//                        (k+v)/2) · 2N code bits, exact greedy. Effective
//                        unit: Σ stored bits ≤ ⌊avg_bits · d · 2N⌋, exact DP
//                        (allocate_ratequant_priced: widths > 4 store an
//                        extension norm).
//   ratequant+block-gtq  RateQuant with curves fitted on "block-gtq" gives each
//                        component b_i; keys then split the stored bits of
//                        uniform TQ-MSE at b_i over RoPE blocks with
//                        Block-GTQ, values use TQ-MSE.
// Codec options: norm_correction (tq-mse kinds) and key_offset "mean" (uniform,
// block-gtq) set the plan options of format/plan.h.
// Rotation seeds: group g of side s of (layer l, head h) gets a seed derived
// deterministically from (seed, l, h, s, g) by SplitMix64; the plan stores it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ratekv/alloc/ratequant.h"
#include "ratekv/format/calib_stats.h"
#include "ratekv/format/plan.h"

namespace ratekv::alloc {

/// The accepted range of PlanRequest::key_weight: finite, in [kMinKeyWeight, kMaxKeyWeight]. Six decades
/// either way of RateQuant as published (1) keep every weighted sensitivity w·α of a calibration finite and
/// normal (a factor of 1e-300 made every key's w·α subnormal or 0: all keys at the lowest width, the budget
/// unspent, a predicted distortion of 0); the side calibration's measured factors lie well inside
/// (docs/quality_results.md §8).
inline constexpr double kMinKeyWeight = 1e-6;
inline constexpr double kMaxKeyWeight = 1e6;

/// What to build. b_min / b_max < 0 select the method's defaults
/// (block-gtq: 0..4; uniform: 1..8; ratequant: the curves' fitted range within 1..8).
struct PlanRequest {
  std::string method = "uniform";  ///< uniform | block-gtq | ratequant | ratequant+block-gtq
  double k_bits = 3.0;
  double v_bits = 3.0;
  std::optional<double> avg_bits;         ///< ratequant / uniform-baseline average per component
  std::string budget_unit = "effective";  ///< effective | code
  int b_min = -1;
  int b_max = -1;
  uint64_t seed = 0;
  int fp16_window = 0;
  int sink_tokens = 0;
  std::string quantizer = "tq-mse";  ///< codec: tq-mse | kivi | quarot (+ q8_0 | q4_0 | fp16 for uniform)
  std::string v_quantizer;           ///< uniform only: value codec if different ("" = quantizer)
  std::string curves_from;           ///< curves used to allocate ("" = quantizer's own)
  std::string sensitivity = "grad";  ///< sensitivity estimator name in the stats, or "none" (every w_i = 1)
  /// ratequant methods and the uniform RateQuant baseline (avg_bits): every key component's
  /// sensitivity w_i is multiplied by this factor (kMinKeyWeight..kMaxKeyWeight; 1 = RateQuant as published). The
  /// side calibration of docs/quality_results.md §8 measures it on calibration text: the ratio of
  /// the next-token KLD of a K-only and a V-only uniform cache at one width over the ratio
  /// Σ_K w·D / Σ_V w·D that RateQuant's model predicts for them (docs/design.md §4.1).
  double key_weight = 1.0;
  int group_size = 32;               ///< kivi / quarot scale group
  std::string stats_file;            ///< recorded in the plan
  /// "none" | "mean": keys get the pre-RoPE offset μ = stats.k_pre_mean of their (layer, head)
  /// (uniform and block-gtq; Block-GTQ then allocates on the centered energies,
  /// CalibStats::centered_block_energies; docs/design.md §2.5). The plan's method gets "+key-offset".
  std::string key_offset = "none";
  bool norm_correction = false;  ///< every tq-mse / tq-mse-grouped codec stores n/‖c[idx]‖ (docs/design.md §2.4)
};

/// Numbers behind the allocation, for the summary and --json.
struct PlanDiagnostics {
  /// Block-GTQ: J of the allocation and of uniform TQ-MSE at the same budget,
  /// per (layer, head) row-major; empty for other methods.
  std::vector<double> key_j;
  std::vector<double> key_j_uniform;
  std::optional<RateQuantResult> ratequant;  ///< ratequant methods
  std::optional<UniformSplit> uniform_split;  ///< uniform with avg_bits
  double predicted_uniform = 0.0;             ///< RateQuant objective at the uniform split (if computed)
  /// (layer, KV head, side) codecs that store no bits at all (every channel at
  /// 0 bits, e.g. a RateQuant + Block-GTQ head given no bits; a Block-GTQ key
  /// budget that empties every head is refused instead): their keys
  /// score 0 (uniform attention) or their values contribute 0. make_plan logs a
  /// warning naming the first one; the caches accept such plans.
  int zero_bit_sides = 0;
  nlohmann::json to_json() const;
};

/// Builds and validates a plan. Throws ParamError naming the PlanRequest
/// field ("PlanRequest.k_bits", …) for unknown methods or quantizers, a
/// sensitivity estimator the stats lack (naming what is there), budgets
/// outside the bounds, RateQuant bounds outside the curves' fitted widths
/// ("PlanRequest.b_min" / "b_max"), a non-integral code budget, and a
/// Block-GTQ key budget below the cheapest non-empty key group (a plan that
/// would store no key anywhere; "PlanRequest.k_bits" with the valid range), a
/// budget above what the method reaches (uniform effective: one that would fit
/// a code wider than b_max; ratequant: above every component at the widest
/// fitted width; both naming the maximum) or below every component at its
/// lowest width; a key_weight outside kMinKeyWeight..kMaxKeyWeight; a
/// sensitivity estimator whose keys or values (a whole side) are all 0
/// ("PlanRequest.sensitivity", naming the stats field); a sensitivity, curves
/// or key weight given to a method that uses none (block-gtq, uniform without
/// avg_bits); statistics whose RoPE block energies (q_block_energy, k_block_energy; centered with
/// key_offset mean) are all 0 for some (layer, KV head) under block-gtq or ratequant+block-gtq
/// ("make_plan.stats", naming the stats file, the fields and the first head: Block-GTQ's objective is 0 at
/// every allocation there); Error for distortion curves the stats lack.
Plan make_plan(const CalibStats& stats, const PlanRequest& req, PlanDiagnostics* diag = nullptr);

/// Whether `req` allocates with RateQuant's model (sensitivities × distortion
/// curves, docs/design.md §4.1): methods ratequant and ratequant+block-gtq, and
/// uniform with avg_bits (RateQuant's uniform K/V-split baseline). Only these
/// read key_weight, sensitivity and curves_from. Throws nothing.
bool allocates_with_ratequant(const PlanRequest& req);

/// A readable per-layer table: K and V bit histograms ("4:10 3:12 0:10" =
/// blocks or heads per width) and effective bits, plus totals.
std::string plan_summary(const Plan& plan);

/// Seed of group g of side (0 = K, 1 = V) of (layer, head), from the plan seed.
uint32_t group_seed(uint64_t seed, int layer, int head, int side, int group);

}  // namespace ratekv::alloc
