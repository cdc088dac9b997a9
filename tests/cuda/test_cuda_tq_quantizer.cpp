// The CUDA TurboQuant-MSE key/value path against the CPU quantizer itself:
// every group's rotation Π_g and Lloyd–Max levels come from quant::TQMSE
// (seeded as a plan seeds it; rotation().matrix(), codebook().levels), not
// from tables built in the test. Checked: (1) the codes and fp16 norms the GPU
// append and prefill write are quant::TQMSE::encode's (a code may differ only
// where the rotated coordinate lies within 1e-5 of a threshold — fp32 rounding
// of two implementations — or, for the prefill's tensor-core variant, within
// 2.1e-3: Π and x rounded to TF32, the bound of cuda::PrefillVariant; the
// fp16 norm by one ulp); (2) decode attention over those pages equals
// ref::packed_decode_attention given the same CPU quantizer tables. The
// tokens before each sequence's start are valid codes (written by
// ref::packed_prefill), so that attention reads no random norms.
// Block-GTQ-like keys (RoPE pairs in groups of 2..4 bits, padded tiles) and
// uniform values; head_dim 64 / 128 (at 256 these groups pad to 18 tiles, more
// than the kernels hold: cuda::PackedPlan rejects them), GQA 4, lengths
// crossing pages. Needs a GPU: skips when none is visible.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <span>
#include <random>
#include <vector>

#include "../support/cuda_test.h"
#include "../support/packed_plans.h"
#include "ratekv/common/fp16.h"
#include "ratekv/cuda/decode_attention.h"
#include "ratekv/format/packed_format.h"
#include "ratekv/quant/tq_mse.h"
#include "ratekv/ref/packed_decode_attention.h"
#include "ratekv/ref/packed_quantize.h"

using namespace ratekv;
using namespace ratekv::packed;
using namespace ratekv_test;
using ratekv::cuda::DType;

