// DenseKVCache: attention against a naive float64 reference (GQA, causal by
// position, sliding window, softcap), decode and prefill paths, errors, bytes,
// and the transform() hook.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ratekv/common/error.h"
#include "ratekv/model/kv_cache.h"

using namespace ratekv;

namespace {

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.2f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(g);
  return v;
}

// Naive attention of queries (n, H, d) at positions qpos over keys/values
// (T, Hkv, d) at positions kpos.
std::vector<double> naive_attention(const KVCacheShape& s, const std::vector<float>& q, const std::vector<int32_t>& qpos,
                                    const std::vector<float>& k, const std::vector<float>& v,
                                    const std::vector<int32_t>& kpos, const AttnParams& p) {
  const int H = s.n_heads, Hkv = s.n_kv_heads, d = s.head_dim, r = H / Hkv;
  const size_t n = qpos.size(), T = kpos.size();
  std::vector<double> out(n * H * d, 0.0);
  for (size_t i = 0; i < n; ++i) {
    for (int h = 0; h < H; ++h) {
      const int hk = h / r;
      std::vector<double> sc;
      std::vector<size_t> idx;
      for (size_t j = 0; j < T; ++j) {
        if (kpos[j] > qpos[i]) continue;
        if (p.sliding_window > 0 && kpos[j] <= qpos[i] - p.sliding_window) continue;
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += double{q[(i * H + h) * d + c]} * k[(j * Hkv + hk) * d + c];
        dot *= p.scale;
        if (p.softcap > 0) dot = p.softcap * std::tanh(dot / p.softcap);
        sc.push_back(dot);
        idx.push_back(j);
      }
      double mx = -1e300, sum = 0;
      for (double x : sc) mx = std::max(mx, x);
      for (double& x : sc) sum += (x = std::exp(x - mx));
      for (size_t t = 0; t < sc.size(); ++t) {
        for (int c = 0; c < d; ++c) out[(i * H + h) * d + c] += sc[t] / sum * v[(idx[t] * Hkv + hk) * d + c];
      }
    }
  }
  return out;
}

struct Case {
  int H, Hkv, d;
  int64_t prefix, n;  // tokens appended before, then n new tokens appended + attended
  int64_t window;
  float softcap;
};

void run_case(const Case& c) {
  KVCacheShape s{2, c.H, c.Hkv, c.d, 4096};
  DenseKVCache cache(s);
  const int64_t T = c.prefix + c.n;
  const int layer = 1;
  // Positions with gaps (strictly increasing, not contiguous).
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(3 + t + t / 7);
  auto k = randn(T * c.Hkv * c.d, 1 + c.d), v = randn(T * c.Hkv * c.d, 2 + c.d);
  auto kpre = randn(T * c.Hkv * c.d, 3);
  const int64_t row = int64_t{c.Hkv} * c.d;
  if (c.prefix > 0) cache.append(layer, c.prefix, pos.data(), kpre.data(), k.data(), v.data());
  cache.append(layer, c.n, pos.data() + c.prefix, kpre.data() + c.prefix * row, k.data() + c.prefix * row,
               v.data() + c.prefix * row);
  auto q = randn(c.n * c.H * c.d, 4 + c.H);
  std::vector<float> out(c.n * c.H * c.d, -7.0f);
  AttnParams p;
  p.scale = 1.0f / std::sqrt(float(c.d));
  p.sliding_window = c.window;
  p.softcap = c.softcap;
  cache.attend(layer, c.n, pos.data() + c.prefix, q.data(), out.data(), p);
  std::vector<int32_t> qpos(pos.begin() + c.prefix, pos.end());
  auto ref = naive_attention(s, q, qpos, k, v, pos, p);
  double maxerr = 0;
  for (size_t i = 0; i < out.size(); ++i) maxerr = std::max(maxerr, std::fabs(out[i] - ref[i]));
  EXPECT_LT(maxerr, 2e-5) << "H=" << c.H << " Hkv=" << c.Hkv << " d=" << c.d << " prefix=" << c.prefix
                          << " n=" << c.n << " window=" << c.window << " softcap=" << c.softcap;
  EXPECT_EQ(cache.n_tokens(), 0);  // layer 0 is untouched
  EXPECT_EQ(cache.bytes(), size_t(T) * (2 * row * sizeof(float) + sizeof(int32_t)));
}

}  // namespace

