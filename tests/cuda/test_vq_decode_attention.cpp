// CUDA decode attention over the vq pages (TaSQ / CQ plans, codec kind vq,
// docs/packed_format.md §7) against the CPU packed cache's attention over the
// same pages: the CPU PackedKVCache quantizes the keys (pre-RoPE, shared
// scale, channel weights) and values, its vq pages are copied into a shuffled
// GPU page pool, and vq_decode_attention must reproduce PackedKVCache::attend
// for the last position (rel err < 1e-3; both compute in fp32). Needs a GPU:
// skips when none is visible.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/cache/plan_codecs.h"
#include "ratekv/cuda/decode_attention.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/model/model.h"
#include "ratekv/format/packed_vq_format.h"
#include "ratekv/quant/tq_mse.h"
#include "../support/vq_codec.h"

using namespace ratekv;
using namespace ratekv::cache;
using ratekv::cuda::DType;

namespace {

#define CK(x) ASSERT_EQ((x), cudaSuccess) << #x

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) {
    if (cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)) != cudaSuccess) p = nullptr;
  }
  DevBuf(const std::vector<T>& v) : DevBuf(v.size()) {
    if (p) cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DevBuf() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> v(n);
    cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
};

enum class Values { vq, fp16, tq_mse };

ModelConfig config(int head_dim, int n_kv_heads, int gqa, RopeLayout rope) {
  ModelConfig c;
  c.arch = rope == RopeLayout::NeoX ? "qwen2" : "llama";
  c.n_layers = 1;
  c.n_heads = n_kv_heads * gqa;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = head_dim;
  c.d_model = 16;
  c.d_ff = 16;
  c.n_vocab = 10;
  c.n_ctx_train = 1 << 20;
  c.rope_theta = rope == RopeLayout::NeoX ? 1e6 : 5e5;
  c.rms_eps = 1e-5f;
  c.rope_layout = rope;
  return c;
}

using ratekv_test::vq_codec;

// TaSQ-style keys (group g, 2^kbits centroids, shared fp16 scale, channel
// weights, RoPE pairs kept together in a shuffled order); values CQ (g 8,
// 2^vbits, no scale) or fp16. Codebooks random (seeded).
std::shared_ptr<const PlanCodecs> vq_codecs(const ModelConfig& cfg, int g, int kbits, int vbits, Values vals,
                                            uint32_t seed) {
  const int d = cfg.head_dim, H = cfg.n_kv_heads;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.3f, 2.0f);
  Plan p;
  p.method = "tasq";
  static_cast<PlanTarget&>(p.model) = plan_target(cfg);
  p.tensors_file = "in-memory.safetensors";
  p.layers.assign(1, std::vector<HeadPlan>(H));
  const auto pairs = rope_pairs(cfg.rope_layout, d);
  std::vector<int> order(d / 2);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int> perm;
  for (int b : order) perm.insert(perm.end(), {pairs[b][0], pairs[b][1]});
  std::vector<int> id(d);
  std::iota(id.begin(), id.end(), 0);
  for (int h = 0; h < H; ++h) {
    p.layers[0][h].key = vq_codec(d, g, kbits, true, H, perm);
    p.layers[0][h].value = vals == Values::vq     ? vq_codec(d, 8, vbits, false, H, id)
                           : vals == Values::fp16 ? Codec::fp16()
                                                  : Codec::tq_mse(vbits, d, seed + 17 * h);
  }
  VqTensors t = VqTensors::for_plan(p);
  for (int h = 0; h < H; ++h) {
    auto& k = t.at(0, h, 0);
    k.present = true;
    k.codebooks.resize(static_cast<size_t>(d / g) * (size_t{1} << kbits) * g);
    for (float& x : k.codebooks) x = nd(rng);
    k.channel_scale.resize(d);
    for (float& x : k.channel_scale) x = ud(rng);
    if (vals == Values::vq) {
      auto& v = t.at(0, h, 1);
      v.present = true;
      v.codebooks.resize(static_cast<size_t>(d / 8) * (size_t{1} << vbits) * 8);
      for (float& x : v.codebooks) x = 1.5f * nd(rng);
    }
  }
  return std::make_shared<const PlanCodecs>(p, cfg, "vq-plan", std::make_shared<const VqTensors>(std::move(t)));
}

