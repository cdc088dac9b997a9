// ratekv/model/backward.h — gradients of the causal LM loss with respect to
// the cached K and V (activation gradients only; no weight gradients).
//
// For one sequence x_0 .. x_{n−1} the loss is the mean next-token
// cross-entropy
//   L = −1/(n−1) · Σ_{t=0}^{n−2} log softmax(logits_t)[x_{t+1}],
// computed by a "taped" forward pass over the whole sequence (positions
// 0 .. n−1, full causal attention, no KV cache object) followed by the
// reverse pass: LM head → final RMSNorm → for each layer, from the last:
// SwiGLU FFN, RMSNorm, output projection, causal GQA softmax attention, RoPE,
// Q/K/V projection, RMSNorm, residuals (docs/design.md §4.1: sensitivity by a
// backward pass; §5.4: TaSQ's Fisher weights use ∂L/∂k_pre).
//
// The cached tensors are treated as the variables: ∂L/∂K_post is the gradient
// with respect to the post-RoPE key a cache stores (only that layer's
// attention reads it), ∂L/∂K_pre = R_pᵀ ∂L/∂K_post (the pre-RoPE key — after
// QK-norm when the model has one, with the key bias when it has one — feeds
// the loss only through K_post = R_p K_pre), ∂L/∂V likewise. Because R_p is
// orthogonal, ‖∂L/∂k_pre‖ = ‖∂L/∂k_post‖ for every token and head; the two
// differ per channel. The last token's K/V gradient is exactly 0 (nothing
// in L attends to it).
//
// Layouts follow model.h: K/V and their gradients are (n, n_kv_heads,
// head_dim) row-major, token outermost. With GQA the gradient of a KV head
// sums over the query heads that read it.
//
// Memory: one checkpoint of the residual stream per layer (n · d_model
// scalars each), one layer's intermediates (recomputed in the reverse pass),
// three (n, n) attention matrices at a time, and the LM head in chunks of 64
// rows: about 75 MB for n = 512 on SmolLM2-135M in float (37 MB checkpoints,
// 11 MB layer tape, 13 MB logit chunk, FFN/attention gradients), plus, with
// gradients(), the returned 3 · n_layers · n · n_kv_heads · head_dim floats
// (35 MB). The reverse pass recomputes each layer's forward once, so
// backward() costs about 3.3× a Model::forward of the same tokens
// (bench/bench_backward.cpp).
//
// Architectures: every one Model runs ("llama", "gemma3", "qwen2"); others
// throw ratekv::Error naming the arch.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ratekv/model/model.h"

namespace ratekv {

/// Throws Error "<context>: arch '<arch>': the backward pass is implemented
/// for 'llama', 'gemma3' and 'qwen2' (...)" for any other arch. Needs only
/// the config, so callers can check before loading weights (ModelBackward's
/// constructor calls it with context "ModelBackward").
void check_backward_arch(const ModelConfig& cfg, const std::string& context);

/// Which cached tensor of a layer.
enum class KVTensor {
  KPre,   ///< key before RoPE
  KPost,  ///< key after RoPE (what the cache stores)
  V,      ///< value
};

/// Adds `delta` to one element of one layer's cached tensor during the
/// forward pass (finite-difference checks). Perturbing KPre changes KPost
/// through RoPE; perturbing KPost or V changes only that layer's attention
/// inputs. index is the flat index into (n, n_kv_heads, head_dim).
struct KVPerturbation {
  int layer = 0;
  KVTensor tensor = KVTensor::KPost;
  int64_t index = 0;
  double delta = 0.0;
};

/// ∂L/∂(cached K/V) of one layer for one sequence; each (n, n_kv_heads,
/// head_dim) row-major.
template <class T>
struct LayerKVGrad {
  int layer = 0;
  std::vector<T> dk_pre;   ///< ∂L/∂K_pre  = R_pᵀ ∂L/∂K_post per token
  std::vector<T> dk_post;  ///< ∂L/∂K_post (gradient w.r.t. the cached key)
  std::vector<T> dv;       ///< ∂L/∂V
};

/// Loss and the K/V gradients of every layer for one sequence.
template <class T>
struct KVGradients {
  int64_t n = 0;       ///< tokens in the sequence
  int n_kv_heads = 0;
  int head_dim = 0;
  double loss = 0.0;   ///< L (mean cross-entropy over the n − 1 predictions, nats)
  std::vector<LayerKVGrad<T>> layers;  ///< index = layer
};

/// The backward pass over one model in scalar type T (float: sgemm, for
/// calibration; double: dgemm on the fp32 weights converted exactly, for
/// finite-difference checks). Construction validates the architecture and,
/// for double, converts all weights once (2× the fp32 weight bytes).
/// Calls only read the model and allocate their own working memory, so
/// concurrent calls are safe (they share the OpenBLAS / OpenMP threads).
/// The Model must outlive this object (float reads its weights in place).
template <class T>
class ModelBackward {
 public:
  /// Throws Error when model.config().arch is not one check_backward_arch accepts.
  explicit ModelBackward(const Model& model);
  ~ModelBackward();
  ModelBackward(ModelBackward&&) noexcept;
  ModelBackward& operator=(ModelBackward&&) noexcept;

  const ModelConfig& config() const;

  /// Forward pass only: returns L. logits: nullptr, or (n, n_vocab) row-major
  /// receiving every position's logits (the same numbers Model::forward
  /// computes with an fp32 cache, up to rounding). perturb: nullptr, or one
  /// element to shift (see KVPerturbation). Throws Error for n < 2, a token id
  /// outside [0, n_vocab), n beyond the model's position limit, a perturbation
  /// outside the model / sequence, or non-finite activations (naming the layer).
  double loss(std::span<const int32_t> tokens, T* logits = nullptr,
              const KVPerturbation* perturb = nullptr) const;

  /// Forward + reverse pass. on_layer receives each layer's gradients as soon
  /// as they are known, in reverse layer order (n_layers − 1 first); the
  /// references are valid during the call only. Returns L. logits and
  /// perturb as in loss(). hooks: nullptr, or ForwardHooks whose on_layer
  /// sees every layer's activations of the (first) forward pass, in layer
  /// order, exactly as Model::forward's hook would with positions 0..n−1
  /// (float only: Error for double) — a caller that needs both the forward
  /// activations and the gradients then runs one pass, not two. Errors as in
  /// loss().
  double backward(std::span<const int32_t> tokens,
                  const std::function<void(const LayerKVGrad<T>&)>& on_layer, T* logits = nullptr,
                  const KVPerturbation* perturb = nullptr, const ForwardHooks* hooks = nullptr) const;

  /// backward() collecting every layer (layers[l] is layer l).
  KVGradients<T> gradients(std::span<const int32_t> tokens) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

extern template class ModelBackward<float>;
extern template class ModelBackward<double>;

/// Per-token gradient magnitudes of a batch of sequences (float path), for
/// Fisher weights (docs/design.md §5.4: F = s_p² Σ_{i∈G} g_i²/w_i with
/// g = ∂L/∂k_pre) and sensitivities. Each sequence is its own loss (positions
/// from 0); sequences are processed one after another (OpenMP / BLAS threads
/// inside each). For every sequence s the callback receives its full
/// gradients (KVGradients<float>: loss, dk_pre, dk_post, dv per layer) and its
/// index; the reference is valid during the call only. Throws Error as
/// ModelBackward::backward for any sequence (naming its index).
void kv_gradients_batch(const Model& model, std::span<const std::vector<int32_t>> sequences,
                        const std::function<void(size_t seq, const KVGradients<float>&)>& fn);

}  // namespace ratekv
