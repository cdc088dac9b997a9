// make_plan and codecs that store no bits: a Block-GTQ key budget too small
// for any block (every key side empty) is refused, naming k_bits and the
// valid range; at the cheapest budget that stores a block none is empty.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ratekv/alloc/make_plan.h"
#include "ratekv/common/param_error.h"

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
  // K budget 3.875 · 8 = 31 bits per head: below the smallest group, so every key side would be empty (a plan
  // storing no key anywhere, as `plan --kbits 0` wrote): refused, naming k_bits and the range
  // 32 / 8 = 4 .. (16·4 + 16) / 8 = 10 bits per element at the default widths 0..4.
  for (double k : {3.875, 0.0}) {
    rq.k_bits = k;
    try {
      make_plan(st, rq);
      ADD_FAILURE() << "k_bits " << k << " accepted";
    } catch (const ParamError& e) {
      EXPECT_EQ(e.param(), "PlanRequest.k_bits");
      EXPECT_NE(std::string(e.what()).find("block-gtq would store no key at all"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("takes 32 bits per head at head_dim 8); expected 4..10 bits per element"),
                std::string::npos)
          << e.what();
    }
  }
  // A budget that affords one tile at 1 bit everywhere (32 bits) leaves none empty.
  rq.k_bits = 4.0;
  PlanDiagnostics dg2;
  const Plan p = make_plan(st, rq, &dg2);
  EXPECT_EQ(dg2.zero_bit_sides, 0);
  for (const auto& layer : p.layers)
    for (const auto& h : layer) {
      int stored = 0;
      for (const auto& g : h.key.groups) stored += g.bits > 0;
      EXPECT_EQ(stored, 1);  // one 1-bit group (the tile's worth the budget buys), the other blocks at 0
      EXPECT_EQ(h.value.groups.at(0).bits, 2);
    }
}
