// Host-side parts of the GPU engine (run in CI, no GPU needed): the cache
// formats' page sizes against the published per-token sizes, what the GPU
// refuses and why, the memory plan's arithmetic, and the architecture check.
#include <gtest/gtest.h>

#include "ratekv/format/stored_bytes.h"

#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/cache/plan_codecs.h"
#include "ratekv/common/error.h"
#include "ratekv/cuda/decode_attention.h"
#include "ratekv/engine/cache_format.h"
#include "ratekv/engine/engine.h"
#include "ratekv/eval/baseline_plans.h"
#include "ratekv/model/synthetic.h"
#include "../support/vq_plans.h"

namespace {

using namespace ratekv;
using engine::CacheFormat;

std::shared_ptr<const cache::PlanCodecs> codecs(const Plan& p, const ModelConfig& c) {
  return std::make_shared<const cache::PlanCodecs>(p, c);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Llama-3.1-8B: an fp16 K/V cache holds 2·32·8·128·2 = 131072 bytes per token
// (the 128 KiB per token everyone quotes); K3V3 packs a 128-channel head's
// token into 3·128/8 = 48 bytes of codes + a 2-byte norm per side: 100 bytes
// per head, 25600 per token (5.12x less).
TEST(EngineCacheFormat, PageSizesOfFp16AndK3V3) {
  const ModelConfig c = synthetic_config("llama-3.1-8b");
  const CacheFormat f16 = CacheFormat::fp16(c);
  EXPECT_EQ(f16.label(), "fp16");
  EXPECT_EQ(f16.page_bytes(0), size_t{262144});
  EXPECT_DOUBLE_EQ(f16.bytes_per_token(), 131072.0);
  EXPECT_EQ(static_cast<double>(c.kv_bytes_per_token_fp16()), f16.bytes_per_token());
  const CacheFormat k3 = CacheFormat::packed(codecs(eval::cache_type_plan("tq3", "tq3", c), c));
  EXPECT_EQ(k3.label(), "K3V3");
  EXPECT_DOUBLE_EQ(k3.bytes_per_token(), 25600.0);
  EXPECT_EQ(k3.layout(5).page_bytes(), size_t{51200});
  // Π and the levels of every group, in PackedPlan's order: 8 heads × 2 sides.
  EXPECT_EQ(k3.rotations(0).size(), size_t{8 * 2 * 128 * 128});
  EXPECT_EQ(k3.levels(0).size(), size_t{8 * 2 * 8});
  EXPECT_THROW(f16.layout(0), Error);
  const CacheFormat k2v4 = CacheFormat::packed(codecs(eval::cache_type_plan("tq2", "tq4", c), c));
  EXPECT_EQ(k2v4.label(), "K2V4");
  EXPECT_DOUBLE_EQ(k2v4.bytes_per_token(), 32.0 * 8 * (32 + 2 + 64 + 2));
}

// A Block-GTQ-style plan (keys in two groups of different widths over RoPE
// blocks, values uniform) is served and labelled by its method; what the GPU
// does not serve is refused naming the plan field.
TEST(EngineCacheFormat, ServesGroupedPlansAndRefusesTheRest) {
  ModelConfig c = synthetic_config("llama-3.1-8b", 2);
  Plan p = eval::cache_type_plan("tq3", "tq3", c);
  p.method = "block-gtq";
  for (auto& layer : p.layers)
    for (auto& hp : layer) {
      Codec k;
      k.kind = CodecKind::TqMseGrouped;
      k.norm = NormStorage::FP16;
      CodecGroup g4, g2;
      g4.bits = 4;
      g2.bits = 2;
      for (int b = 0; b < 64; ++b) (b < 16 ? g4 : g2).blocks.push_back(b);
      g4.seed = 11;
      g2.seed = 12;
      k.groups = {g4, g2};
      hp.key = k;
    }
  const CacheFormat gtq = CacheFormat::packed(codecs(p, c), "gtq-K3V3");
  EXPECT_EQ(gtq.label(), "gtq-K3V3");
  // keys: 32 channels at 4 bits + 96 at 2 = 320 bits = 40 bytes + 2 norms; values 48 + 2
  EXPECT_DOUBLE_EQ(gtq.layout(1).bytes_per_token_per_head(), 40 + 4 + 48 + 2);
  EXPECT_EQ(CacheFormat::packed(codecs(p, c)).label(), "plan:block-gtq");

  auto refuse = [&](const Plan& bad, const std::string& want) {
    const std::string why = CacheFormat::unsupported_reason(*codecs(bad, c));
    EXPECT_NE(why.find(want), std::string::npos) << why;
    const std::string thrown = error_of([&] { CacheFormat::packed(codecs(bad, c)); });
    EXPECT_EQ(thrown, why);
  };
  refuse(eval::cache_type_plan("q8_0", "q8_0", c), "layers[0].heads[0].key: codec kind 'q8_0'");
  // fp16 values under TQ-MSE keys: the vq decode kernel reads keys from the vq pages.
  refuse(eval::cache_type_plan("tq3", "f16", c), "layers[0].heads[0].value: a fp16 value side under TQ-MSE keys");
  // fp16 keys (every head) over TQ-MSE values are served, as the CPU packed
  // cache stores them: keys in the vq pages, values in the scalar pages.
  EXPECT_EQ(CacheFormat::unsupported_reason(*codecs(eval::cache_type_plan("f16", "tq3", c), c)), "");
  Plan mixed = eval::cache_type_plan("tq3", "tq3", c);
  mixed.layers[1][2].key = Codec::fp16();
  refuse(mixed, "layers[1].heads[2].key: stored fp16 but head 0's key is TQ-MSE");
  // A key group at 0 bits is served (since issue 18 item 4): it stores
  // nothing, so the head's keys are the 4-bit group alone (32 channels: 16
  // bytes + a norm), as in the CPU packed cache's layout; a whole side at 0
  // bits stores nothing at all.
  Plan zero = p;
  zero.layers[1][3].key.groups[1].bits = 0;
  {
    Codec none;  // layer 0, head 1: every value block at 0 bits (a zero-budget RateQuant + Block-GTQ head)
    none.kind = CodecKind::TqMseGrouped;
    none.norm = NormStorage::FP16;
    CodecGroup z;
    z.bits = 0;
    for (int b = 0; b < 64; ++b) z.blocks.push_back(b);
    none.groups = {z};
    zero.layers[0][1].value = none;
  }
  const CacheFormat zf = CacheFormat::packed(codecs(zero, c));
  EXPECT_EQ(zf.layout(1).head(3).block_bytes, size_t{64} * (16 + 2 + 48 + 2));
  EXPECT_EQ(zf.layout(0).head(1).block_bytes, size_t{64} * (40 + 4));
  EXPECT_TRUE(zf.layout(0).head(1).value.empty());
  const cache::PackedKVCache cpu(c.kv_shape(64), codecs(zero, c));
  for (int l = 0; l < c.n_layers; ++l) EXPECT_EQ(zf.page_bytes(l), cpu.layout(l).page_bytes()) << "layer " << l;
  EXPECT_DOUBLE_EQ(zf.bytes_per_token(), plan_stored_bytes(zero).bytes_per_token());
  Plan wide = eval::cache_type_plan("tq3", "tq3", c);
  wide.layers[0][2].value = Codec::tq_mse(6, c.head_dim, 5);
  // A 6-bit group is served: its low 4 bits in the layer's pages, its high 2
  // in the extension pages, byte for byte the CPU packed cache's two layouts.
  EXPECT_EQ(CacheFormat::unsupported_reason(*codecs(wide, c)), "");
  const CacheFormat wf = CacheFormat::packed(codecs(wide, c));
  const cache::PackedKVCache wcpu(c.kv_shape(64), codecs(wide, c));
  ASSERT_NE(wf.ext_layout(0), nullptr);
  ASSERT_NE(wcpu.ext_layout(0), nullptr);
  EXPECT_EQ(wf.ext_layout(1), nullptr);
  EXPECT_EQ(wf.layout(0).page_bytes(), wcpu.layout(0).page_bytes());
  EXPECT_EQ(wf.ext_layout(0)->page_bytes(), wcpu.ext_layout(0)->page_bytes());
  EXPECT_EQ(wf.page_bytes(0), wcpu.layout(0).page_bytes() + wcpu.ext_layout(0)->page_bytes());
  EXPECT_EQ(wf.scalar_page_bytes(0), wf.page_bytes(0));
  EXPECT_EQ(wf.layout(0).head(2).value.at(0).bits, 4);
  EXPECT_EQ(wf.ext_layout(0)->head(2).value.at(0).bits, 2);
  EXPECT_DOUBLE_EQ(wf.bytes_per_token(), plan_stored_bytes(wide).bytes_per_token());
  EXPECT_EQ(wf.levels(0).size(), size_t{8 * 2 * 8 - 8 + 64});  // 3-bit groups 8 levels, the 6-bit one 64
  Plan win = eval::cache_type_plan("tq3", "tq3", c);
  win.fp16_window = 32;
  refuse(win, "fp16_window 32");
  EXPECT_EQ(CacheFormat::unsupported_reason(*codecs(eval::cache_type_plan("tq4", "tq2", c), c)), "");
}

// TaSQ / CQ plans (vq keys: shared scale, channel weights; values CQ, fp16 or
// TQ-MSE) are served: a layer's page is its scalar page (the tq-mse values)
// plus its vq page, byte for byte the CPU packed cache's two layouts, and the
// plan's stored bytes per token; the encoder's tables are the codecs'
// weighted-space codebooks and weights, the decoder's codewords C̃ = C / a.
TEST(EngineCacheFormat, ServesVqPlans) {
  using ratekv_test::VqValues;
  for (const VqValues vals : {VqValues::tq_mse, VqValues::vq, VqValues::fp16}) {
    SCOPED_TRACE(static_cast<int>(vals));
    const ModelConfig c = ratekv_test::vq_config(128, 8, 4, RopeLayout::NeoX);
    const auto vc = ratekv_test::vq_codecs(c, 8, 10, 4, vals, 5);
    EXPECT_EQ(CacheFormat::unsupported_reason(*vc), "");
    const CacheFormat f = CacheFormat::packed(vc);
    EXPECT_EQ(f.label(), "plan:tasq");
    ASSERT_TRUE(f.has_vq());
    const CacheFormat::VqLayer* vq = f.vq(0);
    ASSERT_NE(vq, nullptr);
    const cache::PackedKVCache cpu(c.kv_shape(64), vc);
    ASSERT_NE(cpu.vq_layout(0), nullptr);
    EXPECT_EQ(vq->layout.page_bytes(), cpu.vq_layout(0)->page_bytes());
    EXPECT_EQ(f.scalar_page_bytes(0), cpu.layout(0).page_bytes());
    EXPECT_EQ(f.page_bytes(0), cpu.layout(0).page_bytes() + cpu.vq_layout(0)->page_bytes());
    EXPECT_EQ(f.layout(0).page_bytes(), cpu.layout(0).page_bytes());
    // A KV head's key segment: 64 slots · 16 groups · 10 bits = 1280 bytes.
    EXPECT_EQ(vq->layout.segment_bytes(packed::Side::key), size_t{64 * 16 * 10 / 8});
    EXPECT_NEAR(f.bytes_per_token(), plan_stored_bytes(vc->plan()).bytes_per_token(), 1e-9);
    const int n_vq_sides = vals == VqValues::vq ? 2 : 1;
    EXPECT_EQ(vq->channels.size(), size_t(8 * n_vq_sides * 128));
    EXPECT_EQ(vq->channel_scale.size(), size_t(8 * n_vq_sides * 128));
    EXPECT_EQ(vq->codebooks.size(), vq->codewords.size());
    const cache::VqCodec* k0 = vc->vq(0, 0, cache::KVSide::key);
    for (size_t i = 0; i < k0->codebooks().size(); ++i) {
      EXPECT_EQ(vq->codebooks[i], k0->codebooks()[i]);
      const int gi = static_cast<int>(i / (1024 * 8)), q = static_cast<int>(i % 8);
      const float a = k0->channel_scale()[k0->group_channels(gi)[q]];
      ASSERT_NEAR(vq->codewords[i] * a, vq->codebooks[i], 1e-6f * (1 + std::abs(vq->codebooks[i]))) << i;
    }
  }
  // 5..8-bit TQ-MSE values beside vq keys: the vq decode reads no extension pages.
  const ModelConfig c = ratekv_test::vq_config(64, 2, 2, RopeLayout::NeoX);
  const auto wide = ratekv_test::vq_codecs(c, 8, 6, 6, VqValues::tq_mse, 5);
  const std::string why = CacheFormat::unsupported_reason(*wide);
  EXPECT_NE(why.find("plan: layers[0]: 5..8-bit TQ-MSE groups beside vq / fp16 sides"), std::string::npos) << why;
  EXPECT_THROW(CacheFormat::packed(wide), Error);
}

// The engine's pages store what the plan's accounting says it stores
// (format/stored_bytes.h, plan_stored_bytes): uniform 2/3/4-bit plans of
// Llama-3.1-8B (head_dim 128) and Qwen2.5-3B shapes, mixed K/V widths, and a
// two-width Block-GTQ plan.
TEST(EngineCacheFormat, PageBytesArePlanStoredBytes) {
  for (const char* model : {"llama-3.1-8b", "qwen2.5-3b", "tiny-llama"}) {
    const ModelConfig c = synthetic_config(model, 2);
    for (const auto& [kt, vt] : {std::pair{"tq2", "tq2"}, std::pair{"tq3", "tq3"}, std::pair{"tq4", "tq4"},
                                 std::pair{"tq4", "tq2"}}) {
      const Plan p = eval::cache_type_plan(kt, vt, c);
      const CacheFormat f = CacheFormat::packed(codecs(p, c));
      EXPECT_DOUBLE_EQ(f.bytes_per_token(), plan_stored_bytes(p).bytes_per_token()) << model << " " << kt << vt;
    }
  }
}

// plan_memory: weights are every parameter at 2 bytes except the fp32 norms
// (Llama-3.1-8B: 8,030,261,248 parameters, 266,240 of them norm weights);
// the pool is the rest in whole pages of every layer.
TEST(EngineMemoryPlan, ArithmeticAndRefusal) {
  const ModelConfig c = synthetic_config("llama-3.1-8b");
  const CacheFormat k3 = CacheFormat::packed(codecs(eval::cache_type_plan("tq3", "tq3", c), c));
  engine::EngineOptions o;
  o.max_batch = 4;
  o.max_prefill_tokens = 2048;
  const size_t free_b = size_t{139} << 30;
  const engine::MemoryPlan p = engine::plan_memory(c, true, k3, o, free_b);
  const size_t norms = 2 * 4096 * 32 + 4096;
  EXPECT_EQ(p.weights, 2 * (size_t{8030261248} - norms) + 4 * norms);
  EXPECT_EQ(p.reserve, o.reserve_bytes);
  const size_t fixed = p.weights + p.activations + p.workspace + p.reserve;
  EXPECT_EQ(p.pages, static_cast<int64_t>((free_b - fixed) / k3.page_bytes_all_layers()));
  EXPECT_EQ(p.pool, static_cast<size_t>(p.pages) * k3.page_bytes_all_layers());
  EXPECT_EQ(p.capacity_tokens, p.pages * 64);
  // 1M-token contexts for 4 sequences fit in K3V3 (≈ 107 GB); fp16 holds
  // fewer than 8 sequences of 128K.
  EXPECT_GE(p.capacity_tokens, 4 * (int64_t{1} << 20));
  const engine::MemoryPlan f = engine::plan_memory(c, true, CacheFormat::fp16(c), o, free_b);
  EXPECT_LT(f.capacity_tokens, 8 * 131072);
  EXPECT_GE(f.capacity_tokens, 5 * 131072);
  // One page less of free memory, one page less of pool (at most).
  const engine::MemoryPlan q = engine::plan_memory(c, true, k3, o, free_b - k3.page_bytes_all_layers());
  EXPECT_EQ(q.pages, p.pages - 1);
  // An explicit pool size caps the pool.
  engine::EngineOptions capped = o;
  capped.pool_bytes = size_t{10} << 30;
  EXPECT_EQ(engine::plan_memory(c, true, k3, capped, free_b).pages,
            static_cast<int64_t>((size_t{10} << 30) / k3.page_bytes_all_layers()));
  // Too little memory for the weights: an error naming both sizes.
  const std::string why = error_of([&] { engine::plan_memory(c, true, k3, o, size_t{12} << 30); });
  EXPECT_NE(why.find("the device has 12.00 GiB free"), std::string::npos) << why;
  EXPECT_NE(why.find("weights 14.96"), std::string::npos) << why;
  engine::EngineOptions bad = o;
  bad.max_batch = 0;
  EXPECT_THROW(engine::plan_memory(c, true, k3, bad, free_b), Error);
}

// Every part of the plan against a count written out here from the engine's
// buffers (Llama-3.1-8B widths, 2 layers, K3V3; max_batch 4, 2048-token
// prefill, context 32768): activations are the per-token buffers of 2048 rows,
// the logits of 512 rows and the decode state (per row: position, length,
// 4096-step history, temperature, top-k, top-p, uniform; the page tables of
// 4 rows + the prefill's, 512 pages each); workspace the 64 MiB cuBLAS
// workspace, 1 GiB of prefill scores/probabilities (6 bytes an entry), the
// chunked prefill's key tiles (2688 keys of K and V: the largest multiple of
// 64 whose scores for 2048 rows × 32 heads fit 1 GiB) and softmax state, the
// decode split states, the packed plans' tables and the prefill's rotated rows
// (2048 rows × 2 sides × 8 heads × 128 fp32 = 16 MiB; capped at 64 MiB for
// longer prompts). The decode workspace is checked to cover every kernel's
// split count at every length the engine may decode (its exact size is
// checked on the GPU by Engine.MemoryPlanIsWhatTheEngineAllocates).
TEST(EngineMemoryPlan, EveryBufferCounted) {
  const ModelConfig c = synthetic_config("llama-3.1-8b", 2);
  const CacheFormat k3 = CacheFormat::packed(codecs(eval::cache_type_plan("tq3", "tq3", c), c));
  engine::EngineOptions o;
  o.max_batch = 4;
  o.max_prefill_tokens = 2048;
  o.context_limit = 32768;
  const size_t free_b = size_t{139} << 30;
  const engine::MemoryPlan p = engine::plan_memory(c, true, k3, o, free_b);
  const size_t d = 4096, qd = 4096, kvd = 1024, qkvd = 6144, dff = 14336, V = 128256, H = 32, R = 2048, B = 4;
  const size_t row = 4 * d /*x*/ + 2 * d /*xn*/ + 4 * qkvd /*qkv*/ + 2 * qd /*q16*/ + 4 * kvd + 4 * kvd /*k32 v32*/ +
                     2 * kvd + 2 * kvd /*k16 v16*/ + 4 * qd /*q32*/ + 4 * qd /*o32*/ + 2 * qd /*att16*/ + 4 * d /*tmp*/ +
                     8 * dff /*gate|up*/ + 2 * dff /*h16*/ + 4 + 4 /*token, position*/;
  const size_t max_pages = 32768 / 64;
  const size_t decode_state = B * (4 + 4 + 4 * 4096 + 4 + 4 + 4 + 8) + 3 * 4 + 4 * B * max_pages + 4 * max_pages;
  EXPECT_EQ(p.activations, R * row + 4 * 512 * V + decode_state);
  // Packed plan tables per layer: Π (8 heads × 2 sides × 128² fp32), channel
  // lists (8 × 2 × 128 int32), levels (8 × 2 × 8 fp32), the fp32 prefill
  // matrix (2 × 8 × 128² fp32), and per KV head its fixed-size head tables.
  const packed::LayerLayout& L = k3.layout(0);
  const size_t group_tables = 4 * (8 * 2 * 128 * 128) + 4 * (8 * 2 * 128) + 4 * (8 * 2 * 8);
  const size_t none = cuda::packed_plan_device_bytes(L, cuda::PrefillMatrices::none);
  ASSERT_GT(none, group_tables);
  const size_t head_tables = none - group_tables;
  EXPECT_EQ(head_tables % 8, 0u);
  EXPECT_LE(head_tables / 8, size_t{8192});  // fixed-size per-head tables (src/cuda/head_tables.h)
  const size_t m = 2 * 8 * 128 * 128;
  EXPECT_EQ(cuda::packed_plan_device_bytes(L, cuda::PrefillMatrices::f32), none + 4 * m);
  EXPECT_EQ(cuda::packed_plan_device_bytes(L, cuda::PrefillMatrices::f16), none + 2 * m);
  EXPECT_EQ(cuda::packed_plan_device_bytes(L, cuda::PrefillMatrices::both), none + 6 * m);
  const size_t tables = 2 * (none + 4 * m) + 8 * 64 /*RoPE frequencies*/ + 4 * 2048 /*probe sink*/;
  EXPECT_EQ(p.tables, tables);
  EXPECT_EQ(p.prefill_rotation, size_t{2048} * 2 * 8 * 128 * 4);
  const size_t gib = size_t{1} << 30;
  const size_t scores = gib / 6 * 4 + gib / 6 * 2;
  const size_t key_tile = 2688;
  ASSERT_LE(6 * key_tile * H * R, gib);
  ASSERT_GT(6 * (key_tile + 64) * H * R, gib);
  const size_t chunk = 2 * 2 * key_tile * kvd + 2 * 4 * R * H;
  ASSERT_GT(p.workspace, (size_t{64} << 20) + scores + chunk + tables + p.prefill_rotation);
  const size_t decode_ws = p.workspace - ((size_t{64} << 20) + scores + chunk + tables + p.prefill_rotation);
  for (int b = 1; b <= 4; ++b)
    for (int len : {1, 64, 100, 4096, 5000, 32768}) {
      int splits = std::max(cuda::fp16_default_splits(b, 8, 32, 128, len),
                            cuda::fp16_default_splits(b, 8, 32, 128, len, cuda::Fp16DecodeVariant::rows16));
      splits = std::max(splits, cuda::default_splits(L, 32, b, len));
      EXPECT_GE(decode_ws, cuda::decode_workspace_bytes(b, 32, 128, splits)) << "B " << b << " length " << len;
    }
  EXPECT_LE(decode_ws, size_t{64} << 20);
  EXPECT_EQ(p.allocated(), p.weights + p.activations + p.workspace + p.pool);
  // A prompt past the 64 MiB rotation chunk: the buffer stays at the chunk.
  engine::EngineOptions longp = o;
  longp.max_prefill_tokens = 30000;
  EXPECT_EQ(engine::plan_memory(c, true, k3, longp, free_b).prefill_rotation, size_t{64} << 20);
  // A 97-token prompt: whole 64-row blocks (128 rows).
  engine::EngineOptions shortp = o;
  shortp.max_prefill_tokens = 97;
  EXPECT_EQ(engine::plan_memory(c, true, k3, shortp, free_b).prefill_rotation, size_t{128} * 2 * 8 * 128 * 4);
  // The fp16 cache has no packed tables and no rotation buffer.
  const engine::MemoryPlan f = engine::plan_memory(c, true, CacheFormat::fp16(c), o, free_b);
  EXPECT_EQ(f.tables, 8 * 64 + 4 * 2048u);
  EXPECT_EQ(f.prefill_rotation, 0u);
  EXPECT_EQ(f.activations, p.activations);
}

// The engine refuses what it does not run before touching the GPU: an
// architecture outside llama / qwen2 / gemma3, weights that do not match, a
// sliding window on a packed cache at GQA > 8, with vq keys or 5..8-bit groups
// on a sliding layer, or beyond 2^30 tokens.
TEST(EngineCreate, RefusesUnknownArchitecturesAndMismatchedWeights) {
  ModelConfig g = synthetic_config("llama-3.1-8b", 1);
  g.arch = "gpt2";
  const std::string why =
      error_of([&] { engine::Engine::create_synthetic(g, true, 1, CacheFormat::fp16(g), engine::EngineOptions{}); });
  EXPECT_NE(why.find("architecture 'gpt2' is not served on the GPU (llama, qwen2 and gemma3 are)"), std::string::npos)
      << why;
  ModelConfig gq = synthetic_config("gemma-3-270m", 6);
  gq.n_heads = 16;  // GQA 16 over one KV head
  const std::string why3 = error_of([&] {
    engine::Engine::create_synthetic(
        gq, false, 1,
        CacheFormat::packed(std::make_shared<const cache::PlanCodecs>(eval::cache_type_plan("tq3", "tq3", gq, 7), gq)),
        engine::EngineOptions{});
  });
  EXPECT_NE(why3.find("sliding_window 512 with a packed cache needs GQA <= 8"), std::string::npos) << why3;
  // fp16 keys on every head make a vq layer (CacheFormat::vq): vq_decode_attention has no window.
  ModelConfig gv = synthetic_config("gemma-3-270m", 6);
  const std::string why4 = error_of([&] {
    engine::Engine::create_synthetic(
        gv, false, 1,
        CacheFormat::packed(std::make_shared<const cache::PlanCodecs>(eval::cache_type_plan("f16", "tq3", gv, 7), gv)),
        engine::EngineOptions{});
  });
  EXPECT_NE(why4.find("layer 0 slides (sliding_window 512) and its plan keys are vq"), std::string::npos) << why4;
  // 5..8-bit groups on a sliding layer (the generic decode kernel has no window).
  Plan wide = eval::cache_type_plan("tq3", "tq3", gv, 7);
  for (auto& layer : wide.layers)
    for (HeadPlan& hp : layer) hp.key = Codec::tq_mse(5, gv.head_dim, 11);
  const std::string why5 = error_of([&] {
    engine::Engine::create_synthetic(gv, false, 1, CacheFormat::packed(codecs(wide, gv)), engine::EngineOptions{});
  });
  EXPECT_NE(why5.find("layer 0 slides (sliding_window 512) and its plan has 5..8-bit groups"), std::string::npos)
      << why5;
  // A window beyond 2^30 tokens (the kernels' int positions).
  ModelConfig huge = synthetic_config("gemma-3-270m", 6);
  huge.sliding_window = (int64_t{1} << 30) + 1;
  const std::string why8 = error_of(
      [&] { engine::Engine::create_synthetic(huge, false, 1, CacheFormat::fp16(huge), engine::EngineOptions{}); });
  EXPECT_NE(why8.find("sliding_window 1073741825 exceeds 2^30 tokens"), std::string::npos) << why8;
  // EngineOptions::fp16_kernel outside 0..3, or an n8 kernel (2, 3) for an
  // fp16 cache at GQA > 8, is refused naming the option.
  engine::EngineOptions bad_kernel;
  bad_kernel.fp16_kernel = 4;
  ModelConfig l1 = synthetic_config("llama-3.1-8b", 1);
  const std::string why6 =
      error_of([&] { engine::Engine::create_synthetic(l1, true, 1, CacheFormat::fp16(l1), bad_kernel); });
  EXPECT_NE(why6.find("EngineOptions::fp16_kernel 4 (0 automatic, 1 rows16, 2 n8, 3 n8_fused)"), std::string::npos)
      << why6;
  ModelConfig g16 = synthetic_config("llama-3.1-8b", 1);
  g16.n_kv_heads = 2;  // GQA 16
  bad_kernel.fp16_kernel = 3;
  const std::string why7 =
      error_of([&] { engine::Engine::create_synthetic(g16, true, 1, CacheFormat::fp16(g16), bad_kernel); });
  EXPECT_NE(why7.find("EngineOptions::fp16_kernel 3 (n8_fused) needs GQA <= 8; this model has GQA 16"),
            std::string::npos)
      << why7;
  ModelConfig q = synthetic_config("qwen2.5-3b", 1);
  const std::string why2 =
      error_of([&] { engine::Engine::create(q, ModelWeights{}, CacheFormat::fp16(q), engine::EngineOptions{}); });
  EXPECT_NE(why2.find("0 weight layers for 1 config layers"), std::string::npos) << why2;
}

}  // namespace
