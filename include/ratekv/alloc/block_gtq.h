// ratekv/alloc/block_gtq.h — Block-GTQ bit allocation over the RoPE blocks of
// one (layer, KV head), with the group-norm metadata charged to the budget.
//
// Spec: docs/design.md §3.2 (Block-GTQ; references in §13). A head of dimension d has L = d/2
// RoPE blocks (2 channels each). Block i gets b_i bits per channel; blocks
// with equal b > 0 form one TurboQuant-MSE group that stores one norm of
// `norm_bits` bits (fp16: 16) per token; b_i = 0 drops the block (no norm).
//
//   minimize   J(b) = Σ_i s_i 4^(−b_i)
//   subject to 2 Σ_i b_i + norm_bits · |{distinct b_i > 0}| ≤ budget_bits,
//              b_i ∈ {b_min..b_max}   (b_i = 0 allowed only when b_min = 0)
//
// budget_bits is the effective budget per head per token (bits per element ×
// head_dim). The norm term makes the problem non-separable, so the marginal
// greedy of greedy.h does not apply directly, and neither does "enumerate the
// set S of widths, then greedy on S": with S = {1, 3} a block can only jump
// 1 → 3, an item of two units, which turns the subproblem into a knapsack.
//
// Exact method used here. (1) Ordering: if s_i > s_j then some optimum has
// b_i ≥ b_j — swapping b_i < b_j lowers J by (s_i − s_j)(4^−b_i − 4^−b_j) > 0
// and keeps Σ b and the set of widths, hence the norm cost. With equal
// energies, swapping changes nothing. So sort blocks by s descending (stable:
// lower index first among ties) and look only at non-increasing width
// sequences. (2) In such a sequence each distinct width is one contiguous run,
// so the norm is charged exactly when the width changes to a new value > 0.
// (3) Dynamic programming over (blocks done, bits spent, current width) with
// that charge gives the exact optimum in O(L · budget/2 · (b_max+1)²).
// Among optimal J it returns the allocation with the fewest bits, then the
// lowest final width; transitions are scanned in a fixed order (deterministic).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace ratekv::alloc {

/// One Block-GTQ group: a bit width and the RoPE block indices (ascending)
/// encoded at that width. bits = 0 lists the dropped blocks.
struct BlockGroup {
  int bits = 0;
  std::vector<int> blocks;
};

/// The allocation of one (layer, KV head).
struct BlockAllocation {
  std::vector<int> bits;           ///< (L,) bits per channel of each RoPE block
  std::vector<BlockGroup> groups;  ///< by descending bits; a bits = 0 group lists dropped blocks
  double distortion = 0.0;         ///< J(b) = Σ s_i 4^(−b_i)
  int64_t code_bits = 0;           ///< 2 Σ b_i, bits per token
  int64_t norm_bits = 0;           ///< norm_bits × (number of groups with bits > 0), bits per token
  /// (code_bits + norm_bits) / head_dim.
  double effective_bits_per_element() const;
};

/// Bounds and metadata price for Block-GTQ. 0 ≤ b_min ≤ b_max ≤ 8;
/// norm_bits ≥ 0 and even (16 = one fp16 norm per group).
struct BlockGtqOptions {
  int b_min = 0;
  int b_max = 4;
  int norm_bits = 16;
};

/// Budget in bits per head per token for an effective rate of
/// `bits_per_element` at `head_dim`: floor(bits_per_element · head_dim),
/// tolerant to 1e-9 rounding (3.25 × 64 = 208). Throws Error for a negative or
/// non-finite rate.
int64_t budget_bits_for(double bits_per_element, int head_dim);

/// J(b) = Σ_i s_i 4^(−b_i) for energies s (L,) and widths b (L,).
double block_distortion(std::span<const double> energies, std::span<const int> bits);

/// Exact Block-GTQ allocation (see file comment). `energies` are the L = d/2
/// block energies s_i (finite, ≥ 0), in RoPE block order.
/// Throws ratekv::Error for an empty or non-finite/negative energy, bad
/// options, a budget below the cheapest allocation (b_min everywhere plus one
/// norm), or above the most b_max can use (b_max everywhere plus one norm);
/// the message gives the budget and both limits in bits and bits/element.
BlockAllocation allocate_block_gtq(std::span<const double> energies, int64_t budget_bits,
                                   const BlockGtqOptions& opt = {});

/// Uniform TQ-MSE over the whole head: every block at the largest b in
/// [b_min, b_max] with b·d + norm_bits ≤ budget_bits (one norm per head;
/// b = 0 costs nothing). `energies` only serve to report J. Throws Error when
/// even b_min does not fit, or the budget exceeds b_max·d + norm_bits.
BlockAllocation allocate_block_uniform(std::span<const double> energies, int64_t budget_bits,
                                       const BlockGtqOptions& opt = {});

/// Groups {bits, blocks} of a width vector, by descending bits (helper shared
/// with the plan builder and tests).
std::vector<BlockGroup> groups_from_bits(std::span<const int> bits);

}  // namespace ratekv::alloc
