// Gradient sensitivity (calib/sensitivity.h): the float accumulation against
// a direct float64 computation on a tiny random model, the optional tensors
// of the statistics file (round trip, files without them), and the
// allocators' "grad" / "activation" views.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "../support/tiny_model.h"
#include "ratekv/calib/calibrate.h"
#include "ratekv/calib/kv_stats.h"
#include "ratekv/calib/sensitivity.h"
#include "ratekv/common/error.h"
#include "ratekv/model/backward.h"
#include "ratekv/io/safetensors.h"

using namespace ratekv;
using namespace ratekv::calib;

namespace {

const std::vector<int32_t> kTokens = {3, 36, 0, 17, 17, 5, 22, 9, 1, 30, 11, 4, 4, 19, 2, 28};

std::string temp_path(const char* name) { return (std::filesystem::temp_directory_path() / name).string(); }

}  // namespace

// 2 sequences of 7 tokens (the last 2 of the 16 unused): the float means equal
// Σ_seq Σ_t g² / 14 computed from the float64 gradients.
TEST(GradSensitivity, MatchesDirectFloat64Computation) {
  Model m = ratekv_test::tiny_model(7);
  const GradSensitivity s = gradient_sensitivity(m, kTokens, 2, 7);
  EXPECT_EQ(s.n_sequences, 2);
  EXPECT_EQ(s.seq_len, 7);
  const int L = 3, Hkv = 2, d = 6;
  const size_t per_layer = Hkv * d;
  ASSERT_EQ(s.k_pre_sq.size(), L * per_layer);
  std::vector<double> kpre(L * per_layer, 0), kpost(L * per_layer, 0), v(L * per_layer, 0);
  double loss = 0;
  const ModelBackward<double> bw(m);
  for (int q = 0; q < 2; ++q) {
    const std::vector<int32_t> seq(kTokens.begin() + 7 * q, kTokens.begin() + 7 * q + 7);
    const KVGradients<double> g = bw.gradients(seq);
    loss += g.loss / 2;
    for (int l = 0; l < L; ++l) {
      for (size_t i = 0; i < 7 * per_layer; ++i) {
        kpre[l * per_layer + i % per_layer] += g.layers[l].dk_pre[i] * g.layers[l].dk_pre[i] / 14;
        kpost[l * per_layer + i % per_layer] += g.layers[l].dk_post[i] * g.layers[l].dk_post[i] / 14;
        v[l * per_layer + i % per_layer] += g.layers[l].dv[i] * g.layers[l].dv[i] / 14;
      }
    }
  }
  EXPECT_NEAR(s.mean_loss, loss, 1e-5 * loss);
  for (size_t i = 0; i < kpre.size(); ++i) {
    EXPECT_NEAR(s.k_pre_sq[i], kpre[i], 1e-4 * kpre[i] + 1e-12) << i;
    EXPECT_NEAR(s.k_post_sq[i], kpost[i], 1e-4 * kpost[i] + 1e-12) << i;
    EXPECT_NEAR(s.v_sq[i], v[i], 1e-4 * v[i] + 1e-12) << i;
    EXPECT_GT(v[i], 0.0) << i;
  }
  // Per head, pre- and post-RoPE sums agree (RoPE is orthogonal), though the
  // channels differ.
  bool channels_differ = false;
  for (size_t lh = 0; lh < size_t(L * Hkv); ++lh) {
    double a = 0, b = 0;
    for (int c = 0; c < d; ++c) {
      a += s.k_pre_sq[lh * d + c];
      b += s.k_post_sq[lh * d + c];
      channels_differ |= std::abs(s.k_pre_sq[lh * d + c] - s.k_post_sq[lh * d + c]) > 1e-3 * s.k_post_sq[lh * d + c];
    }
    EXPECT_NEAR(a, b, 1e-5 * b) << lh;
  }
  EXPECT_TRUE(channels_differ);
}

TEST(GradSensitivity, RejectsBadArguments) {
  Model m = ratekv_test::tiny_model(7);
  EXPECT_THROW(gradient_sensitivity(m, kTokens, 0, 4), Error);
  EXPECT_THROW(gradient_sensitivity(m, kTokens, 2, 1), Error);
  EXPECT_THROW(gradient_sensitivity(m, kTokens, 3, 6), Error);   // 18 > 16 tokens
  EXPECT_THROW(gradient_sensitivity(m, kTokens, 1, 65), Error);  // beyond context 64
  EXPECT_NO_THROW(gradient_sensitivity(m, kTokens, 2, 8));       // exactly 16
}

