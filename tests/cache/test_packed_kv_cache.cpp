// PackedKVCache: its pages hold exactly the quantizers' codes in the packed
// format (checked with the scalar reference reader), attention from the codes
// equals the fake-quant cache's fp32 attention over the decoded vectors to
// fp32 rounding, byte counts match the format arithmetic, unsupported codecs
// are clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "ratekv/cache/fake_quant_cache.h"
#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/io/gguf.h"
#include "ratekv/model/model.h"
#include "ratekv/model/tokenizer.h"
#include "ratekv/quant/grouped_tq_mse.h"
#include "ratekv/ref/packed_decode_attention.h"
#include "../support/packed_cache_plans.h"
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

// Block-GTQ-style keys: blocks {0, 3} at 4 bits (4 channels), blocks 1, 5..
// 5+11 at 3 bits (24 channels: a padded 16-channel tile), the rest at 2 bits,
// block 2 and the last block dropped (0 bits).
Codec block_gtq_key(int d, uint32_t seed) {
  Codec c;
  c.kind = CodecKind::TqMseGrouped;
  c.norm = NormStorage::FP16;
  CodecGroup a, b, r, z;
  a.bits = 4;
  a.blocks = {0, 3};
  a.seed = seed;
  b.bits = 3;
  b.blocks = {1};
  for (int i = 5; i < 16; ++i) b.blocks.push_back(i);
  b.seed = seed + 1;
  r.bits = 2;
  r.blocks = {4};
  for (int i = 16; i < d / 2 - 1; ++i) r.blocks.push_back(i);
  r.seed = seed + 2;
  z.bits = 0;
  z.blocks = {2, d / 2 - 1};
  c.groups = {a, b, r, z};
  return c;
}

Codec whole(CodecKind kind, int bits, int d, int group_size = 0) {
  Codec c;
  c.kind = kind;
  c.group_size = group_size;
  c.norm = kind == CodecKind::TqMse ? NormStorage::FP16 : NormStorage::None;
  CodecGroup g;
  g.bits = bits;
  for (int i = 0; i < d; ++i) g.channels.push_back(i);
  c.groups.push_back(g);
  return c;
}

// A tq-mse-grouped codec with every block at 0 bits: the side stores nothing
// (what a RateQuant + Block-GTQ plan gives a head with a zero budget).
Codec all_zero_grouped(int d) {
  Codec c;
  c.kind = CodecKind::TqMseGrouped;
  c.norm = NormStorage::FP16;
  CodecGroup z;
  z.bits = 0;
  for (int i = 0; i < d / 2; ++i) z.blocks.push_back(i);
  c.groups = {z};
  return c;
}

// uniform: K kbits V vbits everywhere. block_gtq: block_gtq_key keys, V vbits.
// ratequant: RateQuant over TQ-MSE, a width per (layer, KV head, side), from
// kRqK / kRqV at index (l·H + h) mod 8; with the tests' 2 layers × 2 KV heads
// keys get 2, 5, 1, 4 and values 3, 1, 8, 2: heads of a layer differ, K ≠ V,
// and both sides have a 5..8-bit (extension page) group.
// zero_side: block_gtq, but layer 0 head 0 keys and layer 1 head 1 values at
// 0 bits on every block.
enum class PlanKind { uniform, block_gtq, ratequant, zero_side };
constexpr int kRqK[] = {2, 5, 1, 4, 8, 3, 7, 6};
constexpr int kRqV[] = {3, 1, 8, 2, 6, 4, 5, 7};

Plan make_plan(const ModelConfig& cfg, PlanKind kind, int kbits = 3, int vbits = 2) {
  Plan p;
  p.method = "test";
  static_cast<PlanTarget&>(p.model) = plan_target(cfg);
  p.layers.assign(cfg.n_layers, std::vector<HeadPlan>(cfg.n_kv_heads));
  for (int l = 0; l < cfg.n_layers; ++l)
    for (int h = 0; h < cfg.n_kv_heads; ++h) {
      const uint32_t seed = 100 + 10 * l + h;
      const int i = (l * cfg.n_kv_heads + h) % 8;
      HeadPlan& hp = p.layers[l][h];
      switch (kind) {
        case PlanKind::uniform:
          hp.key = Codec::tq_mse(kbits, cfg.head_dim, seed);
          hp.value = Codec::tq_mse(vbits, cfg.head_dim, seed + 1000);
          break;
        case PlanKind::block_gtq:
        case PlanKind::zero_side:
          hp.key = block_gtq_key(cfg.head_dim, seed);
          hp.value = Codec::tq_mse(vbits, cfg.head_dim, seed + 1000);
          if (kind == PlanKind::zero_side && l == 0 && h == 0) hp.key = all_zero_grouped(cfg.head_dim);
          if (kind == PlanKind::zero_side && l == 1 && h == 1) hp.value = all_zero_grouped(cfg.head_dim);
          break;
        case PlanKind::ratequant:
          hp.key = Codec::tq_mse(kRqK[i], cfg.head_dim, seed);
          hp.value = Codec::tq_mse(kRqV[i], cfg.head_dim, seed + 1000);
          break;
      }
    }
  return p;
}

