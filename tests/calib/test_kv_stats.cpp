// Calibration statistics: closed-form accumulator cases, a tiny random model
// against a direct two-pass computation, the safetensors round trip, and
// validation errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "ratekv/calib/accumulator.h"
#include "ratekv/calib/calibrate.h"
#include "ratekv/calib/kv_stats.h"
#include "ratekv/common/error.h"
#include "ratekv/io/safetensors.h"
#include "../support/tiny_model.h"

using namespace ratekv;
using namespace ratekv::calib;

namespace {

using ratekv_test::randn;

// 3 layers, 4 query heads / 2 KV heads, head_dim 6 (3 RoPE blocks), d_model 20.
Model tiny_model(RopeLayout layout = RopeLayout::Interleaved) { return ratekv_test::tiny_model(7, layout); }

const std::vector<int32_t> kTokens = {3, 36, 0, 17, 17, 5, 22, 9, 1, 30, 11};

ModelConfig one_layer_config() {
  return ratekv_test::tiny_config({.n_layers = 1,
                                   .n_heads = 2,
                                   .n_kv_heads = 1,
                                   .head_dim = 4,
                                   .d_model = 8,
                                   .d_ff = 8,
                                   .n_vocab = 10,
                                   .n_ctx = 16,
                                   .rope_theta = 10000.0});
}

}  // namespace

// Two tokens, two query heads sharing one KV head, head_dim 4 (blocks {0,1}, {2,3}).
TEST(KVStatsAccumulator, HandComputedTwoTokens) {
  const ModelConfig c = one_layer_config();
  // q (2 tokens, 2 heads, 4): token 0: head0 (1,2,0,0) head1 (0,0,3,0); token 1: head0 (0,0,0,1) head1 (2,0,0,2)
  const std::vector<float> q = {1, 2, 0, 0, 0, 0, 3, 0, 0, 0, 0, 1, 2, 0, 0, 2};
  // k (2 tokens, 1 head, 4): (1,0,2,0), (3,0,0,4); v: (1,1,1,1), (0,2,0,-2)
  const std::vector<float> k = {1, 0, 2, 0, 3, 0, 0, 4};
  const std::vector<float> v = {1, 1, 1, 1, 0, 2, 0, -2};
  const int32_t pos[2] = {0, 1};
  LayerActivations a;
  a.layer = 0;
  a.n = 2;
  a.pos = pos;
  a.n_heads = 2;
  a.n_kv_heads = 1;
  a.head_dim = 4;
  a.q_pre = a.q_post = q.data();
  a.k_pre = a.k_post = k.data();
  a.v = v.data();
  KVStatsAccumulator acc(c);
  acc.add(a);
  const KVStats s = acc.finish();
  // q block 0: ‖(1,2)‖²=5, 0, 0, ‖(2,0)‖²=4 → 9 / (2 tokens · 2 heads) = 2.25
  // q block 1: 0, 9, 1, 4 → 14 / 4 = 3.5
  ASSERT_EQ(s.q_block_energy.size(), 2u);
  EXPECT_DOUBLE_EQ(s.q_block_energy[0], 2.25);
  EXPECT_DOUBLE_EQ(s.q_block_energy[1], 3.5);
  // k block 0: 1, 9 → 5; block 1: 4, 16 → 10
  EXPECT_DOUBLE_EQ(s.k_block_energy[0], 5.0);
  EXPECT_DOUBLE_EQ(s.k_block_energy[1], 10.0);
  // key mean (2, 0, 1, 2); covariance: deviations (−1,0,1,−2), (1,0,−1,2) → outer/1
  const std::vector<double> mean = {2, 0, 1, 2};
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(s.k_pre_mean[i], mean[i]);
  const double dev[4] = {-1, 0, 1, -2};
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_NEAR(s.k_pre_cov[i * 4 + j], dev[i] * dev[j], 1e-12) << i << "," << j;
  // q second moments per query head: head0 (0.5, 2, 0, 0.5), head1 (2, 0, 4.5, 2)
  const std::vector<double> qsq = {0.5, 2, 0, 0.5, 2, 0, 4.5, 2};
  for (int i = 0; i < 8; ++i) EXPECT_DOUBLE_EQ(s.q_pre_sq[i], qsq[i]);
  const std::vector<double> vsq = {0.5, 2.5, 0.5, 2.5};
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(s.v_sq[i], vsq[i]);
  EXPECT_EQ(s.n_tokens, 2);
}

