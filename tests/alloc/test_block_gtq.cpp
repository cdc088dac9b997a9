// Block-GTQ with group-norm charging against brute force (alloc/block_gtq.h).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "ratekv/alloc/block_gtq.h"
#include "ratekv/alloc/greedy.h"
#include "ratekv/common/error.h"
#include "ratekv/format/stored_bytes.h"

using namespace ratekv;
using namespace ratekv::alloc;

namespace {

// Stored bits of a width vector, written from the packed format's rules
// (docs/packed_format.md §4–§5) for `o`'s prices: per width w > 0 used by n
// blocks, w bits on every channel of ⌈2n / t⌉ tiles of t channels, one norm,
// and for w > 4 the extension norm.
int64_t stored_bits_of(const std::vector<int>& b, const BlockGtqOptions& o) {
  std::map<int, int64_t> n;
  for (int x : b)
    if (x > 0) ++n[x];
  int64_t bits = 0;
  for (const auto& [w, cnt] : n) {
    const int64_t tiles = (2 * cnt + o.tile_channels - 1) / o.tile_channels;
    bits += w * o.tile_channels * tiles + o.norm_bits + (w > 4 ? o.wide_norm_bits : 0);
  }
  return bits;
}

// Exhaustive minimum of J over all width vectors in {0,b_min..b_max}^L for
// every budget 0..max_budget at once: best[B] = min J with stored bits ≤ B
// (+inf if none).
std::vector<double> brute_force_all(const std::vector<double>& s, int64_t max_budget, const BlockGtqOptions& o) {
  const int L = (int)s.size();
  std::vector<int> widths;
  if (o.b_min == 0) widths.push_back(0);
  for (int w = std::max(1, o.b_min); w <= o.b_max; ++w) widths.push_back(w);
  std::vector<double> at((size_t)max_budget + 1, std::numeric_limits<double>::infinity());
  std::vector<int> b(L);
  std::function<void(int)> rec = [&](int i) {
    if (i == L) {
      const int64_t bits = stored_bits_of(b, o);
      if (bits <= max_budget) at[(size_t)bits] = std::min(at[(size_t)bits], block_distortion(s, b));
      return;
    }
    for (int w : widths) {
      b[i] = w;
      rec(i + 1);
    }
  };
  rec(0);
  for (size_t B = 1; B < at.size(); ++B) at[B] = std::min(at[B], at[B - 1]);
  return at;
}

// Checks one allocation against the exhaustive optimum and its own accounting.
void check_allocation(const std::vector<double>& s, int64_t budget, const BlockGtqOptions& o, double ref,
                      const std::string& what) {
  const BlockAllocation a = allocate_block_gtq(s, budget, o);
  ASSERT_NEAR(a.distortion, ref, 1e-12 * (1 + ref)) << what;
  ASSERT_LE(a.stored_bits(), budget) << what;
  ASSERT_EQ(a.stored_bits(), stored_bits_of(a.bits, o)) << what;
  std::set<int> used;
  int64_t code = 0;
  for (int x : a.bits) {
    ASSERT_TRUE(x == 0 ? o.b_min == 0 : (x >= o.b_min && x <= o.b_max)) << what;
    code += 2 * x;
    if (x > 0) used.insert(x);
  }
  ASSERT_EQ(a.code_bits, code) << what;
  ASSERT_EQ(a.norm_bits, (int64_t)o.norm_bits * (int64_t)used.size()) << what;
  size_t listed = 0;
  for (const auto& g : a.groups) {
    for (int blk : g.blocks) ASSERT_EQ(a.bits[blk], g.bits) << what;
    listed += g.blocks.size();
  }
  ASSERT_EQ(listed, s.size()) << what;
}

}  // namespace

