// CUDA decode attention (packed and fp16) and quantize-append against CPU
// references that round their inputs the way the kernels do (fp16 rotated
// query, fp16 levels — int8 key levels for the uniform kernel — fp16 K/V), on
// random pages and on real SmolLM2 K/V/Q (RATEKV_CUDA_CAPTURE). Needs a GPU:
// skips when none is visible.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <random>

#include "ratekv/cuda/decode_attention.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/io/npy.h"
#include "ratekv/format/packed_format.h"
#include "ratekv/quant/lloyd_max.h"

using namespace ratekv;
using namespace ratekv::packed;
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

// Haar-random orthogonal m×m (Gram–Schmidt on a Gaussian matrix), row-major.
std::vector<float> random_rotation(int m, std::mt19937& rng) {
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

// Ascending levels roughly on the scale of a rotated unit vector's coordinate.
std::vector<float> test_levels(int m, int bits, std::mt19937& rng) {
  const int n = 1 << bits;
  std::uniform_real_distribution<float> jitter(-0.2f, 0.2f);
  std::vector<float> l(n);
  for (int i = 0; i < n; ++i)
    l[i] = (2.f * i + 1.f - n + jitter(rng)) / n * 2.5f / std::sqrt((float)m);
  return l;
}

// Block-GTQ-like keys: RoPE pairs shuffled into groups of widths 1..4 (sizes
// not multiples of 16: padded); values one uniform group.
HeadSpec mixed_head(int d, std::mt19937& rng) {
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

// Layouts the tensor-core kernels do not assume (test kinds of make_plan):
//  zero_bit: head h % 3 == 0 has no key groups (scores 0), == 1 no value groups
//            (output 0), == 2 covers only part of each side (0-bit channels);
//  wide:     5..8-bit groups (low nibble in the pages, high bits in the
//            extension pages, docs/packed_format.md §5) beside 3-bit ones.
enum class Special { none, zero_bit, wide };

HeadSpec special_head(int d, int h, Special sp, std::mt19937& rng) {
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
  if (sp == Special::zero_bit) {
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

struct Plan {
  std::unique_ptr<LayerLayout> layout;
  std::unique_ptr<LayerLayout> ext;  // high bits of 5..8-bit groups (Special::wide)
  std::vector<std::vector<int>> wide;  // per head·2+side: group -> effective bits (0: ≤ 4)
  std::vector<float> rot, lvl;
  // per head, side, group: offsets into rot / lvl
  std::vector<std::array<std::vector<size_t>, 2>> rot_at, lvl_at;
};

/// lloyd_max: the TurboQuant-MSE codebooks (Lloyd–Max levels of a rotated
/// unit vector's coordinate, quant::lloyd_max_codebook) instead of random
/// ascending levels (real data).
Plan make_plan(int d, int hkv, bool mixed, int kb, int vb, std::mt19937& rng,
               Special sp = Special::none, bool lloyd_max = false) {
  Plan P;
  std::vector<HeadSpec> heads, main_heads, ext_heads(hkv);
  for (int h = 0; h < hkv; ++h)
    heads.push_back(sp != Special::none ? special_head(d, h, sp, rng)
                    : mixed           ? mixed_head(d, rng)
                                      : LayerLayout::uniform(d, 1, kb, vb).spec(0));
  main_heads = heads;
  P.wide.assign((size_t)hkv * 2, {});
  for (int h = 0; h < hkv; ++h)
    for (int s = 0; s < 2; ++s) {
      auto& gs = s == 0 ? main_heads[h].key : main_heads[h].value;
      for (GroupSpec& G : gs) {
        P.wide[(size_t)h * 2 + s].push_back(G.bits > kMaxBits ? G.bits : 0);
        if (G.bits > kMaxBits) {
          (s == 0 ? ext_heads[h].key : ext_heads[h].value).push_back({G.channels, G.bits - kMaxBits});
          G.bits = kMaxBits;
        }
      }
    }
  P.layout = std::make_unique<LayerLayout>(d, main_heads);
  if (sp == Special::wide) P.ext = std::make_unique<LayerLayout>(d, ext_heads);
  P.rot_at.resize(hkv);
  P.lvl_at.resize(hkv);
  for (int h = 0; h < hkv; ++h)
    for (int s = 0; s < 2; ++s)
      for (const GroupSpec& G : s == 0 ? heads[h].key : heads[h].value) {
        const int m = (int)G.channels.size();
        P.rot_at[h][s].push_back(P.rot.size());
        auto R = random_rotation(m, rng);
        P.rot.insert(P.rot.end(), R.begin(), R.end());
        P.lvl_at[h][s].push_back(P.lvl.size());
        auto L = lloyd_max ? quant::lloyd_max_codebook(m, G.bits).levels : test_levels(m, G.bits, rng);
        P.lvl.insert(P.lvl.end(), L.begin(), L.end());
      }
  return P;
}

struct Batch {
  std::vector<int32_t> lens, page_table;
  int max_pages = 0, n_pages = 0, max_len = 0;
};

Batch make_batch(const std::vector<int>& lens, std::mt19937& rng, int extra_tokens = 0) {
  Batch B;
  B.lens.assign(lens.begin(), lens.end());
  for (int l : lens) {
    B.max_len = std::max(B.max_len, l);
    B.max_pages = std::max(B.max_pages, (l + extra_tokens + kPageTokens - 1) / kPageTokens);
  }
  B.n_pages = B.max_pages * (int)lens.size();
  std::vector<int32_t> perm(B.n_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  B.page_table = perm;  // (batch, max_pages): every sequence owns max_pages shuffled pages
  return B;
}

double rel_err(const std::vector<float>& a, const std::vector<double>& ref, size_t off, size_t n) {
  double e = 0, r = 0;
  for (size_t i = off; i < off + n; ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    e += (a[i] - ref[i]) * (a[i] - ref[i]);
    r += ref[i] * ref[i];
  }
  return std::sqrt(e / r);
}

/// Real activations of one layer (ratekv capture --queries): post-RoPE keys,
/// values and queries, head-major: k, v (hkv, n, d), q (hkv·gqa, n, d).
struct RealData {
  std::string name;
  int hkv = 0, gqa = 0, d = 0, n = 0;
  std::vector<float> k, v, q;
};

struct Case {
  int d, hkv, gqa;
  std::vector<int> lens;
  bool mixed;
  int kb, vb;
  DType q_dtype;
  Special sp = Special::none;
  /// Real data: pages written by packed_prefill from R's K/V (every sequence
  /// the captured tokens 0..len−1), sequence b's query = the captured query of
  /// its last token; plan codebooks Lloyd–Max.
  const RealData* real = nullptr;
};

std::string name(const Case& c) {
  std::string s = "d=" + std::to_string(c.d) + " hkv=" + std::to_string(c.hkv) +
                  " gqa=" + std::to_string(c.gqa) + (c.mixed ? " mixed" : " uniform K" +
                  std::to_string(c.kb) + "V" + std::to_string(c.vb)) +
                  (c.sp == Special::zero_bit ? " zero-bit sides" : c.sp == Special::wide ? " 5..8-bit groups" : "") +
                  (c.real ? " real " + c.real->name : "") + " lens=";
  for (int l : c.lens) s += std::to_string(l) + ",";
  return s;
}

void run_packed_case(const Case& c, uint32_t seed) {
  SCOPED_TRACE(name(c));
  std::mt19937 rng(seed);
  Plan P = make_plan(c.d, c.hkv, c.mixed, c.kb, c.vb, rng, c.sp, c.real != nullptr);
  const LayerLayout& L = *P.layout;
  const int hq = c.hkv * c.gqa, nb = (int)c.lens.size();
  Batch B = make_batch(c.lens, rng);
  std::unique_ptr<cuda::PackedPlan> plan_ptr =
      P.ext ? std::make_unique<cuda::PackedPlan>(L, *P.ext, hq, P.rot, P.lvl)
            : std::make_unique<cuda::PackedPlan>(L, hq, P.rot, P.lvl);
  const cuda::PackedPlan& plan = *plan_ptr;
  // Every bit pattern is a valid code: fill pages with random bytes, then
  // valid fp16 norms in [0.5, 2).
  HostPagePool pool{&L, std::vector<uint8_t>((size_t)B.n_pages * L.page_bytes())};
  for (auto& x : pool.bytes) x = (uint8_t)rng();
  std::uniform_real_distribution<float> U(0.5f, 2.f);
  for (int p = 0; p < B.n_pages; ++p)
    for (int h = 0; h < c.hkv; ++h)
      for (Side s : {Side::key, Side::value})
        for (int g = 0; g < (int)L.head(h).side(s).size(); ++g)
          for (int t = 0; t < kPageTokens; ++t)
            write_norm(L, pool.page(p), h, s, g, t, fp32_to_fp16(U(rng)));
  if (c.real) {  // real K/V quantized into the pages by the GPU prefill (slots past a length stay random)
    const RealData& R = *c.real;
    ASSERT_TRUE(R.hkv == c.hkv && R.gqa == c.gqa && R.d == c.d && R.n >= B.max_len);
    const int nt = B.max_len;
    std::vector<float> kx((size_t)nb * nt * c.hkv * c.d), vx(kx.size());
    for (int b = 0; b < nb; ++b)
      for (int i = 0; i < nt; ++i)
        for (int h = 0; h < c.hkv; ++h) {
          const size_t dst = (((size_t)b * nt + i) * c.hkv + h) * c.d, src = ((size_t)h * R.n + i) * c.d;
          std::copy_n(R.k.data() + src, c.d, kx.data() + dst);
          std::copy_n(R.v.data() + src, c.d, vx.data() + dst);
        }
    DevBuf<uint8_t> dp(pool.bytes);
    DevBuf<float> dk(kx), dv(vx);
    DevBuf<int32_t> dpt0(B.page_table), dlen0(std::vector<int32_t>(nb, 0));
    cuda::DecodeBatch pb{dpt0.p, B.max_pages, dlen0.p, nb, nt};
    cuda::packed_prefill(plan, pb, dp.p, dk.p, dv.p, nt, DType::f32, nullptr);
    CK(cudaDeviceSynchronize());
    pool.bytes = dp.get();
  }
  // Extension pages (high bits of 5..8-bit groups): random bytes, same page table.
  HostPagePool ext_pool{P.ext.get(), std::vector<uint8_t>(P.ext ? (size_t)B.n_pages * P.ext->page_bytes() : 0)};
  for (auto& x : ext_pool.bytes) x = (uint8_t)rng();
  std::normal_distribution<float> N;
  std::vector<float> q((size_t)nb * hq * c.d);
  for (auto& x : q) x = N(rng);
  if (c.real)
    for (int b = 0; b < nb; ++b)
      for (int qh = 0; qh < hq; ++qh)
        std::copy_n(c.real->q.data() + ((size_t)qh * c.real->n + c.lens[b] - 1) * c.d, c.d,
                    q.data() + ((size_t)b * hq + qh) * c.d);
  std::vector<uint16_t> q16(q.size());
  for (size_t i = 0; i < q.size(); ++i) {
    q16[i] = fp32_to_fp16(q[i]);
    if (c.q_dtype == DType::f16) q[i] = fp16_to_fp32(q16[i]);
  }
  const float scale = 1.f / std::sqrt((float)c.d);

  // ---- GPU ----
  DevBuf<uint8_t> dpool(pool.bytes), dext(ext_pool.bytes);
  DevBuf<int32_t> dpt(B.page_table), dlen(B.lens);
  DevBuf<float> dq(q);
  DevBuf<uint16_t> dq16(q16);
  DevBuf<float> dout((size_t)nb * hq * c.d);
  CK(cudaMemset(dout.p, 0xff, dout.n * sizeof(float)));  // NaN poison
  const int splits = cuda::default_splits(plan, nb, B.max_len);
  const size_t ws_bytes = cuda::decode_workspace_bytes(nb, hq, c.d, splits);
  DevBuf<uint8_t> ws(ws_bytes);
  cuda::DecodeBatch db{dpt.p, B.max_pages, dlen.p, nb, B.max_len};
  std::vector<std::vector<float>> outs;
  const void* qp = c.q_dtype == DType::f16 ? (void*)dq16.p : dq.p;
  if (P.ext) {  // generic kernel (extension pages); run twice so both result slots are filled
    for (int rep = 0; rep < 2; ++rep) {
      CK(cudaMemset(dout.p, 0xff, dout.n * sizeof(float)));  // NaN poison
      cuda::packed_decode_attention(plan, db, dpool.p, dext.p, qp, c.q_dtype, scale, dout.p, ws.p,
                                    ws_bytes, splits, nullptr);
      CK(cudaDeviceSynchronize());
      outs.push_back(dout.get());
    }
    EXPECT_THROW(cuda::packed_decode_attention(plan, db, dpool.p, qp, c.q_dtype, scale, dout.p, ws.p,
                                               ws_bytes, splits, nullptr),
                 ratekv::Error);  // a wide plan needs the extension pages
  } else {
    for (auto variant : {cuda::PackedDecodeVariant::specialized, cuda::PackedDecodeVariant::runtime_tables}) {
      CK(cudaMemset(dout.p, 0xff, dout.n * sizeof(float)));  // NaN poison
      cuda::packed_decode_attention(plan, db, dpool.p, qp, c.q_dtype, scale, dout.p, ws.p, ws_bytes,
                                    splits, nullptr, variant);
      CK(cudaDeviceSynchronize());
      outs.push_back(dout.get());
    }
  }
  const std::vector<float>& out = outs[0];

  // ---- CPU reference ----
  // int8_keys: key levels as the uniform kernel's int8 codebooks (int8_key_levels).
  auto reference = [&](bool int8_keys) {
  std::vector<double> ref(out.size(), 0.0);
  for (int b = 0; b < nb; ++b) {
    const int T = c.lens[b];
    for (int h = 0; h < c.hkv; ++h) {
      const HeadSpec& spec = L.spec(h);
      const auto& KG = L.head(h).key;
      const auto& VG = L.head(h).value;
      // decoded levels (fp16-rounded) and norms per token and group
      std::vector<std::vector<float>> kc(KG.size()), vc(VG.size());
      std::vector<std::vector<float>> kn(KG.size()), vn(VG.size());
      std::vector<std::vector<float>> k8(KG.size());  // int8 key levels
      for (size_t g = 0; g < KG.size(); ++g) {
        kc[g].resize((size_t)T * KG[g].dim);
        kn[g].resize(T);
        if (int8_keys)
          k8[g] = cuda::int8_key_levels(std::span<const float>(
              P.lvl.data() + P.lvl_at[h][0][g], (size_t)1 << KG[g].bits));
      }
      for (size_t g = 0; g < VG.size(); ++g) {
        vc[g].resize((size_t)T * VG[g].dim);
        vn[g].resize(T);
      }
#pragma omp parallel for
      for (int t = 0; t < T; ++t) {
        auto page = std::as_const(pool).page(B.page_table[(size_t)b * B.max_pages + t / kPageTokens]);
        std::vector<uint8_t> codes;
        for (int s = 0; s < 2; ++s) {
          const auto& G = s == 0 ? KG : VG;
          for (size_t g = 0; g < G.size(); ++g) {
            codes.resize(G[g].dim);
            read_codes(L, page, h, s == 0 ? Side::key : Side::value, (int)g, t % kPageTokens, codes);
            if (const int wb = P.wide[(size_t)h * 2 + s][g]; wb > 0) {  // high bits: e-th wide group
              int e = 0;
              for (size_t g2 = 0; g2 < g; ++g2) e += P.wide[(size_t)h * 2 + s][g2] > 0;
              std::vector<uint8_t> hi(G[g].dim);
              read_codes(*P.ext, std::as_const(ext_pool).page(B.page_table[(size_t)b * B.max_pages + t / kPageTokens]),
                         h, s == 0 ? Side::key : Side::value, e, t % kPageTokens, hi);
              for (int j = 0; j < G[g].dim; ++j) codes[j] = (uint8_t)(codes[j] | hi[j] << 4);
            }
            const float* lv = P.lvl.data() + P.lvl_at[h][s][g];
            float* dst = (s == 0 ? kc : vc)[g].data() + (size_t)t * G[g].dim;
            if (s == 0 && int8_keys) {
              for (int j = 0; j < G[g].dim; ++j) dst[j] = k8[g][codes[j]];
            } else {
              for (int j = 0; j < G[g].dim; ++j) dst[j] = round_fp16(lv[codes[j]]);
            }
            (s == 0 ? kn : vn)[g][t] = fp16_to_fp32(
                read_norm(L, page, h, s == 0 ? Side::key : Side::value, (int)g, t % kPageTokens));
          }
        }
      }
      for (int r = 0; r < c.gqa; ++r) {
        const int qh = h * c.gqa + r;
        const float* qv = q.data() + ((size_t)b * hq + qh) * c.d;
        std::vector<std::vector<double>> qr(KG.size());
        for (size_t g = 0; g < KG.size(); ++g) {
          const int m = KG[g].dim;
          const float* R = P.rot.data() + P.rot_at[h][0][g];
          qr[g].resize(m);
          for (int j = 0; j < m; ++j) {
            float acc = 0.f;
            for (int i = 0; i < m; ++i) acc = std::fma(R[(size_t)j * m + i], qv[spec.key[g].channels[i]], acc);
            qr[g][j] = round_fp16(scale * acc);
          }
        }
        std::vector<double> sc(T);
        double mx = -INFINITY;
        for (int t = 0; t < T; ++t) {
          double s = 0;
          for (size_t g = 0; g < KG.size(); ++g) {
            double dot = 0;
            const float* kk = kc[g].data() + (size_t)t * KG[g].dim;
            for (int j = 0; j < KG[g].dim; ++j) dot += qr[g][j] * kk[j];
            s += kn[g][t] * dot;
          }
          sc[t] = s;
          mx = std::max(mx, s);
        }
        double l = 0;
        for (int t = 0; t < T; ++t) l += (sc[t] = std::exp(sc[t] - mx));
        double* o = ref.data() + ((size_t)b * hq + qh) * c.d;
        for (size_t g = 0; g < VG.size(); ++g) {
          const int m = VG[g].dim;
          std::vector<double> orot(m, 0.0);
          for (int t = 0; t < T; ++t) {
            const double w = sc[t] / l * vn[g][t];
            const float* vv = vc[g].data() + (size_t)t * m;
            for (int j = 0; j < m; ++j) orot[j] += w * vv[j];
          }
          const float* R = P.rot.data() + P.rot_at[h][1][g];
          for (int i = 0; i < m; ++i) {
            double acc = 0;
            for (int j = 0; j < m; ++j) acc += (double)R[(size_t)j * m + i] * orot[j];
            o[spec.value[g].channels[i]] = acc;
          }
        }
      }
    }
  }
  return ref;
  };
  const std::vector<double> ref = reference(false);
  const bool int8_keys = !P.ext && cuda::uses_int8_keys(plan, cuda::PackedDecodeVariant::specialized);
  const std::vector<double> ref8 = int8_keys ? reference(true) : std::vector<double>{};
  for (int b = 0; b < nb; ++b) {
    const int T = c.lens[b];
    const size_t n = (size_t)hq * c.d;
    const double e = rel_err(out, int8_keys ? ref8 : ref, (size_t)b * n, n);
    EXPECT_LT(e, 1e-3) << "specialized variant, sequence " << b << " (length " << T << ")";
    if (int8_keys) {  // what the int8 key codebooks cost against fp16 levels
      std::vector<float> r8(ref8.begin(), ref8.end());
      const double e8 = rel_err(r8, ref, (size_t)b * n, n);
      EXPECT_LT(e8, 5e-3) << "int8 key levels vs fp16 levels, sequence " << b;
      std::printf("  %s seq %d: int8 key levels move the reference by %.2e (rel), kernel vs fp16-level "
                  "reference %.2e\n", name(c).c_str(), b, e8, rel_err(out, ref, (size_t)b * n, n));
    }
    const double e1 = rel_err(outs[1], ref, (size_t)b * n, n);
    EXPECT_LT(e1, 1e-3) << "runtime_tables variant, sequence " << b << " (length " << T << ")";
    std::printf("  %s seq %d len %d: rel err %.2e (specialized) %.2e (runtime_tables)\n", name(c).c_str(), b,
                T, e, e1);
  }
}

}  // namespace

// Small, fast case (also the compute-sanitizer case): mixed groups, GQA 4.
TEST(CudaPackedDecode, Small) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  run_packed_case({64, 2, 4, {1, 97, 130}, true, 0, 0, DType::f32}, 11);
  run_packed_case({128, 2, 3, {1, 97, 130}, false, 2, 2, DType::f32}, 12);  // uniform instance
}

TEST(CudaPackedDecode, AwkwardLengthsBatchesGqa) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  const Case cases[] = {
      {128, 2, 4, {100003}, false, 3, 3, DType::f32},
      {64, 3, 8, {1, 97, 4096}, true, 0, 0, DType::f32},
      {128, 2, 8, {1, 97, 4096, 100003, 64, 65, 200, 5000}, true, 0, 0, DType::f16},
      {256, 1, 1, {97, 4096, 1}, false, 4, 2, DType::f32},
      {256, 2, 4, {100003, 1, 4096, 97, 33, 16, 17, 1000}, false, 2, 4, DType::f16},
      {128, 8, 4, {4096, 97, 1}, false, 1, 1, DType::f32},
      {64, 1, 1, {100003}, false, 4, 4, DType::f32},
      {64, 2, 8, {97, 1, 4096}, false, 2, 2, DType::f32},
      {128, 2, 3, {4096, 1, 97, 100003}, false, 2, 2, DType::f16},
      {256, 1, 4, {97, 4096}, false, 2, 2, DType::f32},
      {128, 8, 4, {4096, 1, 97}, false, 4, 4, DType::f16},
      {128, 2, 16, {97, 1, 5000}, false, 3, 3, DType::f32},  // GQA 16: 16-row general instance
      {64, 1, 12, {4096, 33}, true, 0, 0, DType::f16},
  };
  uint32_t seed = 100;
  for (const Case& c : cases) run_packed_case(c, seed++);
}

// Real SmolLM2-135M activations (head_dim 64, 3 KV heads, GQA 3): the
// directory in RATEKV_CUDA_CAPTURE holds k/v/q_layer<l>.npy from
// `ratekv capture --queries` (tools/device/run_cuda.sh makes them). Uniform
// K3V3 and K2V2 and a Block-GTQ-like mixed plan, Lloyd–Max codebooks; pages
// written by the GPU prefill; lengths 1, 97 and the whole capture.
TEST(CudaPackedDecode, RealSmolLM2) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  const char* dir = std::getenv("RATEKV_CUDA_CAPTURE");
  if (!dir || !*dir)
    GTEST_SKIP() << "RATEKV_CUDA_CAPTURE is not set (a directory of `ratekv capture --queries` output)";
  int n_layers = 0;
  for (int layer = 0; layer < 64; ++layer) {
    const std::string base = std::string(dir) + "/";
    const std::string kp = base + "k_layer" + std::to_string(layer) + ".npy";
    if (!std::filesystem::exists(kp)) continue;
    const NpyMatrix K = read_npy_f32(kp, "RATEKV_CUDA_CAPTURE");
    const NpyMatrix V = read_npy_f32(base + "v_layer" + std::to_string(layer) + ".npy", "RATEKV_CUDA_CAPTURE");
    const NpyMatrix Q = read_npy_f32(base + "q_layer" + std::to_string(layer) + ".npy", "RATEKV_CUDA_CAPTURE");
    RealData R;
    R.name = "SmolLM2 layer " + std::to_string(layer);
    R.hkv = 3;  // SmolLM2-135M: 3 KV heads, 9 query heads, head_dim 64
    R.d = (int)K.cols;
    R.n = (int)(K.rows / R.hkv);
    R.gqa = (int)(Q.rows / R.n / R.hkv);
    ASSERT_EQ(R.d, 64);
    ASSERT_EQ(K.rows, V.rows);
    ASSERT_EQ((int64_t)R.hkv * R.gqa * R.n, Q.rows);
    ASSERT_GE(R.n, 98);
    R.k = K.data;
    R.v = V.data;
    R.q = Q.data;
    const Case cases[] = {
        {64, 3, R.gqa, {R.n, 97, 1}, false, 3, 3, DType::f32, Special::none, &R},
        {64, 3, R.gqa, {1, R.n, 97}, false, 2, 2, DType::f16, Special::none, &R},
        {64, 3, R.gqa, {97, R.n}, true, 0, 0, DType::f32, Special::none, &R},
    };
    uint32_t seed = 900 + layer;
    for (const Case& c : cases) run_packed_case(c, seed++);
    ++n_layers;
  }
  EXPECT_GT(n_layers, 0) << "no k_layer<l>.npy in " << dir;
}

// A NaN or infinite query element gives NaN for that query row (never a
// finite number: the uniform kernel's integer conversion would otherwise
// turn NaN into 0), and leaves the other rows as they are; both variants,
// uniform and mixed plans.
TEST(CudaPackedDecode, NonFiniteQueryGivesNaNRow) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  for (const bool mixed : {false, true}) {
    std::mt19937 rng(31 + mixed);
    const int d = 64, hkv = 2, gqa = 4, hq = hkv * gqa, T = 100;
    Plan P = make_plan(d, hkv, mixed, 3, 3, rng);
    const LayerLayout& L = *P.layout;
    cuda::PackedPlan plan(L, hq, P.rot, P.lvl);
    Batch B = make_batch({T}, rng);
    HostPagePool pool{&L, std::vector<uint8_t>((size_t)B.n_pages * L.page_bytes())};
    for (auto& x : pool.bytes) x = (uint8_t)rng();
    for (int p = 0; p < B.n_pages; ++p)
      for (int h = 0; h < hkv; ++h)
        for (Side s : {Side::key, Side::value})
          for (int g = 0; g < (int)L.head(h).side(s).size(); ++g)
            for (int t = 0; t < kPageTokens; ++t) write_norm(L, pool.page(p), h, s, g, t, fp32_to_fp16(1.f));
    std::normal_distribution<float> N;
    for (const float bad : {NAN, INFINITY}) {
      std::vector<float> q((size_t)hq * d);
      for (auto& x : q) x = N(rng);
      q[(size_t)5 * d + 17] = bad;  // query row 5 (KV head 1, GQA row 1)
      DevBuf<uint8_t> dpool(pool.bytes);
      DevBuf<int32_t> dpt(B.page_table), dlen(B.lens);
      DevBuf<float> dq(q), dout((size_t)hq * d);
      const int splits = cuda::default_splits(plan, 1, T);
      const size_t ws_bytes = cuda::decode_workspace_bytes(1, hq, d, splits);
      DevBuf<uint8_t> ws(ws_bytes);
      cuda::DecodeBatch db{dpt.p, B.max_pages, dlen.p, 1, T};
      for (auto variant : {cuda::PackedDecodeVariant::specialized, cuda::PackedDecodeVariant::runtime_tables}) {
        CK(cudaMemset(dout.p, 0, dout.n * sizeof(float)));
        cuda::packed_decode_attention(plan, db, dpool.p, dq.p, DType::f32, 0.125f, dout.p, ws.p, ws_bytes,
                                      splits, nullptr, variant);
        CK(cudaDeviceSynchronize());
        const std::vector<float> out = dout.get();
        for (int r = 0; r < hq; ++r) {
          int n_nan = 0;
          for (int c = 0; c < d; ++c) n_nan += std::isnan(out[(size_t)r * d + c]);
          if (r == 5)
            EXPECT_EQ(n_nan, d) << "row with a non-finite query element, mixed=" << mixed;
          else
            EXPECT_EQ(n_nan, 0) << "row " << r << ", mixed=" << mixed;
        }
      }
    }
  }
}

