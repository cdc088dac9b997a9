// ratekv/model/synthetic.h — synthetic models: published configurations with
// seeded random weights, identical on the CPU and the GPU.
//
// Every weight is a pure function of (seed, tensor id, element index) — a
// counter-based generator (SplitMix64's finalizer over the three), not a
// sequential stream — so the GPU engine fills its bf16 tensors in parallel
// (cuda/model_kernels.h) and the CPU runtime its fp32 tensors here, and both
// hold the same numbers. Every value is exactly representable in bf16 (at most
// 8 significant bits times a power of two), so the GPU's bf16 weights equal
// the CPU's fp32 weights bit for bit: a GPU-vs-CPU comparison measures the
// runtimes' arithmetic, not weight rounding.
//
// Values (u = the hash's top 8 bits, an integer 0..255):
//   linear / embedding  (u − 128) · 2^(e − 7)   e = amplitude exponent: uniform
//                       on [−2^e, 2^e) in steps of 2^(e−7);
//   norm weights        (128 + (u >> 2) − 32) / 128 ∈ [0.75, 1.24];
//   biases              as linear with e = −2.
// Amplitude of a linear map with fan-in n: 2^e with e = round(log2 √(3/n)),
// so an output has about the variance of one input element (std ≈ 2^e/√3);
// embeddings e = 0.
//
// Tensor ids: token_embd 1, output 2, output_norm 3; layer l: 16 + 16·l + k
// with k = attn_norm 0, wqkv 1, wo 2, ffn_norm 3, w_gate_up 4, w_down 5,
// qkv bias 6, and for Gemma 3 configs (qk_norm / post_norms) the norms
// attn_q_norm 7, attn_k_norm 8, attn_post_norm 9, ffn_post_norm 10. Element index = row-major offset in the tensor as
// ModelWeights / LayerWeights lay it out.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ratekv/model/model.h"

#if defined(__CUDACC__)
#define RATEKV_HD __host__ __device__
#else
#define RATEKV_HD
#endif

namespace ratekv {

/// Which formula of the file comment a tensor uses.
enum class SyntheticKind : int { linear = 0, norm = 1 };

/// Tensor ids of the file comment.
enum class SyntheticTensor : uint32_t {
  token_embd = 1,
  output = 2,
  output_norm = 3,
};
enum class SyntheticLayerTensor : uint32_t {
  attn_norm = 0,
  wqkv = 1,
  wo = 2,
  ffn_norm = 3,
  w_gate_up = 4,
  w_down = 5,
  qkv_bias = 6,
  attn_q_norm = 7,     ///< (head_dim), norm values; cfg.qk_norm
  attn_k_norm = 8,     ///< (head_dim), norm values; cfg.qk_norm
  attn_post_norm = 9,  ///< (d_model), norm values; cfg.post_norms
  ffn_post_norm = 10,  ///< (d_model), norm values; cfg.post_norms
};
/// Id of a layer tensor: 16 + 16·layer + kind.
constexpr uint32_t synthetic_tensor_id(int layer, SyntheticLayerTensor t) {
  return 16u + 16u * static_cast<uint32_t>(layer) + static_cast<uint32_t>(t);
}

/// SplitMix64's finalizer.
RATEKV_HD inline uint64_t synthetic_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// The hash: SplitMix64's finalizer applied twice, first over (seed, tensor),
/// then over that and the element index. Same result on host and device.
RATEKV_HD inline uint64_t synthetic_hash(uint64_t seed, uint32_t tensor, uint64_t index) {
  const uint64_t h = synthetic_mix(seed + 0x9e3779b97f4a7c15ull * (1ull + tensor));
  return synthetic_mix(h + 0x9e3779b97f4a7c15ull * (1ull + index));
}

/// One weight value (see the file comment). `amp_exp` is e (linear only).
RATEKV_HD inline float synthetic_value(uint64_t seed, uint32_t tensor, uint64_t index, SyntheticKind kind,
                                       int amp_exp) {
  const int u = static_cast<int>(synthetic_hash(seed, tensor, index) >> 56);
  if (kind == SyntheticKind::norm) return static_cast<float>(128 + (u >> 2) - 32) * (1.0f / 128.0f);
  return ldexpf(static_cast<float>(u - 128), amp_exp - 7);
}

/// Amplitude exponent of a linear map with fan-in `fan_in` (> 0):
/// round(log2 √(3/fan_in)).
int synthetic_amp_exp(int64_t fan_in);

/// Names of the synthetic configurations: "llama-3.1-8b", "qwen2.5-7b",
/// "qwen2.5-3b", "gemma-3-270m", "gemma-3-1b", and "tiny-llama" (not a
/// published model: 2 layers, d_model 256, 4/2 heads of 64, d_ff 512, vocab
/// 512, context 4096; for tests).
std::vector<std::string> synthetic_model_names();

/// The published configuration of `name` (Llama-3.1-8B: 32 layers, d_model
/// 4096, 32/8 heads of 128, d_ff 14336, vocab 128256, context 131072, θ 5e5,
/// untied LM head — without Llama 3.1's long-context RoPE frequency scaling;
/// Qwen2.5-7B: 28 layers, 3584, 28/4 heads of 128, d_ff 18944, vocab 152064,
/// context 32768, θ 1e6, ε 1e-6, Q/K/V biases, untied; Qwen2.5-3B: 36 layers,
/// 2048, 16/2 heads of 128, d_ff 11008, vocab 151936, context 32768, θ 1e6,
/// ε 1e-6, biases, tied embeddings; Gemma 3 270M: 18 layers, 640, 4/1 heads
/// of 256, d_ff 2048, vocab 262144, context 32768, θ 1e6, sliding window 512
/// on layers l mod 6 < 5 with θ_swa 1e4, ε 1e-6, embedding scale √d_model,
/// QK-norm, post-norms, GeGLU, no soft-cap, tied; Gemma 3 1B: the same with
/// 26 layers, 1152, d_ff 6912 — the values of the GGUF files' metadata as
/// ModelConfig::from_gguf reads them). n_layers > 0 keeps the first n_layers
/// layers (a model "at full width" for CPU comparisons). Throws Error for an
/// unknown name (listing the known ones), ParamError "synthetic_config.n_layers"
/// for n_layers < 0 or above the model's layer count (naming it).
ModelConfig synthetic_config(const std::string& name, int n_layers = 0);

/// Whether a synthetic configuration has an untied LM head (ModelWeights::output).
bool synthetic_untied_output(const std::string& name);

/// The fp32 weights of `cfg` from `seed` (every tensor of the file comment;
/// LayerWeights::bqkv = synthetic_qkv_bias when cfg.qkv_bias).
/// `untied_output`: fill ModelWeights::output (else the LM head is tied to
/// token_embd). Throws Error on a config that fails ModelConfig::validate.
ModelWeights synthetic_weights(const ModelConfig& cfg, uint64_t seed, bool untied_output);

/// The Q/K/V bias of layer l: (n_heads·hd + 2·n_kv_heads·hd) fp32, Q then K then V.
std::vector<float> synthetic_qkv_bias(const ModelConfig& cfg, uint64_t seed, int layer);

}  // namespace ratekv
