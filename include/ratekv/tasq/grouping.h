// ratekv/tasq/grouping.h — covariance-aware grouping of RoPE pairs into VQ
// groups (docs/design.md §5.3).
//
// Cost of a group G of channels: c(G) = log det Σ[G,G] (the high-rate
// Gaussian VQ distortion at fixed |G| and K grows with det^(1/|G|)). A
// partition's cost is Σ_G c(G). Hierarchical matching: units start as the
// RoPE pairs; at each level the units are paired by a minimum-weight perfect
// matching (LEMON's MaxWeightedPerfectMatching on negated weights) with edge
// weight c(A∪B) − c(A) − c(B) (≤ 0 by Fischer's inequality: minus twice the
// Gaussian mutual information of A and B), and each matched pair merges;
// repeat until units have g channels (g = 2·2^k).
#pragma once

#include <array>
#include <vector>

namespace ratekv::tasq {

/// log det of the principal submatrix Σ[G,G] of a symmetric positive
/// semi-definite d×d matrix (row-major), by Cholesky in double. A ridge of
/// 1e-12·(trace/|G| + 1e-30) keeps singular submatrices finite. Throws Error
/// for an empty group, a channel out of range, or a matrix that is not PSD
/// (Cholesky fails after the ridge).
double logdet_cost(const std::vector<double>& sigma, int d, const std::vector<int>& group);

/// Σ over groups of logdet_cost.
double partition_cost(const std::vector<double>& sigma, int d, const std::vector<std::vector<int>>& groups);

/// One matching level: units (each a channel list) paired by a minimum-weight
/// perfect matching on c(A∪B) − c(A) − c(B); returns the merged units, each
/// A's channels then B's, ordered by their first unit's index. The number of
/// units must be even (Error otherwise). Edge weights go to LEMON as integers
/// (round(−w·2^32)); ties resolve as LEMON does.
std::vector<std::vector<int>> match_level(const std::vector<double>& sigma, int d,
                                          const std::vector<std::vector<int>>& units);

/// Hierarchical matching from the RoPE pairs to groups of g channels
/// (g = 2, 4, 8, …; (d/2) / (g/2) must be a whole number and each level's
/// unit count even). Throws Error otherwise.
std::vector<std::vector<int>> match_groups(const std::vector<double>& sigma, int d,
                                           const std::vector<std::array<int, 2>>& pairs, int g);

/// Contiguous RoPE pairs: group j = pairs j·g/2 … (j+1)·g/2 − 1.
std::vector<std::vector<int>> contiguous_pair_groups(const std::vector<std::array<int, 2>>& pairs, int g);
/// Contiguous channels: group j = channels j·g … (j+1)·g − 1 (CQ).
std::vector<std::vector<int>> contiguous_channel_groups(int d, int g);

/// Exhaustive reference for tests: the perfect matching of `units` (even
/// count ≤ 12) minimizing Σ c(A∪B), returned like match_level.
std::vector<std::vector<int>> best_pairing_exhaustive(const std::vector<double>& sigma, int d,
                                                      const std::vector<std::vector<int>>& units);

}  // namespace ratekv::tasq
