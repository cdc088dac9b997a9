// The vq pages of the packed format (docs/packed_format.md §7): golden bytes
// of a hand-made case, tightly packed awkward widths (1, 5, 10, 13 bits) at
// lengths 1, 97, 200, bit-exact agreement of the reference encoder/decoder
// with the fake-quant vq path, size arithmetic, bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "ratekv/cache/vq_codec.h"
#include "ratekv/cache/vq_page_codec.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/format/packed_vq_format.h"
#include "../support/vq_codec.h"

using namespace ratekv;
using namespace ratekv::packed;
using ratekv::cache::VqCodec;
using ratekv::cache::decode_vq_token;
using ratekv::cache::encode_vq_token;
using ratekv::cache::vq_token_scale;

namespace {

using ratekv_test::vq_codec;

std::vector<int> iota(int d) {
  std::vector<int> p(d);
  for (int i = 0; i < d; ++i) p[i] = i;
  return p;
}

std::vector<const VqCodec*> ptrs(const std::vector<std::unique_ptr<VqCodec>>& v) {
  std::vector<const VqCodec*> p;
  for (const auto& c : v) p.push_back(c.get());
  return p;
}

}  // namespace

// d 4, g 2, 5-bit indices, one KV head: slot 0 = (3, 17), slot 1 = (31, 1) →
// stream 0xFE23 → bytes 23 FE 00 (docs/packed_format.md §7.2), both through
// the reference writer and through the encoder (codebook centroid j = (j, 0):
// the input (z0, 0, z1, 0) is its own nearest centroid).
TEST(PackedVqFormat, GoldenBytesFiveBitIndices) {
  const VqLayerLayout L(4, 1, VqSideSpec{VqSideKind::vq, 2, 5, false}, VqSideSpec{});
  ASSERT_EQ(L.segment_bytes(Side::key), 80u);  // 8·G·bits
  ASSERT_EQ(L.page_bytes(), 80u);
  std::vector<uint8_t> page(L.page_bytes(), 0);
  const int32_t s0[] = {3, 17}, s1[] = {31, 1};
  write_vq_indices(L, page, 0, Side::key, 0, s0);
  EXPECT_EQ(page[0], 0x23);
  EXPECT_EQ(page[1], 0x02);
  write_vq_indices(L, page, 0, Side::key, 1, s1);
  const uint8_t want[] = {0x23, 0xFE, 0x00};
  for (int i = 0; i < 3; ++i) EXPECT_EQ(page[i], want[i]) << "byte " << i;
  for (size_t i = 3; i < page.size(); ++i) EXPECT_EQ(page[i], 0) << "byte " << i;
  int32_t r[2];
  read_vq_indices(L, page, 0, Side::key, 1, r);
  EXPECT_EQ(r[0], 31);
  EXPECT_EQ(r[1], 1);

  // Same bytes through the encoder. Centroid 9 of group 0 duplicates centroid
  // 5: an input at (5, 0) is a tie, won by the lower index.
  const Codec c = vq_codec(4, 2, 5, false, 1, iota(4));
  std::vector<float> cb(2 * 32 * 2, 0.0f);
  for (int gi = 0; gi < 2; ++gi)
    for (int j = 0; j < 32; ++j) cb[(gi * 32 + j) * 2] = static_cast<float>(j);
  cb[(0 * 32 + 9) * 2] = 5.0f;
  const VqCodec codec(c, 4, cb, {});
  const VqCodec* heads[] = {&codec};
  std::vector<uint8_t> enc(L.page_bytes(), 0);
  const float x0[] = {3, 0, 17, 0}, x1[] = {31, 0, 1, 0};
  encode_vq_token(L, enc, Side::key, 0, heads, x0, vq_token_scale(heads, x0));
  encode_vq_token(L, enc, Side::key, 1, heads, x1, vq_token_scale(heads, x1));
  EXPECT_EQ(enc, page);
  float xh[4];
  decode_vq_token(L, enc, Side::key, 1, heads, xh);
  EXPECT_EQ(std::vector<float>(xh, xh + 4), std::vector<float>({31, 0, 1, 0}));
  const float tie[] = {5, 0, 0, 0};
  encode_vq_token(L, enc, Side::key, 2, heads, tie, 1.0f);
  read_vq_indices(L, enc, 0, Side::key, 2, r);
  EXPECT_EQ(r[0], 5);
  EXPECT_EQ(r[1], 0);
}