// Small cases of the two tests below (also the compute-sanitizer cases).
TEST(CudaPackedDecode, SmallZeroBit) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  run_packed_case({64, 3, 4, {1, 97, 130}, false, 0, 0, DType::f32, Special::zero_bit}, 690);
}
TEST(CudaPackedDecode, SmallWide) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  run_packed_case({64, 2, 3, {1, 97, 130}, false, 0, 0, DType::f32, Special::wide}, 790);
}

// Sides with no groups and 0-bit channels (docs/packed_format.md §6): scores 0
// for a KV head without key groups, output 0 on channels in no value group;
// general tensor-core instance (GQA ≤ 8 rows-8 and the 16-row one).
TEST(CudaPackedDecode, ZeroBitSides) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  const Case cases[] = {
      {64, 3, 4, {1, 97, 4096}, false, 0, 0, DType::f32, Special::zero_bit},
      {128, 3, 8, {97, 1, 300}, false, 0, 0, DType::f16, Special::zero_bit},
      {256, 3, 1, {4096, 1}, false, 0, 0, DType::f32, Special::zero_bit},
      {64, 3, 12, {97, 65}, false, 0, 0, DType::f32, Special::zero_bit},
  };
  uint32_t seed = 700;
  for (const Case& c : cases) run_packed_case(c, seed++);
}