// The GPU plan's tables from the CPU codecs: reconstruction codewords C̃ (one
// decode per one-hot index: x̂ = 1 · C̃[z] on the group's channels) and the
// channel lists.
std::unique_ptr<cuda::VqPlan> gpu_plan(const PlanCodecs& codecs, const packed::VqLayerLayout& L, int n_heads,
                                       const ModelConfig& cfg, const cuda::PackedPlan* scalar_values = nullptr) {
  std::vector<float> cw;
  std::vector<int32_t> ch;
  const int d = cfg.head_dim;
  for (int h = 0; h < cfg.n_kv_heads; ++h)
    for (int s = 0; s < 2; ++s) {
      const VqCodec* c = codecs.vq(0, h, s == 0 ? KVSide::key : KVSide::value);
      if (!c) continue;
      const int G = c->n_groups(), K = c->n_centroids(), g = c->group_size();
      std::vector<int32_t> z(G, 0);
      std::vector<float> xhat(d);
      for (int gi = 0; gi < G; ++gi) {
        for (int j = 0; j < K; ++j) {
          z[gi] = j;
          c->decode(z.data(), 1.0f, xhat.data());
          for (int i = 0; i < g; ++i) cw.push_back(xhat[c->group_channels(gi)[i]]);
        }
        z[gi] = 0;
        for (int i = 0; i < g; ++i) ch.push_back(c->group_channels(gi)[i]);
      }
    }
  return std::make_unique<cuda::VqPlan>(L, n_heads, cw, ch,
                                        cuda::VqRope{cfg.rope_layout == RopeLayout::NeoX, cfg.rope_theta},
                                        scalar_values);
}

// (T, H, d) data with per-channel scales and an offset (never zeros).
std::vector<float> kv_data(int64_t T, int H, int d, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(T * H * d);
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h)
      for (int c = 0; c < d; ++c) x[(t * H + h) * d + c] = (0.2f + 2.8f * ((c * 7 + h) % d) / d) * nd(rng) + 0.3f;
  return x;
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b, size_t off, size_t n) {
  double e = 0, r = 0;
  for (size_t i = off; i < off + n; ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    e += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    r += double(b[i]) * b[i];
  }
  return std::sqrt(e / r);
}

struct Case {
  int d, hkv, gqa;
  std::vector<int> lens;
  int g, kbits, vbits;
  Values values;
  RopeLayout rope;
  DType q_dtype;
};

