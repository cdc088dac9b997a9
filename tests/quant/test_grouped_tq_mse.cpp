// Grouped TQ-MSE (Block-GTQ key codec): per-group encoders, dropped channels,
// effective bits with one norm per non-empty group.
#include <gtest/gtest.h>

#include <vector>

#include "ratekv/common/error.h"
#include "ratekv/quant/grouped_tq_mse.h"
#include "ratekv/quant/prng.h"

using namespace ratekv;
using namespace ratekv::quant;

namespace {
// d = 64 = 32 RoPE blocks (2i, 2i+1): blocks 0..9 at 4 bits, 10..23 at 2 bits,
// 24..29 at 1 bit, 30..31 dropped (0 bits, listed), nothing else missing.
GroupedTQMSEConfig example() {
  GroupedTQMSEConfig c;
  c.dim = 64;
  auto blocks = [](int a, int b) {
    std::vector<int> ch;
    for (int i = a; i < b; ++i) ch.insert(ch.end(), {2 * i, 2 * i + 1});
    return ch;
  };
  c.groups = {{blocks(0, 10), 4, 101}, {blocks(10, 24), 2, 102}, {blocks(24, 30), 1, 103}, {blocks(30, 32), 0, 104}};
  return c;
}
}  // namespace

TEST(GroupedTQMSE, MatchesPerGroupTQMSE) {
  GroupedTQMSE q(example());
  SplitMix64 rng(5);
  const int T = 13;
  std::vector<float> x(T * 64), xh(T * 64);
  for (auto& v : x) v = (float)rng.gaussian();
  q.fake_quant(x.data(), T, xh.data());
  const auto cfg = example();
  for (int t = 0; t < T; ++t) {
    for (const auto& g : cfg.groups) {
      std::vector<float> sub(g.channels.size()), subh(g.channels.size());
      for (size_t i = 0; i < sub.size(); ++i) sub[i] = x[t * 64 + g.channels[i]];
      TQMSE single({.dim = (int)sub.size(), .bits = g.bits, .seed = g.seed});
      single.fake_quant(sub.data(), 1, subh.data());
      for (size_t i = 0; i < sub.size(); ++i) ASSERT_EQ(xh[t * 64 + g.channels[i]], subh[i]);
    }
    for (int c = 60; c < 64; ++c) EXPECT_EQ(xh[t * 64 + c], 0.0f);
  }
  // Effective bits: (20·4 + 28·2 + 12·1 + 3·16) / 64 = 196/64.
  EXPECT_DOUBLE_EQ(q.bits_per_element(), 196.0 / 64);
  EXPECT_DOUBLE_EQ(q.code_bits_per_element(), 148.0 / 64);
  EXPECT_EQ(q.total_codes(), 60u);
  // JSON round trip preserves everything (same reconstruction).
  auto back = make_quantizer(q.to_json());
  std::vector<float> xh2(T * 64);
  back->fake_quant(x.data(), T, xh2.data());
  EXPECT_EQ(xh, xh2);
  EXPECT_EQ(back->to_json(), q.to_json());
}

TEST(GroupedTQMSE, RejectsBadGroups) {
  auto c = example();
  c.groups[1].channels.push_back(0);  // channel 0 twice
  EXPECT_THROW(GroupedTQMSE{c}, Error);
  c = example();
  c.groups[0].channels.push_back(64);  // out of range
  EXPECT_THROW(GroupedTQMSE{c}, Error);
  c = example();
  c.groups[3].channels = {60, 61, 62};
  c.groups.push_back({{63}, 2, 1});  // a single-channel group
  EXPECT_THROW(GroupedTQMSE{c}, Error);
  c = example();
  c.groups[2].bits = 9;
  EXPECT_THROW(GroupedTQMSE{c}, Error);
}