// Groups of 5..8 bits (low nibble in the pages, high bits in the extension
// pages, docs/packed_format.md §5) on the generic kernel.
TEST(CudaPackedDecode, WideGroups) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  const Case cases[] = {
      {64, 2, 4, {1, 97, 4096}, false, 0, 0, DType::f32, Special::wide},
      {128, 3, 8, {97, 1, 130}, false, 0, 0, DType::f16, Special::wide},
      {256, 1, 1, {97, 1}, false, 0, 0, DType::f32, Special::wide},
      {128, 2, 16, {200}, false, 0, 0, DType::f32, Special::wide},
  };
  uint32_t seed = 800;
  for (const Case& c : cases) run_packed_case(c, seed++);
}

TEST(CudaPackedDecode, WidePlanErrors) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  std::mt19937 rng(5);
  Plan P = make_plan(64, 2, false, 0, 0, rng, Special::wide);
  cuda::PackedPlan plan(*P.layout, *P.ext, 4, P.rot, P.lvl);
  ASSERT_NE(plan.ext_layout(), nullptr);
  DevBuf<int32_t> dpt(std::vector<int32_t>{0}), dlen(std::vector<int32_t>{0});
  DevBuf<uint8_t> pool(P.layout->page_bytes());
  DevBuf<float> x(2 * 64);
  cuda::DecodeBatch db{dpt.p, 1, dlen.p, 1, 64};
  // The GPU quantizers do not write extension pages.
  EXPECT_THROW(cuda::packed_append(plan, db, pool.p, x.p, x.p, DType::f32, nullptr), ratekv::Error);
  EXPECT_THROW(cuda::packed_prefill(plan, db, pool.p, x.p, x.p, 1, DType::f32, nullptr), ratekv::Error);
  // Without the extension layout the levels do not fit (2^b per wide group).
  EXPECT_THROW(cuda::PackedPlan(*P.layout, 4, P.rot, P.lvl), ratekv::Error);
  // An extension layout of another head_dim / head count.
  const LayerLayout other = LayerLayout::uniform(64, 1, 2, 2);
  EXPECT_THROW(cuda::PackedPlan(*P.layout, other, 4, P.rot, P.lvl), ratekv::Error);
}

