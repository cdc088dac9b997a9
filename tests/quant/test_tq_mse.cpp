// TurboQuant-MSE: distortion through the real encoder, reference vs fast
// paths, golden codes, rotated-domain operations, options.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/quant/bitpack.h"
#include "ratekv/quant/prng.h"
#include "ratekv/quant/tq_mse.h"

using namespace ratekv;
using namespace ratekv::quant;

namespace {

std::vector<float> gaussian_rows(int64_t n, int m, uint64_t seed, double scale = 1.0) {
  SplitMix64 rng(seed);
  std::vector<float> x(n * m);
  for (auto& v : x) v = (float)(scale * rng.gaussian());
  return x;
}

// Monte-Carlo E‖u − û‖² over N random unit vectors through fake_quant.
double mc_unit_distortion(const TQMSE& q, int64_t N, uint64_t seed) {
  const int m = q.dim();
  auto x = gaussian_rows(N, m, seed);
  for (int64_t i = 0; i < N; ++i) {
    double s = 0;
    for (int j = 0; j < m; ++j) s += (double)x[i * m + j] * x[i * m + j];
    for (int j = 0; j < m; ++j) x[i * m + j] = (float)(x[i * m + j] / std::sqrt(s));
  }
  std::vector<float> xh(x.size());
  q.fake_quant(x.data(), N, xh.data());
  double d = 0;
  for (size_t i = 0; i < x.size(); ++i) d += ((double)x[i] - xh[i]) * ((double)x[i] - xh[i]);
  return d / N;
}

}  // namespace

// The Haar rotation is orthogonal and Π = Q diag(sign R_ii) makes Πx a
// function of the seed only; Hadamard is orthogonal too.
TEST(Rotation, OrthogonalAndSeeded) {
  for (auto kind : {RotationKind::haar, RotationKind::hadamard}) {
    for (int m : {2, 64, 128}) {
      Rotation r(kind, m, 42);
      const Eigen::MatrixXd P = r.matrix();
      EXPECT_LT((P * P.transpose() - Eigen::MatrixXd::Identity(m, m)).cwiseAbs().maxCoeff(), 1e-5)
          << to_string(kind) << " m=" << m;
      Rotation r2(kind, m, 42), r3(kind, m, 43);
      EXPECT_EQ((r2.matrix() - P).cwiseAbs().maxCoeff(), 0.0);
      EXPECT_GT((r3.matrix() - P).cwiseAbs().maxCoeff(), 1e-3);
    }
  }
  EXPECT_THROW(Rotation(RotationKind::hadamard, 96, 1), Error);
  Rotation h(RotationKind::haar, 97, 5);  // odd dims work for Haar
  EXPECT_LT((h.matrix() * h.matrix().transpose() - Eigen::MatrixXd::Identity(97, 97)).cwiseAbs().maxCoeff(), 1e-5);
}

// SplitMix64 reference values (Vigna's splitmix64.c with seed 0): the stream
// is portable.
TEST(Prng, SplitMix64KnownValues) {
  SplitMix64 g(0);
  EXPECT_EQ(g.next(), 0xe220a8397b1dcdafull);
  EXPECT_EQ(g.next(), 0x6e789e6aa1b965f4ull);
  EXPECT_EQ(g.next(), 0x06c45d188009454full);
  SplitMix64 n(1);
  double s = 0, s2 = 0;
  for (int i = 0; i < 200000; ++i) {
    const double v = n.gaussian();
    s += v;
    s2 += v * v;
  }
  EXPECT_NEAR(s / 200000, 0.0, 0.01);
  EXPECT_NEAR(s2 / 200000, 1.0, 0.01);
}

