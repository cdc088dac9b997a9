// ratekv/model/model.h — Llama-family, Gemma 3 and Qwen2 decoders on the CPU (fp32 compute).
//
// Pieces, one per source file in src/model/:
//   config.cpp          ModelConfig from GGUF metadata, validation
//   rope.cpp            RoPE: arch -> channel-pair layout table, rotation, inverse
//   weights.cpp         weights dequantized to fp32 at load (tied embeddings)
//   forward.cpp         the forward pass (RMSNorm, GQA attention through a
//                       KVCache, gated FFN, LM head), hooks for calibration;
//                       the Gemma 3 and Qwen2 differences are configuration
//                       (ModelConfig fields below, all neutral for "llama")
//   kv_cache_dense.cpp  DenseKVCache (declared in kv_cache.h)
//
// Conventions. Activations are row-major with the token index outermost:
// hidden states (n, d_model), Q (n, n_heads, head_dim), K/V (n, n_kv_heads,
// head_dim). Head and channel order are the GGUF tensor order (docs/design.md §1.1);
// for arch "llama" the converter permuted Q/K rows so RoPE pairs channels
// (2i, 2i+1); "gemma3" and "qwen2" keep the NeoX pairs (i, i + head_dim/2).
//
// Architectures (the one runtime; an arch is a set of ModelConfig values read
// by ModelConfig::from_gguf, following llama.cpp's src/models/<arch>.cpp):
//   llama   RMSNorm, SwiGLU, interleaved RoPE, no biases
//   gemma3  + embedding scale, QK-norm, pre/post norms, GeGLU, sliding-window
//           layers with their own RoPE base, optional logit soft-capping
//   qwen2   + Q/K/V projection biases (qkv_bias), NeoX RoPE; otherwise llama
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "ratekv/model/kv_cache.h"

namespace ratekv {

class GgufFile;

// ---------------------------------------------------------------------------
// RoPE (Su et al., RoFormer §3.4). Block i (i = 0 .. head_dim/2 - 1) is a pair
// of channels (a_i, b_i) rotated by the angle pos · θ^(−2i/head_dim):
//   x'_a = x_a cos − x_b sin,   x'_b = x_a sin + x_b cos.
// ---------------------------------------------------------------------------

/// Which channels form a RoPE block.
enum class RopeLayout {
  Interleaved,  ///< block i = channels (2i, 2i+1)          — GGUF "llama"
  NeoX,         ///< block i = channels (i, i + head_dim/2) — "gemma3", "qwen2"
};

/// The one arch -> layout table (docs/design.md §1.1). Throws Error naming the
/// architecture when it is not in the table.
RopeLayout rope_layout_for_arch(const std::string& arch);
/// "interleaved" or "neox".
const char* rope_layout_name(RopeLayout layout);

/// The two channels of every RoPE block: element i is {a_i, b_i} for block i,
/// whose frequency is θ^(−2i/head_dim). head_dim must be even and positive
/// (Error otherwise).
std::vector<std::array<int, 2>> rope_pairs(RopeLayout layout, int head_dim);

/// Angular frequency of block i: θ^(−2i/head_dim) (radians per position).
double rope_frequency(int block, int head_dim, double theta);

/// cos/sin of pos · θ^(−2i/head_dim) for the head_dim/2 blocks (angles in
/// double, rounded to float). cos_out and sin_out hold head_dim/2 floats.
void rope_angles(int64_t pos, int head_dim, double theta, float* cos_out, float* sin_out);

/// Rotates n_vecs contiguous vectors of head_dim channels (layout (n_vecs,
/// head_dim)) in place with precomputed cos/sin of one position (from
/// rope_angles). inverse = true rotates by the negative angle (R_pᵀ).
void apply_rope(float* x, int64_t n_vecs, int head_dim, RopeLayout layout, const float* cos,
                const float* sin, bool inverse = false);

/// Convenience: rotates n_vecs vectors (n_vecs, head_dim) all at position pos.
/// Throws Error for an odd or non-positive head_dim or a non-finite /
/// non-positive θ.
void apply_rope(float* x, int64_t n_vecs, int head_dim, int64_t pos, RopeLayout layout,
                double theta, bool inverse = false);

// ---------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------

/// Gated-FFN activation: SwiGLU (Shazeer 2020) uses SiLU(x) = x·σ(x); GeGLU
/// uses GELU's tanh approximation 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
enum class FfnActivation { SiLU, GeluTanh };

/// Hyper-parameters of a Llama-family, Gemma 3 or Qwen2 model, read from
/// GGUF metadata `<arch>.*` (arch = general.architecture). The fields after
/// rope_layout describe the Gemma 3 and Qwen2 differences; their defaults
/// are Llama's (every field neutral), so a runtime (CPU here, the GPU engine)
/// implements an architecture by honouring these fields, never by testing
/// `arch`.
struct ModelConfig {
  std::string arch;          ///< general.architecture
  int n_layers = 0;          ///< <arch>.block_count
  int n_heads = 0;           ///< <arch>.attention.head_count (query heads)
  int n_kv_heads = 0;        ///< <arch>.attention.head_count_kv (default n_heads)
  int head_dim = 0;          ///< <arch>.attention.key_length, else d_model / n_heads
  int d_model = 0;           ///< <arch>.embedding_length
  int d_ff = 0;              ///< <arch>.feed_forward_length
  int n_vocab = 0;           ///< rows of token_embd.weight
  int64_t n_ctx_train = 0;   ///< <arch>.context_length
  double rope_theta = 0;     ///< <arch>.rope.freq_base (default 10000)
  float rms_eps = 0;         ///< <arch>.attention.layer_norm_rms_epsilon
  RopeLayout rope_layout = RopeLayout::Interleaved;

