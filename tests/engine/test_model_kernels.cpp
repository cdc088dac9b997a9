// The engine's own kernels (ratekv/cuda/model_kernels.h) against their CPU
// references: the CPU runtime's rms_norm and apply_rope (both layouts), the
// SwiGLU and softmax formulas in double, the CPU synthetic generator, the
// format's scalar reader + TQ-MSE decoder for the dequantizer, a host XOR for
// the read probe. GPU only (skipped without a device).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "gpu_util.h"
#include "ratekv/cache/plan_codecs.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/cuda/decode_attention.h"
#include "ratekv/cuda/model_kernels.h"
#include "ratekv/engine/cache_format.h"
#include "ratekv/engine/sampling.h"
#include "ratekv/eval/baseline_plans.h"
#include "ratekv/model/sliding_window.h"
#include "ratekv/model/synthetic.h"
#include "ratekv/quant/grouped_tq_mse.h"
#include "ratekv/quant/tq_mse.h"

namespace {

using namespace ratekv;
using engine_test::bf16_to_f32;
using engine_test::Dev;
using engine_test::have_gpu;

std::vector<float> randn(size_t n, std::mt19937& g, float sd = 1.f) {
  std::normal_distribution<float> N(0.f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = N(g);
  return v;
}

TEST(EngineKernels, SyntheticFillEqualsTheCpuGenerator) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  const int64_t n = 100003;
  Dev<uint16_t> b(n);
  Dev<float> f(n);
  cuda::synthetic_fill_bf16(b.p, n, 42, 77, 0, -5, 1000, nullptr);
  cuda::synthetic_fill_f32(f.p, n, 42, 78, 1, 0, 0, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto hb = b.get();
  const auto hf = f.get();
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(bf16_to_f32(hb[i]), synthetic_value(42, 77, 1000 + i, SyntheticKind::linear, -5)) << i;
    ASSERT_EQ(hf[i], synthetic_value(42, 78, i, SyntheticKind::norm, 0)) << i;
  }
}

// x += delta, out = bf16(rms_norm(x)) against ratekv::rms_norm, ≤ 1 bf16 ulp.
TEST(EngineKernels, AddRmsNormMatchesCpuRuntime) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  std::mt19937 g(3);
  for (int d : {576, 4096}) {
    const int n = 3;
    auto x = randn(size_t(n) * d, g, 2.f), delta = randn(size_t(n) * d, g), w = randn(d, g, 0.2f);
    for (auto& v : w) v += 1.f;
    Dev<float> dx(x), dd(delta), dw(w);
    Dev<uint16_t> out(size_t(n) * d);
    cuda::add_rms_norm(dx.p, dd.p, dw.p, n, d, 1e-5f, out.p, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (size_t i = 0; i < x.size(); ++i) x[i] += delta[i];
    std::vector<float> ref(x.size());
    rms_norm(x.data(), w.data(), ref.data(), n, d, 1e-5f);
    const auto gx = dx.get();
    const auto go = out.get();
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(gx[i], x[i]) << i;  // the residual is an fp32 add
      const float o = bf16_to_f32(go[i]);
      ASSERT_LE(std::fabs(o - ref[i]), std::ldexp(std::fabs(ref[i]), -7) + 1e-30f) << "d " << d << " i " << i;
    }
  }
}

// Q/K/V split + bias + RoPE against apply_rope at each token's position, both
// channel layouts, GQA 3, head_dim 64 and 128; fp16 copies are the fp32
// outputs rounded.
TEST(EngineKernels, QkvBiasRopeMatchesApplyRope) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  std::mt19937 g(5);
  for (RopeLayout layout : {RopeLayout::Interleaved, RopeLayout::NeoX})
    for (int hd : {64, 128}) {
      const int H = 6, Hkv = 2, n = 4, qd = H * hd, kvd = Hkv * hd, row = qd + 2 * kvd;
      const double theta = hd == 64 ? 1e4 : 5e5;
      const std::vector<int32_t> pos = {0, 1, 4097, 131071};
      auto qkv = randn(size_t(n) * row, g), bias = randn(row, g, 0.3f);
      std::vector<double> inv(hd / 2);
      for (int i = 0; i < hd / 2; ++i) inv[i] = rope_frequency(i, hd, theta);
      Dev<float> dqkv(qkv), db(bias), q32(size_t(n) * qd), k32(size_t(n) * kvd), v32(size_t(n) * kvd);
      Dev<uint16_t> q16(size_t(n) * qd), k16(size_t(n) * kvd), v16(size_t(n) * kvd);
      Dev<int32_t> dpos(pos);
      Dev<double> dinv(inv);
      cuda::QkvRopeOut o{q32.p, q16.p, k32.p, v32.p, k16.p, v16.p};
      cuda::qkv_bias_rope(dqkv.p, db.p, dpos.p, n, H, Hkv, hd, layout == RopeLayout::NeoX, dinv.p, o, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto gq = q32.get(), gk = k32.get(), gv = v32.get();
      const auto gq16 = q16.get(), gv16 = v16.get();
      for (int i = 0; i < n; ++i) {
        std::vector<float> r(qkv.begin() + size_t(i) * row, qkv.begin() + size_t(i + 1) * row);
        for (int c = 0; c < row; ++c) r[c] += bias[c];
        apply_rope(r.data(), H + Hkv, hd, pos[i], layout, theta);  // Q heads then K heads
        for (int c = 0; c < qd; ++c) {
          ASSERT_NEAR(gq[size_t(i) * qd + c], r[c], 2e-5f * (1.f + std::fabs(r[c]))) << i << " " << c;
          ASSERT_EQ(fp16_to_fp32(gq16[size_t(i) * qd + c]), fp16_to_fp32(fp32_to_fp16(gq[size_t(i) * qd + c])));
        }
        for (int c = 0; c < kvd; ++c) {
          ASSERT_NEAR(gk[size_t(i) * kvd + c], r[qd + c], 2e-5f * (1.f + std::fabs(r[qd + c])));
          ASSERT_EQ(gv[size_t(i) * kvd + c], r[qd + kvd + c]);
          ASSERT_EQ(gv16[size_t(i) * kvd + c], fp32_to_fp16(r[qd + kvd + c]));
        }
      }
    }
}

