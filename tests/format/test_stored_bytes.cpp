// Stored bytes of a plan (format/stored_bytes.h): hand-computed values from
// docs/packed_format.md §4 / §7.3 and the SmolLM2 numbers, and
// agreement with the page sizes of the layout classes (LayerLayout,
// VqLayerLayout) built from the same groups.
#include <gtest/gtest.h>

#include <random>

#include "ratekv/common/error.h"
#include "ratekv/format/packed_format.h"
#include "ratekv/format/packed_vq_format.h"
#include "ratekv/format/stored_bytes.h"
#include "../support/vq_codec.h"

using namespace ratekv;

namespace {

Codec grouped(const std::vector<std::pair<int, std::vector<int>>>& groups) {
  Codec c;
  c.kind = CodecKind::TqMseGrouped;
  c.norm = NormStorage::FP16;
  for (const auto& [bits, blocks] : groups) {
    CodecGroup g;
    g.bits = bits;
    g.blocks = blocks;
    c.groups.push_back(g);
  }
  return c;
}

std::vector<int> range(int a, int b) {
  std::vector<int> v;
  for (int i = a; i < b; ++i) v.push_back(i);
  return v;
}

Codec whole(CodecKind kind, int bits, int d, int group_size) {
  Codec c;
  c.kind = kind;
  c.group_size = group_size;
  CodecGroup g;
  g.bits = bits;
  g.channels = range(0, d);
  c.groups = {g};
  return c;
}

}  // namespace

TEST(StoredBytes, HandValuesPerCodec) {
  // d = 64 uniform TQ-MSE 3 bits: 24 B codes + 2 B norm (docs/packed_format.md §4).
  const StoredBytes u = codec_stored_bytes(Codec::tq_mse(3, 64, 1), 64);
  EXPECT_EQ(u.codes, 64 * 24);
  EXPECT_EQ(u.norms, 64 * 2);
  EXPECT_EQ(u.padding, 0);
  EXPECT_DOUBLE_EQ(u.per_token(), 26.0);
  EXPECT_DOUBLE_EQ(Codec::tq_mse(3, 64, 1).effective_bits(64), 3.25);
  // A Block-GTQ group of 24 channels (12 blocks) at 2 bits: 32·2/8 = 8 B per token, 2 B of it padding (docs/packed_format.md §4);
  // plus a 4-bit group of 8 channels: 16·4/8 = 8 B, 4 B padding; 2 norms. The rest (12 blocks) dropped.
  const Codec g = grouped({{4, range(0, 4)}, {2, range(4, 16)}, {0, range(16, 32)}});
  const StoredBytes gb = codec_stored_bytes(g, 64);
  EXPECT_EQ(gb.codes, 64 * (24 * 2 + 8 * 4) / 8);
  EXPECT_EQ(gb.padding, 64 * (2 + 4));
  EXPECT_EQ(gb.norms, 64 * 4);
  EXPECT_DOUBLE_EQ(g.effective_bits(64), (8 + 8 + 4) * 8.0 / 64);
  // A 6-bit group: 16·6/8 = 12 B codes, its norm, and the extension pages' unused norm array (docs/packed_format.md §5).
  const StoredBytes w = codec_stored_bytes(grouped({{6, range(0, 8)}, {0, range(8, 32)}}), 64);
  EXPECT_EQ(w.codes, 64 * 12);
  EXPECT_EQ(w.norms, 64 * 2);
  EXPECT_EQ(w.padding, 64 * 2);
  EXPECT_EQ(scalar_group_stored_bits(16, 6), 16 * 6 + 32);
  EXPECT_EQ(scalar_group_stored_bits(24, 2), 32 * 2 + 16);
  EXPECT_EQ(scalar_group_stored_bits(5, 0), 0);
  EXPECT_THROW(scalar_group_stored_bits(0, 2), Error);
  EXPECT_THROW(scalar_group_stored_bits(16, 9), Error);
  // KIVI 2 bits, scale + zero per 32: 16 B codes + 2·4 B = 3 bits per element; QuaRot the same arithmetic.
  EXPECT_DOUBLE_EQ(codec_stored_bytes(whole(CodecKind::Kivi, 2, 64, 32), 64).per_token(), 24.0);
  EXPECT_DOUBLE_EQ(whole(CodecKind::QuaRot, 4, 64, 16).effective_bits(64), 4.0 + 2.0);
  // ggml q8_0 / q4_0 blocks of 32: 34 / 18 bytes.
  EXPECT_DOUBLE_EQ(codec_stored_bytes(whole(CodecKind::Q8_0, 8, 64, 32), 64).per_token(), 68.0);
  EXPECT_DOUBLE_EQ(codec_stored_bytes(whole(CodecKind::Q4_0, 4, 64, 32), 64).per_token(), 36.0);
  // fp16: 2 bytes per element.
  EXPECT_DOUBLE_EQ(codec_stored_bytes(Codec::fp16(), 64).per_token(), 128.0);
  // vq, d 64, g 8, 10-bit indices: 8 · 10 bits = 10 B per token (page segment 640 B, a multiple of 16);
  // the shared scale (2 B per token per layer side) is 16/3 bits per head of a 3-head layer.
  const Codec t = ratekv_test::vq_codec(64, 8, 10, true, 3, range(0, 64));
  EXPECT_DOUBLE_EQ(codec_stored_bytes(t, 64).per_token(), 10.0);
  EXPECT_DOUBLE_EQ(t.effective_bits(64), 80.0 / 64 + 16.0 / 192);
  // 7-bit indices over 5 groups: 35 bits per token, 280 B per page rounded to 288.
  const StoredBytes v7 = codec_stored_bytes(ratekv_test::vq_codec(40, 8, 7, false, 1, range(0, 40)), 40);
  EXPECT_EQ(v7.codes, 280);
  EXPECT_EQ(v7.padding, 8);
}