TEST(DenseKVCache, MatchesNaiveAttention) {
  // Decode path (n < 16) and prefill path (n >= 16), awkward lengths.
  for (const Case& c : std::vector<Case>{
           {1, 1, 2, 0, 1, 0, 0},      {9, 3, 64, 0, 1, 0, 0},      {9, 3, 64, 96, 1, 0, 0},
           {9, 3, 64, 0, 97, 0, 0},    {4, 2, 16, 30, 67, 0, 0},    {9, 3, 64, 10, 130, 0, 0},
           {4, 1, 32, 50, 3, 20, 0},   {4, 1, 32, 50, 70, 20, 0},   {4, 4, 8, 5, 40, 0, 2.5f},
           {6, 2, 24, 0, 5, 3, 30.0f}, {8, 2, 256, 20, 100, 33, 50.0f}}) {
    run_case(c);
  }
}

TEST(DenseKVCache, DecodeAndPrefillAgree) {
  // Attending 20 queries at once (prefill path) equals 20 single-query calls.
  KVCacheShape s{1, 6, 2, 32, 200};
  DenseKVCache a(s), b(s);
  const int64_t T = 20, row = 2 * 32;
  auto k = randn(T * row, 5), v = randn(T * row, 6), q = randn(T * 6 * 32, 7);
  std::vector<int32_t> pos(T);
  for (int t = 0; t < T; ++t) pos[t] = t;
  AttnParams p;
  p.scale = 0.2f;
  std::vector<float> oa(T * 6 * 32), ob(T * 6 * 32);
  a.append(0, T, pos.data(), k.data(), k.data(), v.data());
  a.attend(0, T, pos.data(), q.data(), oa.data(), p);
  for (int t = 0; t < T; ++t) {
    b.append(0, 1, pos.data() + t, k.data() + t * row, k.data() + t * row, v.data() + t * row);
    b.attend(0, 1, pos.data() + t, q.data() + t * 6 * 32, ob.data() + t * 6 * 32, p);
  }
  for (size_t i = 0; i < oa.size(); ++i) ASSERT_NEAR(oa[i], ob[i], 1e-5) << i;
}

TEST(DenseKVCache, Errors) {
  KVCacheShape s{2, 4, 2, 8, 5};
  DenseKVCache c(s);
  auto x = randn(10 * 16, 1);
  std::vector<int32_t> pos{0, 1, 2, 3, 4, 5};
  EXPECT_THROW(c.append(2, 1, pos.data(), x.data(), x.data(), x.data()), Error);   // layer
  EXPECT_THROW(c.append(0, 6, pos.data(), x.data(), x.data(), x.data()), Error);   // capacity
  c.append(0, 3, pos.data(), x.data(), x.data(), x.data());
  EXPECT_THROW(c.append(0, 1, pos.data() + 2, x.data(), x.data(), x.data()), Error);  // non-increasing
  EXPECT_THROW(c.append(0, 3, pos.data() + 3, x.data(), x.data(), x.data()), Error);  // 3 + 3 > 5
  std::vector<float> out(4 * 8);
  AttnParams p;
  p.scale = 0.5f;
  EXPECT_THROW(c.attend(1, 1, pos.data(), x.data(), out.data(), p), Error);  // layer 1 empty
  AttnParams bad;
  EXPECT_THROW(c.attend(0, 1, pos.data(), x.data(), out.data(), bad), Error);  // scale 0
  EXPECT_THROW(DenseKVCache(KVCacheShape{1, 3, 2, 8, 5}), Error);                // 2 ∤ 3
  c.clear();
  EXPECT_EQ(c.n_tokens(), 0);
  EXPECT_EQ(c.bytes(), 0u);
}

namespace {
// A subclass that negates V on the way in: attention output must be negated.
class NegateV : public DenseKVCache {
 public:
  using DenseKVCache::DenseKVCache;
  int calls = 0;

 protected:
  void transform(int, int64_t n, const int32_t*, float*, float*, float* v) override {
    ++calls;
    for (int64_t i = 0; i < n * shape_.n_kv_heads * shape_.head_dim; ++i) v[i] = -v[i];
  }
};
}  // namespace

TEST(DenseKVCache, TransformHook) {
  KVCacheShape s{1, 2, 1, 4, 10};
  DenseKVCache plain(s);
  NegateV neg(s);
  auto k = randn(3 * 4, 9), v = randn(3 * 4, 10), q = randn(3 * 2 * 4, 11);
  std::vector<int32_t> pos{0, 1, 2};
  AttnParams p;
  p.scale = 0.5f;
  std::vector<float> o1(3 * 2 * 4), o2(3 * 2 * 4);
  plain.append(0, 3, pos.data(), k.data(), k.data(), v.data());
  neg.append(0, 3, pos.data(), k.data(), k.data(), v.data());
  plain.attend(0, 3, pos.data(), q.data(), o1.data(), p);
  neg.attend(0, 3, pos.data(), q.data(), o2.data(), p);
  EXPECT_EQ(neg.calls, 1);
  for (size_t i = 0; i < o1.size(); ++i) {
    EXPECT_NE(o1[i], 0.0f);
    EXPECT_FLOAT_EQ(o2[i], -o1[i]);
  }
}