// ---- fp16 baseline kernel ---------------------------------------------------

TEST(CudaFp16Decode, AgainstReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  struct C {
    int d, hkv, gqa;
    std::vector<int> lens;
  };
  const C cases[] = {{64, 3, 8, {1, 97, 4096}},
                     {128, 2, 4, {100003, 1, 97, 4096, 5, 16, 17, 300}},
                     {256, 1, 1, {97}}};
  uint32_t seed = 7;
  for (const C& c : cases) {
    SCOPED_TRACE("d=" + std::to_string(c.d) + " gqa=" + std::to_string(c.gqa));
    std::mt19937 rng(seed++);
    Batch B = make_batch(c.lens, rng);
    const int hq = c.hkv * c.gqa, nb = (int)c.lens.size();
    const size_t page_elems = (size_t)c.hkv * 2 * kPageTokens * c.d;
    std::normal_distribution<float> N;
    std::vector<uint16_t> pool((size_t)B.n_pages * page_elems);
    for (auto& x : pool) x = fp32_to_fp16(N(rng));
    std::vector<float> q((size_t)nb * hq * c.d);
    for (auto& x : q) x = N(rng);
    const float scale = 1.f / std::sqrt((float)c.d);
    DevBuf<uint16_t> dpool(pool);
    DevBuf<int32_t> dpt(B.page_table), dlen(B.lens);
    DevBuf<float> dq(q), dout((size_t)nb * hq * c.d);
    CK(cudaMemset(dout.p, 0xff, dout.n * sizeof(float)));
    const int splits = cuda::default_splits(nb, c.hkv, B.max_len);
    const size_t ws_bytes = cuda::decode_workspace_bytes(nb, hq, c.d, splits);
    DevBuf<uint8_t> ws(ws_bytes);
    cuda::DecodeBatch db{dpt.p, B.max_pages, dlen.p, nb, B.max_len};
    cuda::fp16_decode_attention(hq, c.hkv, c.d, db, dpool.p, dq.p, DType::f32, scale, dout.p,
                                ws.p, ws_bytes, splits, nullptr);
    CK(cudaDeviceSynchronize());
    const auto out = dout.get();
    std::vector<double> ref(out.size());
    for (int b = 0; b < nb; ++b) {
      const int T = c.lens[b];
      for (int qh = 0; qh < hq; ++qh) {
        const int h = qh / c.gqa;
        std::vector<double> qs(c.d), sc(T);
        for (int i = 0; i < c.d; ++i) qs[i] = round_fp16(scale * q[((size_t)b * hq + qh) * c.d + i]);
        auto kv = [&](int t, int side, int i) {
          const size_t p = B.page_table[(size_t)b * B.max_pages + t / kPageTokens];
          return (double)fp16_to_fp32(pool[p * page_elems + ((size_t)h * 2 + side) * kPageTokens * c.d +
                                           (size_t)(t % kPageTokens) * c.d + i]);
        };
        double mx = -INFINITY;
        for (int t = 0; t < T; ++t) {
          double s = 0;
          for (int i = 0; i < c.d; ++i) s += qs[i] * kv(t, 0, i);
          mx = std::max(mx, sc[t] = s);
        }
        double l = 0;
        for (int t = 0; t < T; ++t) l += (sc[t] = std::exp(sc[t] - mx));
        for (int i = 0; i < c.d; ++i) {
          double o = 0;
          for (int t = 0; t < T; ++t) o += sc[t] * kv(t, 1, i);
          ref[((size_t)b * hq + qh) * c.d + i] = o / l;
        }
      }
      const size_t n = (size_t)hq * c.d;
      EXPECT_LT(rel_err(out, ref, (size_t)b * n, n), 1e-3) << "sequence " << b;
    }
  }
}