TEST(EngineKernels, SwigluArgmaxSoftmax) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  std::mt19937 g(9);
  // SwiGLU
  const int n = 3, dff = 1000;
  auto gu = randn(size_t(n) * 2 * dff, g, 3.f);
  Dev<float> dgu(gu);
  Dev<uint16_t> h(size_t(n) * dff);
  cuda::swiglu(dgu.p, n, dff, h.p, nullptr);
  // argmax: ties keep the first index; a NaN never wins
  const int V = 50000;
  std::vector<float> lg(3 * size_t(V));
  for (auto& v : lg) v = std::uniform_real_distribution<float>(-5, 5)(g);
  lg[0 * V + 31337] = 9.f;
  lg[0 * V + 40000] = 9.f;
  lg[1 * V + 7] = NAN;
  lg[1 * V + 49999] = 8.f;
  lg[2 * V + 0] = 10.f;
  Dev<float> dlg(lg);
  Dev<int32_t> am(3);
  cuda::argmax_rows(dlg.p, 3, V, am.p, nullptr);
  // causal softmax: 2 matrices of 5 rows × 12 columns, chunk starting at row 7
  const int rows = 5, cols = 12, r0 = 7;
  auto S = randn(2 * size_t(rows) * cols, g, 4.f);
  Dev<float> dS(S);
  Dev<uint16_t> dP(S.size());
  cuda::causal_softmax(dS.p, 2, rows * cols, rows, cols, r0, 0.7f, dP.p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto hh = h.get();
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < dff; ++j) {
      const double a = gu[size_t(i) * 2 * dff + j], u = gu[size_t(i) * 2 * dff + dff + j];
      const double ref = a / (1 + std::exp(-a)) * u;
      ASSERT_NEAR(bf16_to_f32(hh[size_t(i) * dff + j]), ref, std::fabs(ref) * 8e-3 + 1e-6);
    }
  const auto ha = am.get();
  EXPECT_EQ(ha[0], 31337);
  EXPECT_EQ(ha[1], 49999);
  EXPECT_EQ(ha[2], 0);
  const auto hp = dP.get();
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < rows; ++i) {
      const int lim = r0 + i + 1;
      double mx = -1e300, sum = 0;
      for (int j = 0; j < lim; ++j) mx = std::max(mx, 0.7 * S[(size_t(b) * rows + i) * cols + j]);
      for (int j = 0; j < lim; ++j) sum += std::exp(0.7 * S[(size_t(b) * rows + i) * cols + j] - mx);
      for (int j = 0; j < cols; ++j) {
        const double ref = j < lim ? std::exp(0.7 * S[(size_t(b) * rows + i) * cols + j] - mx) / sum : 0.0;
        ASSERT_NEAR(fp16_to_fp32(hp[(size_t(b) * rows + i) * cols + j]), ref, 1e-3 * ref + 1e-7) << b << i << j;
      }
    }
}

