// PackedKVCache serving vq plans (TaSQ / CQ, docs/packed_format.md §7): its
// vq pages hold exactly the fake-quant path's indices and scales (read back
// with the format's reference reader), attention from them equals the
// fake-quant cache's fp32 attention over the decoded, re-rotated keys to fp32
// rounding (keys vq with a shared scale and channel weights; values vq, fp16
// or TQ-MSE), byte counts are the format's arithmetic, and a vq plan without
// its side file is a clear Error.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "ratekv/cache/fake_quant_cache.h"
#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/model/model.h"
#include "../support/vq_codec.h"
#include "../support/tiny_model.h"

using namespace ratekv;
using namespace ratekv::cache;

namespace {

// A llama-shaped config (no weights): only the cache shape and RoPE matter here.
ModelConfig config(int head_dim, int n_kv_heads, int ratio, int n_layers = 2) {
  return ratekv_test::tiny_config({.n_layers = n_layers,
                                   .n_heads = n_kv_heads * ratio,
                                   .n_kv_heads = n_kv_heads,
                                   .head_dim = head_dim,
                                   .n_ctx = 8192,
                                   .rope_theta = 10000.0});
}

enum class Values { vq, fp16, tq_mse };

using ratekv_test::vq_codec;

// TaSQ-style keys (g 8, 2^6 centroids, shared scale, channel weights, RoPE
// pairs kept together in a shuffled order) per layer; values by `vals`.
struct VqSetup {
  Plan plan;
  std::shared_ptr<VqTensors> tensors;
};

VqSetup vq_setup(const ModelConfig& cfg, Values vals, uint32_t seed) {
  const int d = cfg.head_dim, H = cfg.n_kv_heads, g = 8, kb = 6, vb = 5;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.3f, 2.0f);
  VqSetup s;
  Plan& p = s.plan;
  p.method = "tasq";
  static_cast<PlanTarget&>(p.model) = plan_target(cfg);
  p.tensors_file = "in-memory.safetensors";
  p.layers.assign(cfg.n_layers, std::vector<HeadPlan>(H));
  for (int l = 0; l < cfg.n_layers; ++l) {
    std::vector<int> pairs(d / 2);
    for (int i = 0; i < d / 2; ++i) pairs[i] = i;
    std::shuffle(pairs.begin(), pairs.end(), rng);
    std::vector<int> perm;
    for (int b : pairs) perm.insert(perm.end(), {2 * b, 2 * b + 1});
    for (int h = 0; h < H; ++h) {
      HeadPlan& hp = p.layers[l][h];
      hp.key = vq_codec(d, g, kb, true, H, perm);
      if (vals == Values::vq) {
        std::vector<int> id(d);
        for (int i = 0; i < d; ++i) id[i] = i;
        hp.value = vq_codec(d, g, vb, false, H, id);
      } else if (vals == Values::fp16) {
        hp.value = Codec::fp16();
      } else {
        hp.value = Codec::tq_mse(3, d, 500 + 10 * l + h);
      }
    }
  }
  VqTensors t = VqTensors::for_plan(p);
  for (int l = 0; l < cfg.n_layers; ++l)
    for (int h = 0; h < H; ++h) {
      auto& k = t.at(l, h, 0);
      k.present = true;
      k.codebooks.resize(static_cast<size_t>(d / g) * (1 << kb) * g);
      for (float& x : k.codebooks) x = round_fp16(nd(rng));  // side files store fp16
      k.channel_scale.resize(d);
      for (float& x : k.channel_scale) x = round_fp16(ud(rng));
      if (vals == Values::vq) {
        auto& v = t.at(l, h, 1);
        v.present = true;
        v.codebooks.resize(static_cast<size_t>(d / g) * (1 << vb) * g);
        for (float& x : v.codebooks) x = round_fp16(1.5f * nd(rng));
      }
    }
  s.tensors = std::make_shared<VqTensors>(std::move(t));
  return s;
}

// (T, H, d) pre-RoPE keys with per-channel scales and an offset (never zeros).
std::vector<float> kv_data(int64_t T, int H, int d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(T * H * d);
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h)
      for (int c = 0; c < d; ++c) x[(t * H + h) * d + c] = (0.2f + 2.8f * ((c * 7 + h) % d) / d) * nd(rng) + 0.3f;
  return x;
}