TEST(KVStatsAccumulator, RejectsWrongShapesAndUnevenLayers) {
  ModelConfig c = one_layer_config();
  c.n_layers = 2;
  KVStatsAccumulator acc(c);
  EXPECT_THROW(acc.finish(), Error);  // nothing added
  const std::vector<float> q(8, 1.0f), k(4, 1.0f);
  const int32_t pos[1] = {0};
  LayerActivations a;
  a.layer = 0;
  a.n = 1;
  a.pos = pos;
  a.n_heads = 2;
  a.n_kv_heads = 1;
  a.head_dim = 4;
  a.q_pre = a.q_post = q.data();
  a.k_pre = a.k_post = a.v = k.data();
  acc.add(a);
  try {
    acc.finish();
    FAIL() << "uneven layers accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1 saw 0 tokens"), std::string::npos) << e.what();
  }
  // Every layer at one token: statistics of nothing (a key covariance of 0), refused.
  a.layer = 1;
  acc.add(a);
  try {
    acc.finish();
    FAIL() << "one token accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1 token was processed; at least 2 are needed"), std::string::npos)
        << e.what();
  }
  a.head_dim = 6;
  EXPECT_THROW(acc.add(a), Error);
  a.head_dim = 4;
  a.layer = 2;
  EXPECT_THROW(acc.add(a), Error);
}

// calibrate() on a tiny random model, chunks 4 + 4 + 3, against a direct
// two-pass computation over hooked activations (both RoPE layouts).
class CalibrateTiny : public ::testing::TestWithParam<RopeLayout> {};

TEST_P(CalibrateTiny, MatchesDirectComputation) {
  Model m = tiny_model(GetParam());
  const ModelConfig& c = m.config();
  const int L = c.n_layers, H = c.n_heads, Hkv = c.n_kv_heads, d = c.head_dim, B = d / 2, r = H / Hkv;
  const int64_t ctx = 4, N = static_cast<int64_t>(kTokens.size());
  const KVStats s = calibrate(m, kTokens, ctx);
  EXPECT_EQ(s.n_tokens, N);
  EXPECT_EQ(s.ctx, ctx);
  // Direct: capture every layer's activations of the same chunks.
  std::vector<std::vector<float>> qp(L), qq(L), kp(L), kq(L), vv(L);
  ForwardHooks hooks;
  hooks.on_layer = [&](const LayerActivations& a) {
    qp[a.layer].insert(qp[a.layer].end(), a.q_post, a.q_post + a.n * H * d);
    qq[a.layer].insert(qq[a.layer].end(), a.q_pre, a.q_pre + a.n * H * d);
    kp[a.layer].insert(kp[a.layer].end(), a.k_post, a.k_post + a.n * Hkv * d);
    kq[a.layer].insert(kq[a.layer].end(), a.k_pre, a.k_pre + a.n * Hkv * d);
    vv[a.layer].insert(vv[a.layer].end(), a.v, a.v + a.n * Hkv * d);
  };
  for (int64_t s0 = 0; s0 < N; s0 += ctx) {
    const int64_t n = std::min(ctx, N - s0);
    auto cache = m.make_dense_cache(n);
    m.forward(std::span<const int32_t>(kTokens).subspan(s0, n), 0, cache, nullptr, false, &hooks);
  }
  // Block i of the layout: interleaved (2i, 2i+1), NeoX (i, i + d/2) — written out, not via rope_pairs().
  auto ch = [&](int i, int which) {
    return GetParam() == RopeLayout::Interleaved ? 2 * i + which : i + which * B;
  };
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < Hkv; ++h) {
      for (int i = 0; i < B; ++i) {
        double eq = 0, ek = 0;
        for (int64_t t = 0; t < N; ++t) {
          for (int g = h * r; g < (h + 1) * r; ++g)
            for (int w = 0; w < 2; ++w) eq += std::pow(qp[l][(t * H + g) * d + ch(i, w)], 2);
          for (int w = 0; w < 2; ++w) ek += std::pow(kp[l][(t * Hkv + h) * d + ch(i, w)], 2);
        }
        const size_t at = (static_cast<size_t>(l) * Hkv + h) * B + i;
        EXPECT_NEAR(s.q_block_energy[at], eq / (N * r), 1e-5 * (1 + eq / (N * r))) << l << " " << h << " " << i;
        EXPECT_NEAR(s.k_block_energy[at], ek / N, 1e-5 * (1 + ek / N)) << l << " " << h << " " << i;
      }
      // Two-pass mean and covariance of pre-RoPE keys.
      std::vector<double> mu(d, 0.0);
      for (int64_t t = 0; t < N; ++t)
        for (int a = 0; a < d; ++a) mu[a] += kq[l][(t * Hkv + h) * d + a] / static_cast<double>(N);
      for (int a = 0; a < d; ++a) {
        EXPECT_NEAR(s.k_pre_mean[(static_cast<size_t>(l) * Hkv + h) * d + a], mu[a], 1e-5);
        double vs = 0;
        for (int64_t t = 0; t < N; ++t) vs += std::pow(vv[l][(t * Hkv + h) * d + a], 2) / N;
        EXPECT_NEAR(s.v_sq[(static_cast<size_t>(l) * Hkv + h) * d + a], vs, 1e-5 * (1 + vs));
        for (int b = 0; b < d; ++b) {
          double cv = 0;
          for (int64_t t = 0; t < N; ++t)
            cv += (kq[l][(t * Hkv + h) * d + a] - mu[a]) * (kq[l][(t * Hkv + h) * d + b] - mu[b]) / N;
          EXPECT_NEAR(s.k_pre_cov[((static_cast<size_t>(l) * Hkv + h) * d + a) * d + b], cv, 1e-4 * (1 + std::abs(cv)));
        }
      }
    }
  for (int l = 0; l < L; ++l)
    for (int g = 0; g < H; ++g)
      for (int a = 0; a < d; ++a) {
        double e = 0;
        for (int64_t t = 0; t < N; ++t) e += std::pow(qq[l][(t * H + g) * d + a], 2) / N;
        EXPECT_NEAR(s.q_pre_sq[(static_cast<size_t>(l) * H + g) * d + a], e, 1e-5 * (1 + e));
      }
  // RoPE keeps block norms: pre-RoPE block energies equal the post-RoPE ones.
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < Hkv; ++h)
      for (int i = 0; i < B; ++i) {
        double pre = 0;
        for (int64_t t = 0; t < N; ++t)
          for (int w = 0; w < 2; ++w) pre += std::pow(kq[l][(t * Hkv + h) * d + ch(i, w)], 2) / N;
        EXPECT_NEAR(s.k_block_energy[(static_cast<size_t>(l) * Hkv + h) * B + i], pre, 1e-4 * (1 + pre));
      }
}