// SmolLM2's shape (30 layers, 3 KV heads, d 64): uniform K3V3 stores 4680 B
// per token; the Block-GTQ K3V3 plan of the NIAH run (allocated without tile
// prices) 5036 B (issue 21); TaSQ keys 32 B per layer (docs/packed_format.md §7.3).
TEST(StoredBytes, PlanTotals) {
  Plan p;
  p.method = "test";
  p.model = {{"llama", 30, 3, 64, "interleaved"}, "", ""};
  p.layers.assign(30, std::vector<HeadPlan>(3));
  for (auto& layer : p.layers)
    for (auto& hp : layer) {
      hp.key = Codec::tq_mse(3, 64, 1);
      hp.value = Codec::tq_mse(3, 64, 2);
    }
  PlanStoredBytes sb = plan_stored_bytes(p);
  EXPECT_DOUBLE_EQ(sb.bytes_per_token(), 4680.0);
  EXPECT_DOUBLE_EQ(sb.k_bits_per_element(), 3.25);
  EXPECT_DOUBLE_EQ(plan_stored_bytes_at(p, 64), 4680.0 * 64);
  EXPECT_DOUBLE_EQ(plan_stored_bytes_at(p, 65), 4680.0 * 128);  // a second page
  EXPECT_DOUBLE_EQ(plan_stored_bytes_at(p, 0), 0.0);
  // fp16 sinks and window: 4 + 8 rows of 2 · 3 · 64 · 2 B per layer, the rest in pages.
  EXPECT_DOUBLE_EQ(plan_stored_bytes_at(p, 76, 4, 8), 12.0 * 30 * 3 * 2 * 128 + 4680.0 * 64);
  EXPECT_THROW(plan_stored_bytes_at(p, -1), Error);
  // TaSQ keys: 3 · 10 + 2 = 32 B per layer.
  for (auto& layer : p.layers)
    for (auto& hp : layer) hp.key = ratekv_test::vq_codec(64, 8, 10, true, 3, range(0, 64));
  sb = plan_stored_bytes(p);
  EXPECT_DOUBLE_EQ(sb.k.per_token(), 30.0 * 32);
  EXPECT_DOUBLE_EQ(sb.k_bits_per_element(), 32.0 * 8 / 192);
  EXPECT_DOUBLE_EQ(p.achieved().k, 1.25 + 16.0 / 192);
  EXPECT_EQ(sb.fixed_bytes, 30 * 3 * 8 * 1024 * 8 * 2);  // G · K · g fp16 values per head
  EXPECT_EQ(plan_codebook_bytes(p), sb.fixed_bytes);
}

