// FakeQuantKVCache: stored K/V equal the quantizers' fake_quant exactly,
// window/sink rows are fp16-rounded originals, KIVI keys re-quantize their
// token groups, plan/model mismatches are clear errors.
#include <gtest/gtest.h>

#include <random>

#include "ratekv/cache/fake_quant_cache.h"
#include "ratekv/cache/plan_codecs.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "../support/tiny_model.h"

using namespace ratekv;
using namespace ratekv::cache;

namespace {

// 2 layers, 4 query / 2 KV heads (no weights): only the cache shape and RoPE matter here.
ModelConfig config(int head_dim, RopeLayout layout = RopeLayout::Interleaved) {
  return ratekv_test::tiny_config(
      {.n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .head_dim = head_dim, .n_ctx = 512, .rope_theta = 10000.0},
      layout);
}

Codec grouped(int d) {
  // Blocks 0 and 3 at 4 bits, 1 and 5.. at 2 bits, block 2 dropped.
  Codec c;
  c.kind = CodecKind::TqMseGrouped;
  c.norm = NormStorage::FP16;
  CodecGroup a, b, z;
  a.bits = 4;
  a.blocks = {0, 3};
  a.seed = 11;
  b.bits = 2;
  b.blocks = {1};
  for (int i = 4; i < d / 2; ++i) b.blocks.push_back(i);
  b.seed = 12;
  z.bits = 0;
  z.blocks = {2};
  c.groups = {a, b, z};
  return c;
}

Codec whole(CodecKind kind, int bits, int d, int group_size) {
  Codec c;
  c.kind = kind;
  c.group_size = group_size;
  CodecGroup g;
  g.bits = bits;
  for (int i = 0; i < d; ++i) g.channels.push_back(i);
  c.groups.push_back(g);
  return c;
}

Plan make_plan(const ModelConfig& cfg, const Codec& key, const Codec& value) {
  Plan p;
  p.method = "test";
  static_cast<PlanTarget&>(p.model) = plan_target(cfg);
  p.layers.assign(cfg.n_layers, std::vector<HeadPlan>(cfg.n_kv_heads, HeadPlan{key, value}));
  for (int l = 0; l < cfg.n_layers; ++l)
    for (int h = 0; h < cfg.n_kv_heads; ++h) {
      for (auto& g : p.layers[l][h].key.groups)
        if (g.bits > 0 && (p.layers[l][h].key.kind == CodecKind::TqMse || p.layers[l][h].key.kind == CodecKind::TqMseGrouped)) g.seed = 100 + 10 * l + h;
      for (auto& g : p.layers[l][h].value.groups)
        if (g.bits > 0 && p.layers[l][h].value.kind == CodecKind::TqMse) g.seed = 200 + 10 * l + h;
    }
  return p;
}

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(g);
  return v;
}

// Rows [a, b) of head h of x (T, Hkv, d) as a contiguous (b − a, d) block.
std::vector<float> head_rows(const std::vector<float>& x, int Hkv, int d, int h, int64_t a, int64_t b) {
  std::vector<float> out;
  for (int64_t t = a; t < b; ++t)
    out.insert(out.end(), x.begin() + (t * Hkv + h) * d, x.begin() + (t * Hkv + h + 1) * d);
  return out;
}

// Appends x (T rows) in the given chunk sizes to every layer.
void append_chunks(FakeQuantKVCache& c, const std::vector<float>& k, const std::vector<float>& v,
                   const std::vector<int64_t>& chunks, int64_t row) {
  int64_t t = 0;
  for (int64_t n : chunks) {
    std::vector<int32_t> pos(n);
    for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(t + i);
    for (int l = 0; l < c.shape().n_layers; ++l)
      c.append(l, n, pos.data(), k.data() + t * row, k.data() + t * row, v.data() + t * row);
    t += n;
  }
}

}  // namespace