// Monte-Carlo distortion through the real encoder (rotation, fp16 norm) agrees
// with the codebook's analytic distortion: m = 3 → 4^(−b), m = 2 b = 1 →
// 1 − 8/π², m = 128 → 0.361, 0.116, 0.034, 0.0093.
TEST(TQMSE, MonteCarloDistortionMatchesAnalytic) {
  struct Case {
    int m, b;
    double expect;
    RotationKind rot;
  };
  const double pi = 3.14159265358979;
  const Case cases[] = {
      {3, 1, 0.25, RotationKind::haar},      {3, 2, 0.0625, RotationKind::haar},
      {3, 3, 1.0 / 64, RotationKind::haar},  {2, 1, 1 - 8 / (pi * pi), RotationKind::haar},
      {128, 1, 0.361, RotationKind::haar},   {128, 2, 0.116, RotationKind::haar},
      {128, 3, 0.034, RotationKind::haar},   {128, 4, 0.0093, RotationKind::haar},
      {128, 2, 0.116, RotationKind::hadamard}, {128, 4, 0.0093, RotationKind::hadamard},
  };
  for (const auto& c : cases) {
    TQMSE q({.dim = c.m, .bits = c.b, .seed = 9, .rotation = c.rot});
    const int64_t N = c.m <= 3 ? 200000 : 8000;
    const double d = mc_unit_distortion(q, N, 100 + c.m + c.b);
    EXPECT_NEAR(q.codebook().distortion, c.expect, 0.02 * c.expect) << "m=" << c.m << " b=" << c.b;
    EXPECT_NEAR(d, q.codebook().distortion, 0.02 * c.expect)
        << "m=" << c.m << " b=" << c.b << " rot=" << to_string(c.rot);
  }
}

// Anisotropic inputs (channel standard deviations spread over e^5: most of
// the energy in a few channels, as in real keys): the random rotation spreads
// the energy so every rotated coordinate follows the density the Lloyd–Max
// codebook was built for, and the distortion per unit vector is the
// codebook's analytic one. Without the rotation (identity: the same quantizer,
// codebook and norm) the high-variance coordinates overflow the codebook and
// the distortion is several times larger, so this test fails when the
// rotation does nothing — the isotropic test above cannot tell.
TEST(TQMSE, AnisotropicInputNeedsTheRotation) {
  struct Case {
    int m, b;
    RotationKind rot;
  };
  for (const Case c : {Case{64, 2, RotationKind::haar}, Case{64, 3, RotationKind::haar},
                       Case{128, 3, RotationKind::haar}, Case{128, 2, RotationKind::hadamard}}) {
    const int64_t N = 6000;
    auto x = gaussian_rows(N, c.m, 500 + c.m + c.b);
    for (int64_t i = 0; i < N; ++i)
      for (int j = 0; j < c.m; ++j) x[i * c.m + j] *= (float)std::exp(-5.0 * j / c.m);
    auto distortion = [&](RotationKind rot) {
      TQMSE q({.dim = c.m, .bits = c.b, .seed = 11, .rotation = rot});
      std::vector<float> u(x.size()), uh(x.size());
      for (int64_t i = 0; i < N; ++i) {
        double n = 0;
        for (int j = 0; j < c.m; ++j) n += (double)x[i * c.m + j] * x[i * c.m + j];
        for (int j = 0; j < c.m; ++j) u[i * c.m + j] = (float)(x[i * c.m + j] / std::sqrt(n));
      }
      q.fake_quant(u.data(), N, uh.data());
      double d = 0;
      for (size_t i = 0; i < u.size(); ++i) d += ((double)u[i] - uh[i]) * ((double)u[i] - uh[i]);
      return std::pair{d / N, q.codebook().distortion};
    };
    const auto [d_rot, analytic] = distortion(c.rot);
    const auto [d_id, analytic_id] = distortion(RotationKind::identity);
    EXPECT_EQ(analytic, analytic_id);  // same codebook: only the rotation differs
    EXPECT_NEAR(d_rot, analytic, 0.08 * analytic) << "m=" << c.m << " b=" << c.b << " " << to_string(c.rot);
    EXPECT_GT(d_id, 2.0 * analytic) << "m=" << c.m << " b=" << c.b << ": identity rotation " << d_id;
  }
}