// ---- quantize-append --------------------------------------------------------

TEST(CudaPackedAppend, MatchesReferenceQuantizerAndTouchesOnlyItsToken) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  for (int d : {64, 128, 256}) {
    SCOPED_TRACE("d=" + std::to_string(d));
    std::mt19937 rng(300 + d);
    const int hkv = 2, hq = 4;
    Plan P = make_plan(d, hkv, d != 256, 3, 2, rng);
    const LayerLayout& L = *P.layout;
    const std::vector<int> pos = {0, 97, 4095, 63};
    const int nb = (int)pos.size();
    Batch B = make_batch(pos, rng, 1);
    HostPagePool pool{&L, std::vector<uint8_t>((size_t)B.n_pages * L.page_bytes())};
    for (auto& x : pool.bytes) x = (uint8_t)rng();
    const std::vector<uint8_t> before = pool.bytes;
    std::normal_distribution<float> N;
    std::vector<float> k((size_t)nb * hkv * d), v(k.size());
    for (auto& x : k) x = 3.f * N(rng);
    for (auto& x : v) x = N(rng);
    cuda::PackedPlan plan(L, hq, P.rot, P.lvl);
    DevBuf<uint8_t> dpool(pool.bytes);
    DevBuf<int32_t> dpt(B.page_table), dlen(B.lens);
    DevBuf<float> dk(k), dv(v);
    cuda::DecodeBatch db{dpt.p, B.max_pages, dlen.p, nb, B.max_len + 1};
    cuda::packed_append(plan, db, dpool.p, dk.p, dv.p, DType::f32, nullptr);
    CK(cudaDeviceSynchronize());
    const auto after = dpool.get();
    HostPagePool gpu{&L, after};
    HostPagePool expect{&L, before};
    int ambiguous = 0;
    for (int b = 0; b < nb; ++b) {
      const int page = B.page_table[(size_t)b * B.max_pages + pos[b] / kPageTokens];
      const int slot = pos[b] % kPageTokens;
      for (int h = 0; h < hkv; ++h)
        for (int s = 0; s < 2; ++s) {
          const Side side = s == 0 ? Side::key : Side::value;
          const auto& specs = s == 0 ? L.spec(h).key : L.spec(h).value;
          for (size_t g = 0; g < specs.size(); ++g) {
            const int m = (int)specs[g].channels.size();
            const float* x = (s == 0 ? k : v).data() + ((size_t)b * hkv + h) * d;
            double nn = 0;
            for (int c : specs[g].channels) nn += (double)x[c] * x[c];
            nn = std::sqrt(nn);
            const float* R = P.rot.data() + P.rot_at[h][s][g];
            const float* lv = P.lvl.data() + P.lvl_at[h][s][g];
            std::vector<uint8_t> got(m);
            read_codes(L, gpu.page(page), h, side, (int)g, slot, got);
            for (int j = 0; j < m; ++j) {
              double y = 0;
              for (int i = 0; i < m; ++i) y += (double)R[(size_t)j * m + i] * x[specs[g].channels[i]];
              y /= nn;
              int code = 0;
              double closest = INFINITY;
              for (int l = 0; l + 1 < (1 << specs[g].bits); ++l) {
                const double mid = 0.5 * ((double)lv[l] + lv[l + 1]);
                code += y > mid;
                closest = std::min(closest, std::abs(y - mid));
              }
              if (got[j] != code) {
                ++ambiguous;
                ASSERT_LT(closest, 1e-5) << "b " << b << " h " << h << " side " << s << " group " << g
                                         << " coord " << j << ": GPU code " << (int)got[j]
                                         << ", reference " << code << " (y = " << y << ")";
              }
            }
            const uint16_t gn = read_norm(L, gpu.page(page), h, side, (int)g, slot);
            EXPECT_NEAR(fp16_to_fp32(gn), nn, std::abs(nn) * 1e-3);
            write_codes(L, expect.page(page), h, side, (int)g, slot, got);
            write_norm(L, expect.page(page), h, side, (int)g, slot, gn);
          }
        }
    }
    EXPECT_LE(ambiguous, 2);
    // Bit placement equals the reference writer's, and nothing else changed.
    EXPECT_TRUE(expect.bytes == after);
  }
}

