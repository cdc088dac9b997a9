// tests/support/packed_plans.h — packed layouts, rotations, codebooks, page
// tables and random pages for the tests of the packed kernels (tests/cuda)
// and of their named CPU references (tests/ref).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "ratekv/common/fp16.h"
#include "ratekv/format/packed_format.h"
#include "ratekv/quant/lloyd_max.h"
#include "ratekv/ref/decode_batch.h"
#include "ratekv/ref/packed_plan.h"

namespace ratekv_test {

using ratekv::packed::GroupSpec;
using ratekv::packed::HeadSpec;
using ratekv::packed::LayerLayout;

/// Haar-random orthogonal m×m (Gram–Schmidt on a Gaussian matrix), row-major.
inline std::vector<float> random_rotation(int m, std::mt19937& rng) {
  std::normal_distribution<double> N;
  std::vector<double> a((size_t)m * m);
  for (auto& x : a) x = N(rng);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < i; ++j) {
      double d = 0;
      for (int k = 0; k < m; ++k) d += a[(size_t)i * m + k] * a[(size_t)j * m + k];
      for (int k = 0; k < m; ++k) a[(size_t)i * m + k] -= d * a[(size_t)j * m + k];
    }
    double n = 0;
    for (int k = 0; k < m; ++k) n += a[(size_t)i * m + k] * a[(size_t)i * m + k];
    n = std::sqrt(n);
    for (int k = 0; k < m; ++k) a[(size_t)i * m + k] /= n;
  }
  return std::vector<float>(a.begin(), a.end());
}

/// A random signed permutation (orthogonal, entries 0 and ±1), row-major:
/// rotating by it is exact in any precision.
inline std::vector<float> signed_permutation(int m, std::mt19937& rng) {
  std::vector<int> p(m);
  std::iota(p.begin(), p.end(), 0);
  std::shuffle(p.begin(), p.end(), rng);
  std::vector<float> r((size_t)m * m, 0.f);
  for (int j = 0; j < m; ++j) r[(size_t)j * m + p[j]] = (rng() & 1) ? -1.f : 1.f;
  return r;
}

/// Ascending levels roughly on the scale of a rotated unit vector's coordinate.
inline std::vector<float> test_levels(int m, int bits, std::mt19937& rng) {
  const int n = 1 << bits;
  std::uniform_real_distribution<float> jitter(-0.2f, 0.2f);
  std::vector<float> l(n);
  for (int i = 0; i < n; ++i) l[i] = (2.f * i + 1.f - n + jitter(rng)) / n * 2.5f / std::sqrt((float)m);
  return l;
}

/// Block-GTQ-like keys: RoPE pairs shuffled into groups of widths 2..4
/// (sizes not multiples of 16: padded); values one 3-bit group.
inline HeadSpec mixed_head(int d, std::mt19937& rng) {
  std::vector<int> blocks(d / 2);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  const int nb = d / 2;
  const int cuts[4] = {0, nb / 4 + 1, nb / 2 + 3, nb};
  HeadSpec h;
  for (int g = 0; g < 3; ++g) {
    GroupSpec G;
    G.bits = 2 + g;
    for (int b = cuts[g]; b < cuts[g + 1]; ++b) {
      G.channels.push_back(2 * blocks[b]);
      G.channels.push_back(2 * blocks[b] + 1);
    }
    h.key.push_back(G);
  }
  GroupSpec all;
  for (int c = 0; c < d; ++c) all.channels.push_back(c);
  all.bits = 3;
  h.value = {all};
  return h;
}

/// Layouts the tensor-core kernels do not assume (special_head):
///  zero_bit: head h % 3 == 0 has no key groups (scores 0), == 1 no value groups
///            (output 0), == 2 covers only part of each side (0-bit channels);
///  wide:     5..8-bit groups (low nibble in the pages, high bits in the
///            extension pages, docs/packed_format.md §5) beside 3-bit ones;
///  groups:   three key groups (1, 4, 2 bits) and three value groups (4, 1,
///            2 bits) per head, sizes not multiples of 16 (head_dim 256: 16
///            tiles, none padded), odd tile counts at every head_dim (the
///            general int8 instance's per-group loops on both sides);
///  value_groups: one 3-bit key group over the head (a uniform key side)
///            and the value groups of `groups`;
///  key_groups: the key groups of `groups` and one value group over the
///            head of 1 + h % 4 bits (Block-GTQ / RateQuant's shape: the
///            general int8 instance with the value tiles at compile time).
enum class Special { none, zero_bit, wide, groups, value_groups, key_groups };