TEST(FakeQuantCache, StoresExactlyTheQuantizerOutput) {
  const ModelConfig cfg = config(32);
  const int d = 32, Hkv = 2;
  const int64_t T = 97, row = int64_t{Hkv} * d;
  auto codecs = std::make_shared<const PlanCodecs>(make_plan(cfg, grouped(d), Codec::tq_mse(3, d, 0)), cfg);
  FakeQuantKVCache cache(cfg.kv_shape(T), codecs);
  const auto k = randn(T * row, 1), v = randn(T * row, 2);
  append_chunks(cache, k, v, {1, 40, 56}, row);  // per-vector codecs: any split gives the same rows
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < Hkv; ++h) {
      for (int s = 0; s < 2; ++s) {
        const auto* q = codecs->quantizer(l, h, static_cast<KVSide>(s));
        ASSERT_NE(q, nullptr);
        const auto x = head_rows(s == 0 ? k : v, Hkv, d, h, 0, T);
        std::vector<float> xh(x.size());
        q->fake_quant(x.data(), T, xh.data());
        const auto span = s == 0 ? cache.keys(l) : cache.values(l);
        const std::vector<float> stored(span.begin(), span.end());
        const auto got = head_rows(stored, Hkv, d, h, 0, T);
        ASSERT_EQ(got, xh) << "layer " << l << " head " << h << " side " << s;
        EXPECT_NE(got, x);  // it did quantize
      }
    }
  // The dropped block (2) reconstructs as zeros; its channels under interleaved RoPE are 4 and 5.
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_EQ(cache.keys(0)[t * row + 4], 0.0f);
    EXPECT_EQ(cache.keys(0)[t * row + 5], 0.0f);
  }
  // fake_quant_sequence gives the same array.
  std::vector<float> seq(T * row);
  fake_quant_sequence(*codecs, 1, KVSide::key, k.data(), T, 0, 0, seq.data());
  EXPECT_EQ(seq, std::vector<float>(cache.keys(1).begin(), cache.keys(1).end()));
}

// A row whose norm overflows the codec's fp16 norm is an Error naming the
// quantizer, on the serial path (one token) and the parallel one (128 tokens ×
// 2 heads × 32 channels): it used to be thrown inside the OpenMP region
// (std::terminate, the process aborted).
TEST(FakeQuantCache, NormOverflowIsAnErrorNotAnAbort) {
  const ModelConfig cfg = config(32);
  const int d = 32, Hkv = 2;
  const int64_t row = int64_t{Hkv} * d;
  auto codecs = std::make_shared<const PlanCodecs>(make_plan(cfg, grouped(d), Codec::tq_mse(3, d, 0)), cfg);
  for (const int64_t n : {1, 128}) {
    FakeQuantKVCache cache(cfg.kv_shape(128), codecs);
    auto k = randn(n * row, 1), v = randn(n * row, 2);
    v[(n - 1) * row + d + 3] = 1e30f;  // last token, KV head 1
    std::vector<int32_t> pos(n);
    for (int64_t t = 0; t < n; ++t) pos[t] = static_cast<int32_t>(t);
    try {
      cache.append(0, n, pos.data(), k.data(), k.data(), v.data());
      ADD_FAILURE() << "no error for n = " << n;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("overflows"), std::string::npos) << e.what();
    }
  }
}

TEST(FakeQuantCache, BlocksMapToTheLayoutsChannelPairs) {
  const auto j = PlanCodecs::quantizer_json(grouped(8), KVSide::key, 8, RopeLayout::NeoX, "k");
  // NeoX: block i = channels (i, i + 4). Group 0 = blocks {0, 3} → (0, 4, 3, 7).
  EXPECT_EQ(j["groups"][0]["channels"], nlohmann::json({0, 4, 3, 7}));
  EXPECT_EQ(j["groups"][1]["channels"], nlohmann::json({1, 5}));
  EXPECT_EQ(j["groups"][2]["bits"], 0);
  const auto ji = PlanCodecs::quantizer_json(grouped(8), KVSide::key, 8, RopeLayout::Interleaved, "k");
  EXPECT_EQ(ji["groups"][0]["channels"], nlohmann::json({0, 1, 6, 7}));
}