// Only "llama" (interleaved) has a forward pass today; the NeoX block → channel
// mapping is covered by the cache tests (PlanCodecs::quantizer_json).
INSTANTIATE_TEST_SUITE_P(Layouts, CalibrateTiny, ::testing::Values(RopeLayout::Interleaved));

TEST(KVStatsFile, RoundTripAndAllocatorView) {
  Model m = tiny_model();
  KVStats s = calibrate(m, kTokens, 5);
  s.model.file = "tiny.gguf";
  s.model.sha256 = std::string(64, 'a');
  s.text_file = "calib.txt";
  s.text_sha256 = std::string(64, 'b');
  const auto path = (std::filesystem::temp_directory_path() / "ratekv_test_stats.safetensors").string();
  s.save(path);
  EXPECT_TRUE(is_safetensors_file(path));
  const KVStats r = KVStats::load(path);
  EXPECT_EQ(r.model.file, "tiny.gguf");
  EXPECT_EQ(r.model.sha256, s.model.sha256);
  EXPECT_EQ(r.text_sha256, s.text_sha256);
  EXPECT_EQ(r.n_tokens, 11);
  EXPECT_EQ(r.ctx, 5);
  EXPECT_EQ(r.n_heads, 4);
  ASSERT_EQ(r.k_pre_cov.size(), s.k_pre_cov.size());
  for (size_t i = 0; i < s.k_pre_cov.size(); ++i)
    EXPECT_EQ(r.k_pre_cov[i], static_cast<double>(static_cast<float>(s.k_pre_cov[i])));
  r.validate_against(m.config());
  // The allocators' view: s_i = ½(q_i + k_i).
  const CalibStats a = load_alloc_stats(path);
  EXPECT_EQ(a.n_tokens, 11);
  EXPECT_EQ(a.source, "calib.txt");
  const std::vector<double> e = a.block_energies(2, 1);
  ASSERT_EQ(e.size(), 3u);
  for (int i = 0; i < 3; ++i)
    EXPECT_NEAR(e[i], 0.5 * (r.q_block_energy[(2 * 2 + 1) * 3 + i] + r.k_block_energy[(2 * 2 + 1) * 3 + i]), 1e-12);
  std::filesystem::remove(path);
}