// Tokens written by fp16_write_tokens land where fp16_decode_attention reads
// them: page table lookup, slot, K then V per KV head — including pages past
// 4 GiB of the pool.
TEST(EngineKernels, Fp16WriterLayoutAnd64BitOffsets) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  const int Hkv = 2, hd = 128, n = 70;
  const size_t page_elems = size_t(Hkv) * 2 * 64 * hd;  // 64 KiB pages
  const int n_pages = int((size_t{5} << 30) / (page_elems * 2)) + 3;  // > 5 GiB
  Dev<uint16_t> pool(size_t(n_pages) * page_elems);
  ASSERT_NE(pool.p, nullptr);
  std::mt19937 g(1);
  auto k = randn(size_t(n) * Hkv * hd, g), v = randn(size_t(n) * Hkv * hd, g);
  const std::vector<int32_t> pt = {n_pages - 1, 7, n_pages - 2};  // first page past 5 GiB
  const std::vector<int32_t> start = {40};  // positions 40..109: pages 0 and 1
  Dev<int32_t> dpt(pt), dst(start);
  Dev<float> dk(k), dv(v);
  cuda::fp16_write_tokens(pool.p, Hkv, hd, dpt.p, 3, dst.p, dk.p, dv.p, n, 1, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int i : {0, 23, 24, 69}) {
    const int p = 40 + i;
    const size_t page = size_t(pt[p / 64]);
    for (int h = 0; h < Hkv; ++h)
      for (int side = 0; side < 2; ++side) {
        std::vector<uint16_t> got(hd);
        const size_t off = page * page_elems + (size_t(h) * 2 + side) * 64 * hd + size_t(p % 64) * hd;
        ASSERT_EQ(cudaMemcpy(got.data(), pool.p + off, 2 * hd, cudaMemcpyDeviceToHost), cudaSuccess);
        const float* src = (side ? v.data() : k.data()) + (size_t(i) * Hkv + h) * hd;
        for (int c = 0; c < hd; ++c) ASSERT_EQ(got[c], fp32_to_fp16(src[c])) << i << " " << h << " " << side;
      }
  }
}

// fp16_read_tokens reads back what fp16_write_tokens wrote: the fp16 of each
// value (fp32_to_fp16 on the host), through a shuffled page table, also from
// a table offset by a page (what chunked prefill's key tiles pass).
TEST(EngineKernels, Fp16ReaderReadsWhatTheWriterWrote) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  const int Hkv = 3, hd = 64, n = 150, kvd = Hkv * hd;
  std::mt19937 g(4);
  auto k = randn(size_t(n) * kvd, g), v = randn(size_t(n) * kvd, g);
  const std::vector<int32_t> pt = {4, 0, 2};
  const std::vector<int32_t> start = {0};
  Dev<uint16_t> pool(size_t(5) * Hkv * 2 * 64 * hd);
  Dev<int32_t> dpt(pt), dst(start);
  Dev<float> dk(k), dv(v);
  cuda::fp16_write_tokens(pool.p, Hkv, hd, dpt.p, 3, dst.p, dk.p, dv.p, n, 1, nullptr);
  Dev<uint16_t> rk(size_t(n) * kvd), rv(size_t(n) * kvd), sk(size_t(n - 64) * kvd), sv(size_t(n - 64) * kvd);
  cuda::fp16_read_tokens(pool.p, Hkv, hd, dpt.p, n, rk.p, rv.p, nullptr);
  cuda::fp16_read_tokens(pool.p, Hkv, hd, dpt.p + 1, n - 64, sk.p, sv.p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto hk = rk.get(), hv = rv.get(), hsk = sk.get(), hsv = sv.get();
  for (size_t i = 0; i < size_t(n) * kvd; ++i) {
    ASSERT_EQ(hk[i], fp32_to_fp16(k[i])) << i;
    ASSERT_EQ(hv[i], fp32_to_fp16(v[i])) << i;
    if (i >= size_t(64) * kvd) {
      ASSERT_EQ(hsk[i - 64 * kvd], hk[i]) << i;
      ASSERT_EQ(hsv[i - 64 * kvd], hv[i]) << i;
    }
  }
}