// 10-bit indices straddle bytes: slot 0 = (0x3FF, 0x001, 0x2AA) → stream
// bits 0–9 ones, bit 10 one, bits 21, 23, 25, 27, 29 ones → FF 07 A0 2A.
TEST(PackedVqFormat, GoldenBytesTenBitIndices) {
  const VqLayerLayout L(6, 1, VqSideSpec{VqSideKind::vq, 3, 10, false}, VqSideSpec{});
  EXPECT_EQ(L.segment_bytes(Side::key), 240u);  // 8·3·10 = 240, a multiple of 16
  std::vector<uint8_t> page(L.page_bytes(), 0);
  const int32_t z[] = {0x3FF, 0x001, 0x2AA};
  write_vq_indices(L, page, 0, Side::key, 0, z);
  const uint8_t want[] = {0xFF, 0x07, 0xA0, 0x2A};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(page[i], want[i]) << "byte " << i;
  for (size_t i = 4; i < page.size(); ++i) EXPECT_EQ(page[i], 0) << "byte " << i;
}

// Shared scale: two KV heads with RMS 2 over all 8 values → fp16 2.0 =
// 0x4000 at byte 2·slot of the key scale array, after both head segments.
TEST(PackedVqFormat, SharedScaleIsOnePerTokenPerLayer) {
  const int d = 4, H = 2;
  const VqLayerLayout L(d, H, VqSideSpec{VqSideKind::vq, 2, 3, true}, VqSideSpec{VqSideKind::fp16, 0, 0, false});
  EXPECT_EQ(L.segment_bytes(Side::key), 48u);    // 8·2·3
  EXPECT_EQ(L.segment_bytes(Side::value), 512u); // 128·d
  EXPECT_EQ(L.segment_offset(1, Side::key), 48u + 512u);
  EXPECT_EQ(L.scale_offset(Side::key), 2 * (48u + 512u));
  EXPECT_EQ(L.page_bytes(), 2 * (48u + 512u) + 128u);
  EXPECT_THROW(L.scale_offset(Side::value), Error);
  const Codec c = vq_codec(d, 2, 3, true, H, iota(d));
  std::vector<float> cb(2 * 8 * 2);
  for (int gi = 0; gi < 2; ++gi)
    for (int j = 0; j < 8; ++j) {
      cb[(gi * 8 + j) * 2] = 0.5f * (j - 4);
      cb[(gi * 8 + j) * 2 + 1] = gi == 0 ? -0.5f * (j - 4) : 0.5f * (j - 4);
    }
  const VqCodec a(c, d, cb, {}), b(c, d, cb, {});
  const VqCodec* heads[] = {&a, &b};
  const float x[] = {2, -2, 2, 2, -1, 1, 1, 1};  // Σ x² = 16 + 4 = 20 over 8 values
  const float s = vq_token_scale(heads, x);
  EXPECT_EQ(s, round_fp16(std::sqrt(20.0f / 8.0f)));
  const float x2[] = {2, -2, 2, 2, -2, 2, 2, 2};  // RMS 2 exactly
  std::vector<uint8_t> page(L.page_bytes(), 0);
  encode_vq_token(L, page, Side::key, 5, heads, x2, vq_token_scale(heads, x2));
  EXPECT_EQ(page[L.scale_offset(Side::key) + 10], 0x00);
  EXPECT_EQ(page[L.scale_offset(Side::key) + 11], 0x40);
  EXPECT_EQ(read_vq_scale(L, page, Side::key, 5), 0x4000);
  // x/s = (1, −1, 1, 1) / (−1, 1, 1, 1): group 0 centroid j = (0.5(j−4), −0.5(j−4)) → j = 6 / 2;
  // group 1 centroid (0.5(j−4), 0.5(j−4)) → j = 6.
  int32_t z[2];
  read_vq_indices(L, page, 0, Side::key, 5, z);
  EXPECT_EQ(z[0], 6);
  EXPECT_EQ(z[1], 6);
  read_vq_indices(L, page, 1, Side::key, 5, z);
  EXPECT_EQ(z[0], 2);
  EXPECT_EQ(z[1], 6);
  float xh[8];
  decode_vq_token(L, page, Side::key, 5, heads, xh);
  EXPECT_EQ(std::vector<float>(xh, xh + 8), std::vector<float>(x2, x2 + 8));
  // fp16 rows round trip.
  std::vector<uint16_t> row = {0x3C00, 0xBC00, 0x0001, 0x7BFF}, back(4);
  write_fp16_row(L, page, 1, Side::value, 63, row);
  read_fp16_row(L, page, 1, Side::value, 63, back);
  EXPECT_EQ(back, row);
  const size_t at = L.segment_offset(1, Side::value) + 2 * 63 * d;
  EXPECT_EQ(page[at], 0x00);
  EXPECT_EQ(page[at + 1], 0x3C);
  EXPECT_EQ(page[at + 6], 0xFF);
  EXPECT_EQ(page[at + 7], 0x7B);
}