std::vector<float> rotated(const std::vector<float>& k_pre, int64_t T, int H, int d, const int32_t* pos,
                           const ModelConfig& cfg, int layer) {
  std::vector<float> k = k_pre;
  for (int64_t t = 0; t < T; ++t)
    apply_rope(k.data() + t * H * d, H, d, pos[t], cfg.rope_layout, cfg.layer_rope_theta(layer));
  return k;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

struct Case {
  int64_t T;
  int ratio;
  int d;
  Values values;
};

std::string case_name(const testing::TestParamInfo<Case>& i) {
  const char* v = i.param.values == Values::vq ? "vqV" : i.param.values == Values::fp16 ? "fp16V" : "tqV";
  return fmt::format("T{}_gqa{}_d{}_{}", i.param.T, i.param.ratio, i.param.d, v);
}

class PackedVqEqualsFake : public testing::TestWithParam<Case> {};

}  // namespace

// Prefill T−k tokens in one call, decode the last k one at a time, then
// compare decode (1 query), a block of queries and the full causal prefill on
// every layer against the fake-quant cache (fast and reference packed paths);
// layer 1 uses another RoPE base (sliding layers of Gemma 3 do).
TEST_P(PackedVqEqualsFake, AttentionFromIndicesEqualsFakeQuant) {
  const Case cs = GetParam();
  const int Hkv = 3, d = cs.d, H = Hkv * cs.ratio;
  ModelConfig cfg = config(d, Hkv, cs.ratio);
  cfg.sliding_window = 4096;
  cfg.layer_sliding = {0, 1};
  cfg.rope_theta_swa = 500.0;
  ASSERT_NE(cfg.layer_rope_theta(0), cfg.layer_rope_theta(1));
  VqSetup vs = vq_setup(cfg, cs.values, 7 + static_cast<uint32_t>(cs.T));
  auto codecs = std::make_shared<const PlanCodecs>(vs.plan, cfg, "vq-plan", vs.tensors);
  const KVCacheShape shape = cfg.kv_shape(cs.T);
  FakeQuantKVCache fake(shape, codecs);
  PackedCacheOptions po;
  po.pages_per_split = 2;
  PackedKVCache packed(shape, codecs, po);
  po.reference_attention = true;
  PackedKVCache packed_ref(shape, codecs, po);

  const int64_t k = std::min<int64_t>(cs.T - 1, 3), T0 = cs.T - k;
  const int64_t row = int64_t{Hkv} * d;
  std::vector<int32_t> pos(cs.T);
  for (int64_t t = 0; t < cs.T; ++t) pos[t] = static_cast<int32_t>(3 * t + 2);  // not the token index
  for (int l = 0; l < cfg.n_layers; ++l) {
    const auto Kp = kv_data(cs.T, Hkv, d, 10 + l), V = kv_data(cs.T, Hkv, d, 20 + l);
    const auto K = rotated(Kp, cs.T, Hkv, d, pos.data(), cfg, l);
    for (KVCache* c : {static_cast<KVCache*>(&fake), static_cast<KVCache*>(&packed), static_cast<KVCache*>(&packed_ref)}) {
      c->append(l, T0, pos.data(), Kp.data(), K.data(), V.data());
      for (int64_t t = T0; t < cs.T; ++t) c->append(l, 1, &pos[t], &Kp[t * row], &K[t * row], &V[t * row]);
    }
  }
  ASSERT_EQ(packed.n_quantized(0), cs.T);
  ASSERT_NE(packed.vq_layout(0), nullptr);

  AttnParams ap;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(d));
  double worst = 0;
  for (int l = 0; l < cfg.n_layers; ++l)
    for (int64_t nq : {int64_t{1}, std::min<int64_t>(cs.T, 40), cs.T}) {
      std::mt19937 rng(77 + l);
      std::normal_distribution<float> nd(0.0f, 1.5f);
      std::vector<float> q(nq * H * d);
      for (float& x : q) x = nd(rng);
      const int32_t* qpos = pos.data() + (cs.T - nq);
      std::vector<float> of(q.size()), op(q.size()), orf(q.size());
      fake.attend(l, nq, qpos, q.data(), of.data(), ap);
      packed.attend(l, nq, qpos, q.data(), op.data(), ap);
      packed_ref.attend(l, nq, qpos, q.data(), orf.data(), ap);
      const double e = rel_err(op, of), er = rel_err(orf, of);
      worst = std::max({worst, e, er});
      EXPECT_LT(e, 1e-5) << "layer " << l << ", " << nq << " queries";
      EXPECT_LT(er, 1e-5) << "reference path, layer " << l << ", " << nq << " queries";
    }
  std::printf("[ max rel err %s: %.3g ]\n", case_name({GetParam(), 0}).c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(
    VqPlans, PackedVqEqualsFake,
    testing::Values(Case{1, 1, 64, Values::vq}, Case{97, 3, 64, Values::vq}, Case{200, 1, 128, Values::vq},
                    Case{513, 3, 64, Values::vq}, Case{1, 3, 128, Values::fp16}, Case{97, 1, 64, Values::fp16},
                    Case{200, 3, 64, Values::fp16}, Case{513, 1, 128, Values::fp16}, Case{1, 3, 64, Values::tq_mse},
                    Case{97, 3, 128, Values::tq_mse}, Case{200, 1, 64, Values::tq_mse},
                    Case{513, 3, 64, Values::tq_mse}),
    case_name);

// The vq pages hold the fake-quant path's indices and scales bit for bit;
// bytes are the format's arithmetic: per token per layer 3 KV heads · G ·
// bits / 8 + 2 (shared scale) for keys, 3 · 2d for fp16 values.
TEST(PackedVqCache, PagesHoldTheFakeQuantIndicesAndBytesAreExact) {
  const int Hkv = 3, d = 64, G = 8, kbits = 6;
  const ModelConfig cfg = config(d, Hkv, 3);
  VqSetup vs = vq_setup(cfg, Values::fp16, 3);
  auto codecs = std::make_shared<const PlanCodecs>(vs.plan, cfg, "vq-plan", vs.tensors);
  const int64_t T = 97;
  PackedKVCache packed(cfg.kv_shape(T), codecs);
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(t);
  const auto Kp = kv_data(T, Hkv, d, 1), V = kv_data(T, Hkv, d, 2);
  const auto K = rotated(Kp, T, Hkv, d, pos.data(), cfg, 0);
  packed.append(0, T, pos.data(), Kp.data(), K.data(), V.data());
  packed.append(1, T, pos.data(), Kp.data(), K.data(), V.data());

  std::vector<const VqCodec*> heads;
  for (int h = 0; h < Hkv; ++h) heads.push_back(codecs->vq(0, h, KVSide::key));
  std::vector<float> out(Kp.size()), sc(T);
  std::vector<int32_t> codes(T * Hkv * G);
  vq_fake_quant_layer(heads, Kp.data(), T, out.data(), codes.data(), sc.data());
  const packed::VqLayerLayout& VL = *packed.vq_layout(0);
  std::vector<int32_t> z(G);
  std::vector<uint16_t> h16(d);
  int64_t mismatches = 0;
  for (int64_t t = 0; t < T; ++t) {
    const auto page = packed.vq_page(0, static_cast<int>(t / 64));
    const int slot = static_cast<int>(t % 64);
    mismatches += fp16_to_fp32(packed::read_vq_scale(VL, page, packed::Side::key, slot)) != sc[t];
    for (int h = 0; h < Hkv; ++h) {
      packed::read_vq_indices(VL, page, h, packed::Side::key, slot, z);
      for (int gi = 0; gi < G; ++gi) mismatches += z[gi] != codes[(t * Hkv + h) * G + gi];
      packed::read_fp16_row(VL, page, h, packed::Side::value, slot, h16);
      for (int i = 0; i < d; ++i) mismatches += h16[i] != fp32_to_fp16(V[(t * Hkv + h) * d + i]);
    }
  }
  EXPECT_EQ(mismatches, 0);
  // Exact bytes: keys 3·8·6/8 + 2 = 20 B, fp16 values 3·128 = 384 B per token per layer.
  EXPECT_DOUBLE_EQ(VL.bytes_per_token(), 3.0 * G * kbits / 8 + 2 + 3.0 * 2 * d);
  EXPECT_EQ(VL.page_bytes(), size_t((18 + 2 + 384) * 64));
  EXPECT_EQ(packed.layout(0).page_bytes(), 0u);  // no scalar sides
  EXPECT_EQ(packed.page_bytes(), size_t(2) * 2 * VL.page_bytes());  // 2 layers × 2 pages
  EXPECT_EQ(packed.bytes(), packed.page_bytes() + 2 * T * sizeof(int32_t));
  std::printf("[ vq keys g 8, 2^6 centroids, d 64, 3 KV heads: %.1f B/token/layer incl. the shared scale; "
              "fp16 values %d B ]\n", 3.0 * G * kbits / 8 + 2, 3 * 2 * d);
}

// fp16 window and sink tokens around the vq codes: equal to the fake-quant cache.
TEST(PackedVqCache, WindowAndSinkEqualFakeQuant) {
  const int Hkv = 3, d = 64, ratio = 3;
  const ModelConfig cfg = config(d, Hkv, ratio);
  VqSetup vs = vq_setup(cfg, Values::vq, 5);
  auto codecs = std::make_shared<const PlanCodecs>(vs.plan, cfg, "vq-plan", vs.tensors);
  const int64_t T = 150;
  FakeQuantOptions fo;
  fo.fp16_window = 17;
  fo.sink_tokens = 4;
  PackedCacheOptions po;
  po.fp16_window = 17;
  po.sink_tokens = 4;
  FakeQuantKVCache fake(cfg.kv_shape(T), codecs, fo);
  PackedKVCache packed(cfg.kv_shape(T), codecs, po);
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(t);
  const int64_t row = int64_t{Hkv} * d;
  const auto Kp = kv_data(T, Hkv, d, 3), V = kv_data(T, Hkv, d, 4);
  const auto K = rotated(Kp, T, Hkv, d, pos.data(), cfg, 0);
  AttnParams ap;
  ap.scale = 0.125f;
  // Token by token, attending after each append (tokens leave the window one at a time).
  for (int64_t t = 0; t < T; ++t) {
    fake.append(0, 1, &pos[t], &Kp[t * row], &K[t * row], &V[t * row]);
    packed.append(0, 1, &pos[t], &Kp[t * row], &K[t * row], &V[t * row]);
    if (t % 13 != 0 && t != T - 1) continue;
    std::vector<float> q(ratio * Hkv * d);
    std::mt19937 rng(static_cast<uint32_t>(t));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (float& x : q) x = nd(rng);
    std::vector<float> of(q.size()), op(q.size());
    fake.attend(0, 1, &pos[t], q.data(), of.data(), ap);
    packed.attend(0, 1, &pos[t], q.data(), op.data(), ap);
    EXPECT_LT(rel_err(op, of), 1e-5) << "after token " << t;
  }
  EXPECT_EQ(packed.n_quantized(0), T - 17 - 4);
}

// A vq plan whose side file is missing or belongs to another plan is an Error
// naming the file, before any cache exists; vq keys need k_pre.
TEST(PackedVqCache, MissingOrMismatchedSideFileIsAnError) {
  const int Hkv = 3, d = 64;
  const ModelConfig cfg = config(d, Hkv, 1);
  VqSetup vs = vq_setup(cfg, Values::vq, 9);
  const auto dir = std::filesystem::temp_directory_path() / "ratekv_test_packed_vq";
  std::filesystem::create_directories(dir);
  Plan p = vs.plan;
  p.source_dir = dir.string();
  p.tensors_file = "does-not-exist.safetensors";
  try {
    PlanCodecs c(p, cfg, "vq-plan.json");
    ADD_FAILURE() << "missing side file accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does-not-exist.safetensors"), std::string::npos) << e.what();
  }
  // A side file saved for another plan (values at 4 bits instead of 5: other tensor sizes).
  VqSetup other = vq_setup(cfg, Values::vq, 9);
  for (auto& layer : other.plan.layers)
    for (auto& hp : layer)
      for (auto& g : hp.value.groups) g.bits = 4;
  for (int l = 0; l < cfg.n_layers; ++l)
    for (int h = 0; h < Hkv; ++h) other.tensors->at(l, h, 1).codebooks.resize(8 * 16 * 8, 0.5f);
  const std::string path = (dir / "other.safetensors").string();
  other.tensors->save(path, other.plan);
  p.tensors_file = "other.safetensors";
  try {
    PlanCodecs c(p, cfg, "vq-plan.json");
    ADD_FAILURE() << "side file of another plan accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("other.safetensors"), std::string::npos) << e.what();
  }
  // The right side file loads and serves the packed cache; k_pre is required.
  vs.tensors->save((dir / "right.safetensors").string(), vs.plan);
  p.tensors_file = "right.safetensors";
  auto codecs = std::make_shared<const PlanCodecs>(p, cfg, "vq-plan.json");
  PackedKVCache packed(cfg.kv_shape(4), codecs);
  const auto K = kv_data(1, Hkv, d, 1);
  const int32_t p0 = 0;
  EXPECT_THROW(packed.append(0, 1, &p0, nullptr, K.data(), K.data()), Error);
  EXPECT_NO_THROW(packed.append(0, 1, &p0, K.data(), K.data(), K.data()));
  std::filesystem::remove_all(dir);
}

