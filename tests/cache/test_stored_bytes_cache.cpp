// Planned == measured: for every plan kind the packed cache serves, the bytes
// its pages hold after n tokens (PackedKVCache::page_bytes(), pages counted
// one by one as they are allocated) equal plan_stored_bytes_at(plan, n)
// (format/stored_bytes.h), and on whole pages n · the plan's bytes per token.
// Kinds: uniform TQ-MSE, Block-GTQ groups that need tile padding, RateQuant
// widths 1..8 (5..8: extension pages), sides with every block at 0 bits, TaSQ
// (vq keys, shared scale) with vq / fp16 / TQ-MSE values, CQ (no scale); head
// dims 40 (uniform groups padded too), 64, 128; GQA 1 and 3; lengths 1, 64,
// 97, 200; with sink tokens and an fp16 window (their fp16 rows are
// the cache's sink arrays; the window's rows stay outside the pages).
#include <gtest/gtest.h>

#include <random>

#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/common/error.h"
#include "ratekv/format/stored_bytes.h"
#include "ratekv/quant/ggml_blocks.h"
#include "ratekv/model/model.h"
#include "../support/vq_codec.h"

using namespace ratekv;
using namespace ratekv::cache;

namespace {

ModelConfig config(int head_dim, int n_kv_heads, int n_layers = 2) {
  ModelConfig c;
  c.arch = "llama";
  c.n_layers = n_layers;
  c.n_heads = n_kv_heads * 2;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = head_dim;
  c.d_model = 16;
  c.d_ff = 16;
  c.n_vocab = 10;
  c.n_ctx_train = 8192;
  c.rope_theta = 10000.0;
  c.rms_eps = 1e-5f;
  c.rope_layout = RopeLayout::Interleaved;
  return c;
}

// A tq-mse-grouped codec from a width per RoPE block (0 = dropped).
Codec grouped(const std::vector<int>& block_bits, uint32_t seed) {
  Codec c;
  c.kind = CodecKind::TqMseGrouped;
  c.norm = NormStorage::FP16;
  for (int w = 8; w >= 0; --w) {
    CodecGroup g;
    g.bits = w;
    for (size_t i = 0; i < block_bits.size(); ++i)
      if (block_bits[i] == w) g.blocks.push_back((int)i);
    if (g.blocks.empty()) continue;
    g.seed = w > 0 ? seed + (uint32_t)w : 0;
    c.groups.push_back(g);
  }
  return c;
}

enum class Kind { uniform, block_gtq, ratequant, zero_sides, tasq_vq_values, tasq_fp16_values, tasq_tq_values, cq };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::uniform: return "uniform";
    case Kind::block_gtq: return "block_gtq";
    case Kind::ratequant: return "ratequant";
    case Kind::zero_sides: return "zero_sides";
    case Kind::tasq_vq_values: return "tasq_vq_values";
    case Kind::tasq_fp16_values: return "tasq_fp16_values";
    case Kind::tasq_tq_values: return "tasq_tq_values";
    case Kind::cq: return "cq";
  }
  return "?";
}

struct PlanSetup {
  Plan plan;
  std::shared_ptr<VqTensors> tensors;
};

