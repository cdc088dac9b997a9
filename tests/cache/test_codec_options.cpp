// Codec options of plans (format/plan.h, docs/design.md §2.4, §2.5): norm
// correction and the pre-RoPE key offset — their JSON, their stored bytes,
// what the fake-quant cache reconstructs (against RoPE written out here from
// its definition), that the packed cache serves norm correction with the same
// attention as the fake path and refuses offsets, and what the options buy on
// keys that have a mean.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ratekv/cache/fake_quant_cache.h"
#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/format/stored_bytes.h"
#include "ratekv/quant/tq_mse.h"
#include "../support/tiny_model.h"

using namespace ratekv;
using namespace ratekv::cache;

namespace {

ModelConfig config(int head_dim, int n_kv_heads, RopeLayout layout, int n_layers = 2) {
  return ratekv_test::tiny_config({.n_layers = n_layers,
                                   .n_heads = 2 * n_kv_heads,
                                   .n_kv_heads = n_kv_heads,
                                   .head_dim = head_dim,
                                   .n_ctx = 8192,
                                   .rope_theta = 10000.0},
                                  layout);
}

// fp16 offsets with a large mean part (what Qwen2's key bias looks like).
std::vector<float> offset_of(int d, uint32_t seed, float scale = 20.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> o(d);
  for (float& x : o) x = round_fp16(nd(g));
  return o;
}

Plan plan_with(const ModelConfig& cfg, int bits, bool nc, bool offsets) {
  Plan p;
  p.method = "test";
  static_cast<PlanTarget&>(p.model) = plan_target(cfg);
  p.layers.assign(cfg.n_layers, std::vector<HeadPlan>(cfg.n_kv_heads));
  for (int l = 0; l < cfg.n_layers; ++l)
    for (int h = 0; h < cfg.n_kv_heads; ++h) {
      HeadPlan& hp = p.layers[l][h];
      hp.key = Codec::tq_mse(bits, cfg.head_dim, 11 + 7 * l + h);
      hp.value = Codec::tq_mse(bits, cfg.head_dim, 91 + 7 * l + h);
      hp.key.norm_correction = hp.value.norm_correction = nc;
      if (offsets) hp.key.offset = offset_of(cfg.head_dim, 5 + 3 * l + h);
    }
  return p;
}

// RoPE of one head vector at position p written out from its definition (docs/design.md §1.1):
// block i is the channel pair (2i, 2i+1) (interleaved) or (i, i + d/2) (neox), rotated by
// p·θ^(−2i/d) counter-clockwise: (a, b) → (a cos − b sin, a sin + b cos).
std::vector<double> rope_ref(const float* x, int d, int p, double theta, RopeLayout layout) {
  std::vector<double> y(x, x + d);
  for (int i = 0; i < d / 2; ++i) {
    const int ia = layout == RopeLayout::NeoX ? i : 2 * i, ib = layout == RopeLayout::NeoX ? i + d / 2 : 2 * i + 1;
    const double ang = p * std::pow(theta, -2.0 * i / d), c = std::cos(ang), s = std::sin(ang);
    y[ia] = x[ia] * c - x[ib] * s;
    y[ib] = x[ia] * s + x[ib] * c;
  }
  return y;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(CodecOptions, JsonRoundTripAndRules) {
  const ModelConfig cfg = config(64, 2, RopeLayout::Interleaved);
  const Plan p = plan_with(cfg, 3, true, true);
  const nlohmann::json j = p.to_json();
  EXPECT_EQ(j["layers"][1]["heads"][1]["key"]["norm_correction"], true);
  ASSERT_EQ(j["layers"][1]["heads"][1]["key"]["offset"].size(), 64u);
  EXPECT_FALSE(j["layers"][1]["heads"][1]["value"].contains("offset"));
  const Plan q = Plan::from_json(j, "p.json");
  EXPECT_EQ(q.layers[1][1].key.offset, p.layers[1][1].key.offset);
  EXPECT_TRUE(q.layers[0][0].value.norm_correction);
  // Without options the JSON has neither key (plans of earlier builds are unchanged).
  const nlohmann::json j0 = plan_with(cfg, 3, false, false).to_json();
  EXPECT_FALSE(j0["layers"][0]["heads"][0]["key"].contains("norm_correction"));
  EXPECT_FALSE(j0["layers"][0]["heads"][0]["key"].contains("offset"));

  auto bad = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json b = j;
    edit(b);
    return error_of([&] { Plan::from_json(b, "p.json"); });
  };
  EXPECT_NE(bad([](auto& b) { b["layers"][0]["heads"][0]["value"]["offset"] = b["layers"][0]["heads"][0]["key"]["offset"]; })
                .find("p.json: layers[0].heads[0].value.offset: a value codec has no offset"),
            std::string::npos);
  EXPECT_NE(bad([](auto& b) { b["layers"][0]["heads"][1]["key"]["offset"].erase(0); })
                .find("layers[0].heads[1].key.offset: 63 values, expected head_dim 64"),
            std::string::npos);
  EXPECT_NE(bad([](auto& b) { b["layers"][0]["heads"][0]["key"]["offset"][5] = 0.1; })
                .find("layers[0].heads[0].key.offset[5] = 0.1: expected a finite fp16 number"),
            std::string::npos);
  EXPECT_NE(bad([](auto& b) { b["layers"][0]["heads"][0]["key"]["norm_correction"] = 1; })
                .find("layers[0].heads[0].key.norm_correction is an integer: expected a boolean"),
            std::string::npos);
  EXPECT_NE(bad([](auto& b) { b["layers"][0]["heads"][0]["key"]["offset"] = nlohmann::json::array(); })
                .find("key.offset: empty"),
            std::string::npos);
  // Norm correction belongs to TQ-MSE codecs; offsets to keys of every kind but fp16 and vq.
  Plan k = plan_with(cfg, 3, false, false);
  k.layers[0][0].key = Codec{};
  k.layers[0][0].key.kind = CodecKind::Kivi;
  k.layers[0][0].key.group_size = 32;
  k.layers[0][0].key.groups = {CodecGroup{2, {}, {}, 0}};
  for (int c = 0; c < 64; ++c) k.layers[0][0].key.groups[0].channels.push_back(c);
  k.layers[0][0].key.offset = offset_of(64, 1);
  EXPECT_NO_THROW(k.validate("k"));
  k.layers[0][0].key.norm_correction = true;
  EXPECT_NE(error_of([&] { k.validate("k"); })
                .find("k: layers[0].heads[0].key.norm_correction: kind kivi has no TQ-MSE norm to correct"),
            std::string::npos);
  Plan f = plan_with(cfg, 3, false, false);
  f.layers[1][0].key = Codec::fp16();
  f.layers[1][0].key.offset = offset_of(64, 2);
  EXPECT_NE(error_of([&] { f.validate("f"); }).find("f: layers[1].heads[0].key.offset: kind fp16 takes no offset"),
            std::string::npos);
}

// Offsets are a fixed cost of the plan (2 bytes per value), not a per-token one; norm correction costs nothing.
TEST(CodecOptions, StoredBytes) {
  const ModelConfig cfg = config(128, 2, RopeLayout::NeoX, 3);
  const PlanStoredBytes plain = plan_stored_bytes(plan_with(cfg, 3, false, false));
  const PlanStoredBytes opt = plan_stored_bytes(plan_with(cfg, 3, true, true));
  EXPECT_EQ(opt.bytes_per_token(), plain.bytes_per_token());
  EXPECT_EQ(opt.bytes_per_token(), 3 * 2 * 2 * (128 * 3 + 16) / 8.0);  // layers · heads · sides · (codes + norm)
  EXPECT_EQ(plain.fixed_bytes, 0);
  EXPECT_EQ(opt.fixed_bytes, 3 * 2 * 128 * 2);  // layers · KV heads · head_dim · fp16
  EXPECT_EQ(plan_offset_bytes(plan_with(cfg, 3, true, true)), opt.fixed_bytes);
  EXPECT_EQ(opt.to_json()["fixed_bytes"], opt.fixed_bytes);
}

// The fake-quant reconstruction with an offset: R_p μ + Q(k − R_p μ), with R_p written out here,
// at scattered positions, both RoPE layouts; the quantizer Q is the codec's TQ-MSE on the residual.
TEST(CodecOptions, OffsetReconstructionEqualsDefinition) {
  for (RopeLayout layout : {RopeLayout::Interleaved, RopeLayout::NeoX}) {
    const int d = 64, Hkv = 2;
    const ModelConfig cfg = config(d, Hkv, layout);
    const PlanCodecs codecs(plan_with(cfg, 2, true, true), cfg, "p");
    const std::vector<int32_t> pos = {0, 1, 7, 63, 64, 500, 4097};
    const int64_t T = static_cast<int64_t>(pos.size());
    std::mt19937 g(4);
    const auto k = ratekv_test::randn(static_cast<size_t>(T) * d, g, 1.0f);
    for (int l = 0; l < 2; ++l)
      for (int h = 0; h < Hkv; ++h) {
        std::vector<float> got(k.size());
        codecs.fake_quant(l, h, KVSide::key, k.data(), pos.data(), T, got.data());
        const auto* tq = dynamic_cast<const quant::TQMSE*>(codecs.quantizer(l, h, KVSide::key));
        ASSERT_NE(tq, nullptr);
        const float* mu = codecs.key_offset(l, h);
        ASSERT_NE(mu, nullptr);
        for (int64_t t = 0; t < T; ++t) {
          const std::vector<double> rmu = rope_ref(mu, d, pos[t], cfg.rope_theta, layout);
          std::vector<float> r(d), rq(d);
          for (int i = 0; i < d; ++i) r[i] = static_cast<float>(k[t * d + i] - rmu[i]);
          tq->fake_quant(r.data(), 1, rq.data());
          for (int i = 0; i < d; ++i)
            EXPECT_NEAR(got[t * d + i], rq[i] + rmu[i], 2e-4 * (1 + std::abs(rmu[i])))
                << "layer " << l << " head " << h << " t " << t << " channel " << i;
        }
      }
    // Without positions an offset cannot be placed: a clear error.
    std::vector<float> out(static_cast<size_t>(T) * d);
    EXPECT_NE(error_of([&] { codecs.fake_quant(0, 0, KVSide::key, k.data(), T, out.data()); })
                  .find("layers[0].heads[0].key has an offset (pre-RoPE): the rows' positions are needed"),
              std::string::npos);
    std::vector<float> seq(static_cast<size_t>(T) * Hkv * d, 0.5f), sq(seq.size());
    EXPECT_NE(error_of([&] { fake_quant_sequence(codecs, 0, KVSide::key, seq.data(), T, 0, 0, sq.data()); })
                  .find("positions are needed"),
              std::string::npos);
  }
}

// Keys k_p = R_p μ + small noise (a large pre-RoPE mean): with the offset the 2-bit error is that of
// the noise; without it, that of ‖μ‖. A RoPE sign or direction error would leave the mean in the residual.
TEST(CodecOptions, OffsetRemovesTheMeanFromTheError) {
  const int d = 128, Hkv = 1;
  const ModelConfig cfg = config(d, Hkv, RopeLayout::NeoX, 1);
  const PlanCodecs with(plan_with(cfg, 2, false, true), cfg, "with");
  Plan pw = plan_with(cfg, 2, false, false);
  const PlanCodecs without(pw, cfg, "without");
  const float* mu = with.key_offset(0, 0);
  const int64_t T = 300;
  std::vector<int32_t> pos(T);
  std::mt19937 g(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> k(static_cast<size_t>(T) * d);
  double noise2 = 0, mean2 = 0;
  for (int64_t t = 0; t < T; ++t) {
    pos[t] = static_cast<int32_t>(3 * t + 1);
    const std::vector<double> r = rope_ref(mu, d, pos[t], cfg.rope_theta, RopeLayout::NeoX);
    for (int i = 0; i < d; ++i) {
      const float n = nd(g);
      k[t * d + i] = static_cast<float>(r[i] + n);
      noise2 += n * n;
      mean2 += r[i] * r[i];
    }
  }
  std::vector<float> a(k.size()), b(k.size());
  with.fake_quant(0, 0, KVSide::key, k.data(), pos.data(), T, a.data());
  without.fake_quant(0, 0, KVSide::key, k.data(), pos.data(), T, b.data());
  double ea = 0, eb = 0;
  for (size_t i = 0; i < k.size(); ++i) {
    ea += (a[i] - k[i]) * (a[i] - k[i]);
    eb += (b[i] - k[i]) * (b[i] - k[i]);
  }
  // TQ-MSE at 2 bits, m = 128: relative error ≈ 0.116 of the quantized vector's energy (docs/design.md §2.2).
  EXPECT_NEAR(ea / noise2, 0.116, 0.02);
  EXPECT_NEAR(eb / (noise2 + mean2), 0.116, 0.02);
  EXPECT_LT(ea, 0.01 * eb);  // ‖μ‖² ≈ 400·d ≫ d
}

// The cache serves offsets as fake_quant_sequence defines them (appended in pieces, positions not
// starting at 0); the packed cache refuses them, naming the codec and the cache that serves them.
TEST(CodecOptions, FakeQuantCacheServesOffsetsPackedRefuses) {
  const int d = 32, Hkv = 2;
  const ModelConfig cfg = config(d, Hkv, RopeLayout::Interleaved);
  auto codecs = std::make_shared<const PlanCodecs>(plan_with(cfg, 3, false, true), cfg, "p");
  const int64_t T = 40, row = int64_t{Hkv} * d;
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(t + 100);
  std::mt19937 g(2);
  const auto K = ratekv_test::randn(static_cast<size_t>(T * row), g, 2.0f);
  const auto V = ratekv_test::randn(static_cast<size_t>(T * row), g, 1.0f);
  FakeQuantKVCache fake(cfg.kv_shape(T), codecs);
  fake.append(1, 25, pos.data(), K.data(), K.data(), V.data());
  for (int64_t t = 25; t < T; ++t) fake.append(1, 1, &pos[t], &K[t * row], &K[t * row], &V[t * row]);
  std::vector<float> want(K.size());
  fake_quant_sequence(*codecs, 1, KVSide::key, K.data(), K.data(), pos.data(), T, 0, 0, want.data());
  const auto got = fake.keys(1);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << i;
  EXPECT_NE(error_of([&] { PackedKVCache(cfg.kv_shape(T), codecs); })
                .find("PackedKVCache: plan: layers[0].heads[0].key: the codec has a key offset; the packed pages have "
                      "no place for it (FakeQuantKVCache serves key offsets)"),
            std::string::npos);
}

// Norm correction: every reconstruction keeps its input's norm (to fp16), which plain TQ-MSE does not;
// the packed cache stores the corrected norms and attends exactly like the fake-quant cache.
TEST(CodecOptions, NormCorrectionPackedEqualsFake) {
  const int d = 64, Hkv = 2, H = 4;
  const ModelConfig cfg = config(d, Hkv, RopeLayout::NeoX);
  auto nc = std::make_shared<const PlanCodecs>(plan_with(cfg, 2, true, false), cfg, "nc");
  auto plain = std::make_shared<const PlanCodecs>(plan_with(cfg, 2, false, false), cfg, "plain");
  EXPECT_EQ(nc->quantizer(1, 1, KVSide::value)->to_json()["norm_correction"], true);
  const int64_t T = 97, row = int64_t{Hkv} * d;
  std::mt19937 g(6);
  const auto K = ratekv_test::randn(static_cast<size_t>(T * row), g, 1.5f, 0.2f);
  const auto V = ratekv_test::randn(static_cast<size_t>(T * row), g, 1.0f);
  // Norms: ‖x̂‖ = ‖x‖ with the correction (fp16 norm: relative 1e-3), not without it.
  std::vector<float> a(static_cast<size_t>(T) * d), b(a.size()), x(a.size());
  for (int64_t t = 0; t < T; ++t) std::copy(&V[t * row], &V[t * row] + d, &x[t * d]);
  nc->fake_quant(0, 0, KVSide::value, x.data(), T, a.data());
  plain->fake_quant(0, 0, KVSide::value, x.data(), T, b.data());
  double worst_nc = 0, mean_plain = 0;
  for (int64_t t = 0; t < T; ++t) {
    double nx = 0, na = 0, nb = 0;
    for (int i = 0; i < d; ++i) {
      nx += x[t * d + i] * x[t * d + i];
      na += a[t * d + i] * a[t * d + i];
      nb += b[t * d + i] * b[t * d + i];
    }
    worst_nc = std::max(worst_nc, std::abs(std::sqrt(na / nx) - 1));
    mean_plain += std::abs(std::sqrt(nb / nx) - 1) / T;
  }
  EXPECT_LT(worst_nc, 1e-3);
  EXPECT_GT(mean_plain, 0.03);  // 2-bit TQ-MSE shrinks: E‖c[idx]‖² = 1 − D(2) ≈ 0.88
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(t);
  FakeQuantKVCache fake(cfg.kv_shape(T), nc);
  PackedKVCache packed(cfg.kv_shape(T), nc);
  for (int l = 0; l < 2; ++l)
    for (KVCache* c : {static_cast<KVCache*>(&fake), static_cast<KVCache*>(&packed)})
      c->append(l, T, pos.data(), K.data(), K.data(), V.data());
  AttnParams ap;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(d));
  const auto q = ratekv_test::randn(static_cast<size_t>(T) * H * d, g, 1.0f);
  for (int l = 0; l < 2; ++l) {
    std::vector<float> of(q.size()), op(q.size());
    fake.attend(l, T, pos.data(), q.data(), of.data(), ap);
    packed.attend(l, T, pos.data(), q.data(), op.data(), ap);
    double num = 0, den = 0;
    for (size_t i = 0; i < of.size(); ++i) {
      num += (double(op[i]) - of[i]) * (double(op[i]) - of[i]);
      den += double(of[i]) * of[i];
    }
    EXPECT_LT(std::sqrt(num / den), 1e-5) << "layer " << l;
  }
}