inline HeadSpec special_head(int d, int h, Special sp, std::mt19937& rng) {
  std::vector<int> perm(d);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  auto group = [&](int lo, int hi, int bits) {
    GroupSpec G;
    G.bits = bits;
    for (int i = lo; i < hi; ++i) G.channels.push_back(perm[i]);
    return G;
  };
  HeadSpec H;
  const int o = d == 256 ? 0 : 1;  // head_dim 256: 16 tiles at most, so no padded groups
  if (sp == Special::groups || sp == Special::value_groups || sp == Special::key_groups) {
    // Cut points: head_dim 64 / 128 keys 11+21+32 / 19+45+64 channels (1+2+2 / 2+3+4
    // padded tiles), values 21+27+16 / 37+59+32; head_dim 256 (16 tiles at most:
    // none padded) keys 48+80+128 (3+5+8 tiles), values 48+112+96 (3+7+6).
    const int k1 = o ? d / 8 + 3 : 48, k2 = o ? d / 2 : 128, v1 = o ? d / 4 + 5 : 48, v2 = o ? 3 * d / 4 : 160;
    if (sp == Special::value_groups)
      H.key = {group(0, d, 3)};
    else
      H.key = {group(0, k1, 1), group(k1, k2, 4), group(k2, d, 2)};
    if (sp == Special::key_groups)
      H.value = {group(0, d, 1 + h % 4)};
    else
      H.value = {group(0, v1, 4), group(v1, v2, 1), group(v2, d, 2)};
  } else if (sp == Special::zero_bit) {
    if (h % 3 == 0) H.value = {group(0, d, 3)};
    if (h % 3 == 1) H.key = {group(0, d / 2 + 6 * o, 2), group(d / 2 + 6 * o, d, 4)};
    if (h % 3 == 2) {
      H.key = {group(0, d / 4 + 2 * o, 2), group(d / 4 + 2 * o, d / 2, 3)};  // channels ≥ d/2 at 0 bits
      H.value = {group(d / 8, d, 4)};
    }
  } else {  // wide: effective widths in GroupSpec::bits (> 4 allowed here)
    H.key = {group(0, d / 2 + 10 * o, 5 + h % 4), group(d / 2 + 10 * o, d, 3)};
    H.value = {group(0, d, h % 2 ? 8 : 6)};
  }
  return H;
}

/// A packed layer's layout with its rotations and codebooks in the order
/// cuda::PackedPlan and ref::PackedPlan take them.
struct PackedTestPlan {
  std::unique_ptr<LayerLayout> layout;
  std::unique_ptr<LayerLayout> ext;  // high bits of 5..8-bit groups (Special::wide)
  std::vector<float> rot, lvl;
  /// [h · 2 + side][group]: the code width (5..8 for a wide group, whose high
  /// part is the next group of that side in `ext`).
  std::vector<std::vector<int>> bits;
  ratekv::ref::PackedPlan ref(int n_heads) const {
    return ext ? ratekv::ref::PackedPlan(*layout, *ext, n_heads, rot, lvl)
               : ratekv::ref::PackedPlan(*layout, n_heads, rot, lvl);
  }
};

enum class Rotations { haar, signed_permutation };