TEST(BlockGtq, MatchesBruteForceWithNormCharging) {
  // Tiles of 2 channels (one RoPE block): no padding, only the norm charge.
  std::mt19937_64 rng(7);
  const double pool[] = {0.0, 1.0, 1.0, 2.0, 4.0, 16.0, 0.37, 5.5};  // zeros and ties on purpose
  int compared = 0, infeasible = 0;
  for (int d : {2, 4, 6, 8, 10}) {
    for (int trial = 0; trial < (d == 10 ? 15 : 60); ++trial) {
      std::vector<double> s(d / 2);
      for (auto& x : s) x = pool[rng() % 8] * (trial % 3 == 0 ? 1.0 : 0.5 + (double)(rng() % 1000) / 1000.0);
      BlockGtqOptions o;
      o.b_min = trial % 4 == 3 ? 1 : 0;
      o.b_max = 4;
      o.norm_bits = trial % 5 == 4 ? 0 : 16;
      o.tile_channels = 2;
      const int64_t max_bits = (int64_t)o.b_max * d + o.norm_bits;
      const std::vector<double> ref = brute_force_all(s, max_bits, o);
      for (int64_t budget = 0; budget <= max_bits; budget += 1 + (int64_t)(rng() % 3)) {
        if (!std::isfinite(ref[(size_t)budget])) {
          EXPECT_THROW(allocate_block_gtq(s, budget, o), Error) << "d " << d << " budget " << budget;
          ++infeasible;
          continue;
        }
        check_allocation(s, budget, o, ref[(size_t)budget],
                         "d " + std::to_string(d) + " budget " + std::to_string(budget) + " trial " + std::to_string(trial));
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 1000);
  EXPECT_GT(infeasible, 10);
}

// The packed format's price: groups padded to 16-channel tiles (8 RoPE
// blocks), fp16 norms, an extension norm for widths > 4. Heads of 9..11
// blocks so that one width's group can cross a tile boundary; exhaustive over
// all width vectors (up to 5^11) against the dynamic program. The
// exhaustive search prices a width vector with scalar_group_stored_bits, the
// format's own function, so this also checks that the allocator's price is it.
TEST(BlockGtq, MatchesBruteForceUnderTheFormatsTiles) {
  std::mt19937_64 rng(12);
  int compared = 0, differ_from_untiled = 0;
  struct Case {
    int L, b_max;
  };
  for (const Case cs : {Case{9, 4}, Case{9, 5}, Case{10, 3}, Case{11, 2}}) {
    const int L = cs.L, d = 2 * L;
    std::vector<double> s(L);
    for (auto& x : s) x = (rng() % 7 == 0) ? 0.0 : std::exp((double)(rng() % 4000) / 1000.0 - 2.0);
    BlockGtqOptions o;
    o.b_max = cs.b_max;
    const int64_t max_bits = scalar_group_stored_bits(d, o.b_max);
    std::vector<double> ref((size_t)max_bits + 1, std::numeric_limits<double>::infinity());
    // Odometer over {0..b_max}^L with the width histogram kept up to date.
    std::vector<int> b(L, 0), n(o.b_max + 1, 0);
    n[0] = L;
    const int64_t total = (int64_t)std::pow(o.b_max + 1, L);
    for (int64_t it = 0; it < total; ++it) {
      int64_t bits = 0;
      for (int w = 1; w <= o.b_max; ++w)
        if (n[w] > 0) bits += scalar_group_stored_bits(2 * n[w], w);  // the format's own price
      if (bits <= max_bits) ref[(size_t)bits] = std::min(ref[(size_t)bits], block_distortion(s, b));
      for (int i = 0; i < L; ++i) {  // next vector
        --n[b[i]];
        b[i] = b[i] == o.b_max ? 0 : b[i] + 1;
        ++n[b[i]];
        if (b[i] != 0) break;
      }
    }
    for (size_t B = 1; B < ref.size(); ++B) ref[B] = std::min(ref[B], ref[B - 1]);
    BlockGtqOptions untiled = o;
    untiled.tile_channels = 2;
    untiled.wide_norm_bits = 0;
    for (int64_t budget = 0; budget <= max_bits; budget += 1 + (int64_t)(rng() % 3)) {
      check_allocation(s, budget, o, ref[(size_t)budget], "L " + std::to_string(L) + " budget " + std::to_string(budget));
      // Under the old, untiled price the optimum often stores more than the budget.
      if (budget <= (int64_t)o.b_max * d + untiled.norm_bits) {
        const BlockAllocation u = allocate_block_gtq(s, budget, untiled);
        differ_from_untiled += stored_bits_of(u.bits, o) > budget;
      }
      ++compared;
    }
  }
  EXPECT_GT(compared, 150);
  EXPECT_GT(differ_from_untiled, 10) << "the tile price should matter on these heads";
}

// With smaller tiles (4 channels = 2 blocks) every run length's parity
// matters; d up to 12, exhaustive.
TEST(BlockGtq, MatchesBruteForceWithSmallTiles) {
  std::mt19937_64 rng(13);
  int compared = 0;
  for (int d : {4, 6, 10, 12}) {
    for (int trial = 0; trial < 6; ++trial) {
      std::vector<double> s(d / 2);
      for (auto& x : s) x = (double)(rng() % 50) / 3.0;
      BlockGtqOptions o;
      o.b_min = trial % 3 == 2 ? 1 : 0;
      o.b_max = trial % 2 ? 6 : 4;
      o.tile_channels = 4;
      o.norm_bits = trial % 4 == 3 ? 0 : 8;
      o.wide_norm_bits = 6;
      const int64_t max_bits = stored_bits_of(std::vector<int>(d / 2, o.b_max), o);
      const std::vector<double> ref = brute_force_all(s, max_bits, o);
      for (int64_t budget = 0; budget <= max_bits; ++budget) {
        if (!std::isfinite(ref[(size_t)budget])) {
          EXPECT_THROW(allocate_block_gtq(s, budget, o), Error);
          continue;
        }
        check_allocation(s, budget, o, ref[(size_t)budget], "d " + std::to_string(d) + " budget " + std::to_string(budget));
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 500);
}

TEST(BlockGtq, WithoutNormsEqualsTheSeparableGreedy) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const int L = 1 + (int)(rng() % 12);
    std::vector<double> s(L);
    for (auto& x : s) x = (rng() % 5 == 0) ? 0.0 : (double)(rng() % 100) / 7.0;
    const BlockGtqOptions o{0, 5, 0, 2, 0};  // no norms, no tiles, no extension norms
    const int64_t budget = (int64_t)(rng() % (2 * 5 * L + 1));
    const BlockAllocation a = allocate_block_gtq(s, budget, o);
    const Allocation g = allocate_separable_convex(
        std::vector<int>(L, 0), std::vector<int>(L, 5), [&](int i, int b) { return s[i] * std::ldexp(1.0, -2 * b); },
        budget / 2, BudgetMode::AtMost);
    ASSERT_NEAR(a.distortion, g.cost, 1e-12 * (1 + g.cost)) << trial;
  }
}

TEST(BlockGtq, HandExample) {
  // Untiled (t = 2), 16-bit norms. d = 4, s = {64, 1}, 24 bits: {4, 0} costs
  // 8 + 16 bits, J = 64/256 + 1 = 1.25; {3, 1} would need two norms (6 + 2 + 32 = 40 bits).
  const BlockGtqOptions o{0, 4, 16, 2, 16};
  const std::vector<double> s = {64.0, 1.0};
  const BlockAllocation a = allocate_block_gtq(s, 24, o);
  EXPECT_EQ(a.bits, (std::vector<int>{4, 0}));
  EXPECT_DOUBLE_EQ(a.distortion, 1.25);
  EXPECT_EQ(a.code_bits, 8);
  EXPECT_EQ(a.norm_bits, 16);
  EXPECT_EQ(a.pad_bits, 0);
  EXPECT_DOUBLE_EQ(a.effective_bits_per_element(), 6.0);
  ASSERT_EQ(a.groups.size(), 2u);
  EXPECT_EQ(a.groups[0].bits, 4);
  EXPECT_EQ(a.groups[0].blocks, (std::vector<int>{0}));
  EXPECT_EQ(a.groups[1].bits, 0);
  EXPECT_EQ(a.groups[1].blocks, (std::vector<int>{1}));
  // 32 bits: {3, 1} would need 8 + 32 = 40 bits, but one norm over both
  // blocks at 4 bits costs 16 + 16 = 32 bits with J = (64 + 1)/256.
  const BlockAllocation b = allocate_block_gtq(s, 32, o);
  EXPECT_EQ(b.bits, (std::vector<int>{4, 4}));
  EXPECT_DOUBLE_EQ(b.distortion, 65.0 / 256.0);
  EXPECT_EQ(b.groups.size(), 1u);
  // 31 bits: {4, 4} no longer fits; {3, 3} (12 + 16) gives J = 1 + 1/64.
  EXPECT_EQ(allocate_block_gtq(s, 31, o).bits, (std::vector<int>{3, 3}));
}

TEST(BlockGtq, TilePaddingIsPartOfThePrice) {
  // d = 32 (16 blocks), s = {100, 100, 1 × 14}, budget 80 bits = uniform
  // 2-bit TQ-MSE (32·2 + 16). Untiled, {4, 4, 1 × 14} fits: 16 + 28 code bits
  // + 2 norms = 76, J = 200/256 + 14/4 = 4.28125. In the packed format its
  // 4-channel 4-bit group pads to a 16-channel tile (64 bits) and its
  // 28-channel 1-bit group to 32 (32 bits): 64 + 32 + 32 = 128 bits stored.
  // Tile-aware: a tile holds 8 blocks, so the best is 8 blocks at 4 bits (the
  // two strong ones and blocks 2..7, lowest index first among ties) and 8
  // dropped: 64 + 16 = 80 bits, J = 206/256 + 8 = 8.8046875 — better than
  // uniform 2 bits (J = 200/16 + 14/16 = 13.375) and than {3 × 8, 0 × 8}
  // (64 bits, J = 206/64 + 8); two widths pay two norms and ≥ 2 tiles.
  std::vector<double> s(16, 1.0);
  s[0] = s[1] = 100.0;
  const BlockAllocation untiled = allocate_block_gtq(s, 80, {0, 4, 16, 2, 16});
  std::vector<int> want(16, 1);
  want[0] = want[1] = 4;
  EXPECT_EQ(untiled.bits, want);
  EXPECT_DOUBLE_EQ(untiled.distortion, 200.0 / 256 + 14.0 / 4);
  EXPECT_EQ(untiled.stored_bits(), 76);
  const BlockAllocation tiled = allocate_block_gtq(s, 80);
  std::vector<int> eight(16, 0);
  for (int i = 0; i < 8; ++i) eight[i] = 4;
  EXPECT_EQ(tiled.bits, eight);
  EXPECT_DOUBLE_EQ(tiled.distortion, 206.0 / 256 + 8);
  EXPECT_EQ(tiled.stored_bits(), 80);
  EXPECT_EQ(tiled.pad_bits, 0);
  EXPECT_LT(tiled.distortion, allocate_block_uniform(s, 80).distortion);
  // The untiled allocation, priced as the format stores it: 128 bits.
  int64_t stored = 0;
  for (const auto& g : untiled.groups) stored += g.bits > 0 ? scalar_group_stored_bits(2 * (int)g.blocks.size(), g.bits) : 0;
  EXPECT_EQ(stored, 128);
  // A group of 9 blocks (18 channels) at 3 bits stores two tiles: 96 code bits, 42 of them padding.
  std::vector<double> t(9, 1.0);
  const BlockAllocation nine = allocate_block_gtq(t, 96 + 16, {0, 3});
  EXPECT_EQ(nine.bits, std::vector<int>(9, 3));
  EXPECT_EQ(nine.code_bits, 54);
  EXPECT_EQ(nine.pad_bits, 42);
  EXPECT_EQ(nine.stored_bits(), 112);
  // Wider than 4 bits: the extension norm (16 bits) is charged: 16·5 + 16 + 16 = 112.
  EXPECT_EQ(block_group_cost(16, 5), 112);
  EXPECT_EQ(block_group_cost(16, 5), scalar_group_stored_bits(16, 5));
  EXPECT_EQ(block_group_cost(17, 2), scalar_group_stored_bits(17, 2));
  EXPECT_EQ(block_group_cost(17, 2), 2 * 32 + 16);
}

TEST(BlockGtq, EqualEnergiesTieToLowerIndexFirst) {
  // No norm charge, no tiles: 10 bits = 5 units over four equal blocks; the
  // extra unit goes to block 0.
  const std::vector<double> s = {1, 1, 1, 1};
  EXPECT_EQ(allocate_block_gtq(s, 10, {0, 4, 0, 2, 0}).bits, (std::vector<int>{2, 1, 1, 1}));
  EXPECT_EQ(allocate_block_gtq(s, 14, {0, 4, 0, 2, 0}).bits, (std::vector<int>{2, 2, 2, 1}));
  // With a 16-bit norm one shared width wins: 26 bits -> all at 1 (8 + 16).
  EXPECT_EQ(allocate_block_gtq(s, 26, {0, 4, 16, 2, 16}).bits, (std::vector<int>{1, 1, 1, 1}));
  // Unequal: s = {9, 1, 1, 0}; 0-energy blocks are dropped rather than paid for.
  const std::vector<double> t = {9, 1, 1, 0};
  const BlockAllocation a = allocate_block_gtq(t, 32, {0, 4, 16, 2, 16});
  EXPECT_EQ(a.bits[3], 0);
}

TEST(BlockGtq, UniformAndBudgetConversion) {
  EXPECT_EQ(budget_bits_for(3.25, 64), 208);
  EXPECT_EQ(budget_bits_for(2.25, 64), 144);
  EXPECT_EQ(budget_bits_for(0.1 * 3, 10), 3);  // 0.30000000000000004 × 10
  EXPECT_THROW(budget_bits_for(-1, 64), Error);
  EXPECT_THROW(budget_bits_for(std::nan(""), 64), Error);
  std::vector<double> s(32, 1.0);
  s[0] = 8.0;
  const BlockAllocation u = allocate_block_uniform(s, 208);
  EXPECT_EQ(u.bits, std::vector<int>(32, 3));
  EXPECT_DOUBLE_EQ(u.effective_bits_per_element(), 3.25);
  EXPECT_DOUBLE_EQ(u.distortion, 39.0 / 64.0);
  EXPECT_EQ(allocate_block_uniform(s, 207).bits, std::vector<int>(32, 2));
  // At the same budget Block-GTQ is never worse than uniform.
  EXPECT_LE(allocate_block_gtq(s, 208).distortion, u.distortion);
}

TEST(BlockGtq, InfeasibleBudgetsAreErrorsWithNumbers) {
  const std::vector<double> s = {1, 2, 3, 4};  // d = 8
  const BlockGtqOptions untiled1{1, 4, 16, 2, 16}, untiled0{0, 4, 16, 2, 16};
  try {
    allocate_block_gtq(s, 23, untiled1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("budget of 23 bits per head (2.875 bits/element at head_dim 8) is below "
                                         "the minimum 24 bits"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(allocate_block_gtq(s, 24, untiled1));
  // Tiled: 8 channels pad to 16, so b_min = 1 needs 16 + 16 bits.
  try {
    allocate_block_gtq(s, 31, {1, 4});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is below the minimum 32 bits"), std::string::npos) << e.what();
  }
  try {
    allocate_block_gtq(s, 49, untiled0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the most b_max = 4 can use: 48 bits"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(allocate_block_gtq(s, 48, untiled0).bits, (std::vector<int>{4, 4, 4, 4}));
  EXPECT_EQ(allocate_block_gtq(s, 0, untiled0).bits, (std::vector<int>{0, 0, 0, 0}));
  EXPECT_THROW(allocate_block_gtq(s, 30, {3, 2, 16}), Error);
  EXPECT_THROW(allocate_block_gtq(s, 30, {0, 9, 16}), Error);
  EXPECT_THROW(allocate_block_gtq(s, 30, {0, 4, 15}), Error);
  EXPECT_THROW(allocate_block_gtq(s, 30, {0, 4, 16, 3}), Error);   // odd tile
  EXPECT_THROW(allocate_block_gtq(s, 30, {0, 4, 16, 16, 7}), Error);  // odd extension norm
  EXPECT_THROW(allocate_block_gtq(std::vector<double>{1, -1}, 30), Error);
  EXPECT_THROW(allocate_block_gtq(std::vector<double>{1, std::nan("")}, 30), Error);
  EXPECT_THROW(allocate_block_gtq(std::vector<double>{}, 30), Error);
  EXPECT_THROW(allocate_block_uniform(s, 23, untiled1), Error);
  EXPECT_THROW(allocate_block_uniform(s, 49, untiled0), Error);
}