namespace {

// A layer whose every group is a CPU TurboQuant-MSE quantizer.
struct CpuQuantizerPlan {
  std::unique_ptr<LayerLayout> layout;
  std::vector<std::vector<std::unique_ptr<quant::TQMSE>>> tq;  // [h · 2 + side][group]
  std::vector<float> rot, lvl;                                 // in cuda::PackedPlan's order
};

CpuQuantizerPlan make_cpu_plan(int d, int hkv, std::mt19937& rng) {
  CpuQuantizerPlan P;
  std::vector<HeadSpec> heads;
  for (int h = 0; h < hkv; ++h) heads.push_back(mixed_head(d, rng));
  P.layout = std::make_unique<LayerLayout>(d, heads);
  P.tq.resize((size_t)hkv * 2);
  uint64_t seed = 7000;
  for (int h = 0; h < hkv; ++h)
    for (int s = 0; s < 2; ++s)
      for (const GroupSpec& G : s == 0 ? heads[h].key : heads[h].value) {
        const int m = (int)G.channels.size();
        auto q = std::make_unique<quant::TQMSE>(quant::TQMSEConfig{.dim = m, .bits = G.bits, .seed = ++seed});
        const Eigen::MatrixXd R = q->rotation().matrix();  // y = Π u
        for (int i = 0; i < m; ++i)
          for (int j = 0; j < m; ++j) P.rot.push_back((float)R(i, j));
        const auto& levels = q->codebook().levels;
        P.lvl.insert(P.lvl.end(), levels.begin(), levels.end());
        P.tq[(size_t)h * 2 + s].push_back(std::move(q));
      }
  return P;
}

// Codes and norms of tokens [start_b, start_b + n) of every sequence in `pages`
// against quant::TQMSE::encode of the same vectors. x: (batch, n, hkv, d).
// Returns the number of threshold ties (codes that differ within max_margin of a threshold).
int check_codes(const CpuQuantizerPlan& P, const TestBatch& B, const std::vector<int>& starts, int n,
                const std::vector<float>& k, const std::vector<float>& v, const std::vector<uint8_t>& pages,
                float max_margin = 1e-5f) {
  const LayerLayout& L = *P.layout;
  const int hkv = L.n_kv_heads(), d = L.head_dim();
  HostPagePool pool{&L, pages};
  int ties = 0;
  for (size_t b = 0; b < starts.size(); ++b)
    for (int i = 0; i < n; ++i) {
      const int pos = starts[b] + i;
      const int page = B.page_table[b * B.max_pages + pos / kPageTokens], slot = pos % kPageTokens;
      for (int h = 0; h < hkv; ++h)
        for (int s = 0; s < 2; ++s) {
          const Side side = s == 0 ? Side::key : Side::value;
          const float* x = (s == 0 ? k : v).data() + ((b * n + i) * hkv + h) * (size_t)d;
          const auto& specs = s == 0 ? L.spec(h).key : L.spec(h).value;
          for (size_t g = 0; g < specs.size(); ++g) {
            const quant::TQMSE& q = *P.tq[(size_t)h * 2 + s][g];
            const int m = (int)specs[g].channels.size();
            std::vector<float> xg(m), u(m), y(m);
            for (int c = 0; c < m; ++c) xg[c] = x[specs[g].channels[c]];
            std::vector<uint8_t> want(m), got(m);
            const float norm = q.encode(xg.data(), want.data());  // the CPU quantizer's codes and stored norm
            read_codes(L, pool.page(page), h, side, (int)g, slot, got);
            double nn = 0;
            for (float e : xg) nn += (double)e * e;
            for (int c = 0; c < m; ++c) u[c] = (float)(xg[c] / std::sqrt(nn));
            q.rotate(u.data(), y.data());
            const auto& lv = q.codebook().levels;
            for (int c = 0; c < m; ++c) {
              if (got[c] == want[c]) continue;
              const int lo = std::min(got[c], want[c]);
              EXPECT_EQ(std::abs((int)got[c] - (int)want[c]), 1) << "b " << b << " pos " << pos << " h " << h
                                                                  << " side " << s << " group " << g << " coord " << c;
              EXPECT_LT(std::abs(y[c] - 0.5f * (lv[lo] + lv[lo + 1])), max_margin)
                  << "b " << b << " pos " << pos << " h " << h << " side " << s << " group " << g << " coord " << c
                  << ": GPU code " << (int)got[c] << ", CPU quantizer " << (int)want[c];
              ++ties;
            }
            const uint16_t gn = read_norm(L, pool.page(page), h, side, (int)g, slot);
            EXPECT_LE(std::abs((int)gn - (int)fp32_to_fp16(norm)), 1) << "norm, b " << b << " pos " << pos;
          }
        }
    }
  return ties;
}

void run_case(int d, const std::vector<int>& starts, int n_tokens, uint32_t seed,
              cuda::PrefillVariant variant = cuda::PrefillVariant::fp32) {
  SCOPED_TRACE("d=" + std::to_string(d) + " n_tokens=" + std::to_string(n_tokens) +
               (variant == cuda::PrefillVariant::tensor_cores ? " tensor_cores" : ""));
  std::mt19937 rng(seed);
  const int hkv = 2, hq = 8, nb = (int)starts.size();
  CpuQuantizerPlan P = make_cpu_plan(d, hkv, rng);
  const LayerLayout& L = *P.layout;
  TestBatch B = make_batch(starts, rng, n_tokens);
  std::vector<uint8_t> pages((size_t)B.n_pages * L.page_bytes());
  for (auto& x : pages) x = (uint8_t)rng();
  std::normal_distribution<float> N;
  const ref::PackedPlan rplan(L, hq, P.rot, P.lvl);
  // Valid codes and norms for positions [0, start) of every sequence.
  for (int b = 0; b < nb; ++b) {
    if (starts[b] == 0) continue;
    std::vector<float> pk((size_t)starts[b] * hkv * d), pv(pk.size());
    for (auto& x : pk) x = N(rng);
    for (auto& x : pv) x = N(rng);
    const std::vector<int32_t> zero{0};
    const ref::DecodeBatch one{std::span<const int32_t>(B.page_table).subspan((size_t)b * B.max_pages, B.max_pages),
                               B.max_pages, zero};
    ref::packed_prefill(rplan, one, pages, pk, pv, starts[b]);
  }
  std::vector<float> k((size_t)nb * n_tokens * hkv * d), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = (1.f + 2.f * (float)((i % d) % 5 == 0)) * N(rng);  // anisotropic keys
    v[i] = N(rng);
  }
  cuda::PackedPlan plan(L, hq, P.rot, P.lvl);
  DevBuf<uint8_t> dpool(pages);
  DevBuf<int32_t> dpt(B.page_table), dlen(B.lens);
  DevBuf<float> dk(k), dv(v);
  cuda::DecodeBatch pb{dpt.p, B.max_pages, dlen.p, nb, B.max_len + n_tokens};
  if (n_tokens == 1)
    cuda::packed_append(plan, pb, dpool.p, dk.p, dv.p, DType::f32, nullptr);
  else
    cuda::packed_prefill(plan, pb, dpool.p, dk.p, dv.p, n_tokens, DType::f32, nullptr, variant);
  CK(cudaDeviceSynchronize());
  CK(cudaGetLastError());
  pages = dpool.get();
  const int checked = nb * n_tokens * hkv * 2 * d;
  if (variant == cuda::PrefillVariant::tensor_cores)
    EXPECT_LE(check_codes(P, B, starts, n_tokens, k, v, pages, 2.1e-3f), 1 + checked / 100);
  else
    EXPECT_LE(check_codes(P, B, starts, n_tokens, k, v, pages), 2 + checked / 100000);

