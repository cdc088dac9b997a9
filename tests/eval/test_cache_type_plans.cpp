// llama.cpp-style cache types as plans (eval/baseline_plans.h cache_type_plan):
// the codecs and effective bits each name stands for, the seeds of `plan
// --method uniform`, plans the packed cache serves, and errors naming the side.
#include <gtest/gtest.h>

#include "ratekv/alloc/make_plan.h"
#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/cache/plan_codecs.h"
#include "ratekv/common/error.h"
#include "ratekv/eval/baseline_plans.h"

#include "../support/tiny_model.h"

namespace {

using namespace ratekv;
using ratekv_test::tiny_config;
using ratekv_test::TinyShape;

ModelConfig config64() {
  TinyShape s;
  s.head_dim = 64;
  s.n_layers = 2;
  return tiny_config(s);
}

TEST(CacheTypePlans, CodecsAndEffectiveBits) {
  const ModelConfig c = config64();
  // tq<b>: b code bits + one fp16 norm per 64 channels.
  const Plan p = eval::cache_type_plan("tq3", "tq2", c, 9);
  EXPECT_DOUBLE_EQ(p.achieved().k, 3.25);
  EXPECT_DOUBLE_EQ(p.achieved().v, 2.25);
  EXPECT_EQ(p.method, "cache-type:tq3/tq2");
  for (int l = 0; l < c.n_layers; ++l)
    for (int h = 0; h < c.n_kv_heads; ++h) {
      const Codec& k = p.layers[l][h].key;
      ASSERT_EQ(k.kind, CodecKind::TqMse);
      ASSERT_EQ(k.groups.size(), 1u);
      EXPECT_EQ(k.groups[0].bits, 3);
      // the seed `plan --method uniform --seed 9` writes for this head and side
      EXPECT_EQ(k.groups[0].seed, alloc::group_seed(9, l, h, 0, 0));
      EXPECT_EQ(p.layers[l][h].value.groups[0].seed, alloc::group_seed(9, l, h, 1, 0));
    }
  EXPECT_NE(p.layers[0][0].key.groups[0].seed, p.layers[0][1].key.groups[0].seed);
  EXPECT_DOUBLE_EQ(eval::cache_type_plan("q8_0", "q4_0", c).achieved().k, 8.5);
  EXPECT_DOUBLE_EQ(eval::cache_type_plan("q8_0", "q4_0", c).achieved().v, 4.5);
  EXPECT_DOUBLE_EQ(eval::cache_type_plan("f16", "tq4", c).achieved().k, 16.0);
  EXPECT_DOUBLE_EQ(eval::cache_type_plan("f16", "tq4", c).achieved().v, 4.25);
}

// tq and f16 plans are served by the packed cache; its bytes per token are the
// format's: per KV head, K3 codes 64·3/8 = 24 bytes + a 2-byte norm, V2 16 + 2.
TEST(CacheTypePlans, PackedCacheServesTqPlans) {
  const ModelConfig c = config64();
  auto codecs = std::make_shared<const cache::PlanCodecs>(eval::cache_type_plan("tq3", "tq2", c), c);
  cache::PackedKVCache kv(c.kv_shape(64), codecs);
  EXPECT_DOUBLE_EQ(kv.layout(0).bytes_per_token_per_head(), 24 + 2 + 16 + 2);
}

TEST(CacheTypePlans, ErrorsNameTheSide) {
  const ModelConfig c = config64();
  try {
    eval::cache_type_plan("tq3", "q3_k", c);
    FAIL() << "unknown v type accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("v_type 'q3_k'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tq4"), std::string::npos) << e.what();
  }
  const ModelConfig c6 = tiny_config();  // head_dim 6
  try {
    eval::cache_type_plan("q8_0", "f16", c6);
    FAIL() << "q8_0 at head_dim 6 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("k_type 'q8_0'"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(eval::cache_type_plan("tq2", "f16", c6));
}

}  // namespace