// Awkward widths (1, 5, 10, 13 bits; G·bits odd at 5 and 13, so segments are
// padded) and lengths 1, 97, 200 (not multiples of a page): T tokens written
// by the reference encoder into ⌈T/64⌉ pages pre-filled with random bytes, in
// shuffled order (only a token's own bits change), read back: the indices and
// scales equal vq_fake_quant_layer's bit for bit, the decoded vectors equal
// its output bit for bit, on both sides (keys with a shared scale and
// channel weights, values without).
TEST(PackedVqFormat, AwkwardWidthsMatchFakeQuantBitExact) {
  const int d = 12, g = 4, G = 3, H = 3;
  for (int bits : {1, 5, 10, 13})
    for (int64_t T : {1, 97, 200}) {
      SCOPED_TRACE(testing::Message() << "bits " << bits << ", T " << T);
      const int K = 1 << bits;
      std::mt19937 rng(static_cast<uint32_t>(bits * 1000 + T));
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::uniform_real_distribution<float> ud(0.4f, 2.5f);
      std::vector<int> perm = iota(d);
      std::shuffle(perm.begin(), perm.end(), rng);
      std::vector<std::unique_ptr<VqCodec>> kc, vc;
      for (int h = 0; h < H; ++h) {
        std::vector<float> cb(static_cast<size_t>(G) * K * g), a(d);
        for (float& v : cb) v = nd(rng);
        for (float& v : a) v = ud(rng);
        kc.push_back(std::make_unique<VqCodec>(vq_codec(d, g, bits, true, H, perm), d, cb, a));
        for (float& v : cb) v = 3.0f * nd(rng);
        vc.push_back(std::make_unique<VqCodec>(vq_codec(d, g, bits, false, 0, iota(d)), d, cb,
                                               std::span<const float>{}));
      }
      const auto kh = ptrs(kc), vh = ptrs(vc);
      std::vector<float> xk(T * H * d), xv(T * H * d);
      for (int64_t i = 0; i < T * H * d; ++i) {
        xk[i] = 1.7f * nd(rng) + 0.2f;
        xv[i] = 2.5f * nd(rng);
      }
      std::vector<float> fk(xk.size()), fv(xv.size()), sk(T), sv(T);
      std::vector<int32_t> zk(T * H * G), zv(T * H * G);
      cache::vq_fake_quant_layer(kh, xk.data(), T, fk.data(), zk.data(), sk.data());
      cache::vq_fake_quant_layer(vh, xv.data(), T, fv.data(), zv.data(), sv.data());

      const VqLayerLayout L(d, H, VqSideSpec{VqSideKind::vq, G, bits, true}, VqSideSpec{VqSideKind::vq, G, bits, false});
      const size_t seg = (static_cast<size_t>(8) * G * bits + 15) / 16 * 16;
      ASSERT_EQ(L.segment_bytes(Side::key), seg);
      ASSERT_EQ(L.page_bytes(), H * 2 * seg + 128);
      const int64_t n_pages = (T + kPageTokens - 1) / kPageTokens;
      std::vector<std::vector<uint8_t>> pages(n_pages, std::vector<uint8_t>(L.page_bytes()));
      for (auto& p : pages)
        for (auto& b : p) b = static_cast<uint8_t>(rng());
      std::vector<int64_t> order(T);
      for (int64_t t = 0; t < T; ++t) order[t] = t;
      std::shuffle(order.begin(), order.end(), rng);
      for (int64_t t : order) {
        auto& pg = pages[t / kPageTokens];
        const int slot = static_cast<int>(t % kPageTokens);
        const float* xkt = xk.data() + t * H * d;
        const float* xvt = xv.data() + t * H * d;
        encode_vq_token(L, pg, Side::key, slot, kh, xkt, vq_token_scale(kh, xkt));
        encode_vq_token(L, pg, Side::value, slot, vh, xvt, vq_token_scale(vh, xvt));
      }
      std::vector<int32_t> z(G);
      std::vector<float> xh(H * d);
      int64_t mismatches = 0;
      for (int64_t t = 0; t < T; ++t) {
        const auto& pg = pages[t / kPageTokens];
        const int slot = static_cast<int>(t % kPageTokens);
        EXPECT_EQ(fp16_to_fp32(read_vq_scale(L, pg, Side::key, slot)), sk[t]);
        for (int s = 0; s < 2; ++s) {
          const Side side = static_cast<Side>(s);
          const auto& zz = s == 0 ? zk : zv;
          for (int h = 0; h < H; ++h) {
            read_vq_indices(L, pg, h, side, slot, z);
            for (int gi = 0; gi < G; ++gi) mismatches += z[gi] != zz[(t * H + h) * G + gi];
          }
          decode_vq_token(L, pg, side, slot, s == 0 ? kh : vh, xh.data());
          const auto& f = s == 0 ? fk : fv;
          for (int i = 0; i < H * d; ++i) mismatches += xh[i] != f[t * H * d + i];
        }
      }
      EXPECT_EQ(mismatches, 0);
    }
}