  // Decode attention over the written tokens against the CPU reference with the CPU quantizer's tables.
  std::vector<int32_t> lens(nb);
  for (int b = 0; b < nb; ++b) lens[b] = starts[b] + n_tokens;
  TestBatch D = B;
  D.lens = lens;
  D.max_len = *std::max_element(lens.begin(), lens.end());
  std::vector<float> q((size_t)nb * hq * d);
  for (auto& x : q) x = N(rng);
  const float scale = 1.f / std::sqrt((float)d);
  DevBuf<uint8_t> dpages(pages);
  DevBuf<int32_t> dlens(lens);
  DevBuf<float> dq(q), dout((size_t)nb * hq * d);
  const int splits = cuda::default_splits(plan, nb, D.max_len);
  const size_t ws_bytes = cuda::decode_workspace_bytes(nb, hq, d, splits);
  DevBuf<uint8_t> ws(ws_bytes);
  cuda::DecodeBatch db{dpt.p, D.max_pages, dlens.p, nb, D.max_len};
  CK(cudaMemset(dout.p, 0xff, dout.n * sizeof(float)));  // NaN poison
  cuda::packed_decode_attention(plan, db, dpages.p, dq.p, DType::f32, scale, dout.p, ws.p, ws_bytes, splits, nullptr,
                                cuda::PackedDecodeVariant::specialized);
  CK(cudaDeviceSynchronize());
  const std::vector<float> out = dout.get();
  const bool int8_levels = cuda::uses_int8_levels(plan, cuda::PackedDecodeVariant::specialized);
  const std::vector<float> want =
      ref::packed_decode_attention(rplan, D.ref(), pages, std::span<const uint8_t>{}, q, scale,
                                   int8_levels ? ref::PackedRounding::int8_levels : ref::PackedRounding::fp16);
  for (int b = 0; b < nb; ++b) {
    const size_t n = (size_t)hq * d;
    EXPECT_LT(rel_err(out, want, (size_t)b * n, n), 1e-3) << "sequence " << b << " (length " << lens[b] << ")";
  }
}

}  // namespace

TEST(CudaTqQuantizer, AppendAndDecodeMatchTheCpuQuantizer) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  for (int d : {64, 128}) run_case(d, {0, 97, 63, 200}, 1, 800 + d);
}

TEST(CudaTqQuantizer, PrefillAndDecodeMatchTheCpuQuantizer) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  for (const auto var : {cuda::PrefillVariant::fp32, cuda::PrefillVariant::tensor_cores}) {
    run_case(64, {0, 5, 64}, 130, 900, var);
    run_case(128, {3}, 97, 901, var);
    run_case(128, {61, 0}, 70, 902, var);
  }
}