// ---- quantize-prefill ---------------------------------------------------------

// n_tokens vectors per sequence written from position starts[b] (not page-aligned,
// crossing pages): every code equals the reference quantizer's (up to a midpoint
// tie), norms are fp16(‖x_g‖), the bytes equal the reference writer's output and
// nothing outside the written tokens changed.
void run_prefill_case(int d, bool mixed, DType dtype, const std::vector<int>& starts, int n_tokens,
                      uint32_t seed) {
  SCOPED_TRACE("d=" + std::to_string(d) + (mixed ? " mixed" : " uniform K3V2") +
               (dtype == DType::f16 ? " f16" : " f32") + " n_tokens=" + std::to_string(n_tokens));
  std::mt19937 rng(seed);
  const int hkv = 2, hq = 4;
  Plan P = make_plan(d, hkv, mixed, 3, 2, rng);
  const LayerLayout& L = *P.layout;
  const int nb = (int)starts.size();
  Batch B = make_batch(starts, rng, n_tokens);
  HostPagePool pool{&L, std::vector<uint8_t>((size_t)B.n_pages * L.page_bytes())};
  for (auto& x : pool.bytes) x = (uint8_t)rng();
  const std::vector<uint8_t> before = pool.bytes;
  std::normal_distribution<float> N;
  const size_t n_el = (size_t)nb * n_tokens * hkv * d;
  std::vector<float> k(n_el), v(n_el);
  for (auto& x : k) x = 3.f * N(rng);
  for (auto& x : v) x = N(rng);
  std::vector<uint16_t> k16(n_el), v16(n_el);
  for (size_t i = 0; i < n_el; ++i) {
    k16[i] = fp32_to_fp16(k[i]);
    v16[i] = fp32_to_fp16(v[i]);
    if (dtype == DType::f16) {
      k[i] = fp16_to_fp32(k16[i]);
      v[i] = fp16_to_fp32(v16[i]);
    }
  }
  cuda::PackedPlan plan(L, hq, P.rot, P.lvl);
  DevBuf<uint8_t> dpool(pool.bytes);
  DevBuf<int32_t> dpt(B.page_table), dlen(B.lens);
  DevBuf<float> dk(k), dv(v);
  DevBuf<uint16_t> dk16(k16), dv16(v16);
  cuda::DecodeBatch db{dpt.p, B.max_pages, dlen.p, nb, B.max_len + n_tokens};
  if (dtype == DType::f16)
    cuda::packed_prefill(plan, db, dpool.p, dk16.p, dv16.p, n_tokens, dtype, nullptr);
  else
    cuda::packed_prefill(plan, db, dpool.p, dk.p, dv.p, n_tokens, dtype, nullptr);
  CK(cudaDeviceSynchronize());
  CK(cudaGetLastError());
  const auto after = dpool.get();
  HostPagePool gpu{&L, after};
  HostPagePool expect{&L, before};
  int ambiguous = 0, checked = 0;
  for (int b = 0; b < nb; ++b)
    for (int i = 0; i < n_tokens; ++i) {
      const int pos = starts[b] + i;
      const int page = B.page_table[(size_t)b * B.max_pages + pos / kPageTokens];
      const int slot = pos % kPageTokens;
      for (int h = 0; h < hkv; ++h)
        for (int s = 0; s < 2; ++s) {
          const Side side = s == 0 ? Side::key : Side::value;
          const auto& specs = s == 0 ? L.spec(h).key : L.spec(h).value;
          for (size_t g = 0; g < specs.size(); ++g) {
            const int m = (int)specs[g].channels.size();
            const float* x = (s == 0 ? k : v).data() + (((size_t)b * n_tokens + i) * hkv + h) * d;
            double nn = 0;
            for (int c : specs[g].channels) nn += (double)x[c] * x[c];
            nn = std::sqrt(nn);
            const float* R = P.rot.data() + P.rot_at[h][s][g];
            const float* lv = P.lvl.data() + P.lvl_at[h][s][g];
            std::vector<uint8_t> got(m);
            read_codes(L, gpu.page(page), h, side, (int)g, slot, got);
            for (int j = 0; j < m; ++j) {
              double y = 0;
              for (int c = 0; c < m; ++c) y += (double)R[(size_t)j * m + c] * x[specs[g].channels[c]];
              y /= nn;
              int code = 0;
              double closest = INFINITY;
              for (int l = 0; l + 1 < (1 << specs[g].bits); ++l) {
                const double mid = 0.5 * ((double)lv[l] + lv[l + 1]);
                code += y > mid;
                closest = std::min(closest, std::abs(y - mid));
              }
              ++checked;
              if (got[j] != code) {
                ++ambiguous;
                ASSERT_LT(closest, 1e-5) << "b " << b << " token " << i << " h " << h << " side " << s
                                         << " group " << g << " coord " << j << ": GPU code "
                                         << (int)got[j] << ", reference " << code;
              }
            }
            const uint16_t gn = read_norm(L, gpu.page(page), h, side, (int)g, slot);
            EXPECT_NEAR(fp16_to_fp32(gn), nn, std::abs(nn) * 1e-3);
            write_codes(L, expect.page(page), h, side, (int)g, slot, got);
            write_norm(L, expect.page(page), h, side, (int)g, slot, gn);
          }
        }
    }
  EXPECT_LE(ambiguous, 1 + checked / 100000);
  EXPECT_TRUE(expect.bytes == after) << "bytes outside the prefilled tokens changed, or bit placement differs";
}