PlanSetup make_setup(const ModelConfig& cfg, Kind kind, std::mt19937& rng) {
  const int d = cfg.head_dim, H = cfg.n_kv_heads, L = d / 2;
  PlanSetup s;
  Plan& p = s.plan;
  p.method = kind_name(kind);
  static_cast<PlanTarget&>(p.model) = plan_target(cfg);
  p.layers.assign(cfg.n_layers, std::vector<HeadPlan>(H));
  const bool vq = kind == Kind::tasq_vq_values || kind == Kind::tasq_fp16_values || kind == Kind::tasq_tq_values ||
                  kind == Kind::cq;
  if (vq) p.tensors_file = "in-memory.safetensors";
  std::vector<int> id(d);
  for (int i = 0; i < d; ++i) id[i] = i;
  for (int l = 0; l < cfg.n_layers; ++l)
    for (int h = 0; h < H; ++h) {
      HeadPlan& hp = p.layers[l][h];
      const uint32_t seed = 1000 * (uint32_t)l + 10 * (uint32_t)h;
      std::vector<int> bb(L);
      switch (kind) {
        case Kind::uniform:
          hp.key = Codec::tq_mse(3, d, seed);
          hp.value = Codec::tq_mse(2, d, seed + 1);
          break;
        case Kind::block_gtq:  // random widths 0..4 per block: groups of any size, most padded
          for (int& b : bb) b = (int)(rng() % 5);
          hp.key = grouped(bb, seed);
          hp.value = Codec::tq_mse(3, d, seed + 1);
          break;
        case Kind::ratequant:  // a whole-head width 1..8 per side, heads and layers differ
          hp.key = Codec::tq_mse(1 + (int)((3 * l + h) % 8), d, seed);
          hp.value = Codec::tq_mse(1 + (int)((5 * l + 2 * h + 3) % 8), d, seed + 1);
          break;
        case Kind::zero_sides:  // RateQuant + Block-GTQ: wide groups and sides with every block at 0 bits
          for (int& b : bb) b = (l + h) % 3 == 0 ? 0 : (int)(rng() % 9);
          hp.key = grouped(bb, seed);
          for (int& b : bb) b = (l + h) % 3 == 1 ? 0 : (int)(rng() % 7);
          hp.value = grouped(bb, seed + 100);
          break;
        case Kind::tasq_vq_values:
        case Kind::tasq_fp16_values:
        case Kind::tasq_tq_values:
        case Kind::cq: {
          const bool tasq = kind != Kind::cq;
          hp.key = ratekv_test::vq_codec(d, 8, tasq ? 7 : 5, tasq, H, id);  // 7 bits: G·bits odd, segments rounded
          if (kind == Kind::tasq_vq_values || kind == Kind::cq) hp.value = ratekv_test::vq_codec(d, 4, 5, false, H, id);
          if (kind == Kind::tasq_fp16_values) hp.value = Codec::fp16();
          if (kind == Kind::tasq_tq_values) hp.value = Codec::tq_mse(4, d, seed + 1);
          break;
        }
      }
    }
  p.validate("test plan");
  if (vq) {
    std::normal_distribution<float> nd;
    VqTensors t = VqTensors::for_plan(p);
    for (int l = 0; l < cfg.n_layers; ++l)
      for (int h = 0; h < H; ++h)
        for (int side = 0; side < 2; ++side) {
          const Codec& c = side == 0 ? p.layers[l][h].key : p.layers[l][h].value;
          if (c.kind != CodecKind::Vq) continue;
          auto& e = t.at(l, h, side);
          e.present = true;
          e.codebooks.resize(c.groups.size() * (size_t{1} << c.groups[0].bits) * c.group_size);
          for (float& x : e.codebooks) x = nd(rng);
        }
    s.tensors = std::make_shared<VqTensors>(std::move(t));
  }
  return s;
}

// Appends n tokens to every layer (a prefill of n0, then single tokens).
void fill(PackedKVCache& c, const ModelConfig& cfg, int64_t n, int64_t n0, std::mt19937& rng) {
  const int64_t row = (int64_t)cfg.n_kv_heads * cfg.head_dim;
  std::normal_distribution<float> nd;
  std::vector<float> kp(n * row), k(n * row), v(n * row);
  for (auto* x : {&kp, &k, &v})
    for (float& e : *x) e = 0.3f + nd(rng);
  std::vector<int32_t> pos(n);
  for (int64_t t = 0; t < n; ++t) pos[t] = (int32_t)t;
  for (int l = 0; l < cfg.n_layers; ++l) {
    const int64_t a = std::min(n, n0);
    if (a > 0) c.append(l, a, pos.data(), kp.data(), k.data(), v.data());
    for (int64_t t = a; t < n; ++t) c.append(l, 1, &pos[t], &kp[t * row], &k[t * row], &v[t * row]);
  }
}

}  // namespace