  // --- Gemma 3 (arch "gemma3"); neutral defaults for "llama" ---
  FfnActivation ffn_act = FfnActivation::SiLU;
  float embd_scale = 1.0f;        ///< token embeddings are multiplied by this (gemma3: sqrt(d_model))
  float attn_scale = 0.0f;        ///< <arch>.attention.scale; 0 = 1/sqrt(head_dim)
  float final_logit_softcap = 0;  ///< <arch>.final_logit_softcapping; 0 = off, else c·tanh(logit/c)
  bool qk_norm = false;           ///< RMSNorm over each head of Q and K before RoPE (blk.*.attn_{q,k}_norm)
  bool post_norms = false;        ///< RMSNorm on the attention and FFN outputs before the residual add
  int64_t sliding_window = 0;     ///< <arch>.attention.sliding_window (tokens); used by layers marked below
  std::vector<uint8_t> layer_sliding;  ///< (n_layers) 1 = sliding-window layer; empty = all global
  double rope_theta_swa = 0;      ///< <arch>.rope.freq_base_swa for sliding layers (gemma3 default 10000)

  // --- Qwen2 (arch "qwen2"); neutral default for "llama" / "gemma3" ---
  /// The Q, K and V projections carry biases (blk.*.attn_{q,k,v}.bias, F32;
  /// set by from_gguf when blk.0 has them, as llama.cpp decides — every qwen2
  /// GGUF does, the llama/gemma3 files here do not):
  /// [q k v] = W_qkv·x + b_qkv, added right after the projection — before
  /// QK-norm (if any) and before RoPE, so the pre-RoPE key includes b_k and
  /// RoPE rotates it with the key. LayerWeights::bqkv holds the biases.
  bool qkv_bias = false;

  /// True if layer l attends within sliding_window only.
  bool is_sliding(int l) const { return !layer_sliding.empty() && layer_sliding[l] != 0; }
  /// RoPE base of layer l: rope_theta_swa for sliding layers, else rope_theta.
  double layer_rope_theta(int l) const { return is_sliding(l) ? rope_theta_swa : rope_theta; }
  /// AttnParams::sliding_window of layer l (0 = full causal).
  int64_t layer_window(int l) const { return is_sliding(l) ? sliding_window : 0; }
  /// Attention logit scale: attn_scale if set, else 1/sqrt(head_dim).
  float attention_scale() const;