TEST(CudaPackedPrefill, MatchesReferenceQuantizerAndTouchesOnlyItsTokens) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  run_prefill_case(64, true, DType::f32, {0, 97, 5, 64}, 130, 500);
  run_prefill_case(128, true, DType::f16, {3, 0}, 200, 501);
  run_prefill_case(128, false, DType::f32, {0}, 1, 502);
  run_prefill_case(256, false, DType::f32, {61, 0}, 70, 503);
}

TEST(CudaPackedPrefill, RejectsBadArguments) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  std::mt19937 rng(9);
  Plan P = make_plan(64, 1, false, 2, 2, rng);
  cuda::PackedPlan plan(*P.layout, 1, P.rot, P.lvl);
  DevBuf<int32_t> dpt(std::vector<int32_t>{0}), dlen(std::vector<int32_t>{0});
  DevBuf<uint8_t> pool(P.layout->page_bytes());
  DevBuf<float> x(64);
  cuda::DecodeBatch db{dpt.p, 1, dlen.p, 1, 64};
  EXPECT_THROW(cuda::packed_prefill(plan, db, pool.p, x.p, x.p, 0, DType::f32, nullptr), ratekv::Error);
  EXPECT_THROW(cuda::packed_prefill(plan, db, pool.p, nullptr, x.p, 1, DType::f32, nullptr), ratekv::Error);
}