TEST(StoredBytesCache, PlannedEqualsMeasuredForEveryPlanKind) {
  std::mt19937 rng(2101);
  int checked = 0;
  for (Kind kind : {Kind::uniform, Kind::block_gtq, Kind::ratequant, Kind::zero_sides, Kind::tasq_vq_values,
                    Kind::tasq_fp16_values, Kind::tasq_tq_values, Kind::cq})
    for (int d : {40, 64, 128})
      for (int H : {1, 3}) {
        const ModelConfig cfg = config(d, H);
        const PlanSetup s = make_setup(cfg, kind, rng);
        const auto codecs = std::make_shared<const PlanCodecs>(s.plan, cfg, "test plan", s.tensors);
        const PlanStoredBytes planned = plan_stored_bytes(s.plan);
        for (int64_t n : {1, 64, 97, 200}) {
          SCOPED_TRACE(std::string(kind_name(kind)) + " d=" + std::to_string(d) + " H=" + std::to_string(H) +
                       " n=" + std::to_string(n));
          PackedKVCache c(cfg.kv_shape(512), codecs);
          fill(c, cfg, n, n == 97 ? 90 : n, rng);
          const double want = plan_stored_bytes_at(s.plan, n);
          EXPECT_EQ((double)c.page_bytes(), want);
          if (n % 64 == 0) {
            EXPECT_EQ((double)c.page_bytes(), planned.bytes_per_token() * (double)n);
          }
          ++checked;
        }
      }
  EXPECT_EQ(checked, 8 * 3 * 2 * 4);
}

// Sink tokens are fp16 rows outside the pages; the fp16 window's rows too (the
// CPU cache keeps their fp32 originals so they can be quantized later: that
// is its implementation, not the format, and not counted here). The pages
// hold exactly ⌈(n − sink − window)⁺ / 64⌉ pages.
TEST(StoredBytesCache, SinkAndWindowRowsAreOutsideThePages) {
  std::mt19937 rng(2102);
  const ModelConfig cfg = config(64, 3, 2);
  for (Kind kind : {Kind::block_gtq, Kind::tasq_tq_values})
    for (int sink : {0, 4})
      for (int window : {0, 32})
        for (int64_t n : {3, 36, 100, 161}) {
          SCOPED_TRACE(std::string(kind_name(kind)) + " sink " + std::to_string(sink) + " window " +
                       std::to_string(window) + " n " + std::to_string(n));
          PlanSetup s = make_setup(cfg, kind, rng);
          s.plan.sink_tokens = sink;
          s.plan.fp16_window = window;
          const auto codecs = std::make_shared<const PlanCodecs>(s.plan, cfg, "test plan", s.tensors);
          PackedKVCache c(cfg.kv_shape(512), codecs);
          fill(c, cfg, n, n, rng);
          const int64_t nq = std::max<int64_t>(0, n - sink - window);
          const double fp16_rows = (double)(n - nq) * cfg.n_layers * cfg.n_kv_heads * 2 * cfg.head_dim * 2;
          EXPECT_EQ((double)c.page_bytes(), plan_stored_bytes_at(s.plan, n) - fp16_rows);
          EXPECT_EQ(c.n_quantized(0), nq);
        }
}