std::shared_ptr<const PlanCodecs> make_codecs(const ModelConfig& cfg, PlanKind kind, int kbits = 3, int vbits = 2) {
  return std::make_shared<PlanCodecs>(make_plan(cfg, kind, kbits, vbits), cfg, "test-plan");
}

// (T, n_kv_heads, d) with per-channel scales 0.2..3 (outlier channels, as
// real keys have) and a mean offset.
std::vector<float> kv_data(int64_t T, int Hkv, int d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(T * Hkv * d);
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < Hkv; ++h)
      for (int c = 0; c < d; ++c) x[(t * Hkv + h) * d + c] = (0.2f + 2.8f * ((c * 7 + h) % d) / d) * nd(rng) + 0.3f;
  return x;
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
  PlanKind kind;
  int64_t T;
  int ratio;
  int d;
};

const char* kind_name(PlanKind k) {
  switch (k) {
    case PlanKind::uniform: return "uniform";
    case PlanKind::block_gtq: return "blockgtq";
    case PlanKind::ratequant: return "ratequant";
    case PlanKind::zero_side: return "zeroside";
  }
  return "?";
}

std::string case_name(const testing::TestParamInfo<Case>& i) {
  return fmt::format("{}_T{}_gqa{}_d{}", kind_name(i.param.kind), i.param.T, i.param.ratio, i.param.d);
}

class PackedEqualsFake : public testing::TestWithParam<Case> {};