// fp16 sides without any vq: fp16 keys (post-RoPE rows) with TQ-MSE values and
// the reverse, in the vq pages, equal the fake-quant cache; a layer side with
// fp16 on some KV heads only is an Error naming the layer.
TEST(PackedVqCache, Fp16SidesEqualFakeQuantAndMixedFp16IsAnError) {
  const int Hkv = 3, d = 64, ratio = 3;
  const ModelConfig cfg = config(d, Hkv, ratio);
  const int64_t T = 130;
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(t);
  for (int fp16_side = 0; fp16_side < 2; ++fp16_side) {
    Plan p;
    p.method = "test";
    static_cast<PlanTarget&>(p.model) = plan_target(cfg);
    p.layers.assign(cfg.n_layers, std::vector<HeadPlan>(Hkv));
    for (int l = 0; l < cfg.n_layers; ++l)
      for (int h = 0; h < Hkv; ++h) {
        const Codec tq = Codec::tq_mse(2, d, 40 + h);
        p.layers[l][h] = fp16_side == 0 ? HeadPlan{Codec::fp16(), tq} : HeadPlan{tq, Codec::fp16()};
      }
    auto codecs = std::make_shared<const PlanCodecs>(p, cfg, "fp16-plan");
    FakeQuantKVCache fake(cfg.kv_shape(T), codecs);
    PackedKVCache packed(cfg.kv_shape(T), codecs);
    ASSERT_NE(packed.vq_layout(0), nullptr);
    EXPECT_EQ(packed.vq_layout(0)->side(static_cast<packed::Side>(fp16_side)).kind, packed::VqSideKind::fp16);
    const auto Kp = kv_data(T, Hkv, d, 11), V = kv_data(T, Hkv, d, 12);
    const auto K = rotated(Kp, T, Hkv, d, pos.data(), cfg, 0);
    fake.append(0, T, pos.data(), Kp.data(), K.data(), V.data());
    packed.append(0, T, pos.data(), Kp.data(), K.data(), V.data());
    AttnParams ap;
    ap.scale = 0.125f;
    for (int64_t nq : {int64_t{1}, T}) {
      std::vector<float> q(nq * ratio * Hkv * d);
      std::mt19937 rng(5);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      for (float& x : q) x = nd(rng);
      std::vector<float> of(q.size()), op(q.size());
      fake.attend(0, nq, pos.data() + (T - nq), q.data(), of.data(), ap);
      packed.attend(0, nq, pos.data() + (T - nq), q.data(), op.data(), ap);
      EXPECT_LT(rel_err(op, of), 1e-5) << "fp16 side " << fp16_side << ", " << nq << " queries";
    }
    // Mixed: head 1 of layer 1 back to TQ-MSE on the fp16 side.
    Plan mixed = p;
    (fp16_side == 0 ? mixed.layers[1][1].key : mixed.layers[1][1].value) = Codec::tq_mse(3, d, 9);
    try {
      PackedKVCache c(cfg.kv_shape(T), std::make_shared<const PlanCodecs>(mixed, cfg, "mixed"));
      ADD_FAILURE() << "mixed fp16 layer side accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("layers[1]"), std::string::npos) << e.what();
    }
  }
}
