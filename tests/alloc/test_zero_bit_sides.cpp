// make_plan counts (and warns about) codecs that store no bits: Block-GTQ
// keys with --bmin 0 at a budget too small for any block.
#include <gtest/gtest.h>

#include <vector>

#include "ratekv/alloc/make_plan.h"

using namespace ratekv;
using namespace ratekv::alloc;

namespace {

// 2 layers × 2 KV heads, head_dim 8 (4 RoPE blocks), energies 1..16.
CalibStats small_stats() {
  CalibStats s;
  s.model.arch = "llama";
  s.model.n_layers = 2;
  s.model.n_kv_heads = 2;
  s.model.head_dim = 8;
  s.model.rope_layout = "interleaved";
  s.n_tokens = 10;
  for (int i = 0; i < 16; ++i) {
    s.q_block_energy.push_back(1.0 + i);
    s.k_block_energy.push_back(0.5 * (i % 5) + 0.25);
  }
  return s;
}

}  // namespace

TEST(ZeroBitSides, BlockGtqTinyKeyBudget) {
  const CalibStats st = small_stats();
  PlanRequest rq;
  rq.method = "block-gtq";
  rq.b_min = 0;
  // Stored budgets (effective unit) at head_dim 8: the packed format pads a
  // group to a 16-channel tile, so a 2-bit value side stores 16·2 + 16 = 48
  // bits (6 bits per element) and the smallest non-empty key group (one RoPE
  // block at 1 bit, padded) 16 + 16 = 32 bits.
  rq.v_bits = 6.0;
  rq.budget_unit = "effective";
  // K budget 3.875 · 8 = 31 bits per head: below the smallest group, so every key side is empty.
  rq.k_bits = 3.875;
  PlanDiagnostics dg;
  const Plan p = make_plan(st, rq, &dg);
  EXPECT_EQ(dg.zero_bit_sides, 4);  // every key side; values are TQ-MSE 2 bits
  for (const auto& layer : p.layers)
    for (const auto& h : layer) {
      for (const auto& g : h.key.groups) EXPECT_EQ(g.bits, 0);
      EXPECT_EQ(h.value.groups.at(0).bits, 2);
    }
  // A budget that affords one tile at 1 bit everywhere (32 bits) leaves none empty.
  rq.k_bits = 4.0;
  PlanDiagnostics dg2;
  make_plan(st, rq, &dg2);
  EXPECT_EQ(dg2.zero_bit_sides, 0);
}