// prefill_tile_softmax over three key tiles (7, 7, 4 keys; queries at
// positions 10..14, so the last tile is invisible to row 0 and partly
// visible to the others), with O += P·V done on the host between tiles and
// normalize_rows at the end, equals causal softmax attention computed in
// double over all 18 keys at once (fp16 probabilities: ≤ 1e-3 relative).
void tiled_softmax_case(int window) {
  const int H = 3, rows = 5, hd = 4, q0 = 10, n_keys = 18;
  const int64_t o_ld = H * hd + 2;  // a row stride wider than H·hd
  const float scale = 0.6f;
  std::mt19937 g(12);
  auto S = randn(size_t(H) * rows * n_keys, g, 3.f);  // S[h][i][j] for all keys
  auto V = randn(size_t(H) * n_keys * hd, g);          // V[h][j][c]
  std::vector<float> o(size_t(rows) * o_ld, 123.f);    // garbage before the first tile
  Dev<float> dO(o), dm(size_t(rows) * H), dl(size_t(rows) * H);
  const int tiles[3][2] = {{0, 7}, {7, 7}, {14, 4}};
  for (const auto& t : tiles) {
    const int t0 = t[0], cols = t[1];
    std::vector<float> St(size_t(H) * rows * cols);
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < rows; ++i)
        for (int j = 0; j < cols; ++j)
          St[(size_t(h) * rows + i) * cols + j] = S[(size_t(h) * rows + i) * n_keys + t0 + j];
    Dev<float> dS(St);
    Dev<uint16_t> dP(St.size());
    cuda::prefill_tile_softmax(dS.p, H, int64_t(rows) * cols, rows, cols, q0, t0, scale, dm.p, dl.p, dO.p, o_ld, hd,
                               t0 == 0, dP.p, nullptr, window);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto P = dP.get();
    auto oh = dO.get();
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < rows; ++i)
        for (int c = 0; c < hd; ++c) {
          double acc = oh[size_t(i) * o_ld + h * hd + c];
          for (int j = 0; j < cols; ++j)
            acc += double(fp16_to_fp32(P[(size_t(h) * rows + i) * cols + j])) * V[(size_t(h) * n_keys + t0 + j) * hd + c];
          oh[size_t(i) * o_ld + h * hd + c] = float(acc);
        }
    ASSERT_EQ(cudaMemcpy(dO.p, oh.data(), 4 * oh.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  cuda::normalize_rows(dO.p, o_ld, rows, H, hd, dl.p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = dO.get();
  for (int h = 0; h < H; ++h)
    for (int i = 0; i < rows; ++i) {
      const int lim = q0 + i + 1, lo = static_cast<int>(first_visible_key(q0 + i, window));
      double mx = -1e300, sum = 0;
      for (int j = lo; j < lim; ++j) mx = std::max(mx, scale * double(S[(size_t(h) * rows + i) * n_keys + j]));
      std::vector<double> ref(hd, 0.0);
      for (int j = lo; j < lim; ++j) {
        const double e = std::exp(scale * double(S[(size_t(h) * rows + i) * n_keys + j]) - mx);
        sum += e;
        for (int c = 0; c < hd; ++c) ref[c] += e * V[(size_t(h) * n_keys + j) * hd + c];
      }
      double vmax = 0;
      for (int j = lo; j < lim; ++j)
        for (int c = 0; c < hd; ++c) vmax = std::max(vmax, std::fabs(double(V[(size_t(h) * n_keys + j) * hd + c])));
      for (int c = 0; c < hd; ++c)
        EXPECT_NEAR(got[size_t(i) * o_ld + h * hd + c], ref[c] / sum, 1e-3 * vmax) << "window " << window << " " << h << " " << i << " " << c;
    }
  // The two padding columns of each row are never written.
  for (int i = 0; i < rows; ++i) EXPECT_EQ(got[size_t(i) * o_ld + H * hd], 123.f);
}

TEST(EngineKernels, TiledOnlineSoftmaxEqualsWholeRowSoftmax) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  tiled_softmax_case(0);
  // A sliding window of 6 (model/sliding_window.h): row 0 (position 10) sees
  // keys 5..10 — two in the first tile —, row 4 (14) sees 9..14: nothing in
  // the first tile (its state starts empty there), the rest in the others.
  tiled_softmax_case(6);
}

// Gemma 3's kernels against their CPU references: GeGLU against the CPU
// runtime's formula in double, soft-cap c·tanh(x/c) in double, rms_norm_f32
// against ratekv::rms_norm (in place), the embedding scale, QK-norm inside
// qkv_bias_rope against rms_norm per head then apply_rope (NeoX, head_dim 256,
// GQA 4), and causal_softmax with a window against the windowed softmax in
// double (row i at position r0 + i sees columns r0 + i − w < j ≤ r0 + i).
TEST(EngineKernels, Gemma3KernelsMatchCpuReferences) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  std::mt19937 g(21);
  // GeGLU and soft-cap
  const int n = 3, dff = 1000;
  auto gu = randn(size_t(n) * 2 * dff, g, 3.f);
  auto lg = randn(size_t(n) * 777, g, 40.f);
  Dev<float> dgu(gu), dlg(lg);
  Dev<uint16_t> h(size_t(n) * dff);
  cuda::geglu(dgu.p, n, dff, h.p, nullptr);
  cuda::softcap(dlg.p, int64_t(lg.size()), 30.f, nullptr);
  // rms_norm_f32 in place
  const int d = 640;
  auto x = randn(size_t(n) * d, g, 5.f), w = randn(d, g, 0.2f);
  for (auto& v : w) v += 1.f;
  Dev<float> dx(x), dw(w);
  cuda::rms_norm_f32(dx.p, dw.p, n, d, 1e-6f, dx.p, nullptr);
  // embedding scale
  std::vector<uint16_t> table(size_t(10) * d);
  for (size_t i = 0; i < table.size(); ++i) table[i] = uint16_t(0x3f80 + (i % 97) * 3);  // bf16 values
  const std::vector<int32_t> toks = {3, 9, 0};
  Dev<uint16_t> dtab(table);
  Dev<int32_t> dtok(toks);
  Dev<float> emb(size_t(3) * d);
  cuda::embed_rows(dtab.p, dtok.p, 3, d, emb.p, nullptr, std::sqrt(640.f));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto hh = h.get();
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < dff; ++j) {
      const double a = gu[size_t(i) * 2 * dff + j], u = gu[size_t(i) * 2 * dff + dff + j];
      const double ref = 0.5 * a * (1 + std::tanh(0.7978845608028654 * (a + 0.044715 * a * a * a))) * u;
      ASSERT_NEAR(bf16_to_f32(hh[size_t(i) * dff + j]), ref, std::fabs(ref) * 8e-3 + 1e-5) << i << " " << j;
    }
  const auto hl = dlg.get();
  for (size_t i = 0; i < lg.size(); ++i) ASSERT_NEAR(hl[i], 30.0 * std::tanh(lg[i] / 30.0), 2e-5 * 30) << i;
  std::vector<float> ref(x.size());
  rms_norm(x.data(), w.data(), ref.data(), n, d, 1e-6f);
  const auto hx = dx.get();
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(hx[i], ref[i], 1e-5f * (1.f + std::fabs(ref[i]))) << i;
  const auto he = emb.get();
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < d; ++c)
      ASSERT_EQ(he[size_t(r) * d + c], bf16_to_f32(table[size_t(toks[r]) * d + c]) * std::sqrt(640.f)) << r << c;
  // QK-norm + RoPE
  {
    const int H = 4, Hkv = 1, hd = 256, m = 3, qd = H * hd, kvd = Hkv * hd, row = qd + 2 * kvd;
    const double theta = 1e4;
    const std::vector<int32_t> pos = {0, 511, 20000};
    auto qkv = randn(size_t(m) * row, g, 2.f), qn = randn(hd, g, 0.2f), kn = randn(hd, g, 0.2f);
    for (auto& v : qn) v += 1.f;
    for (auto& v : kn) v += 1.f;
    std::vector<double> inv(hd / 2);
    for (int i = 0; i < hd / 2; ++i) inv[i] = rope_frequency(i, hd, theta);
    Dev<float> dqkv(qkv), dqn(qn), dkn(kn), q32(size_t(m) * qd), k32(size_t(m) * kvd), v32(size_t(m) * kvd),
        kpre(size_t(m) * kvd);
    Dev<int32_t> dpos(pos);
    Dev<double> dinv(inv);
    cuda::QkvRopeOut o;
    o.q32 = q32.p, o.k32 = k32.p, o.v32 = v32.p, o.k_pre32 = kpre.p;
    cuda::QkNorm qk;
    qk.q = dqn.p, qk.k = dkn.p, qk.eps = 1e-6f;
    cuda::qkv_bias_rope(dqkv.p, nullptr, dpos.p, m, H, Hkv, hd, true, dinv.p, o, nullptr, qk);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto gq = q32.get(), gk = k32.get(), gv = v32.get(), gkp = kpre.get();
    for (int i = 0; i < m; ++i) {
      std::vector<float> r(qkv.begin() + size_t(i) * row, qkv.begin() + size_t(i + 1) * row);
      rms_norm(r.data(), qn.data(), r.data(), H, hd, 1e-6f);
      rms_norm(r.data() + qd, kn.data(), r.data() + qd, Hkv, hd, 1e-6f);
      for (int c = 0; c < kvd; ++c)
        ASSERT_NEAR(gkp[size_t(i) * kvd + c], r[qd + c], 1e-5f * (1.f + std::fabs(r[qd + c])));
      apply_rope(r.data(), H + Hkv, hd, pos[i], RopeLayout::NeoX, theta);
      for (int c = 0; c < qd; ++c)
        ASSERT_NEAR(gq[size_t(i) * qd + c], r[c], 2e-5f * (1.f + std::fabs(r[c]))) << i << " " << c;
      for (int c = 0; c < kvd; ++c) {
        ASSERT_NEAR(gk[size_t(i) * kvd + c], r[qd + c], 2e-5f * (1.f + std::fabs(r[qd + c])));
        ASSERT_EQ(gv[size_t(i) * kvd + c], r[qd + kvd + c]);  // V is not normed
      }
    }
  }
  // windowed causal softmax: 2 matrices of 5 rows × 12 columns, rows at 7..11, window 4
  {
    const int rows = 5, cols = 12, r0 = 7, win = 4;
    auto S = randn(2 * size_t(rows) * cols, g, 4.f);
    Dev<float> dS(S);
    Dev<uint16_t> dP(S.size());
    cuda::causal_softmax(dS.p, 2, rows * cols, rows, cols, r0, 0.7f, dP.p, nullptr, win);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto hp = dP.get();
    for (int b = 0; b < 2; ++b)
      for (int i = 0; i < rows; ++i) {
        const int lim = r0 + i + 1, lo = r0 + i - win + 1;
        double mx = -1e300, sum = 0;
        for (int j = lo; j < lim; ++j) mx = std::max(mx, 0.7 * S[(size_t(b) * rows + i) * cols + j]);
        for (int j = lo; j < lim; ++j) sum += std::exp(0.7 * S[(size_t(b) * rows + i) * cols + j] - mx);
        for (int j = 0; j < cols; ++j) {
          const double rf =
              j >= lo && j < lim ? std::exp(0.7 * S[(size_t(b) * rows + i) * cols + j] - mx) / sum : 0.0;
          ASSERT_NEAR(fp16_to_fp32(hp[(size_t(b) * rows + i) * cols + j]), rf, 1e-3 * rf + 1e-7) << b << i << j;
        }
      }
  }
}