TEST(GradSensitivity, StatsFileRoundTripAndAllocatorViews) {
  Model m = ratekv_test::tiny_model(7);
  KVStats s = calibrate(m, kTokens, 8);
  const std::string plain = temp_path("ratekv_test_sens_plain.safetensors");
  s.save(plain);  // a file without sensitivity, as older builds wrote
  s.grad = gradient_sensitivity(m, kTokens, 2, 8);
  const std::string path = temp_path("ratekv_test_sens.safetensors");
  s.save(path);

  const KVStats r = KVStats::load(path);
  EXPECT_EQ(r.grad.n_sequences, 2);
  EXPECT_EQ(r.grad.seq_len, 8);
  EXPECT_DOUBLE_EQ(r.grad.mean_loss, s.grad.mean_loss);
  ASSERT_EQ(r.grad.v_sq.size(), s.grad.v_sq.size());
  for (size_t i = 0; i < s.grad.v_sq.size(); ++i) {
    EXPECT_EQ(r.grad.v_sq[i], double(float(s.grad.v_sq[i])));
    EXPECT_EQ(r.grad.k_pre_sq[i], double(float(s.grad.k_pre_sq[i])));
    EXPECT_EQ(r.grad.k_post_sq[i], double(float(s.grad.k_post_sq[i])));
  }

  const int Hkv = 2, d = 6;
  const CalibStats a = load_alloc_stats(path);
  ASSERT_TRUE(a.sensitivity.count("grad"));
  ASSERT_TRUE(a.sensitivity.count("activation"));
  const Sensitivity& g = a.sensitivity.at("grad");
  const Sensitivity& act = a.sensitivity.at("activation");
  ASSERT_EQ(g.k.size(), size_t(3 * Hkv));
  for (int lh = 0; lh < 3 * Hkv; ++lh) {
    double k = 0, v = 0, ek = 0, ev = 0;
    for (int c = 0; c < d; ++c) {
      k += r.grad.k_post_sq[lh * d + c];
      v += r.grad.v_sq[lh * d + c];
      ev += r.v_sq[lh * d + c];
    }
    for (int b = 0; b < d / 2; ++b) ek += r.k_block_energy[lh * (d / 2) + b];
    EXPECT_NEAR(g.k[lh], k, 1e-12 * k);
    EXPECT_NEAR(g.v[lh], v, 1e-12 * v);
    EXPECT_NEAR(act.k[lh], ek, 1e-12 * ek);
    EXPECT_NEAR(act.v[lh], ev, 1e-12 * ev);
    EXPECT_GT(g.k[lh], 0.0);
  }

  // A file without sensitivity still loads: no "grad", the activation proxy is there.
  const KVStats p = KVStats::load(plain);
  EXPECT_EQ(p.grad.n_sequences, 0);
  EXPECT_TRUE(p.grad.v_sq.empty());
  const CalibStats pa = load_alloc_stats(plain);
  EXPECT_FALSE(pa.sensitivity.count("grad"));
  EXPECT_TRUE(pa.sensitivity.count("activation"));
  std::filesystem::remove(path);
  std::filesystem::remove(plain);
}

TEST(GradSensitivity, StatsFileErrors) {
  Model m = ratekv_test::tiny_model(7);
  KVStats s = calibrate(m, kTokens, 8);
  s.grad = gradient_sensitivity(m, kTokens, 1, 8);
  const std::string path = temp_path("ratekv_test_sens_bad.safetensors");
  KVStats neg = s;
  neg.grad.v_sq[3] = -1.0;
  try {
    neg.save(path);
    FAIL() << "negative squared gradient accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("grad_sq_v"), std::string::npos) << e.what();
  }
  KVStats shape = s;
  shape.grad.k_pre_sq.pop_back();
  EXPECT_THROW(shape.save(path), Error);
  KVStats orphan = s;
  orphan.grad.n_sequences = 0;  // tensors without the sensitivity record
  EXPECT_THROW(orphan.save(path), Error);
  std::filesystem::remove(path);
}