// For random group specifications the function equals the page size of the
// layout classes that define the format (divided by 64 tokens).
TEST(StoredBytes, EqualsTheLayoutClassesPageBytes) {
  std::mt19937 rng(2103);
  for (int trial = 0; trial < 200; ++trial) {
    const int d = 16 * (1 + (int)(rng() % 8)) + (trial % 3 == 0 ? 2 * (int)(rng() % 8) : 0);
    const int H = 1 + (int)(rng() % 4);
    std::vector<packed::HeadSpec> specs(H), ext(H);
    Plan p;
    p.method = "test";
    p.model = {{"llama", 1, H, d, "interleaved"}, "", ""};
    p.layers.assign(1, std::vector<HeadPlan>(H));
    bool any_ext = false;
    for (int h = 0; h < H; ++h)
      for (int side = 0; side < 2; ++side) {
        std::vector<int> bb(d / 2);
        for (int& b : bb) b = (int)(rng() % 9);
        std::vector<std::pair<int, std::vector<int>>> groups;
        for (int w = 8; w >= 0; --w) {
          std::vector<int> blocks;
          for (int i = 0; i < d / 2; ++i)
            if (bb[i] == w) blocks.push_back(i);
          if (blocks.empty()) continue;
          groups.push_back({w, blocks});
          if (w == 0) continue;
          std::vector<int> ch;
          for (int b : blocks) ch.insert(ch.end(), {2 * b, 2 * b + 1});
          auto& main = side == 0 ? specs[h].key : specs[h].value;
          main.push_back({ch, std::min(w, packed::kMaxBits)});
          if (w > packed::kMaxBits) {
            (side == 0 ? ext[h].key : ext[h].value).push_back({ch, w - packed::kMaxBits});
            any_ext = true;
          }
        }
        (side == 0 ? p.layers[0][h].key : p.layers[0][h].value) = grouped(groups);
      }
    const packed::LayerLayout L(d, specs);
    size_t page = L.page_bytes();
    if (any_ext) page += packed::LayerLayout(d, ext).page_bytes();
    EXPECT_EQ(plan_stored_bytes(p).k.total() + plan_stored_bytes(p).v.total(), (int64_t)page) << "trial " << trial;
  }
  for (int trial = 0; trial < 100; ++trial) {
    const int g = 2 << (rng() % 4), d = g * (1 + (int)(rng() % 16)), H = 1 + (int)(rng() % 5);
    const int kb = 1 + (int)(rng() % 16), vb = 1 + (int)(rng() % 16);
    const bool shared = rng() % 2, v_fp16 = rng() % 3 == 0;
    Plan p;
    p.method = "test";
    p.model = {{"llama", 1, H, d, "interleaved"}, "", ""};
    p.layers.assign(1, std::vector<HeadPlan>(H));
    for (int h = 0; h < H; ++h) {
      p.layers[0][h].key = ratekv_test::vq_codec(d, g, kb, shared, H, range(0, d));
      p.layers[0][h].value = v_fp16 ? Codec::fp16() : ratekv_test::vq_codec(d, g, vb, false, H, range(0, d));
    }
    const packed::VqLayerLayout V(d, H, {packed::VqSideKind::vq, d / g, kb, shared},
                                  v_fp16 ? packed::VqSideSpec{packed::VqSideKind::fp16}
                                         : packed::VqSideSpec{packed::VqSideKind::vq, d / g, vb, false});
    EXPECT_EQ(plan_stored_bytes(p).k.total() + plan_stored_bytes(p).v.total(), (int64_t)V.page_bytes())
        << "trial " << trial;
  }
}