// sample_rows against engine::sample_reference (the definition's host
// reference) on 96 rows of 50000 logits (sd 3, some rows with ties and NaN)
// with mixed settings (greedy, temperatures, top-k 1/40/V+, top-p 0.5/0.9/1),
// uniforms from sampling_uniform: every row picks the reference's token
// (a mismatch needs u within ~1e-12 of a boundary).
TEST(EngineKernels, SampleRowsMatchesTheReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  const int n = 96, V = 50000;
  std::mt19937 g(21);
  auto x = randn(size_t(n) * V, g, 3.f);
  for (int r = 0; r < n; r += 7) {  // ties at the top and a NaN
    x[size_t(r) * V + 11] = 20.f;
    x[size_t(r) * V + 4000] = 20.f;
    x[size_t(r) * V + 5] = NAN;
  }
  std::vector<float> temp(n), topp(n);
  std::vector<int32_t> topk(n);
  std::vector<double> u(n);
  const float temps[] = {0.f, 0.7f, 1.f, 1.6f};
  const int ks[] = {0, 1, 40, V + 5};
  const float ps[] = {1.f, 0.9f, 0.5f};
  for (int r = 0; r < n; ++r) {
    temp[r] = temps[r % 4];
    topk[r] = ks[(r / 4) % 4];
    topp[r] = ps[(r / 16) % 3];
    u[r] = engine::sampling_uniform(7, r);
  }
  Dev<float> dx(x), dt(temp), dp(topp);
  Dev<int32_t> dk(topk), out(n);
  Dev<double> du(u);
  cuda::sample_rows(dx.p, n, V, dt.p, dk.p, dp.p, du.p, out.p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = out.get();
  int agree = 0;
  for (int r = 0; r < n; ++r) {
    engine::SamplingParams sp;
    sp.temperature = temp[r];
    sp.top_k = topk[r];
    sp.top_p = topp[r];
    const int32_t want = engine::sample_reference(x.data() + size_t(r) * V, V, sp, u[r]);
    agree += got[r] == want;
    EXPECT_EQ(got[r], want) << "row " << r << " t " << temp[r] << " k " << topk[r] << " p " << topp[r];
    EXPECT_FALSE(std::isnan(x[size_t(r) * V + got[r]]));
  }
  std::printf("  sample_rows: %d of %d rows pick the reference's token\n", agree, n);
}

// packed_prefill (the GPU quantizer) then packed_dequantize against the CPU:
// the codes and norms read back with the format's scalar reader and decoded
// with the plan's TQ-MSE codecs (x̂ = n Πᵀ c[idx]). One case: head_dim hd,
// Hkv KV heads (GQA 2), n tokens in pages placed out of order (a shuffled
// page table into a pool with spare pages); uniform K3V2, or (grouped) keys
// in a 4-bit and a 1-bit group over RoPE blocks 0 .. hd/4−1 and a 0-bit group over the rest (hd/2 channels;
// hd 128: 22 and 42) and values in a 3-bit and a 2-bit
// group over 3·hd/4 (hd 128: 20 and 76): group dims not multiples of 16, the
// 0-bit group's channels 0. Bounds (u = 2⁻¹¹):
//   fp32:          |x − x̂_i| ≤ 1e-3·|x̂_i| + 2e-4 (one fp16 rounding)
//   tensor_cores:  |x − x̂_i| ≤ u·|x̂_i| + 2.1·u·‖x̂_g‖ (DequantVariant's bound;
//                  ‖x̂_g‖ the CPU reconstruction's norm of i's group) and the
//                  RMS error over the case ≤ 2u of the RMS value (~1e-3).
// Returns the case's RMS error relative to the RMS value.
double check_dequantize(int hd, int Hkv, bool grouped, int n, cuda::DequantVariant variant) {
  const std::string what = "hd " + std::to_string(hd) + " Hkv " + std::to_string(Hkv) + " grouped " +
                           std::to_string(grouped) + " n " + std::to_string(n) + " variant " +
                           (variant == cuda::DequantVariant::fp32 ? "fp32" : "tensor_cores");
  ModelConfig c = synthetic_config("llama-3.1-8b", 1);
  c.head_dim = hd;
  c.n_kv_heads = Hkv;
  c.n_heads = 2 * Hkv;
  c.d_model = 256;
  Plan plan = eval::cache_type_plan("tq3", "tq2", c, 3);
  if (grouped)
    for (auto& hp : plan.layers[0]) {
      Codec k;
      k.kind = CodecKind::TqMseGrouped;
      k.norm = NormStorage::FP16;
      // Every RoPE block is in a group (the plan requires it); the blocks past
      // the coded ones go to a 0-bit group, last, so the coded groups keep
      // their packed group indices 0 and 1 and its channels decode to 0.
      CodecGroup a, b, z;
      a.bits = 4, b.bits = 1, z.bits = 0, a.seed = 5, b.seed = 6, z.seed = 7;
      for (int i = 0; i < hd / 2; ++i) (i >= hd / 4 ? z : i % 3 == 0 ? a : b).blocks.push_back(i);
      k.groups = {a, b, z};
      hp.key = k;
      Codec v = k;
      for (auto& gr : v.groups) gr.blocks.clear();
      v.groups[0].bits = 3, v.groups[1].bits = 2;
      for (int i = 0; i < hd / 2; ++i) (i >= 3 * hd / 8 ? v.groups[2] : i % 5 == 1 ? v.groups[0] : v.groups[1]).blocks.push_back(i);
      hp.value = v;
    }
  auto codecs = std::make_shared<const cache::PlanCodecs>(plan, c);
  const engine::CacheFormat fmt = engine::CacheFormat::packed(codecs);
  const packed::LayerLayout& L = fmt.layout(0);
  cuda::PackedPlan pp(L, c.n_heads, fmt.rotations(0), fmt.levels(0));
  const int kvd = Hkv * hd, n_pages = (n + 63) / 64, pool_pages = n_pages + 3;
  std::mt19937 g(hd * 131 + Hkv * 7 + grouped * 3 + n);
  auto k = randn(size_t(n) * kvd, g), v = randn(size_t(n) * kvd, g);
  std::vector<int32_t> phys(pool_pages);
  for (int i = 0; i < pool_pages; ++i) phys[i] = i;
  std::shuffle(phys.begin(), phys.end(), g);
  const std::vector<int32_t> pt(phys.begin(), phys.begin() + n_pages);
  Dev<uint8_t> pool(size_t(pool_pages) * L.page_bytes());
  Dev<int32_t> dpt(pt), zero(std::vector<int32_t>{0});
  Dev<float> dk(k), dv(v);
  Dev<uint16_t> k16(size_t(n) * kvd), v16(size_t(n) * kvd);
  cuda::DecodeBatch db{dpt.p, n_pages, zero.p, 1, n};
  cuda::packed_prefill(pp, db, pool.p, dk.p, dv.p, n, cuda::DType::f32, nullptr);
  // Poison the outputs: every element must be written (0 for channels in no group).
  EXPECT_EQ(cudaMemset(k16.p, 0xff, size_t(n) * kvd * 2), cudaSuccess);
  EXPECT_EQ(cudaMemset(v16.p, 0xff, size_t(n) * kvd * 2), cudaSuccess);
  cuda::packed_dequantize(pp, pool.p, dpt.p, n, k16.p, v16.p, nullptr, variant);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
  const auto bytes = pool.get();
  const auto gk = k16.get(), gv = v16.get();
  const double u = std::ldexp(1.0, -11);
  double err2 = 0, ref2 = 0;
  int bad = 0;
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < Hkv; ++h)
      for (int s = 0; s < 2; ++s) {
        const auto page = std::span<const uint8_t>(bytes).subspan(size_t(pt[t / 64]) * L.page_bytes(), L.page_bytes());
        const quant::Quantizer* q = codecs->quantizer(0, h, static_cast<cache::KVSide>(s));
        std::vector<float> ref(hd, 0.f), gnorm(hd, 0.f);
        std::vector<std::pair<const quant::TQMSE*, std::vector<int>>> groups;
        if (auto* tq = dynamic_cast<const quant::TQMSE*>(q)) {
          std::vector<int> all(hd);
          for (int i = 0; i < hd; ++i) all[i] = i;
          groups.emplace_back(tq, all);
        } else {
          auto* gq = dynamic_cast<const quant::GroupedTQMSE*>(q);
          EXPECT_NE(gq, nullptr) << what;
          if (!gq) return 1.0;
          for (size_t gi = 0; gi < gq->codecs().size(); ++gi)  // 0-bit groups store nothing: channels stay 0
            if (gq->config().groups[gi].bits > 0) groups.emplace_back(&gq->codecs()[gi], gq->config().groups[gi].channels);
        }
        for (size_t gi = 0; gi < groups.size(); ++gi) {
          const auto& [tq, ch] = groups[gi];
          std::vector<uint8_t> idx(ch.size());
          packed::read_codes(L, page, h, static_cast<packed::Side>(s), (int)gi, t % 64, idx);
          const float nrm = fp16_to_fp32(packed::read_norm(L, page, h, static_cast<packed::Side>(s), (int)gi, t % 64));
          std::vector<float> x(ch.size());
          tq->decode(idx.data(), nrm, x.data());
          double x2 = 0;
          for (size_t i = 0; i < ch.size(); ++i) ref[ch[i]] = x[i], x2 += double(x[i]) * x[i];
          for (size_t i = 0; i < ch.size(); ++i) gnorm[ch[i]] = (float)std::sqrt(x2);
        }
        const auto& got = s == 0 ? gk : gv;
        for (int i = 0; i < hd; ++i) {
          const double x = fp16_to_fp32(got[(size_t(t) * Hkv + h) * hd + i]), e = x - ref[i];
          const double tol = variant == cuda::DequantVariant::fp32 ? 1e-3 * std::fabs(ref[i]) + 2e-4
                                                                   : u * std::fabs(ref[i]) + 2.1 * u * gnorm[i];
          err2 += e * e, ref2 += double(ref[i]) * ref[i];
          if (!(std::fabs(e) <= tol) && bad++ < 5)
            ADD_FAILURE() << what << ": t " << t << " h " << h << " side " << s << " i " << i << " got " << x
                          << " want " << ref[i] << " tol " << tol;
        }
      }
  EXPECT_EQ(bad, 0) << what << ": elements out of bounds";
  const double rel = std::sqrt(err2 / std::max(ref2, 1e-30));
  if (variant == cuda::DequantVariant::tensor_cores) {
    EXPECT_LE(rel, 2 * u) << what << ": RMS error / RMS value";
  }
  return rel;
}

