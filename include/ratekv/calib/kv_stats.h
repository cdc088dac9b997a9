// ratekv/calib/kv_stats.h — calibration statistics of the K/V cache of one
// model on one text: what the allocators and later methods need (docs/design.md
// §3.1 Block-GTQ energies, §5 TaSQ sufficient statistics). Produced by
// `ratekv calibrate` (calib/calibrate.h); file format in
// docs/calibration_stats.md.
//
// Every statistic is a mean over the N calibration tokens (all chunks), per
// layer l and KV head h (query statistics per query head where noted).
// Layouts are row-major; L = n_layers, H = n_heads, Hkv = n_kv_heads,
// d = head_dim, B = d/2 RoPE blocks (block i = channels rope_pairs()[i]).
//   q_block_energy (L, Hkv, B)  E_{t, g∈G(h)} ‖q_{g,t}^{(i)}‖²  (post-RoPE; RoPE keeps block norms)
//   k_block_energy (L, Hkv, B)  E_t ‖k_{h,t}^{(i)}‖²            (post-RoPE)
//   k_pre_mean     (L, Hkv, d)  E_t k_{h,t}                      (pre-RoPE)
//   k_pre_cov      (L, Hkv, d, d) E_t (k−μ)(k−μ)ᵀ                (pre-RoPE, population covariance, 1/N)
//   q_pre_sq       (L, H, d)    E_t q_{g,t,c}²                   (pre-RoPE, per query head)
//   v_sq           (L, Hkv, d)  E_t v_{h,t,c}²
// Optional (present when `ratekv calibrate --sensitivity` ran; GradSensitivity
// in calib/sensitivity.h, means over S sequences × T tokens):
//   grad_sq_k_pre  (L, Hkv, d)  E_t (∂L/∂k_pre_{h,t,c})²
//   grad_sq_k_post (L, Hkv, d)  E_t (∂L/∂k_post_{h,t,c})²
//   grad_sq_v      (L, Hkv, d)  E_t (∂L/∂v_{h,t,c})²
// The pre-RoPE key covariance is of the raw projected keys: no TaSQ
// weighting or per-token normalization is applied (a per-channel weighting W
// transforms it as W Σ W; the per-token RMS normalization is not linear and
// needs captures).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ratekv/format/calib_stats.h"
#include "ratekv/calib/distortion_curves.h"
#include "ratekv/calib/sensitivity.h"
#include "ratekv/model/model.h"
#include "ratekv/format/plan.h"

namespace ratekv::calib {

/// Calibration statistics (see file comment). All tensors in double in
/// memory; stored as F32 on disk.
struct KVStats {
  static constexpr int kFormatVersion = 1;
  static constexpr const char* kFormat = "ratekv-calib-stats";

  ModelIdentity model;       ///< arch, n_layers, n_kv_heads, head_dim, rope layout, file, sha256
  int n_heads = 0;           ///< query heads
  std::string text_file;     ///< calibration text (file name, no directory)
  std::string text_sha256;   ///< hex SHA-256 of the whole text file
  int64_t n_tokens = 0;      ///< calibration tokens N
  int64_t ctx = 0;           ///< tokens per forward chunk (fresh cache per chunk)

  std::vector<double> q_block_energy;  ///< (L, Hkv, d/2)
  std::vector<double> k_block_energy;  ///< (L, Hkv, d/2)
  std::vector<double> k_pre_mean;      ///< (L, Hkv, d)
  std::vector<double> k_pre_cov;       ///< (L, Hkv, d, d)
  std::vector<double> q_pre_sq;        ///< (L, H, d)
  std::vector<double> v_sq;            ///< (L, Hkv, d)
  /// Gradient sensitivity; grad.n_sequences == 0 (and empty tensors) when the
  /// file has none (files written before it existed stay readable).
  GradSensitivity grad;
  /// Measured distortion and fitted curves D(b) = α β^(−b) by quantizer name
  /// (kivi, quarot, tq-mse, block-gtq; calib/distortion_curves.h); empty when
  /// `ratekv calibrate --curves` did not run.
  std::map<std::string, QuantizerCurves> curves;

  /// Checks shapes (from model / n_heads), N ≥ 1, finiteness, non-negative
  /// energies and second moments. Throws Error naming `name` and the tensor.
  void validate(const std::string& name = "stats") const;
  /// Checks that the statistics were measured on a model with this config
  /// (arch, n_layers, n_heads, n_kv_heads, head_dim, RoPE layout); throws
  /// Error listing every mismatch ("stats made for n_layers = 30, model has 24").
  void validate_against(const ModelConfig& cfg, const std::string& name = "stats") const;

  /// The allocators' view (format/calib_stats.h): identity, source, N, the two
  /// block energies, the fitted curves of `curves` (by quantizer) and the sensitivities:
  ///   "activation": k = E_t ‖k_{l,h,t}‖² (Σ of k_block_energy), v = E_t ‖v‖²
  ///                 (Σ of v_sq) — the activation-magnitude proxy;
  ///   "grad" (only with grad): k = E_t ‖∂L/∂k_post‖² (Σ_c grad_sq_k_post, equal
  ///                 to the pre-RoPE one: RoPE is orthogonal), v = Σ_c grad_sq_v.
  CalibStats to_alloc_stats() const;

  /// Writes the safetensors file (validates first). Throws Error on I/O failure.
  void save(const std::string& path) const;
  /// Reads and validates a statistics file. Throws Error naming the file and
  /// the tensor / metadata field for a wrong format, version, shape or value.
  static KVStats load(const std::string& path);
};

/// The identity of `cfg` as plans and statistics record it (file and sha256 empty).
ModelIdentity model_identity(const ModelConfig& cfg);

/// True when `path` starts like a safetensors file (8-byte header length
/// followed by '{'), false for anything else (e.g. a JSON document).
bool is_safetensors_file(const std::string& path);

/// Loads allocator statistics from either format: a safetensors file written
/// by `ratekv calibrate` (converted with to_alloc_stats) or the JSON form of
/// format/calib_stats.h. Throws Error naming the file (ParamError
/// "load_alloc_stats.path" when it does not exist).
CalibStats load_alloc_stats(const std::string& path);

}  // namespace ratekv::calib