  /// Query heads per KV head (n_heads / n_kv_heads).
  int gqa_ratio() const { return n_heads / n_kv_heads; }
  /// Reads and validates the config. Throws Error naming the GGUF file and
  /// key for a missing/ill-typed key or a failed validation.
  static ModelConfig from_gguf(const GgufFile& f);
  /// Checks positivity, n_heads % n_kv_heads == 0, even head_dim, finite
  /// positive θ and ε, and the Gemma fields (layer_sliding empty or n_layers
  /// long, positive window and θ_swa when any layer slides, finite
  /// non-negative scales), and bounds the shape (n_layers, n_heads, head_dim ≤ 4096, as the statistics
  /// files; n_heads·head_dim, d_model ≤ 2^20; d_ff ≤ 2^22). `source` names the file in messages. Throws Error.
  void validate(const std::string& source) const;
  /// Cache shape for a sequence of up to n_ctx tokens.
  KVCacheShape kv_shape(int64_t n_ctx) const;
  /// Bytes of K and V per token over all layers at fp16:
  /// 2 (K,V) · n_layers · n_kv_heads · head_dim · 2 bytes.
  int64_t kv_bytes_per_token_fp16() const;
};

// ---------------------------------------------------------------------------
// Weights
// ---------------------------------------------------------------------------

/// One transformer block's weights, fp32. Linear weights are row-major
/// (out_features, in_features) — the ggml layout (ne = {in, out}).
struct LayerWeights {
  std::vector<float> attn_norm;  ///< (d_model)
  std::vector<float> wqkv;       ///< (n_heads·hd + 2·n_kv_heads·hd, d_model): Q rows, then K, then V
  /// (n_heads·hd + 2·n_kv_heads·hd) when cfg.qkv_bias, else empty: the Q, K
  /// and V biases in wqkv's row order (Q heads, then KV heads of K, then of V;
  /// within a head the GGUF channel order, i.e. NeoX pairs (i, i+hd/2) for qwen2).
  std::vector<float> bqkv;
  std::vector<float> wo;         ///< (d_model, n_heads·hd)
  std::vector<float> ffn_norm;   ///< (d_model)
  std::vector<float> w_gate_up;  ///< (2·d_ff, d_model): gate rows, then up rows
  std::vector<float> w_down;     ///< (d_model, d_ff)
  // Gemma 3 only (empty unless cfg.qk_norm / cfg.post_norms):
  std::vector<float> attn_q_norm;     ///< (head_dim), shared by all query heads
  std::vector<float> attn_k_norm;     ///< (head_dim), shared by all KV heads
  std::vector<float> attn_post_norm;  ///< (d_model), on the attention output (after wo)
  std::vector<float> ffn_post_norm;   ///< (d_model), on the FFN output (after w_down)
};

/// All weights, dequantized to fp32 at load.
struct ModelWeights {
  std::vector<float> token_embd;  ///< (n_vocab, d_model)
  /// (n_vocab, d_model) when the GGUF has `output.weight` (an untied LM head,
  /// as both Qwen2.5-Coder files have); empty when tied to token_embd.
  std::vector<float> output;
  std::vector<float> output_norm; ///< (d_model)
  std::vector<LayerWeights> layers;
  /// LM head matrix (n_vocab, d_model): `output`, or token_embd when tied.
  const float* lm_head() const { return output.empty() ? token_embd.data() : output.data(); }
  /// Bytes held by all weight vectors.
  size_t bytes() const;
  /// Dequantizes every tensor of the config's model. Throws Error naming the
  /// tensor when it is missing or its shape is not the expected one.
  static ModelWeights load(const GgufFile& f, const ModelConfig& cfg);
  /// A slice: token_embd, output, output_norm and only the blocks listed in
  /// `blocks` (GGUF block indices, each in [0, cfg.n_layers), in the order
  /// given; layers[i] = block blocks[i]) — for gradient checks and probes on
  /// a few real layers without dequantizing the rest. The caller builds the
  /// matching config (n_layers = blocks.size(), per-layer fields such as
  /// layer_sliding taken from the same blocks). Errors as load(), plus a
  /// block index out of range.
  static ModelWeights load_blocks(const GgufFile& f, const ModelConfig& cfg, std::span<const int> blocks);
};

// ---------------------------------------------------------------------------
// Forward pass
// ---------------------------------------------------------------------------

/// What a calibration hook sees for one layer and one forward chunk of n
/// tokens. Pointers are valid only during the callback.
struct LayerActivations {
  int layer = 0;
  int64_t n = 0;              ///< tokens in this chunk
  const int32_t* pos = nullptr;  ///< (n) absolute positions
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  // "Before RoPE" is after QK-norm when the model has one (what RoPE rotates).
  const float* q_pre = nullptr;   ///< (n, n_heads, head_dim) before RoPE
  const float* q_post = nullptr;  ///< (n, n_heads, head_dim) after RoPE
  const float* k_pre = nullptr;   ///< (n, n_kv_heads, head_dim) before RoPE
  const float* k_post = nullptr;  ///< (n, n_kv_heads, head_dim) after RoPE
  const float* v = nullptr;       ///< (n, n_kv_heads, head_dim)
};

/// Optional per-layer callbacks. on_layer runs after Q/K/V are projected and
/// rotated, before the cache append/attend of that layer.
struct ForwardHooks {
  std::function<void(const LayerActivations&)> on_layer;
};

/// A loaded model ("llama", "gemma3" or "qwen2" arch). The weights are immutable after
/// load; forward() allocates its activations per call and only reads the
/// weights, so concurrent calls with distinct caches are safe.
class Model {
 public:
  /// Reads the config and dequantizes all weights; the GgufFile may be closed
  /// afterwards. Throws Error for an architecture whose forward pass is not
  /// implemented (anything but "llama", "gemma3" and "qwen2"), a bad config,
  /// or missing tensors.
  static Model load(const GgufFile& f);
  /// Builds a model from an explicit config and weights (tests, synthetic
  /// models). Validates the config and every weight's size; throws Error.
  static Model from_weights(ModelConfig cfg, ModelWeights w);

