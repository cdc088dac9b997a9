// Synthetic models: configurations and CPU weights (ratekv/model/synthetic.h).
#include "ratekv/model/synthetic.h"

#include <cmath>

#include "ratekv/common/error.h"
#include "ratekv/common/param_error.h"

namespace ratekv {

int synthetic_amp_exp(int64_t fan_in) {
  check(fan_in > 0, "synthetic_amp_exp: fan_in {} must be positive", fan_in);
  return static_cast<int>(std::lround(std::log2(std::sqrt(3.0 / static_cast<double>(fan_in)))));
}

std::vector<std::string> synthetic_model_names() {
  return {"llama-3.1-8b", "qwen2.5-7b", "qwen2.5-3b", "gemma-3-270m", "gemma-3-1b", "tiny-llama"};
}

bool synthetic_untied_output(const std::string& name) { return name != "qwen2.5-3b" && name.rfind("gemma-3", 0) != 0; }

ModelConfig synthetic_config(const std::string& name, int n_layers) {
  check_param(n_layers >= 0, "synthetic_config.n_layers", "{}: expected >= 0 (0 = all)", n_layers);
  ModelConfig c;
  if (name == "llama-3.1-8b") {
    c.arch = "llama";
    c.n_layers = 32;
    c.n_heads = 32;
    c.n_kv_heads = 8;
    c.head_dim = 128;
    c.d_model = 4096;
    c.d_ff = 14336;
    c.n_vocab = 128256;
    c.n_ctx_train = 131072;
    c.rope_theta = 500000.0;
    c.rms_eps = 1e-5f;
  } else if (name == "qwen2.5-7b") {
    c.arch = "qwen2";
    c.n_layers = 28;
    c.n_heads = 28;
    c.n_kv_heads = 4;
    c.head_dim = 128;
    c.d_model = 3584;
    c.d_ff = 18944;
    c.n_vocab = 152064;
    c.n_ctx_train = 32768;
    c.rope_theta = 1000000.0;
    c.rms_eps = 1e-6f;
  } else if (name == "qwen2.5-3b") {
    c.arch = "qwen2";
    c.n_layers = 36;
    c.n_heads = 16;
    c.n_kv_heads = 2;
    c.head_dim = 128;
    c.d_model = 2048;
    c.d_ff = 11008;
    c.n_vocab = 151936;
    c.n_ctx_train = 32768;
    c.rope_theta = 1000000.0;
    c.rms_eps = 1e-6f;
  } else if (name == "gemma-3-270m" || name == "gemma-3-1b") {
    const bool small = name == "gemma-3-270m";
    c.arch = "gemma3";
    c.n_layers = small ? 18 : 26;
    c.n_heads = 4;
    c.n_kv_heads = 1;
    c.head_dim = 256;
    c.d_model = small ? 640 : 1152;
    c.d_ff = small ? 2048 : 6912;
    c.n_vocab = 262144;
    c.n_ctx_train = 32768;
    c.rope_theta = 1000000.0;
    c.rms_eps = 1e-6f;
    c.ffn_act = FfnActivation::GeluTanh;
    c.embd_scale = std::sqrt(static_cast<float>(c.d_model));
    c.qk_norm = true;
    c.post_norms = true;
    c.sliding_window = 512;
    c.rope_theta_swa = 10000.0;
    c.layer_sliding.resize(c.n_layers);
    for (int l = 0; l < c.n_layers; ++l) c.layer_sliding[l] = l % 6 < 5 ? 1 : 0;
  } else if (name == "tiny-llama") {  // not a published model: CLI tests of `bench --device cpu`
    c.arch = "llama";
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 64;
    c.d_model = 256;
    c.d_ff = 512;
    c.n_vocab = 512;
    c.n_ctx_train = 4096;
    c.rope_theta = 10000.0;
    c.rms_eps = 1e-5f;
  } else {
    std::string known;
    for (const auto& n : synthetic_model_names()) known += (known.empty() ? "" : ", ") + n;
    fail("synthetic_config: unknown model '{}' (expected one of {})", name, known);
  }
  c.rope_layout = rope_layout_for_arch(c.arch);
  c.qkv_bias = c.arch == "qwen2";
  if (n_layers > 0) {
    check_param(n_layers <= c.n_layers, "synthetic_config.n_layers", "{}: {} has {} layers; expected 0..{} (0 = all)",
                n_layers, name, c.n_layers, c.n_layers);
    c.n_layers = n_layers;
    if (!c.layer_sliding.empty()) c.layer_sliding.resize(n_layers);
  }
  return c;
}

namespace {

std::vector<float> fill(uint64_t seed, uint32_t tensor, size_t n, SyntheticKind kind, int amp_exp) {
  std::vector<float> v(n);
#pragma omp parallel for schedule(static) if (n >= 65536)
  for (int64_t i = 0; i < static_cast<int64_t>(n); ++i)
    v[i] = synthetic_value(seed, tensor, static_cast<uint64_t>(i), kind, amp_exp);
  return v;
}

}  // namespace

ModelWeights synthetic_weights(const ModelConfig& cfg, uint64_t seed, bool untied_output) {
  cfg.validate("synthetic_weights");
  const size_t d = cfg.d_model, qd = size_t(cfg.n_heads) * cfg.head_dim, kvd = size_t(cfg.n_kv_heads) * cfg.head_dim,
               dff = cfg.d_ff, V = cfg.n_vocab;
  using K = SyntheticKind;
  using T = SyntheticLayerTensor;
  ModelWeights w;
  w.token_embd = fill(seed, static_cast<uint32_t>(SyntheticTensor::token_embd), V * d, K::linear, 0);
  if (untied_output)
    w.output = fill(seed, static_cast<uint32_t>(SyntheticTensor::output), V * d, K::linear, synthetic_amp_exp(d));
  w.output_norm = fill(seed, static_cast<uint32_t>(SyntheticTensor::output_norm), d, K::norm, 0);
  w.layers.resize(cfg.n_layers);
  for (int l = 0; l < cfg.n_layers; ++l) {
    LayerWeights& L = w.layers[l];
    L.attn_norm = fill(seed, synthetic_tensor_id(l, T::attn_norm), d, K::norm, 0);
    L.wqkv = fill(seed, synthetic_tensor_id(l, T::wqkv), (qd + 2 * kvd) * d, K::linear, synthetic_amp_exp(d));
    L.wo = fill(seed, synthetic_tensor_id(l, T::wo), d * qd, K::linear, synthetic_amp_exp(qd));
    L.ffn_norm = fill(seed, synthetic_tensor_id(l, T::ffn_norm), d, K::norm, 0);
    L.w_gate_up = fill(seed, synthetic_tensor_id(l, T::w_gate_up), 2 * dff * d, K::linear, synthetic_amp_exp(d));
    L.w_down = fill(seed, synthetic_tensor_id(l, T::w_down), d * dff, K::linear, synthetic_amp_exp(dff));
    if (cfg.qkv_bias) L.bqkv = synthetic_qkv_bias(cfg, seed, l);
    if (cfg.qk_norm) {
      L.attn_q_norm = fill(seed, synthetic_tensor_id(l, T::attn_q_norm), cfg.head_dim, K::norm, 0);
      L.attn_k_norm = fill(seed, synthetic_tensor_id(l, T::attn_k_norm), cfg.head_dim, K::norm, 0);
    }
    if (cfg.post_norms) {
      L.attn_post_norm = fill(seed, synthetic_tensor_id(l, T::attn_post_norm), d, K::norm, 0);
      L.ffn_post_norm = fill(seed, synthetic_tensor_id(l, T::ffn_post_norm), d, K::norm, 0);
    }
  }
  return w;
}

std::vector<float> synthetic_qkv_bias(const ModelConfig& cfg, uint64_t seed, int layer) {
  check(layer >= 0 && layer < cfg.n_layers, "synthetic_qkv_bias: layer {} outside [0, {})", layer, cfg.n_layers);
  const size_t n = size_t(cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim;
  return fill(seed, synthetic_tensor_id(layer, SyntheticLayerTensor::qkv_bias), n, SyntheticKind::linear, -2);
}

}  // namespace ratekv