// Exact bytes per token (docs/packed_format.md §7.3), SmolLM2 shapes.
TEST(PackedVqFormat, BytesPerTokenArithmetic) {
  // TaSQ g 8, K 1024: 3 heads · 8 indices · 10 bits = 30 B + 2 B shared scale.
  const VqLayerLayout tasq(64, 3, VqSideSpec{VqSideKind::vq, 8, 10, true}, VqSideSpec{});
  EXPECT_DOUBLE_EQ(tasq.bytes_per_token(), 32.0);
  EXPECT_EQ(tasq.page_bytes(), size_t(32 * 64));  // no padding: 640 B per head segment
  EXPECT_DOUBLE_EQ(8.0 * tasq.bytes_per_token() / (3 * 64), 1.0 + 1.0 / 3.0);  // effective bits
  // TaSQ g 4, K 32: 16 indices · 5 bits = 10 B per head: also 32 B.
  const VqLayerLayout g4(64, 3, VqSideSpec{VqSideKind::vq, 16, 5, true}, VqSideSpec{});
  EXPECT_DOUBLE_EQ(g4.bytes_per_token(), 32.0);
  EXPECT_EQ(g4.page_bytes(), size_t(32 * 64));
  // CQ keys + fp16 values: 30 + 3·128.
  const VqLayerLayout cq(64, 3, VqSideSpec{VqSideKind::vq, 8, 10, false}, VqSideSpec{VqSideKind::fp16, 0, 0, false});
  EXPECT_DOUBLE_EQ(cq.bytes_per_token(), 30.0 + 384.0);
  EXPECT_EQ(cq.page_bytes(), size_t((30 + 384) * 64));
  // Padding: G 3 · 5 bits = 15 bits per token → 120 B per page, padded to 128.
  const VqLayerLayout odd(12, 1, VqSideSpec{VqSideKind::vq, 3, 5, false}, VqSideSpec{});
  EXPECT_DOUBLE_EQ(odd.bytes_per_token(), 15.0 / 8.0);
  EXPECT_EQ(odd.page_bytes(), 128u);
  const VqLayerLayout none(64, 3, VqSideSpec{}, VqSideSpec{});
  EXPECT_TRUE(none.empty());
}

TEST(PackedVqFormat, BadInputIsAnError) {
  EXPECT_THROW(VqLayerLayout(64, 3, VqSideSpec{VqSideKind::vq, 8, 17, false}, VqSideSpec{}), Error);
  EXPECT_THROW(VqLayerLayout(64, 3, VqSideSpec{VqSideKind::vq, 8, 0, false}, VqSideSpec{}), Error);
  EXPECT_THROW(VqLayerLayout(64, 3, VqSideSpec{VqSideKind::vq, 0, 4, false}, VqSideSpec{}), Error);
  EXPECT_THROW(VqLayerLayout(64, 3, VqSideSpec{VqSideKind::fp16, 8, 4, false}, VqSideSpec{}), Error);
  EXPECT_THROW(VqLayerLayout(0, 3, VqSideSpec{}, VqSideSpec{}), Error);
  const VqLayerLayout L(4, 1, VqSideSpec{VqSideKind::vq, 2, 5, false}, VqSideSpec{});
  std::vector<uint8_t> page(L.page_bytes(), 0);
  const int32_t big[] = {32, 0}, neg[] = {-1, 0}, one[] = {1};
  EXPECT_THROW(write_vq_indices(L, page, 0, Side::key, 0, big), Error);
  EXPECT_THROW(write_vq_indices(L, page, 0, Side::key, 0, neg), Error);
  EXPECT_THROW(write_vq_indices(L, page, 0, Side::key, 0, one), Error);       // wrong count
  EXPECT_THROW(write_vq_indices(L, page, 0, Side::key, 64, big), Error);      // slot
  EXPECT_THROW(write_vq_indices(L, page, 1, Side::key, 0, big), Error);       // head
  EXPECT_THROW(write_vq_indices(L, page, 0, Side::value, 0, big), Error);     // not vq
  std::vector<uint8_t> small(10);
  EXPECT_THROW(write_vq_indices(L, small, 0, Side::key, 0, big), Error);      // page size
  // A codec whose width differs from the layout.
  const Codec c = vq_codec(4, 2, 4, false, 1, iota(4));
  const std::vector<float> cb(2 * 16 * 2, 1.0f);
  const VqCodec codec(c, 4, cb, {});
  const VqCodec* heads[] = {&codec};
  const float x[] = {1, 2, 3, 4};
  EXPECT_THROW(encode_vq_token(L, page, Side::key, 0, heads, x, 1.0f), Error);
}