TEST(EngineKernels, DequantizeMatchesCpuDecoderOfTheCodes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  for (auto variant : {cuda::DequantVariant::tensor_cores, cuda::DequantVariant::fp32})
    for (int hd : {64, 128, 256})
      for (int Hkv : {1, 3, 8})
        for (int grouped = 0; grouped < 2; ++grouped)
          for (int n : {1, 97}) {
            const double rel = check_dequantize(hd, Hkv, grouped, n, variant);
            if (n == 97 && Hkv == 3)
              std::printf("  dequantize %s hd %d grouped %d: RMS error / RMS value %.3g\n",
                          variant == cuda::DequantVariant::fp32 ? "fp32" : "tensor_cores", hd, grouped, rel);
          }
}

// Enough pages that a block of the tensor-core kernel takes several (its
// grid covers two waves of the (KV head, side) pairs): Llama-3.1-8B's KV
// shape (8 × 128), 4000 tokens (63 pages, the last partial), both plans.
TEST(EngineKernels, DequantizeManyPagesMatchesCpuDecoder) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  for (int grouped = 0; grouped < 2; ++grouped) {
    const double rel = check_dequantize(128, 8, grouped, 4000, cuda::DequantVariant::tensor_cores);
    std::printf("  dequantize tensor_cores hd 128 Hkv 8 grouped %d n 4000: RMS error / RMS value %.3g\n", grouped,
                rel);
  }
  check_dequantize(256, 8, true, 1500, cuda::DequantVariant::tensor_cores);
}