  const ModelConfig& config() const { return cfg_; }
  const ModelWeights& weights() const { return w_; }

  /// Positions >= this limit are refused (default: n_ctx_train). Raising it
  /// past n_ctx_train is an explicit override (RoPE extrapolation).
  void set_position_limit(int64_t limit);
  int64_t position_limit() const { return pos_limit_; }

  /// Runs n = tokens.size() tokens at positions pos0 .. pos0+n-1 through every
  /// layer, appending their K/V to `cache` and attending over it.
  /// logits: nullptr, or (n, n_vocab) when all_logits, else (n_vocab) for the
  /// last token only. Throws Error for an empty chunk, a token id outside
  /// [0, n_vocab), positions past position_limit() or not matching the cache
  /// (pos0 != cache.n_tokens() is allowed only if the cache accepts it), a
  /// cache shape different from the model's, or NaN/inf activations (naming
  /// the layer).
  void forward(std::span<const int32_t> tokens, int64_t pos0, KVCache& cache, float* logits,
               bool all_logits, const ForwardHooks* hooks = nullptr);

  /// A fresh fp32 cache for up to n_ctx tokens.
  DenseKVCache make_dense_cache(int64_t n_ctx) const;

 private:
  ModelConfig cfg_;
  ModelWeights w_;
  int64_t pos_limit_ = 0;
};

/// In-place RMSNorm of n rows of width d: x ← x / sqrt(mean(x²) + eps) ⊙ weight.
/// (Zhang & Sennrich 2019.) out may equal x.
void rms_norm(const float* x, const float* weight, float* out, int64_t n, int d, float eps);

}  // namespace ratekv