TEST(FakeQuantCache, WindowAndSinkRowsAreFp16Originals) {
  const ModelConfig cfg = config(32);
  const int d = 32, Hkv = 2;
  const int64_t row = int64_t{Hkv} * d;
  auto codecs = std::make_shared<const PlanCodecs>(make_plan(cfg, Codec::tq_mse(2, d, 0), Codec::tq_mse(2, d, 0)), cfg);
  FakeQuantOptions opt;
  opt.fp16_window = 5;
  opt.sink_tokens = 2;
  FakeQuantKVCache cache(cfg.kv_shape(64), codecs, opt);
  const int64_t T = 19;
  const auto k = randn(T * row, 3), v = randn(T * row, 4);
  append_chunks(cache, k, v, {3, 1, 9}, row);  // 13 tokens so far
  auto check_state = [&](int64_t n) {
    const int64_t end = std::max<int64_t>(2, n - 5);
    for (int h = 0; h < Hkv; ++h) {
      const auto* q = codecs->quantizer(1, h, KVSide::key);
      const auto x = head_rows(k, Hkv, d, h, 2, end);
      std::vector<float> xh(x.size());
      q->fake_quant(x.data(), end - 2, xh.data());
      const std::vector<float> stored(cache.keys(1).begin(), cache.keys(1).end());
      EXPECT_EQ(head_rows(stored, Hkv, d, h, 2, end), xh) << "n " << n;
      for (int64_t t : std::vector<int64_t>{0, 1, n - 5, n - 1})
        for (int c = 0; c < d; ++c)
          ASSERT_EQ(stored[(t * Hkv + h) * d + c], round_fp16(k[(t * Hkv + h) * d + c])) << "row " << t;
    }
  };
  check_state(13);
  std::vector<int32_t> pos(6);
  for (int i = 0; i < 6; ++i) pos[i] = 13 + i;
  for (int l = 0; l < 2; ++l) cache.append(l, 6, pos.data(), &k[13 * row], &k[13 * row], &v[13 * row]);
  check_state(19);  // rows 8..13 left the window and are quantized now
}

TEST(FakeQuantCache, KiviKeysRequantizeWholeTokenGroups) {
  const ModelConfig cfg = config(32);
  const int d = 32, Hkv = 2;
  const int64_t T = 97, row = int64_t{Hkv} * d;
  auto codecs = std::make_shared<const PlanCodecs>(
      make_plan(cfg, whole(CodecKind::Kivi, 2, d, 32), whole(CodecKind::Kivi, 2, d, 32)), cfg);
  EXPECT_EQ(codecs->quantizer(0, 0, KVSide::key)->scope(), quant::QuantScope::per_channel_tokens);
  FakeQuantKVCache one(cfg.kv_shape(T), codecs), steps(cfg.kv_shape(T), codecs);
  const auto k = randn(T * row, 5), v = randn(T * row, 6);
  append_chunks(one, k, v, {T}, row);
  append_chunks(steps, k, v, std::vector<int64_t>(T, 1), row);  // token by token
  for (int l = 0; l < 2; ++l) {
    EXPECT_EQ(std::vector<float>(one.keys(l).begin(), one.keys(l).end()),
              std::vector<float>(steps.keys(l).begin(), steps.keys(l).end()));
    for (int h = 0; h < Hkv; ++h) {
      const auto x = head_rows(k, Hkv, d, h, 0, T);
      std::vector<float> xh(x.size());
      codecs->quantizer(l, h, KVSide::key)->fake_quant(x.data(), T, xh.data());
      const std::vector<float> stored(steps.keys(l).begin(), steps.keys(l).end());
      EXPECT_EQ(head_rows(stored, Hkv, d, h, 0, T), xh);
      // Row 96 is the partial group: the fp16 original.
      for (int c = 0; c < d; ++c) EXPECT_EQ(stored[(96 * Hkv + h) * d + c], round_fp16(k[(96 * Hkv + h) * d + c]));
    }
  }
}