// encode() (binary search) and encode_packed() are bit-exact with encode_ref()
// (linear threshold count); decode_packed equals decode.
TEST(TQMSE, FastEncodeMatchesReference) {
  for (int m : {2, 7, 64, 97, 128}) {
    for (int b : {1, 2, 3, 4, 5, 8}) {
      TQMSE q({.dim = m, .bits = b, .seed = 1234});
      const int64_t N = 200;
      auto x = gaussian_rows(N, m, m * 31 + b, 3.0);
      std::vector<uint8_t> i_ref(m), i_fast(m), packed(q.packed_code_bytes()), packed_ref(q.packed_code_bytes());
      std::vector<float> d1(m), d2(m);
      for (int64_t t = 0; t < N; ++t) {
        const float n_ref = q.encode_ref(&x[t * m], i_ref.data());
        const float n_fast = q.encode(&x[t * m], i_fast.data());
        ASSERT_EQ(i_ref, i_fast) << "m=" << m << " b=" << b << " row " << t;
        ASSERT_EQ(n_ref, n_fast);
        ASSERT_EQ(n_ref, round_fp16(n_ref));  // fp16 norm storage
        for (int i = 0; i < m; ++i) ASSERT_LT(i_ref[i], 1 << b);
        const float n_p = q.encode_packed(&x[t * m], packed.data());
        std::vector<uint16_t> wide(i_ref.begin(), i_ref.end());
        pack_bits_ref(wide.data(), m, b, packed_ref.data());
        ASSERT_EQ(packed, packed_ref);
        ASSERT_EQ(n_p, n_ref);
        q.decode(i_ref.data(), n_ref, d1.data());
        q.decode_packed(packed.data(), n_p, d2.data());
        ASSERT_EQ(d1, d2);
      }
    }
  }
}

// Decode against an independent dense reference: x̂ = ñ Πᵀ c[idx] in double.
TEST(TQMSE, DecodeMatchesDenseFormula) {
  const int m = 97;
  TQMSE q({.dim = m, .bits = 3, .seed = 77});
  auto x = gaussian_rows(1, m, 5);
  std::vector<uint8_t> idx(m);
  const float n = q.encode(x.data(), idx.data());
  std::vector<float> xh(m);
  q.decode(idx.data(), n, xh.data());
  const Eigen::MatrixXd P = q.rotation().matrix();
  Eigen::VectorXd c(m);
  for (int i = 0; i < m; ++i) c[i] = q.codebook().levels[idx[i]];
  const Eigen::VectorXd ref = (double)n * P.transpose() * c;
  for (int i = 0; i < m; ++i) EXPECT_NEAR(xh[i], ref[i], 1e-5 * n);
  // and the codes are the nearest levels to Π u
  Eigen::VectorXd u(m);
  for (int i = 0; i < m; ++i) u[i] = x[i];
  const Eigen::VectorXd y = P * (u / u.norm());
  for (int i = 0; i < m; ++i) {
    int best = 0;
    for (int j = 1; j < 8; ++j)
      if (std::fabs(y[i] - q.codebook().levels_f64[j]) < std::fabs(y[i] - q.codebook().levels_f64[best])) best = j;
    EXPECT_EQ(idx[i], best) << i;
  }
}

// Same seed -> same codes. Golden codes for a fixed input and seed, committed:
// a change here means every stored cache and plan changes meaning.
TEST(TQMSE, GoldenCodes) {
  const int m = 16;
  std::vector<float> x(m);
  for (int i = 0; i < m; ++i) x[i] = (float)std::sin(0.7 * i + 0.3) * (1.0f + 0.1f * i);
  TQMSE haar({.dim = m, .bits = 3, .seed = 20261129});
  TQMSE hada({.dim = m, .bits = 2, .seed = 20261129, .rotation = RotationKind::hadamard});
  std::vector<uint8_t> ih(m), id(m);
  const float nh = haar.encode(x.data(), ih.data());
  const float nd = hada.encode(x.data(), id.data());
  const std::vector<uint8_t> golden_haar = {5, 1, 4, 6, 6, 7, 3, 4, 5, 3, 4, 7, 4, 5, 2, 2};
  const std::vector<uint8_t> golden_hada = {2, 1, 1, 2, 3, 1, 1, 2, 2, 2, 1, 3, 0, 1, 3, 1};
  EXPECT_EQ(ih, golden_haar);
  EXPECT_EQ(id, golden_hada);
  EXPECT_EQ(fp32_to_fp16(nh), 0x4534);
  EXPECT_EQ(nh, nd);
  TQMSE again({.dim = m, .bits = 3, .seed = 20261129});
  std::vector<uint8_t> i2(m);
  again.encode(x.data(), i2.data());
  EXPECT_EQ(i2, ih);
}