// Bad input is refused: null pointers, n_tokens ≤ 0, an unknown variant.
TEST(EngineKernels, DequantizeRefusesBadArguments) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  ModelConfig c = synthetic_config("llama-3.1-8b", 1);
  c.head_dim = 64, c.n_kv_heads = 1, c.n_heads = 2, c.d_model = 256;
  auto codecs = std::make_shared<const cache::PlanCodecs>(eval::cache_type_plan("tq3", "tq3", c, 3), c);
  const engine::CacheFormat fmt = engine::CacheFormat::packed(codecs);
  cuda::PackedPlan pp(fmt.layout(0), c.n_heads, fmt.rotations(0), fmt.levels(0));
  Dev<uint8_t> pool(fmt.layout(0).page_bytes());
  Dev<int32_t> pt(std::vector<int32_t>{0});
  Dev<uint16_t> o(64 * 64);
  EXPECT_THROW(cuda::packed_dequantize(pp, pool.p, pt.p, 0, o.p, o.p, nullptr), Error);
  EXPECT_THROW(cuda::packed_dequantize(pp, nullptr, pt.p, 1, o.p, o.p, nullptr), Error);
  EXPECT_THROW(cuda::packed_dequantize(pp, pool.p, pt.p, 1, o.p, o.p, nullptr, static_cast<cuda::DequantVariant>(7)),
               Error);
}

TEST(EngineKernels, ReadProbeReadsEveryWord) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  const size_t words = (size_t{48} << 20) / 4 + 12;  // not a multiple of the grid
  std::vector<uint32_t> h(words);
  std::mt19937 g(2);
  for (auto& w : h) w = g();
  Dev<uint32_t> buf(h), sink(cuda::kReadProbeBlocks);
  cuda::read_probe(buf.p, words * 4, sink.p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  uint32_t want = 0, got = 0;
  for (uint32_t w : h) want ^= w;
  for (uint32_t s : sink.get()) got ^= s;
  EXPECT_EQ(got, want);
}

}  // namespace