// Prefill T−k tokens in one call, decode the last k one at a time (all
// caches), then compare decode attention (1 query: the AVX2 fast path and the
// scalar reference) and prefill attention (a block of queries, the levels-tile
// path) on every layer against the fake-quant cache, and the fast path
// against the reference.
TEST_P(PackedEqualsFake, AttentionFromCodesEqualsFakeQuant) {
  const Case cs = GetParam();
  const int Hkv = 2, d = cs.d, H = Hkv * cs.ratio;
  const ModelConfig cfg = config(d, Hkv, cs.ratio);
  auto codecs = make_codecs(cfg, cs.kind);
  const KVCacheShape shape = cfg.kv_shape(cs.T);
  FakeQuantKVCache fake(shape, codecs);
  PackedCacheOptions po;
  po.pages_per_split = 2;  // several parts at T ≥ 129: exercises the log-sum-exp merge
  PackedKVCache packed(shape, codecs, po);
  po.reference_attention = true;
  PackedKVCache packed_ref(shape, codecs, po);

  const int64_t k = std::min<int64_t>(cs.T - 1, 3), T0 = cs.T - k;
  const int64_t row = int64_t{Hkv} * d;
  std::vector<int32_t> pos(cs.T);
  for (int64_t t = 0; t < cs.T; ++t) pos[t] = static_cast<int32_t>(t);
  for (int l = 0; l < cfg.n_layers; ++l) {
    const auto K = kv_data(cs.T, Hkv, d, 10 + l), V = kv_data(cs.T, Hkv, d, 20 + l);
    for (KVCache* c : {static_cast<KVCache*>(&fake), static_cast<KVCache*>(&packed), static_cast<KVCache*>(&packed_ref)}) {
      c->append(l, T0, pos.data(), K.data(), K.data(), V.data());
      for (int64_t t = T0; t < cs.T; ++t) c->append(l, 1, &pos[t], &K[t * row], &K[t * row], &V[t * row]);
    }
  }
  ASSERT_EQ(packed.n_quantized(0), cs.T);

  AttnParams ap;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int64_t nq_prefill = std::min<int64_t>(cs.T, 40);
  double worst = 0;
  for (int l = 0; l < cfg.n_layers; ++l)
    for (int64_t nq : {int64_t{1}, nq_prefill, cs.T <= 512 ? cs.T : int64_t{1}}) {  // + full causal prefill
      std::mt19937 rng(77 + l);
      std::normal_distribution<float> nd(0.0f, 1.5f);
      std::vector<float> q(nq * H * d);
      for (float& x : q) x = nd(rng);
      const int32_t* qpos = pos.data() + (cs.T - nq);
      std::vector<float> of(q.size()), op(q.size()), orf(q.size());
      fake.attend(l, nq, qpos, q.data(), of.data(), ap);
      packed.attend(l, nq, qpos, q.data(), op.data(), ap);
      packed_ref.attend(l, nq, qpos, q.data(), orf.data(), ap);
      const double e = rel_err(op, of), er = rel_err(orf, of), efr = rel_err(op, orf);
      worst = std::max({worst, e, er});
      EXPECT_LT(e, 1e-5) << "layer " << l << ", " << nq << " queries";
      EXPECT_LT(er, 1e-5) << "reference path, layer " << l << ", " << nq << " queries";
      EXPECT_LT(efr, 1e-5) << "fast vs reference, layer " << l << ", " << nq << " queries";
    }
  RecordProperty("max_rel_err", fmt::format("{:.3g}", worst));
  std::printf("[ max rel err %s: %.3g ]\n", case_name({GetParam(), 0}).c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(Plans, PackedEqualsFake,
                         testing::Values(Case{PlanKind::uniform, 1, 1, 64}, Case{PlanKind::uniform, 97, 3, 64},
                                         Case{PlanKind::uniform, 200, 4, 128}, Case{PlanKind::uniform, 4096, 3, 64}, Case{PlanKind::uniform, 256, 3, 64},
                                         Case{PlanKind::uniform, 97, 1, 128}, Case{PlanKind::uniform, 4096, 4, 128},
                                         Case{PlanKind::uniform, 97, 4, 256}, Case{PlanKind::block_gtq, 200, 4, 256}, Case{PlanKind::uniform, 512, 4, 256},
                                         Case{PlanKind::block_gtq, 1, 3, 128}, Case{PlanKind::block_gtq, 97, 4, 64},
                                         Case{PlanKind::block_gtq, 200, 1, 64}, Case{PlanKind::block_gtq, 4096, 3, 64},
                                         Case{PlanKind::block_gtq, 97, 3, 128},
                                         Case{PlanKind::block_gtq, 4096, 1, 128},
                                         Case{PlanKind::ratequant, 1, 3, 64}, Case{PlanKind::ratequant, 97, 3, 64},
                                         Case{PlanKind::ratequant, 200, 4, 128}, Case{PlanKind::ratequant, 4096, 3, 64},
                                         Case{PlanKind::ratequant, 97, 1, 128}, Case{PlanKind::zero_side, 1, 3, 64},
                                         Case{PlanKind::zero_side, 97, 3, 64}, Case{PlanKind::zero_side, 200, 4, 128},
                                         Case{PlanKind::zero_side, 4096, 3, 64}),
                         case_name);

// Decode attention from the codes equals the named CPU reference of the GPU
// packed decode kernel (ref::packed_decode_attention, exact rounding: double
// sums, no fp16) over the cache's own pages, scattered into a pool by a
// shuffled page table, with the plan's rotations and codebooks: both the AVX2
// fast path and the scalar path; uniform, Block-GTQ (padded groups, 0-bit
// blocks), RateQuant (per-head widths, 5..8-bit groups in extension pages)
// and all-zero sides; T 1, 97, 130, 200 (every page but the last full);
// GQA 1, 3, 4, 7, 8; head_dim 64, 128, 256.
TEST(PackedKVCache, DecodeAttentionEqualsNamedReference) {
  struct C {
    PlanKind kind;
    int T, ratio, d;
  };
  const C cases[] = {{PlanKind::uniform, 1, 1, 64},     {PlanKind::uniform, 97, 8, 128},
                     {PlanKind::block_gtq, 200, 4, 256}, {PlanKind::block_gtq, 130, 7, 64},
                     {PlanKind::ratequant, 97, 3, 64},   {PlanKind::ratequant, 200, 1, 128},
                     {PlanKind::zero_side, 130, 3, 64}};
  for (const C& cs : cases)
    for (const bool scalar : {false, true}) {
      SCOPED_TRACE(fmt::format("{} T={} gqa={} d={}{}", kind_name(cs.kind), cs.T, cs.ratio, cs.d,
                               scalar ? " scalar path" : " fast path"));
      const int Hkv = 2, d = cs.d, H = Hkv * cs.ratio, T = cs.T;
      const ModelConfig cfg = config(d, Hkv, cs.ratio);
      PackedCacheOptions po;
      po.fp16_window = 0;
      po.sink_tokens = 0;
      po.reference_attention = scalar;
      PackedKVCache packed(cfg.kv_shape(T), make_codecs(cfg, cs.kind), po);
      std::vector<int32_t> pos(T);
      for (int t = 0; t < T; ++t) pos[t] = t;
      const int n_used = (T + 63) / 64, n_pages = n_used + 3;  // 3 pages no sequence uses
      std::mt19937 rng(5 + T + d);
      std::vector<int32_t> table(n_pages);
      for (int i = 0; i < n_pages; ++i) table[i] = i;
      std::shuffle(table.begin(), table.end(), rng);
      std::normal_distribution<float> nd(0.0f, 1.5f);
      for (int l = 0; l < cfg.n_layers; ++l) {
        const auto K = kv_data(T, Hkv, d, 30 + l), V = kv_data(T, Hkv, d, 40 + l);
        packed.append(l, T, pos.data(), K.data(), K.data(), V.data());
        std::vector<float> q(static_cast<size_t>(H) * d), got(q.size());
        for (float& x : q) x = nd(rng);
        AttnParams ap;
        ap.scale = 1.0f / std::sqrt(static_cast<float>(d));
        packed.attend(l, 1, &pos.back(), q.data(), got.data(), ap);
        const ref::PackedPlan plan = ratekv_test::cache_ref_plan(packed, l);
        const size_t pb = plan.layout().page_bytes();
        const auto pool = ratekv_test::scatter_pages([&](int i) { return packed.page(l, i); }, n_used, table, n_pages, pb);
        std::vector<uint8_t> ext;
        if (plan.has_wide())
          ext = ratekv_test::scatter_pages([&](int i) { return packed.ext_page(l, i); }, n_used, table, n_pages,
                                           plan.ext_layout()->page_bytes());
        const std::vector<int32_t> lens = {T};
        const auto want = ref::packed_decode_attention(plan, {std::span<const int32_t>(table).first(n_used), n_used, lens},
                                                       pool, ext, q, ap.scale, ref::PackedRounding::exact);
        const double e = rel_err(got, want);
        EXPECT_LT(e, 1e-5) << "layer " << l;
        std::printf("  %s T=%d gqa=%d d=%d %s layer %d: rel err %.2e\n", kind_name(cs.kind), T, cs.ratio, d,
                    scalar ? "scalar" : "fast", l, e);
      }
    }
}

// RateQuant widths 5..8: the low nibble in the layer's pages, the high bits in
// its extension pages, both read back with the format's reference reader;
// bytes per token = Σ (m·b/8 + 2) over both sides and both page kinds.
TEST(PackedKVCache, WideGroupsUseExtensionPages) {
  const int Hkv = 2, d = 64;
  const ModelConfig cfg = config(d, Hkv, 3, 1);
  Plan p = make_plan(cfg, PlanKind::uniform, 6, 2);
  p.layers[0][1].value = Codec::tq_mse(8, d, 77);  // head 1: K6 V8
  auto codecs = std::make_shared<PlanCodecs>(p, cfg);
  PackedKVCache packed(cfg.kv_shape(200), codecs);
  const int64_t T = 131, row = int64_t{Hkv} * d;
  const auto K = kv_data(T, Hkv, d, 18), V = kv_data(T, Hkv, d, 19);
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(t);
  packed.append(0, 100, pos.data(), K.data(), K.data(), V.data());
  for (int64_t t = 100; t < T; ++t) packed.append(0, 1, &pos[t], &K[t * row], &K[t * row], &V[t * row]);
  const packed::LayerLayout* ext = packed.ext_layout(0);
  ASSERT_NE(ext, nullptr);
  // Head 0: K6 V2 → ext K 2 bits only; head 1: K6 V8 → ext K 2 bits, V 4 bits.
  EXPECT_EQ(ext->head(0).key.size(), 1u);
  EXPECT_EQ(ext->head(0).value.size(), 0u);
  EXPECT_EQ(ext->head(1).value.size(), 1u);
  EXPECT_EQ(ext->head(1).value[0].bits, 4);
  // Bytes per token (3 pages of 64 slots): codes m·b/8 + one fp16 norm per
  // group (head 0: K6 50 + V2 18; head 1: K6 50 + V8 66), plus 2 B per wide
  // group for the extension layout's norm array (a format group always has
  // one; unused: the norm lives in the main page).
  const double per_token = double(packed.page_bytes()) / double(3 * 64);
  EXPECT_EQ(per_token, (48 + 2) + (16 + 2) + (48 + 2) + (64 + 2) + 3 * 2);
  for (int h = 0; h < Hkv; ++h)
    for (int s = 0; s < 2; ++s) {
      const auto side = static_cast<KVSide>(s);
      const auto* tq = dynamic_cast<const quant::TQMSE*>(codecs->quantizer(0, h, side));
      ASSERT_NE(tq, nullptr);
      for (int64_t t : {int64_t{0}, int64_t{63}, int64_t{64}, int64_t{99}, int64_t{130}}) {
        std::vector<uint8_t> idx(d), lo(d), hi(d, 0);
        const float* x = (s == 0 ? K.data() : V.data()) + t * row + h * d;
        tq->encode(x, idx.data());
        const int slot = static_cast<int>(t % 64), pg = static_cast<int>(t / 64);
        packed::read_codes(packed.layout(0), packed.page(0, pg), h, static_cast<packed::Side>(s), 0, slot, lo);
        if (tq->bits() > 4)
          packed::read_codes(*ext, packed.ext_page(0, pg), h, static_cast<packed::Side>(s), 0, slot, hi);
        for (int i = 0; i < d; ++i)
          ASSERT_EQ(lo[i] | (hi[i] << 4), idx[i]) << "head " << h << " side " << s << " token " << t << " code " << i;
      }
    }
}

// fp16 window and sink tokens: same regions and values as the fake-quant cache.
TEST(PackedKVCache, WindowAndSinkEqualFakeQuant) {
  const int Hkv = 2, d = 64, ratio = 3, H = Hkv * ratio;
  const ModelConfig cfg = config(d, Hkv, ratio, 1);
  auto codecs = make_codecs(cfg, PlanKind::block_gtq);
  const KVCacheShape shape = cfg.kv_shape(300);
  FakeQuantOptions fo;
  fo.fp16_window = 7;
  fo.sink_tokens = 4;
  PackedCacheOptions po;
  po.fp16_window = 7;
  po.sink_tokens = 4;
  po.pages_per_split = 1;
  FakeQuantKVCache fake(shape, codecs, fo);
  PackedKVCache packed(shape, codecs, po);
  const int64_t T = 230, row = int64_t{Hkv} * d;
  const auto K = kv_data(T, Hkv, d, 5), V = kv_data(T, Hkv, d, 6);
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(2 * t);  // gaps: positions ≠ indices
  AttnParams ap;
  ap.scale = 0.125f;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // Prefill 2 tokens (all sink), then 100, then decode one at a time.
  int64_t t = 0;
  for (int64_t n : {2, 100}) {
    fake.append(0, n, &pos[t], &K[t * row], &K[t * row], &V[t * row]);
    packed.append(0, n, &pos[t], &K[t * row], &K[t * row], &V[t * row]);
    t += n;
  }
  for (; t < T; ++t) {
    fake.append(0, 1, &pos[t], &K[t * row], &K[t * row], &V[t * row]);
    packed.append(0, 1, &pos[t], &K[t * row], &K[t * row], &V[t * row]);
    if (t % 16 != 5) continue;
    std::vector<float> q(H * d), of(H * d), op(H * d);
    for (float& x : q) x = nd(rng);
    fake.attend(0, 1, &pos[t], q.data(), of.data(), ap);
    packed.attend(0, 1, &pos[t], q.data(), op.data(), ap);
    EXPECT_LT(rel_err(op, of), 1e-5) << "after " << t + 1 << " tokens";
  }
  EXPECT_EQ(packed.n_quantized(0), T - 7 - 4);
  // Sliding-window attention sees only recent keys (all fp16 window + a few codes).
  AttnParams sw = ap;
  sw.sliding_window = 2 * 20;
  std::vector<float> q(H * d), of(H * d), op(H * d);
  for (float& x : q) x = nd(rng);
  fake.attend(0, 1, &pos[T - 1], q.data(), of.data(), sw);
  packed.attend(0, 1, &pos[T - 1], q.data(), op.data(), sw);
  EXPECT_LT(rel_err(op, of), 1e-5);
}

// The pages hold exactly the quantizers' codes and fp16 norms, read back with
// the format's scalar reference reader.
TEST(PackedKVCache, PagesHoldTheQuantizerCodes) {
  const int Hkv = 2, d = 64;
  const ModelConfig cfg = config(d, Hkv, 2, 1);
  auto codecs = make_codecs(cfg, PlanKind::block_gtq);
  PackedKVCache packed(cfg.kv_shape(200), codecs);
  const int64_t T = 131, row = int64_t{Hkv} * d;
  const auto K = kv_data(T, Hkv, d, 8), V = kv_data(T, Hkv, d, 9);
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(t);
  packed.append(0, 120, pos.data(), K.data(), K.data(), V.data());
  for (int64_t t = 120; t < T; ++t) packed.append(0, 1, &pos[t], &K[t * row], &K[t * row], &V[t * row]);
  const auto* gk = dynamic_cast<const quant::GroupedTQMSE*>(codecs->quantizer(0, 1, KVSide::key));
  ASSERT_NE(gk, nullptr);
  const packed::LayerLayout& L = packed.layout(0);
  ASSERT_EQ(L.head(1).key.size(), 3u);  // the 0-bit group is not stored
  for (int64_t t : {int64_t{0}, int64_t{63}, int64_t{64}, int64_t{119}, int64_t{130}}) {
    std::vector<uint8_t> idx(gk->total_codes());
    std::vector<float> norms(gk->codecs().size());
    gk->encode(&K[t * row + d], idx.data(), norms.data());
    auto page = packed.page(0, static_cast<int>(t / 64));
    for (int g = 0; g < 3; ++g) {
      std::vector<uint8_t> got(L.head(1).key[g].dim);
      packed::read_codes(L, page, 1, packed::Side::key, g, static_cast<int>(t % 64), got);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(got[i], idx[gk->code_offset(g) + i]) << "token " << t << " group " << g << " code " << i;
      EXPECT_EQ(packed::read_norm(L, page, 1, packed::Side::key, g, static_cast<int>(t % 64)),
                fp32_to_fp16(norms[g]));
    }
  }
}

// The fast packer/unpacker produce the reference writer's bytes / reader's codes.
TEST(PackedKVCache, FastPackUnpackMatchReference) {
  std::vector<int> ch40(40), ch24(24);
  for (int i = 0; i < 40; ++i) ch40[i] = 39 - i;  // channels 39..0 (any order)
  for (int i = 0; i < 24; ++i) ch24[i] = 40 + i;
  for (int bits = 1; bits <= 4; ++bits) {
    packed::HeadSpec hs;
    hs.key = {packed::GroupSpec{ch40, bits}, packed::GroupSpec{ch24, 5 - bits}};
    hs.value = {packed::GroupSpec{ch24, bits}, packed::GroupSpec{ch40, 1 + bits % 4}};
    const packed::LayerLayout L(64, {hs, hs});
    std::vector<uint8_t> ref(L.page_bytes(), 0xA5), fast(L.page_bytes(), 0xA5);
    std::mt19937 rng(bits);
    for (int s = 0; s < 2; ++s)
      for (int g = 0; g < 2; ++g) {
        const packed::Side side = static_cast<packed::Side>(s);
        const packed::GroupLayout& G = L.head(1).side(side)[g];
        std::vector<uint8_t> all(64 * G.dim);
        for (int slot = 0; slot < 64; ++slot) {
          for (int i = 0; i < G.dim; ++i) all[slot * G.dim + i] = static_cast<uint8_t>(rng() % (1u << G.bits));
          std::span<const uint8_t> c(&all[slot * G.dim], G.dim);
          packed::write_codes(L, ref, 1, side, g, slot, c);
          pack_token_codes(G, side, fast.data() + L.head(1).block_offset + G.code_offset, slot, c.data());
        }
        std::vector<uint8_t> un(64 * G.dim_pad);
        unpack_codes(G, side, fast.data() + L.head(1).block_offset + G.code_offset, 64, un.data());
        for (int slot = 0; slot < 64; ++slot)
          for (int i = 0; i < G.dim; ++i)
            ASSERT_EQ(un[slot * G.dim_pad + i], all[slot * G.dim + i]) << "bits " << bits << " slot " << slot;
      }
    EXPECT_EQ(fast, ref) << "bits " << bits;
  }
}

// d = 64 K3V3 uniform: 24 + 24 B of codes + 2 + 2 B of norms = 52 B per token
// per KV head (docs/packed_format.md §4) vs 256 B fp16, measured from the pages.
TEST(PackedKVCache, BytesPerTokenFromAllocations) {
  const int Hkv = 3, d = 64;
  const ModelConfig cfg = config(d, Hkv, 3, 2);
  auto codecs = make_codecs(cfg, PlanKind::uniform, 3, 3);
  PackedKVCache packed(cfg.kv_shape(1000), codecs);
  EXPECT_EQ(packed.page_bytes(), 0u);
  const int64_t T = 640;  // 10 full pages per layer
  const auto K = kv_data(T, Hkv, d, 1);
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(t);
  for (int l = 0; l < 2; ++l) packed.append(l, T, pos.data(), K.data(), K.data(), K.data());
  const double per_token_head = double(packed.page_bytes()) / double(T * Hkv * cfg.n_layers);
  EXPECT_EQ(per_token_head, 52.0);
  size_t code_bytes = 0;
  for (const auto& G : packed.layout(0).head(0).key) code_bytes += G.code_bytes;
  for (const auto& G : packed.layout(0).head(0).value) code_bytes += G.code_bytes;
  EXPECT_EQ(code_bytes / packed::kPageTokens, 48u);
  EXPECT_EQ(2 * d * 2, 256);
  EXPECT_EQ(packed.bytes(), packed.page_bytes() + 2 * T * sizeof(int32_t));
  // One more token allocates one more page per layer touched.
  const int32_t next = static_cast<int32_t>(T);
  packed.append(0, 1, &next, K.data(), K.data(), K.data());
  EXPECT_EQ(packed.page_bytes(), size_t(21) * packed.layout(0).page_bytes());
  EXPECT_EQ(packed.layout(0).page_bytes(), size_t(52 * 64 * Hkv));
  std::printf("[ d=64 K3V3: %.1f B/token/KV head (48 codes + 4 norms) vs 256 fp16: %.2fx ]\n", per_token_head,
              256.0 / per_token_head);
  packed.clear();
  EXPECT_EQ(packed.bytes(), 0u);
}

// K/V the format cannot hold — a NaN / inf element, a group whose norm is
// beyond the fp16 norm (|x| ~ 1e30) — are errors naming the layer, side, token
// and head, raised before anything is stored: the cache then attends and
// appends exactly like a twin that never saw the bad call. (The norm check
// used to throw inside the OpenMP region of the quantizer: std::terminate,
// which aborted a Python interpreter appending a large activation.)
TEST(PackedKVCache, UnrepresentableRowsAreErrorsAndLeaveTheCacheUnchanged) {
  const int Hkv = 2, ratio = 3, d = 64, H = Hkv * ratio;
  const ModelConfig cfg = config(d, Hkv, ratio, 1);
  for (const PlanKind kind : {PlanKind::uniform, PlanKind::block_gtq})
    for (const int window : {0, 8}) {
      SCOPED_TRACE(fmt::format("{} window {}", kind_name(kind), window));
      PackedCacheOptions po;
      po.fp16_window = window;
      po.sink_tokens = window > 0 ? 4 : 0;
      const auto codecs = make_codecs(cfg, kind);
      PackedKVCache good(cfg.kv_shape(300), codecs, po), bad(cfg.kv_shape(300), codecs, po);
      std::vector<int32_t> pos(300);
      for (int t = 0; t < 300; ++t) pos[t] = t;
      const auto K = kv_data(300, Hkv, d, 7), V = kv_data(300, Hkv, d, 8);
      good.append(0, 70, pos.data(), K.data(), K.data(), V.data());
      bad.append(0, 70, pos.data(), K.data(), K.data(), V.data());
      const size_t row = static_cast<size_t>(Hkv) * d;
      auto expect_error = [&](int64_t n, size_t at, float value, bool key, const std::string& what) {
        std::vector<float> k(K.begin() + 70 * row, K.begin() + (70 + n) * row);
        std::vector<float> v(V.begin() + 70 * row, V.begin() + (70 + n) * row);
        (key ? k : v)[at] = value;
        try {
          bad.append(0, n, pos.data() + 70, k.data(), k.data(), v.data());
          ADD_FAILURE() << "no error for " << what;
        } catch (const Error& e) {
          const std::string m = e.what();
          EXPECT_NE(m.find("layer 0"), std::string::npos) << m;
          EXPECT_NE(m.find(key ? "key" : "value"), std::string::npos) << m;
          EXPECT_NE(m.find(what), std::string::npos) << m;
        }
      };
      // 80 tokens × 2 heads × 64: the parallel path; 1 token: the serial one.
      expect_error(80, 50 * row + d, 1e30f, true, "token 50, KV head 1");  // channel 0: block 0, 4 bits
      expect_error(1, 3, 1e30f, false, "beyond the fp16 norm");
      expect_error(80, 79 * row, std::nanf(""), true, "is nan");
      expect_error(1, row - 1, INFINITY, false, "is inf");
      EXPECT_EQ(bad.n_tokens(), 70);
      EXPECT_EQ(bad.bytes(), good.bytes());
      // Both continue identically: the same 30 tokens, then attention of the last one.
      good.append(0, 30, pos.data() + 70, K.data() + 70 * row, K.data() + 70 * row, V.data() + 70 * row);
      bad.append(0, 30, pos.data() + 70, K.data() + 70 * row, K.data() + 70 * row, V.data() + 70 * row);
      std::vector<float> q(static_cast<size_t>(H) * d), a(q.size()), b(q.size());
      std::mt19937 rng(3);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      for (float& x : q) x = nd(rng);
      AttnParams ap;
      ap.scale = 0.125f;
      good.attend(0, 1, &pos[99], q.data(), a.data(), ap);
      bad.attend(0, 1, &pos[99], q.data(), b.data(), ap);
      EXPECT_EQ(a, b);
      EXPECT_GT(std::abs(a[0]) + std::abs(a[1]), 0.0f);
    }
}

TEST(PackedKVCache, UnsupportedCodecsAreErrors) {
  const int Hkv = 2, d = 64;
  const ModelConfig cfg = config(d, Hkv, 1, 1);
  auto plan_with = [&](const Codec& key) {
    Plan p;
    p.method = "test";
    static_cast<PlanTarget&>(p.model) = plan_target(cfg);
    p.layers.assign(1, std::vector<HeadPlan>(Hkv, HeadPlan{key, Codec::tq_mse(2, d, 5)}));
    return std::make_shared<PlanCodecs>(p, cfg);
  };
  auto msg = [&](const Codec& key) {
    try {
      PackedKVCache c(cfg.kv_shape(10), plan_with(key));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg(whole(CodecKind::Kivi, 2, d, 32)).find("'kivi'"), std::string::npos);
  EXPECT_NE(msg(whole(CodecKind::Q8_0, 8, d, 32)).find("'q8_0'"), std::string::npos);
  EXPECT_EQ(msg(Codec::fp16()), "no error");              // fp16 sides: vq pages (docs/packed_format.md §7)
  EXPECT_EQ(msg(Codec::tq_mse(6, d, 1)), "no error");      // 5..8 bits: extension pages
  EXPECT_EQ(msg(all_zero_grouped(d)), "no error");         // 0 bits: the side stores nothing
  // Shape mismatch.
  EXPECT_THROW(PackedKVCache(config(d, Hkv, 1, 2).kv_shape(10), plan_with(Codec::tq_mse(2, d, 1))), Error);
}

// Real SmolLM2 activations: every layer's post-RoPE Q/K and V of a 300-token
// prompt (captured from an fp32 forward), appended to both caches with the
// real Block-GTQ K3V3 plan of bench/results/niah_plans; attention from the
// codes equals the fake-quant attention on every layer.
TEST(PackedKVCache, RealModelActivationsEqualFakeQuant) {
  const char* env = std::getenv("RATEKV_ASSETS");
  const std::string root = env ? env : std::string(std::getenv("HOME") ? std::getenv("HOME") : ".") + "/.cache/ratekv/assets";
  const std::string path = root + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model asset missing: " << path;
  GgufFile f = GgufFile::open(path);
  Model model = Model::load(f);
  const Tokenizer tok = Tokenizer::from_gguf(f);
  std::string text;
  for (int i = 0; i < 30; ++i) text += "The quick brown fox number " + std::to_string(i * 37) + " jumps over the lazy dog. ";
  std::vector<int32_t> ids = tok.encode(text, false);
  ids.resize(std::min<size_t>(ids.size(), 300));
  const ModelConfig& cfg = model.config();
  const int64_t T = static_cast<int64_t>(ids.size());
  std::vector<std::vector<float>> qs(cfg.n_layers), ks(cfg.n_layers), vs(cfg.n_layers);
  ForwardHooks hooks;
  hooks.on_layer = [&](const LayerActivations& a) {
    qs[a.layer].assign(a.q_post, a.q_post + a.n * a.n_heads * a.head_dim);
    ks[a.layer].assign(a.k_post, a.k_post + a.n * a.n_kv_heads * a.head_dim);
    vs[a.layer].assign(a.v, a.v + a.n * a.n_kv_heads * a.head_dim);
  };
  DenseKVCache dense = model.make_dense_cache(T);
  model.forward(ids, 0, dense, nullptr, false, &hooks);
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(t);
  AttnParams ap;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(cfg.head_dim));
  // Block-GTQ K3V3 and the RateQuant (TQ-MSE, 2.25 effective bits, widths
  // 1..4 per head and side) plan of the NIAH grid.
  for (const char* name : {"block-gtq-k3v3", "ratequant-2.25"}) {
    auto codecs = std::make_shared<PlanCodecs>(
        Plan::load(std::string(RATEKV_SOURCE_DIR) + "/bench/results/niah_plans/" + name + ".plan.json"), cfg);
    FakeQuantKVCache fake(cfg.kv_shape(T), codecs);
    PackedKVCache packed(cfg.kv_shape(T), codecs);
    double worst = 0;
    for (int l = 0; l < cfg.n_layers; ++l) {
      fake.append(l, T, pos.data(), ks[l].data(), ks[l].data(), vs[l].data());
      packed.append(l, T, pos.data(), ks[l].data(), ks[l].data(), vs[l].data());
      // Full causal prefill (levels-tile path) and the last query (decode fast path).
      for (int64_t nq : {T, int64_t{1}}) {
        const int64_t q0 = T - nq, qrow = int64_t{cfg.n_heads} * cfg.head_dim;
        std::vector<float> of(nq * qrow), op(nq * qrow);
        fake.attend(l, nq, pos.data() + q0, qs[l].data() + q0 * qrow, of.data(), ap);
        packed.attend(l, nq, pos.data() + q0, qs[l].data() + q0 * qrow, op.data(), ap);
        const double e = rel_err(op, of);
        worst = std::max(worst, e);
        EXPECT_LT(e, 1e-5) << name << " layer " << l << ", " << nq << " queries";
      }
    }
    std::printf("[ SmolLM2 %s, %lld tokens, 30 layers: max rel err %.3g ]\n", name, static_cast<long long>(T), worst);
  }
}

}  // namespace