// q·x̂ = ñ (Πq)·c[idx] and Σ w_t x̂_t = Πᵀ Σ w_t ñ_t c[idx_t].
TEST(TQMSE, RotatedDomainScoreAndAccumulate) {
  for (auto rot : {RotationKind::haar, RotationKind::hadamard}) {
    const int m = 64, T = 37;
    TQMSE q({.dim = m, .bits = 3, .seed = 3, .rotation = rot});
    auto x = gaussian_rows(T, m, 11, 2.0);
    auto qv = gaussian_rows(1, m, 12);
    std::vector<float> q_rot(m), acc_rot(m, 0.0f), acc(m), out(m), xh(m), direct(m, 0.0f);
    q.rotate(qv.data(), q_rot.data());
    std::vector<uint8_t> idx(m);
    for (int t = 0; t < T; ++t) {
      const float n = q.encode(&x[t * m], idx.data());
      q.decode(idx.data(), n, xh.data());
      double s = 0;
      for (int i = 0; i < m; ++i) s += (double)qv[i] * xh[i];
      EXPECT_NEAR(q.score_rotated(q_rot.data(), idx.data(), n), s, 1e-4 * (1 + std::fabs(s)));
      const float w = 0.1f * (t + 1);
      q.accumulate_rotated(w, idx.data(), n, acc_rot.data());
      for (int i = 0; i < m; ++i) direct[i] += w * xh[i];
    }
    q.unrotate(acc_rot.data(), out.data());
    for (int i = 0; i < m; ++i) EXPECT_NEAR(out[i], direct[i], 1e-4 * (1 + std::fabs(direct[i])));
  }
}

// b = 0 drops; norm correction restores ‖x̂‖ = ‖x‖ (to fp16); effective bits.
TEST(TQMSE, ZeroBitsNormCorrectionAndBits) {
  const int m = 64;
  auto x = gaussian_rows(5, m, 21);
  TQMSE drop({.dim = m, .bits = 0, .seed = 1});
  std::vector<float> xh(x.size(), 1.0f);
  drop.fake_quant(x.data(), 5, xh.data());
  for (float v : xh) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(drop.bits_per_element(), 0.0);
  TQMSE nc({.dim = m, .bits = 2, .seed = 1, .norm_correction = true});
  nc.fake_quant(x.data(), 5, xh.data());
  for (int t = 0; t < 5; ++t) {
    double a = 0, b = 0;
    for (int i = 0; i < m; ++i) {
      a += (double)x[t * m + i] * x[t * m + i];
      b += (double)xh[t * m + i] * xh[t * m + i];
    }
    EXPECT_NEAR(std::sqrt(b), std::sqrt(a), 2e-3 * std::sqrt(a));
  }
  EXPECT_DOUBLE_EQ(TQMSE({.dim = 64, .bits = 3}).bits_per_element(), 3.25);
  EXPECT_DOUBLE_EQ(TQMSE({.dim = 128, .bits = 2, .norm = NormCoding::fp32}).bits_per_element(), 2.25);
  // In-place fake quant (x and xhat alias) equals out-of-place.
  TQMSE q({.dim = m, .bits = 3, .seed = 4});
  std::vector<float> a = x, b(x.size());
  q.fake_quant(x.data(), 5, b.data());
  q.fake_quant(a.data(), 5, a.data());
  EXPECT_EQ(a, b);
}

TEST(TQMSE, RejectsBadInput) {
  EXPECT_THROW(TQMSE({.dim = 1, .bits = 2}), Error);
  EXPECT_THROW(TQMSE({.dim = 64, .bits = 9}), Error);
  EXPECT_THROW(TQMSE({.dim = 96, .bits = 2, .rotation = RotationKind::hadamard}), Error);
  TQMSE q({.dim = 4, .bits = 2});
  const float bad[4] = {1.0f, NAN, 0.0f, 2.0f};
  float out[4];
  std::vector<uint8_t> idx(4);
  EXPECT_THROW(q.fake_quant(bad, 1, out), Error);
  EXPECT_THROW(q.encode_ref(bad, idx.data()), Error);
  const float huge[4] = {1e5f, 0.0f, 0.0f, 0.0f};  // norm > 65504: no fp16 norm
  EXPECT_THROW(q.fake_quant(huge, 1, out), Error);
  TQMSE q32({.dim = 4, .bits = 2, .norm = NormCoding::fp32});
  EXPECT_NO_THROW(q32.fake_quant(huge, 1, out));
}