/// hkv KV heads of head_dim d: special heads (sp), mixed_head (mixed) or
/// uniform K kb / V vb. lloyd_max: the TurboQuant-MSE codebooks
/// (quant::lloyd_max_codebook) instead of random ascending levels.
inline PackedTestPlan make_plan(int d, int hkv, bool mixed, int kb, int vb, std::mt19937& rng,
                                Special sp = Special::none, bool lloyd_max = false,
                                Rotations rotations = Rotations::haar) {
  using ratekv::packed::kMaxBits;
  PackedTestPlan P;
  std::vector<HeadSpec> heads, main_heads, ext_heads(hkv);
  for (int h = 0; h < hkv; ++h)
    heads.push_back(sp != Special::none ? special_head(d, h, sp, rng)
                    : mixed           ? mixed_head(d, rng)
                                      : LayerLayout::uniform(d, 1, kb, vb).spec(0));
  main_heads = heads;
  P.bits.assign((size_t)hkv * 2, {});
  for (int h = 0; h < hkv; ++h)
    for (int s = 0; s < 2; ++s)
      for (GroupSpec& G : s == 0 ? main_heads[h].key : main_heads[h].value) {
        P.bits[(size_t)h * 2 + s].push_back(G.bits);
        if (G.bits > kMaxBits) {
          (s == 0 ? ext_heads[h].key : ext_heads[h].value).push_back({G.channels, G.bits - kMaxBits});
          G.bits = kMaxBits;
        }
      }
  P.layout = std::make_unique<LayerLayout>(d, main_heads);
  if (sp == Special::wide) P.ext = std::make_unique<LayerLayout>(d, ext_heads);
  for (int h = 0; h < hkv; ++h)
    for (int s = 0; s < 2; ++s)
      for (const GroupSpec& G : s == 0 ? heads[h].key : heads[h].value) {
        const int m = (int)G.channels.size();
        auto R = rotations == Rotations::haar ? random_rotation(m, rng) : signed_permutation(m, rng);
        P.rot.insert(P.rot.end(), R.begin(), R.end());
        auto L = lloyd_max ? ratekv::quant::lloyd_max_codebook(m, G.bits).levels : test_levels(m, G.bits, rng);
        P.lvl.insert(P.lvl.end(), L.begin(), L.end());
      }
  return P;
}

/// Page table and lengths of a batch: every sequence owns max_pages shuffled
/// physical pages (room for extra_tokens more tokens).
struct TestBatch {
  std::vector<int32_t> lens, page_table;
  int max_pages = 0, n_pages = 0, max_len = 0;
  ratekv::ref::DecodeBatch ref() const { return {page_table, max_pages, lens}; }
};

inline TestBatch make_batch(const std::vector<int>& lens, std::mt19937& rng, int extra_tokens = 0) {
  using ratekv::packed::kPageTokens;
  TestBatch B;
  B.lens.assign(lens.begin(), lens.end());
  for (int l : lens) {
    B.max_len = std::max(B.max_len, l);
    B.max_pages = std::max(B.max_pages, (l + extra_tokens + kPageTokens - 1) / kPageTokens);
  }
  B.n_pages = B.max_pages * (int)lens.size();
  std::vector<int32_t> perm(B.n_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  B.page_table = perm;  // (batch, max_pages)
  return B;
}

/// n_pages pages of L: random bytes (every bit pattern is a valid code),
/// then valid fp16 norms in [0.5, 2) in every group's slots.
inline std::vector<uint8_t> random_pages(const LayerLayout& L, int n_pages, std::mt19937& rng) {
  using namespace ratekv::packed;
  HostPagePool pool{&L, std::vector<uint8_t>((size_t)n_pages * L.page_bytes())};
  for (auto& x : pool.bytes) x = (uint8_t)rng();
  std::uniform_real_distribution<float> U(0.5f, 2.f);
  for (int p = 0; p < n_pages; ++p)
    for (int h = 0; h < L.n_kv_heads(); ++h)
      for (Side s : {Side::key, Side::value})
        for (int g = 0; g < (int)L.head(h).side(s).size(); ++g)
          for (int t = 0; t < kPageTokens; ++t) write_norm(L, pool.page(p), h, s, g, t, ratekv::fp32_to_fp16(U(rng)));
  return pool.bytes;
}

/// Relative L2 error of a[off, off + n) against ref (∞ on a non-finite a).
template <typename A, typename R>
double rel_err(const std::vector<A>& a, const std::vector<R>& ref, size_t off, size_t n) {
  double e = 0, r = 0;
  for (size_t i = off; i < off + n; ++i) {
    if (!std::isfinite((double)a[i])) return INFINITY;
    e += ((double)a[i] - (double)ref[i]) * ((double)a[i] - (double)ref[i]);
    r += (double)ref[i] * (double)ref[i];
  }
  return std::sqrt(e / r);
}

}  // namespace ratekv_test
