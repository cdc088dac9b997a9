// ratekv/alloc/block_gtq.h — Block-GTQ bit allocation over the RoPE blocks of
// one (layer, KV head), priced at what the packed cache stores.
//
// Spec: docs/design.md §3.2 (Block-GTQ; references in §13); the price is the
// packed format's (ratekv/format/stored_bytes.h, docs/packed_format.md §4–§5).
// A head of dimension d has L = d/2 RoPE blocks (2 channels each). Block i gets
// b_i bits per channel; blocks with equal b > 0 form one TurboQuant-MSE group.
// A group of n blocks (m = 2n channels) at width w > 0 stores, per token,
//   cost(n, w) = w · t · ⌈m / t⌉ + norm_bits + (w > 4 ? wide_norm_bits : 0)
// with t = tile_channels (16: the format pads a group to 16-channel tiles and
// the padding is stored; 5..8-bit groups also allocate an unused extension
// norm array, docs/packed_format.md §5); b_i = 0 drops the block (no cost).
//
//   minimize   J(b) = Σ_i s_i 4^(−b_i)
//   subject to Σ_{w > 0} cost(n_w, w) ≤ budget_bits,   n_w = |{i : b_i = w}|,
//              b_i ∈ {b_min..b_max}   (b_i = 0 allowed only when b_min = 0)
//
// budget_bits is the stored budget per head per token (bits per element ×
// head_dim). The cost is not separable (norms, tiles), so the marginal greedy
// of greedy.h does not apply, and neither does "enumerate the set of widths,
// then greedy": with widths {1, 3} a block can only jump 1 → 3, and the tile
// steps make the price of a block depend on how many share its width.
//
// Exact method used here. (1) Ordering: the cost depends only on the width
// histogram {n_w}. If s_i > s_j then some optimum has b_i ≥ b_j — swapping
// b_i < b_j lowers J by (s_i − s_j)(4^−b_i − 4^−b_j) > 0 and keeps the
// histogram, hence the cost. With equal energies, swapping changes nothing.
// So sort blocks by s descending (stable: lower index first among ties) and
// look only at non-increasing width sequences. (2) In such a sequence each
// distinct width is one contiguous run, so the norm is charged when the width
// changes to a new value > 0 and a tile (w·t bits) whenever a run reaches a
// multiple of t/2 blocks. (3) Dynamic programming over (blocks done, cost
// spent in units of gcd(t, norm_bits, wide_norm_bits), current width, run
// length mod t/2) with those charges gives the exact optimum in
// O(L · budget/unit · (b_max+1)² · t/2). Among optimal J it returns the
// allocation with the lowest cost, then the lowest final width; transitions
// are scanned in a fixed order (deterministic).
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

/// The allocation of one (layer, KV head). Bits per token of the head.
struct BlockAllocation {
  std::vector<int> bits;           ///< (L,) bits per channel of each RoPE block
  std::vector<BlockGroup> groups;  ///< by descending bits; a bits = 0 group lists dropped blocks
  double distortion = 0.0;         ///< J(b) = Σ s_i 4^(−b_i)
  int64_t code_bits = 0;           ///< 2 Σ b_i
  int64_t norm_bits = 0;           ///< norm_bits × (number of groups with bits > 0)
  int64_t pad_bits = 0;            ///< tile padding (w · (t⌈m/t⌉ − m) per group) + wide_norm_bits per group > 4 bits
  /// code_bits + norm_bits + pad_bits: what the head stores per token.
  int64_t stored_bits() const { return code_bits + norm_bits + pad_bits; }
  /// stored_bits() / head_dim.
  double effective_bits_per_element() const;
};

/// Bounds and the price of Block-GTQ. 0 ≤ b_min ≤ b_max ≤ 8; norm_bits and
/// wide_norm_bits in 0..64, even; tile_channels even in 2..64 (2 = no
/// padding). The defaults are the packed format's prices
/// (scalar_group_stored_bits in format/stored_bytes.h).
struct BlockGtqOptions {
  int b_min = 0;
  int b_max = 4;
  int norm_bits = 16;       ///< one fp16 norm per group with bits > 0
  int tile_channels = 16;   ///< groups padded to multiples of this many channels
  int wide_norm_bits = 16;  ///< extra per group wider than 4 bits (extension norm array)
};

/// Stored bits per token of a group of `channels` channels at `bits` under
/// `opt`'s prices: 0 for bits = 0, else bits · t⌈channels/t⌉ + norm_bits
/// (+ wide_norm_bits when bits > 4). With default options equal to
/// scalar_group_stored_bits (format/stored_bytes.h).
int64_t block_group_cost(int channels, int bits, const BlockGtqOptions& opt = {});

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
/// options, a budget below the cheapest allocation (b_min everywhere, one
/// group), or above the most b_max can use (b_max everywhere, one group); the
/// message gives the budget and both limits in bits and bits/element.
BlockAllocation allocate_block_gtq(std::span<const double> energies, int64_t budget_bits,
                                   const BlockGtqOptions& opt = {});

/// Uniform TQ-MSE over the whole head: every block at the largest b in
/// [b_min, b_max] with block_group_cost(d, b) ≤ budget_bits (one group; b = 0
/// costs nothing). `energies` only serve to report J. Throws Error when even
/// b_min does not fit, or the budget exceeds block_group_cost(d, b_max).
BlockAllocation allocate_block_uniform(std::span<const double> energies, int64_t budget_bits,
                                       const BlockGtqOptions& opt = {});

/// Groups {bits, blocks} of a width vector, by descending bits (helper shared
/// with the plan builder and tests).
std::vector<BlockGroup> groups_from_bits(std::span<const int> bits);

}  // namespace ratekv::alloc