TEST(KVStatsFile, ClearErrors) {
  Model m = tiny_model();
  KVStats s = calibrate(m, kTokens, 11);
  ModelConfig other = m.config();
  other.n_layers = 5;
  other.head_dim = 8;
  try {
    s.validate_against(other, "stats.safetensors");
    FAIL() << "mismatch accepted";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("n_layers = 3, model has 5"), std::string::npos) << w;
    EXPECT_NE(w.find("head_dim = 6, model has 8"), std::string::npos) << w;
  }
  // A negative energy is refused when saving.
  KVStats bad = s;
  bad.k_block_energy[4] = -1.0;
  const auto path = (std::filesystem::temp_directory_path() / "ratekv_test_stats_bad.safetensors").string();
  EXPECT_THROW(bad.save(path), Error);
  // A file with a tensor of the wrong shape is refused on load, naming the tensor.
  SafetensorsWriter w;
  w.set_metadata("format", "ratekv-calib-stats");
  w.set_metadata("ratekv",
                 R"({"format":"ratekv-calib-stats","version":1,"model":{"arch":"llama","n_layers":3,"n_heads":4,)"
                 R"("n_kv_heads":2,"head_dim":6,"rope_layout":"interleaved","file":"","sha256":""},)"
                 R"("text":{"file":"","sha256":""},"n_tokens":11,"ctx":11})");
  const std::vector<float> wrong(5, 1.0f);
  w.add_f32("q_block_energy", {5}, wrong);
  w.write(path);
  try {
    KVStats::load(path);
    FAIL() << "bad shape accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q_block_energy"), std::string::npos) << e.what();
  }
  // Not a statistics file at all.
  SafetensorsWriter w2;
  w2.add_f32("x", {1}, std::vector<float>{1.0f});
  w2.write(path);
  EXPECT_THROW(KVStats::load(path), Error);
  std::filesystem::remove(path);
  EXPECT_THROW(load_alloc_stats(path), Error);
}

// A metadata key or a tensor this build does not read is an error naming it
// (it used to be ignored silently): a good file re-written with one extra key
// or tensor each time.
TEST(KVStatsFile, UnknownKeysAndTensorsAreErrors) {
  Model m = tiny_model();
  const KVStats s = calibrate(m, kTokens, 11);
  const auto path = (std::filesystem::temp_directory_path() / "ratekv_test_stats_unknown.safetensors").string();
  s.save(path);
  const SafetensorsFile good = SafetensorsFile::open(path);
  auto rewrite = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& extra_tensor) {
    SafetensorsWriter w;
    nlohmann::json meta = nlohmann::json::parse(good.metadata_value("ratekv"));
    edit(meta);
    w.set_metadata("format", "ratekv-calib-stats");
    w.set_metadata("ratekv", meta.dump());
    for (const StTensor& t : good.tensors()) w.add_f32(t.name, t.shape, good.read_f32(t.name));
    if (!extra_tensor.empty()) w.add_f32(extra_tensor, {1}, std::vector<float>{1.0f});
    w.write(path);
    try {
      KVStats::load(path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(rewrite([](nlohmann::json&) {}, ""), "(no error)");
  EXPECT_NE(rewrite([](nlohmann::json& j) { j["norm_correction"] = true; }, "").find("norm_correction: unknown key"),
            std::string::npos);
  EXPECT_NE(rewrite([](nlohmann::json& j) { j["model"]["n_head"] = 4; }, "").find(".model.n_head: unknown key"),
            std::string::npos);
  EXPECT_NE(rewrite([](nlohmann::json& j) { j["text"]["lines"] = 3; }, "").find(".text.lines: unknown key"),
            std::string::npos);
  EXPECT_NE(rewrite([](nlohmann::json&) {}, "k_post_sq").find("tensor 'k_post_sq': unknown to this build"),
            std::string::npos);
  std::filesystem::remove(path);
}

// A binary file that is neither the safetensors statistics nor JSON (here a
// GGUF header: the model given where the statistics belong) is named as not a
// ratekv stats file, with its first bytes, not as a JSON syntax error.
TEST(KVStatsFile, NonStatsFileIsNamed) {
  const auto path = (std::filesystem::temp_directory_path() / "ratekv_test_stats_binary.gguf").string();
  std::ofstream(path, std::ios::binary) << std::string("GGUF\x03\x00\x00\x00\x00\x00\x00\x00", 12);
  try {
    load_alloc_stats(path);
    FAIL() << "a GGUF file was accepted as statistics";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_EQ(w.rfind(path + ": not a ratekv stats file", 0), 0u) << w;
    EXPECT_NE(w.find("GGUF model file"), std::string::npos) << w;
    EXPECT_EQ(w.find("invalid JSON"), std::string::npos) << w;
  }
  std::filesystem::remove(path);
}
