// A TaSQ plan fitted on real SmolLM2-135M activations (few calibration tokens
// and centroids, so the test stays small) served by the packed cache: its
// attention from the stored indices equals the fake-quant cache's on every
// layer, for a real prompt's queries/keys/values captured from an fp32
// forward (keys TaSQ with shared scale and channel weights; values CQ and fp16).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ratekv/cache/fake_quant_cache.h"
#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/io/gguf.h"
#include "ratekv/model/model.h"
#include "ratekv/tasq/fit.h"
#include "ratekv/model/tokenizer.h"

using namespace ratekv;

namespace {

std::string assets_root() {
  const char* env = std::getenv("RATEKV_ASSETS");
  return env ? env : std::string(std::getenv("HOME") ? std::getenv("HOME") : ".") + "/.cache/ratekv/assets";
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

}  // namespace

TEST(PackedVqReal, FittedTasqPlanPackedEqualsFakeQuantOnSmolLM2) {
  const std::string model_path = assets_root() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  const std::string calib_path = assets_root() + "/text/calib.txt";
  if (!std::filesystem::exists(model_path)) GTEST_SKIP() << "model asset missing: " << model_path;
  if (!std::filesystem::exists(calib_path)) GTEST_SKIP() << "calibration text missing: " << calib_path;
  GgufFile f = GgufFile::open(model_path);
  Model model = Model::load(f);
  const Tokenizer tok = Tokenizer::from_gguf(f);
  const ModelConfig& cfg = model.config();

  // Fit: 512 calibration tokens, g 4 with 32 centroids (5-bit indices, G 16),
  // values CQ g 8 with 16 centroids.
  std::ifstream in(calib_path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::vector<int32_t> calib = tok.encode(ss.str(), false);
  ASSERT_GE(calib.size(), 1100u);
  const std::vector<int32_t> fit_tokens(calib.begin(), calib.begin() + 512);
  const tasq::FitCaptures cap = tasq::capture_for_fit(model, fit_tokens, 256, true);
  tasq::FitOptions o;
  o.group = 4;
  o.centroids = 32;
  o.value_group = 8;
  o.value_centroids = 16;
  o.kmeans_iters = 8;
  const tasq::FitResult fit = tasq::fit_vq_plan(cap, o);
  auto tensors = std::make_shared<VqTensors>(fit.tensors);
  Plan fp16_values = fit.plan;  // same keys, fp16 values
  for (auto& layer : fp16_values.layers)
    for (auto& hp : layer) hp.value = Codec::fp16();
  auto tensors_keys = std::make_shared<VqTensors>(fit.tensors);
  for (size_t i = 1; i < tensors_keys->entries.size(); i += 2) tensors_keys->entries[i] = {};  // value entries

  // A prompt disjoint from the fit tokens: its post-RoPE Q, pre/post-RoPE K, V.
  std::vector<int32_t> ids(calib.begin() + 600, calib.begin() + 900);
  const int64_t T = static_cast<int64_t>(ids.size());
  std::vector<std::vector<float>> qs(cfg.n_layers), kpre(cfg.n_layers), ks(cfg.n_layers), vs(cfg.n_layers);
  ForwardHooks hooks;
  hooks.on_layer = [&](const LayerActivations& a) {
    qs[a.layer].assign(a.q_post, a.q_post + a.n * a.n_heads * a.head_dim);
    kpre[a.layer].assign(a.k_pre, a.k_pre + a.n * a.n_kv_heads * a.head_dim);
    ks[a.layer].assign(a.k_post, a.k_post + a.n * a.n_kv_heads * a.head_dim);
    vs[a.layer].assign(a.v, a.v + a.n * a.n_kv_heads * a.head_dim);
  };
  DenseKVCache dense = model.make_dense_cache(T);
  model.forward(ids, 0, dense, nullptr, false, &hooks);
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(t);
  AttnParams ap;
  ap.scale = cfg.attention_scale();

  struct Variant {
    const char* name;
    const Plan* plan;
    std::shared_ptr<VqTensors> tensors;
  };
  for (const Variant& var : {Variant{"tasq K + cq V", &fit.plan, tensors},
                             Variant{"tasq K + fp16 V", &fp16_values, tensors_keys}}) {
    auto codecs = std::make_shared<const cache::PlanCodecs>(*var.plan, cfg, var.name, var.tensors);
    cache::FakeQuantKVCache fake(cfg.kv_shape(T), codecs);
    cache::PackedKVCache packed(cfg.kv_shape(T), codecs);
    double worst = 0;
    for (int l = 0; l < cfg.n_layers; ++l) {
      fake.append(l, T, pos.data(), kpre[l].data(), ks[l].data(), vs[l].data());
      packed.append(l, T, pos.data(), kpre[l].data(), ks[l].data(), vs[l].data());
      for (int64_t nq : {T, int64_t{1}}) {
        const int64_t q0 = T - nq, qrow = int64_t{cfg.n_heads} * cfg.head_dim;
        std::vector<float> of(nq * qrow), op(nq * qrow);
        fake.attend(l, nq, pos.data() + q0, qs[l].data() + q0 * qrow, of.data(), ap);
        packed.attend(l, nq, pos.data() + q0, qs[l].data() + q0 * qrow, op.data(), ap);
        const double e = rel_err(op, of);
        worst = std::max(worst, e);
        EXPECT_LT(e, 1e-5) << var.name << ", layer " << l << ", " << nq << " queries";
      }
    }
    const packed::VqLayerLayout& VL = *packed.vq_layout(0);
    std::printf("[ SmolLM2 %s, %lld tokens, 30 layers: max rel err %.3g; vq pages %.2f B/token/layer "
                "(+ scalar pages %zu B/page) ]\n",
                var.name, static_cast<long long>(T), worst, VL.bytes_per_token(), packed.layout(0).page_bytes());
  }
}