void run_case(const Case& c, uint32_t seed) {
  const std::string nm = "d=" + std::to_string(c.d) + " hkv=" + std::to_string(c.hkv) + " gqa=" +
                         std::to_string(c.gqa) + " g=" + std::to_string(c.g) + " kbits=" + std::to_string(c.kbits) +
                         (c.values == Values::vq ? " V vq" : c.values == Values::fp16 ? " V fp16" : " V tq-mse") +
                         (c.rope == RopeLayout::NeoX ? " neox" : " interleaved");
  SCOPED_TRACE(nm);
  std::mt19937 rng(seed);
  const ModelConfig cfg = config(c.d, c.hkv, c.gqa, c.rope);
  auto codecs = vq_codecs(cfg, c.g, c.kbits, c.vbits, c.values, seed + 1);
  const int nb = (int)c.lens.size(), hq = c.hkv * c.gqa, d = c.d;
  const int max_len = *std::max_element(c.lens.begin(), c.lens.end());
  const int max_pages = (max_len + packed::kPageTokens - 1) / packed::kPageTokens;
  // One CPU packed cache per sequence; positions = token index.
  std::vector<std::unique_ptr<PackedKVCache>> caches;
  std::vector<float> q((size_t)nb * hq * d), ref(q.size());
  std::normal_distribution<float> nq(0.0f, 1.5f);
  for (auto& x : q) x = nq(rng);
  std::vector<uint16_t> q16(q.size());
  for (size_t i = 0; i < q.size(); ++i) {
    q16[i] = fp32_to_fp16(q[i]);
    if (c.q_dtype == DType::f16) q[i] = fp16_to_fp32(q16[i]);
  }
  AttnParams ap;
  ap.scale = 1.0f / std::sqrt((float)d);
  for (int b = 0; b < nb; ++b) {
    const int T = c.lens[b];
    auto cache = std::make_unique<PackedKVCache>(cfg.kv_shape(T), codecs);
    std::vector<int32_t> pos(T);
    std::iota(pos.begin(), pos.end(), 0);
    const auto Kp = kv_data(T, c.hkv, d, rng), V = kv_data(T, c.hkv, d, rng);
    std::vector<float> K = Kp;
    for (int t = 0; t < T; ++t) apply_rope(K.data() + (size_t)t * c.hkv * d, c.hkv, d, t, cfg.rope_layout, cfg.rope_theta);
    cache->append(0, T, pos.data(), Kp.data(), K.data(), V.data());
    const int32_t qpos = T - 1;
    cache->attend(0, 1, &qpos, q.data() + (size_t)b * hq * d, ref.data() + (size_t)b * hq * d, ap);
    caches.push_back(std::move(cache));
  }
  const packed::VqLayerLayout* L = caches[0]->vq_layout(0);
  ASSERT_NE(L, nullptr);
  ASSERT_EQ(L->side(packed::Side::key).kind, packed::VqSideKind::vq);
  // GPU pool: every sequence owns max_pages shuffled physical pages; unused
  // pages hold random bytes (never read).
  const size_t pb = L->page_bytes();
  std::vector<int32_t> table((size_t)nb * max_pages);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<uint8_t> pool(table.size() * pb);
  for (auto& x : pool) x = (uint8_t)rng();
  for (int b = 0; b < nb; ++b)
    for (int i = 0; i < (c.lens[b] + packed::kPageTokens - 1) / packed::kPageTokens; ++i) {
      const auto src = caches[b]->vq_page(0, i);
      ASSERT_EQ(src.size(), pb);
      std::copy(src.begin(), src.end(), pool.begin() + (size_t)table[(size_t)b * max_pages + i] * pb);
    }
  // Scalar TQ-MSE values: the CPU cache's scalar pages (same page table) and
  // a PackedPlan of its layout with the quantizers' rotations and levels.
  std::unique_ptr<cuda::PackedPlan> splan;
  std::vector<uint8_t> spool;
  if (c.values == Values::tq_mse) {
    const packed::LayerLayout& SL = caches[0]->layout(0);
    std::vector<float> rot, lvl;
    for (int h = 0; h < c.hkv; ++h) {
      ASSERT_TRUE(SL.head(h).key.empty());
      ASSERT_EQ(SL.head(h).value.size(), 1u);
      const auto* tq = dynamic_cast<const quant::TQMSE*>(codecs->quantizer(0, h, KVSide::value));
      ASSERT_NE(tq, nullptr);
      const auto M = tq->rotation().matrix();  // y = Π x, channels in the group's order
      const auto& ch = SL.spec(h).value[0].channels;
      for (int i = 0; i < d; ++i) ASSERT_EQ(ch[i], i);
      for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j) rot.push_back((float)M(i, j));
      lvl.insert(lvl.end(), tq->codebook().levels.begin(), tq->codebook().levels.end());
    }
    splan = std::make_unique<cuda::PackedPlan>(SL, hq, rot, lvl);
    const size_t spb = SL.page_bytes();
    spool.resize(table.size() * spb);
    for (auto& x : spool) x = (uint8_t)rng();
    for (int b = 0; b < nb; ++b)
      for (int i = 0; i < (c.lens[b] + packed::kPageTokens - 1) / packed::kPageTokens; ++i) {
        const auto src = caches[b]->page(0, i);
        std::copy(src.begin(), src.end(), spool.begin() + (size_t)table[(size_t)b * max_pages + i] * spb);
      }
  }
  auto plan = gpu_plan(*codecs, *L, hq, cfg, splan.get());
  DevBuf<uint8_t> dpool(pool), dspool(spool);
  DevBuf<int32_t> dpt(table), dlen(std::vector<int32_t>(c.lens.begin(), c.lens.end()));
  DevBuf<float> dq(q), dout(q.size());
  DevBuf<uint16_t> dq16(q16);
  CK(cudaMemset(dout.p, 0xff, dout.n * sizeof(float)));  // NaN poison
  const int splits = cuda::default_splits(*plan, nb, max_len);
  const size_t ws_bytes = cuda::decode_workspace_bytes(nb, hq, d, splits);
  DevBuf<uint8_t> ws(ws_bytes);
  cuda::DecodeBatch db{dpt.p, max_pages, dlen.p, nb, max_len};
  cuda::vq_decode_attention(*plan, db, dpool.p, splan ? dspool.p : nullptr, c.q_dtype == DType::f16 ? (void*)dq16.p : dq.p, c.q_dtype,
                            ap.scale, dout.p, ws.p, ws_bytes, splits, nullptr);
  CK(cudaDeviceSynchronize());
  CK(cudaGetLastError());
  const auto out = dout.get();
  for (int b = 0; b < nb; ++b) {
    const size_t n = (size_t)hq * d;
    const double e = rel_err(out, ref, (size_t)b * n, n);
    EXPECT_LT(e, 1e-3) << "sequence " << b << " (length " << c.lens[b] << ")";
    std::printf("  %s seq %d len %d: rel err %.2e\n", nm.c_str(), b, c.lens[b], e);
  }
}

}  // namespace