// int8_key_levels (host): levels already on an int8 grid come back exactly;
// every level within s/2 of its int8 image; the chosen scale is never worse
// than the smallest admissible one (max|L|/127); the real Lloyd–Max codebooks
// at 1..4 bits lose < 0.5 % of their largest level; bad codebooks throw.
TEST(CudaPackedPlan, Int8KeyLevels) {
  float sc = 0.f;
  const std::vector<float> grid = {-127 * 0.01f, -40 * 0.01f, 3 * 0.01f, 90 * 0.01f};
  const std::vector<float> g8 = cuda::int8_key_levels(grid, &sc);
  EXPECT_FLOAT_EQ(sc, 0.01f);
  for (size_t i = 0; i < grid.size(); ++i) EXPECT_FLOAT_EQ(g8[i], grid[i]);
  for (int m : {64, 128, 256})
    for (int bits = 1; bits <= 4; ++bits) {
      const std::vector<float>& L = quant::lloyd_max_codebook(m, bits).levels;
      const std::vector<float> L8 = cuda::int8_key_levels(L, &sc);
      float amax = 0.f;
      for (float v : L) amax = std::max(amax, std::fabs(v));
      EXPECT_GE(sc, amax / 127.f * (1.f - 1e-6f));
      double e = 0, e0 = 0;
      const double s0 = amax / 127.0;
      for (size_t i = 0; i < L.size(); ++i) {
        const double k = L8[i] / sc;
        EXPECT_NEAR(k, std::nearbyint(k), 1e-3) << "not an int8 multiple of the scale";
        EXPECT_LE(std::fabs(k), 127.0 + 1e-3);
        EXPECT_LE(std::fabs(L8[i] - L[i]), 0.5f * sc * (1.f + 1e-5f));
        EXPECT_LE(std::fabs(L8[i] - L[i]), 0.005f * amax) << "m=" << m << " bits=" << bits;
        e += (L8[i] - L[i]) * (L8[i] - L[i]);
        e0 += std::pow(L[i] - s0 * std::nearbyint(L[i] / s0), 2);
      }
      EXPECT_LE(e, e0 * (1 + 1e-6) + 1e-18) << "m=" << m << " bits=" << bits;
    }
  EXPECT_THROW(cuda::int8_key_levels(std::vector<float>{0.5f}), ratekv::Error);
  EXPECT_THROW(cuda::int8_key_levels(std::vector<float>(17, 0.f)), ratekv::Error);
  EXPECT_THROW(cuda::int8_key_levels(std::vector<float>{-1.f, NAN}), ratekv::Error);
}

TEST(CudaPackedPlan, RejectsUnsupportedCombinations) {
  const LayerLayout L96 = LayerLayout::uniform(96, 1, 2, 2);
  std::vector<float> rot(2 * 96 * 96, 0.f), lvl = {-1, -0.3f, 0.3f, 1, -1, -0.3f, 0.3f, 1};
  EXPECT_THROW(cuda::PackedPlan(L96, 4, rot, lvl), ratekv::Error);  // head_dim 96
  const LayerLayout L64 = LayerLayout::uniform(64, 1, 2, 2);
  rot.assign(2 * 64 * 64, 0.f);
  EXPECT_THROW(cuda::PackedPlan(L64, 3 * 17, rot, lvl), ratekv::Error);  // GQA 51
  std::vector<float> bad = lvl;
  bad[1] = -2.f;  // not ascending
  EXPECT_THROW(cuda::PackedPlan(L64, 4, rot, bad), ratekv::Error);
  rot.pop_back();
  EXPECT_THROW(cuda::PackedPlan(L64, 4, rot, lvl), ratekv::Error);  // wrong rotation size
}