// Real plans on disk: the committed NIAH plans of SmolLM2 (Block-GTQ and
// uniform at 2.25 / 3.25 bits, RateQuant over TQ-MSE), measured on a cache of
// the model's shape.
TEST(StoredBytesCache, CommittedSmolLM2Plans) {
  ModelConfig cfg = config(64, 3, 30);
  for (const char* name : {"block-gtq-k2v2", "block-gtq-k3v3", "uniform-k2v2", "uniform-k3v3", "ratequant-2.25"}) {
    SCOPED_TRACE(name);
    const Plan p = Plan::load(std::string(RATEKV_SOURCE_DIR) + "/bench/results/niah_plans/" + name + ".plan.json");
    const auto codecs = std::make_shared<const PlanCodecs>(p, cfg, name);
    std::mt19937 rng(5);
    PackedKVCache c(cfg.kv_shape(512), codecs);
    fill(c, cfg, 128, 128, rng);
    EXPECT_EQ((double)c.page_bytes(), plan_stored_bytes(p).bytes_per_token() * 128);
    EXPECT_NEAR(p.achieved().k, plan_stored_bytes(p).k_bits_per_element(), 1e-12);
  }
}

// The kinds the packed cache does not store (kivi, quarot, q8_0, q4_0) are
// counted by their quantizers (quant/*.h bits_per_element(T), the KIVI keys'
// unfilled token group at fp16 included) and, for the ggml kinds, by the
// block structs' sizes: the plan's function agrees for every length.
TEST(StoredBytesCache, NonPagedKindsMatchTheirQuantizers) {
  const ModelConfig cfg = config(64, 3, 2);
  const int d = 64;
  struct KindCase {
    CodecKind kind;
    int bits, group;
  };
  for (const KindCase kc : {KindCase{CodecKind::Kivi, 2, 32}, KindCase{CodecKind::Kivi, 4, 16},
                            KindCase{CodecKind::QuaRot, 3, 64}, KindCase{CodecKind::Q8_0, 8, 32},
                            KindCase{CodecKind::Q4_0, 4, 32}}) {
    Plan p;
    p.method = "test";
    static_cast<PlanTarget&>(p.model) = plan_target(cfg);
    p.layers.assign(cfg.n_layers, std::vector<HeadPlan>(cfg.n_kv_heads));
    for (auto& layer : p.layers)
      for (auto& hp : layer)
        for (Codec* c : {&hp.key, &hp.value}) {
          c->kind = kc.kind;
          c->group_size = kc.group;
          CodecGroup g;
          g.bits = kc.bits;
          g.seed = kc.kind == CodecKind::QuaRot ? 7 : 0;
          for (int i = 0; i < d; ++i) g.channels.push_back(i);
          c->groups = {g};
        }
    p.validate("test plan");
    const PlanCodecs codecs(p, cfg, "test plan");
    for (int64_t n : {1, 31, 32, 33, 100, 512}) {
      SCOPED_TRACE(std::string(codec_kind_name(kc.kind)) + " bits " + std::to_string(kc.bits) + " n " +
                   std::to_string(n));
      double bits = 0;
      for (int l = 0; l < cfg.n_layers; ++l)
        for (int h = 0; h < cfg.n_kv_heads; ++h)
          for (KVSide side : {KVSide::key, KVSide::value})
            bits += codecs.quantizer(l, h, side)->bits_per_element(n) * (double)n * d;
      EXPECT_NEAR(plan_stored_bytes_at(p, n), bits / 8, 1e-9 * bits);
      if (kc.kind == CodecKind::Q8_0 || kc.kind == CodecKind::Q4_0) {
        const double block = kc.kind == CodecKind::Q8_0 ? sizeof(quant::BlockQ8_0) : sizeof(quant::BlockQ4_0);
        EXPECT_EQ(plan_stored_bytes_at(p, n), (double)n * cfg.n_layers * cfg.n_kv_heads * 2 * (d / 32) * block);
      }
    }
    const PlanStoredBytes sb = plan_stored_bytes(p);
    if (kc.kind == CodecKind::Kivi)  // ≤ group − 1 fp16 rows of keys per (layer, KV head)
      EXPECT_EQ(sb.per_sequence_max, (int64_t)cfg.n_layers * cfg.n_kv_heads * (kc.group - 1) * 2 * d);
    else
      EXPECT_EQ(sb.per_sequence_max, 0);
  }
}