// Small case (also the compute-sanitizer case).
TEST(CudaVqDecode, Small) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  run_case({64, 3, 3, {1, 97, 130}, 8, 6, 5, Values::vq, RopeLayout::Interleaved, DType::f32}, 21);
  run_case({64, 2, 2, {130, 1}, 4, 10, 3, Values::tq_mse, RopeLayout::NeoX, DType::f16}, 22);
}

// Lengths 1, 97, 4096; batch 1 and 3; GQA 1, 3, 4; TaSQ keys g 4/8 with
// 5..10-bit indices (10 bits: indices straddle bytes), values CQ or fp16;
// interleaved and NeoX RoPE; head_dim 64/128.
TEST(CudaVqDecode, AgainstCpuPackedCache) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  const Case cases[] = {
      {64, 3, 3, {1, 97, 4096}, 8, 10, 6, Values::vq, RopeLayout::Interleaved, DType::f32},
      {64, 3, 1, {4096}, 4, 5, 5, Values::fp16, RopeLayout::Interleaved, DType::f32},
      {128, 2, 4, {97, 4096, 1}, 8, 7, 5, Values::vq, RopeLayout::NeoX, DType::f16},
      {128, 1, 4, {1}, 8, 9, 5, Values::fp16, RopeLayout::NeoX, DType::f32},
      {64, 3, 4, {4096, 1, 97}, 4, 5, 4, Values::fp16, RopeLayout::NeoX, DType::f16},
      {64, 3, 3, {97, 4096, 1}, 8, 6, 3, Values::tq_mse, RopeLayout::Interleaved, DType::f32},
      {128, 2, 1, {4096}, 8, 8, 2, Values::tq_mse, RopeLayout::NeoX, DType::f32},
  };
  uint32_t seed = 900;
  for (const Case& c : cases) run_case(c, seed += 10);
}

TEST(CudaVqDecode, RejectsBadPlans) {
  const packed::VqLayerLayout L(64, 1, {packed::VqSideKind::vq, 8, 4, true}, {packed::VqSideKind::fp16, 0, 0, false});
  std::vector<float> cw(8 * 16 * 8, 0.5f);
  std::vector<int32_t> ch(64);
  std::iota(ch.begin(), ch.end(), 0);
  const cuda::VqRope rope{};
  if (have_gpu()) {
    EXPECT_NO_THROW(cuda::VqPlan(L, 2, cw, ch, rope));
  }
  std::vector<int32_t> dup = ch;
  dup[5] = 4;  // channel 4 twice
  EXPECT_THROW(cuda::VqPlan(L, 2, cw, dup, rope), ratekv::Error);
  std::vector<float> short_cw(cw.begin(), cw.end() - 1);
  EXPECT_THROW(cuda::VqPlan(L, 2, short_cw, ch, rope), ratekv::Error);
  std::vector<float> nan_cw = cw;
  nan_cw[3] = NAN;
  EXPECT_THROW(cuda::VqPlan(L, 2, nan_cw, ch, rope), ratekv::Error);
  EXPECT_THROW(cuda::VqPlan(L, 17, cw, ch, rope), ratekv::Error);  // GQA 17
  EXPECT_THROW(cuda::VqPlan(L, 2, cw, ch, cuda::VqRope{false, -1.0}), ratekv::Error);
  // A value side outside the vq pages (scalar TQ-MSE) needs its PackedPlan.
  const packed::VqLayerLayout Lk(64, 1, {packed::VqSideKind::vq, 8, 4, true}, {});
  EXPECT_THROW(cuda::VqPlan(Lk, 2, cw, ch, rope), ratekv::Error);
}
