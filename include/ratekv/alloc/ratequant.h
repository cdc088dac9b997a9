// ratekv/alloc/ratequant.h — RateQuant head-wise K/V bit allocation.
//
// Spec: docs/design.md §4 (RateQuant; references in §13). There are M = 2N components (the K
// and the V cache of each layer × KV head). Component i has a sensitivity
// w_i ≥ 0 (mean ‖∂L/∂K‖² or ‖∂L/∂V‖² per token), a fitted distortion curve
// D_i(b) = α_i β_i^(−b) (β_i > 1, one β per quantizer and side), and integer
// bounds b_min_i ≤ b_i ≤ b_max_i in code bits per element. With a_i = w_i α_i:
//
//   minimize Σ_i a_i β_i^(−b_i)   subject to Σ_i b_i = B.
//
// Integer answer: each term is convex in b, so the marginal greedy of
// greedy.h from b_min is exact (ties: lowest component index).
// Continuous relaxation (reported, never used as the answer): the Lagrange
// condition a_i ln β_i β_i^(−b_i) = λ gives
//   b_i(μ) = clip((ln(a_i ln β_i) − μ) / ln β_i, b_min_i, b_max_i),  μ = ln λ,
// Σ_i b_i(μ) is non-increasing in μ; μ is found by bisection and then solved
// in closed form on the unclipped set. With one common β and no clipping this
// is reverse water-filling: b_i = b̄ + (ln a_i − mean_j ln a_j) / ln β, and the
// distortion falls by the factor AM(a)/GM(a) against the uniform b̄.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace ratekv::alloc {

/// One RateQuant instance; every vector has M entries.
struct RateQuantProblem {
  std::vector<double> weight;  ///< w_i ≥ 0, sensitivity
  std::vector<double> alpha;   ///< α_i ≥ 0, fitted curve scale
  std::vector<double> beta;    ///< β_i > 1, fitted curve base (per side, repeated per component)
  std::vector<int> b_min;      ///< lower bound, code bits per element
  std::vector<int> b_max;      ///< upper bound
  int64_t total_bits = 0;      ///< B = Σ b_i (e.g. average 2.5 × M)
};

/// The continuous relaxation (clipped reverse water-filling).
struct RateQuantRelaxation {
  std::vector<double> bits;  ///< real-valued b_i, Σ b_i = B
  double distortion = 0.0;   ///< Σ a_i β_i^(−b_i) at those b_i
  double log_lambda = 0.0;   ///< μ = ln λ
  int n_clipped = 0;         ///< components sitting at a bound
};

/// The exact integer allocation plus the diagnostics RateQuant reports.
struct RateQuantResult {
  std::vector<int> bits;            ///< (M,) integer code bits per element
  double distortion = 0.0;          ///< Σ a_i β_i^(−b_i)
  RateQuantRelaxation relaxed;      ///< continuous relaxation
  double uniform_distortion = 0.0;  ///< Σ a_i β_i^(−b̄), b̄ = B/M (continuous uniform reference)
  double am_gm = 1.0;               ///< AM(a)/GM(a) over components with a_i > 0: the predicted gain
};

/// Σ a_i β_i^(−b_i) for integer widths.
double ratequant_distortion(const RateQuantProblem& p, std::span<const int> bits);

/// AM/GM ratio of the strictly positive entries of `a` (1 when fewer than two).
double am_gm_ratio(std::span<const double> a);

/// Continuous relaxation (see file comment). Throws Error like allocate_ratequant.
RateQuantRelaxation ratequant_relaxation(const RateQuantProblem& p);

/// Exact integer allocation + relaxation + AM/GM. Throws ratekv::Error for
/// mismatched sizes, negative/non-finite w or α, β ≤ 1 or non-finite, bad
/// bounds, or B outside [Σ b_min, Σ b_max] (message gives all three).
RateQuantResult allocate_ratequant(const RateQuantProblem& p);

/// Exact allocation under per-width prices (the stored bits of each
/// component's codec at each width, format/stored_bytes.h), for budgets in
/// stored bits ("effective" unit):
///
///   minimize Σ_i a_i β_i^(−b_i)  subject to  Σ_i price_i(b_i) ≤ budget,
///   b_min_i ≤ b_i ≤ b_max_i,
///
/// price[i][b − b_min_i] ≥ 0, non-decreasing in b. Prices need not be linear
/// in b (a TQ-MSE codec wider than 4 bits stores an extra 16-bit extension
/// norm; the greedy of greedy.h is exact only for equal unit prices), so this
/// is a multiple-choice knapsack, solved exactly by dynamic programming over
/// (components, budget in units of the prices' gcd). Among optimal
/// distortions it returns the lowest total price, then the allocation the
/// scan in component order meets first. p.total_bits is ignored. The result's
/// `relaxed` and `uniform_distortion` are those of the code-bit problem with
/// B = Σ b_i of the answer. Throws Error like allocate_ratequant (sizes,
/// values, bounds), for prices of the wrong shape, negative or decreasing,
/// and when even Σ price_i(b_min_i) exceeds the budget (message gives both).
RateQuantResult allocate_ratequant_priced(const RateQuantProblem& p, const std::vector<std::vector<int64_t>>& price,
                                          int64_t budget);

/// A uniform K/V split at a fractional average: K and V widths and the cost.
struct UniformSplit {
  int k_bits = 0;
  int v_bits = 0;
  double cost = 0.0;
};

/// The uniform baseline at average `avg_bits` per element: (b, b) when the
/// average is an integer (within 1e-9), else the better under `cost(k, v)` of
/// K⌈b⌉V⌊b⌋ and K⌊b⌋V⌈b⌉ (tie: K⌈b⌉V⌊b⌋). Throws Error for a negative or
/// non-finite average.
UniformSplit best_uniform_split(double avg_bits, const std::function<double(int k_bits, int v_bits)>& cost);

}  // namespace ratekv::alloc