TEST(FakeQuantCache, KeyOnlyLeavesValuesExact) {
  const ModelConfig cfg = config(32);
  const int d = 32;
  const int64_t T = 7, row = 2 * d;
  auto codecs = std::make_shared<const PlanCodecs>(
      make_plan(cfg, whole(CodecKind::Q4_0, 4, d, 32), whole(CodecKind::Q8_0, 8, d, 32)), cfg);
  FakeQuantOptions ko;
  ko.quantize_v = false;
  FakeQuantKVCache cache(cfg.kv_shape(T), codecs, ko);
  const auto k = randn(T * row, 7), v = randn(T * row, 8);
  append_chunks(cache, k, v, {T}, row);
  EXPECT_EQ(std::vector<float>(cache.values(0).begin(), cache.values(0).end()), v);
  EXPECT_NE(std::vector<float>(cache.keys(0).begin(), cache.keys(0).end()), k);
  FakeQuantOptions vo;
  vo.quantize_k = false;
  FakeQuantKVCache c2(cfg.kv_shape(T), codecs, vo);
  append_chunks(c2, k, v, {T}, row);
  EXPECT_EQ(std::vector<float>(c2.keys(1).begin(), c2.keys(1).end()), k);
  EXPECT_NE(std::vector<float>(c2.values(1).begin(), c2.values(1).end()), v);
}

TEST(FakeQuantCache, PlanModelMismatchIsAClearError) {
  const ModelConfig cfg = config(32);
  Plan p = make_plan(cfg, Codec::tq_mse(3, 32, 0), Codec::tq_mse(3, 32, 0));
  ModelConfig other = cfg;
  other.n_layers = 3;
  try {
    PlanCodecs c(p, other, "k3.plan.json");
    FAIL() << "mismatch accepted";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("k3.plan.json"), std::string::npos) << w;
    EXPECT_NE(w.find("n_layers"), std::string::npos) << w;
  }
  other = cfg;
  other.rope_layout = RopeLayout::NeoX;
  EXPECT_THROW(PlanCodecs(p, other), Error);
  // Cache shape different from the plan's model.
  auto codecs = std::make_shared<const PlanCodecs>(p, cfg);
  KVCacheShape s = cfg.kv_shape(8);
  s.head_dim = 64;
  EXPECT_THROW(FakeQuantKVCache(s, codecs), Error);
  // A whole-head codec with a channel subset is refused.
  Codec bad = Codec::tq_mse(3, 32, 1);
  bad.groups[0].channels.pop_back();
  EXPECT_THROW(PlanCodecs::quantizer_json(bad, KVSide::key, 32, RopeLayout::Interleaved, "k"), Error);
}

TEST(FakeQuantCache, ReseededPlanChangesOnlyRotationSeeds) {
  const ModelConfig cfg = config(32);
  const Plan p = make_plan(cfg, grouped(32), whole(CodecKind::Kivi, 2, 32, 32));
  const Plan r0 = reseeded_plan(p, 0), r1 = reseeded_plan(p, 1), r1b = reseeded_plan(p, 1), r2 = reseeded_plan(p, 2);
  EXPECT_EQ(r0.to_json(), p.to_json());
  EXPECT_EQ(r1.to_json(), r1b.to_json());
  EXPECT_NE(r1.layers[0][0].key.groups[0].seed, p.layers[0][0].key.groups[0].seed);
  EXPECT_NE(r1.layers[0][0].key.groups[0].seed, r2.layers[0][0].key.groups[0].seed);
  EXPECT_EQ(r1.layers[0][0].key.groups[2].seed, p.layers[0][0].key.groups[2].seed);  // dropped group
  EXPECT_EQ(r1.layers[0][0].value.groups[0].seed, 0u);                               // kivi: no rotation
}
