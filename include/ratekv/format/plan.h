// ratekv/format/plan.h — the compression plan: which codec encodes the key and the
// value cache of every (layer, KV head), at how many bits, with which groups
// and rotation seeds (docs/design.md §1). Produced by the allocators (`ratekv
// plan`), consumed by the KV-cache codecs and checked against the model.
//
// On disk a plan is JSON (format "ratekv-plan", version 1); a later TaSQ plan
// adds a safetensors side file named by "tensors". Schema, version 1:
//
//   {
//     "format": "ratekv-plan", "version": 1,
//     "method": "block-gtq",                  // free text: how it was made
//     "model": {"arch": "llama", "n_layers": 30, "n_kv_heads": 3, "head_dim": 64,
//               "rope_layout": "interleaved",  // "interleaved" | "neox"
//               "file": "SmolLM2-135M-Instruct.Q4_1.gguf", "sha256": "…"},  // file/sha256 may be ""
//     "stats": "calib.json",                  // calibration statistics it came from ("" if none)
//     "tensors": null,                        // optional side file (TaSQ codebooks), string or null
//     "seed": 0,                              // plan seed the group seeds were derived from
//     "fp16_window": 0, "sink_tokens": 0,     // recent / first tokens kept in fp16 (0 = no buffer)
//     "budget": {"unit": "effective",         // "effective" (metadata included) | "code"
//                "k": 3.25, "v": 3.25},       // requested bits per element
//     "achieved": {"k": 3.24, "v": 3.25, "total": 3.245,          // effective bits per element
//                  "k_code": 3.0, "v_code": 3.0},                 // code bits only
//     "layers": [ {"heads": [ {"key": CODEC, "value": CODEC}, … n_kv_heads ] }, … n_layers ]
//   }
//   CODEC = {"kind": "tq-mse-grouped", "norm": "fp16", "group_size": 0,
//            "groups": [{"bits": 4, "blocks": [0, 1, 5], "seed": 123},
//                       {"bits": 0, "blocks": [31]}]}
//
// Kinds and their rules (every channel of the head must be covered by exactly
// one group; "blocks" are RoPE block indices 0..d/2−1 mapped to channel pairs
// by the model's rope layout, "channels" are channel indices 0..d−1):
//   fp16            no groups; 16 bits/element.
//   tq-mse-grouped  ≥ 1 group listing "blocks", bits 0..8 (0 = dropped); with
//                   norm "fp16" each group with bits > 0 stores one fp16 norm.
//   tq-mse          exactly one group listing all channels, bits 1..8;
//                   norm "fp16" = one fp16 norm per head per token.
//   kivi, quarot    one group, all channels, bits 1..8, group_size ≥ 1
//                   dividing head_dim: an fp16 scale and an fp16 zero point
//                   per group_size elements (norm "none").
//   q8_0, q4_0      llama.cpp cache types: one group, all channels, bits 8 /
//                   4, group_size 32 (one fp16 scale per 32), norm "none".
//   vq              vector quantization with k-means codebooks (TaSQ / CQ,
//                   docs/design.md §5): ≥ 1 group, each of exactly group_size
//                   "channels" (head_dim divisible by group_size); "bits" is
//                   the index width of the group (1..16, 2^bits centroids),
//                   the same for every group. Keys are quantized pre-RoPE,
//                   values as they are. Codebooks (and the TaSQ per-channel
//                   weights) live in the plan's "tensors" side file
//                   (docs/plan_format.md). norm "none", or "shared-fp16" =
//                   one fp16 RMS scale per token per layer shared by the
//                   scale_heads (= n_kv_heads) KV heads: 16/scale_heads bits
//                   per head per token. Code bits = Σ_g bits_g / head_dim.
// Options of a codec (absent = off):
//   "norm_correction": true   tq-mse / tq-mse-grouped only: each group stores
//                   n/‖c[idx]‖ instead of n, so that ‖x̂‖ = n (docs/design.md
//                   §2.4); the same bytes, a different stored value.
//   "offset": [d numbers]     keys only, any kind but fp16 and vq: a fixed
//                   pre-RoPE key offset μ (each value an fp16 number). The
//                   cache quantizes k − R_p μ (R_p = RoPE at the key's
//                   position p, the layer's base) and stores nothing more
//                   per token; the reconstruction is R_p μ + Q(k − R_p μ)
//                   (docs/design.md §2.5). A fixed cost of 2·d bytes per codec
//                   per plan (format/stored_bytes.h "fixed_bytes").
// Effective bits per element of a codec = the bits it STORES per token / head_dim
// (ratekv/format/stored_bytes.h, the one accounting every table and allocator
// uses): codes, norms and scales as listed above, plus what the packed pages
// allocate beyond them — tq-mse groups padded to 16-channel tiles
// (16·⌈m/16⌉·b code bits), an unused 16-bit extension norm per 5..8-bit
// group, vq segments rounded up to 16 bytes per 64-token page. "achieved"
// k / v are the plan's stored bits per element of each side (all layers and
// KV heads); k_code / v_code the code bits alone.
//
// Errors: Plan::load / from_json throw ratekv::Error naming the file and the
// JSON path of the bad field and what was expected, e.g.
//   "plan.json: layers[3].heads[1].key.groups[0].bits = 9: expected 0..8".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ratekv {

/// What a plan must match in the model: architecture, shape and RoPE layout
/// ("interleaved" or "neox", as rope_layout_name() in model.h prints them).
struct PlanTarget {
  std::string arch;
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  std::string rope_layout;
};

/// The model a plan (or calibration statistics file) was made for.
struct ModelIdentity : PlanTarget {
  std::string file;    ///< model file name (no directory), informational
  std::string sha256;  ///< hex digest of the model file, "" if not computed
};

/// Quantizer kind of one codec.
enum class CodecKind { FP16, TqMseGrouped, TqMse, Kivi, QuaRot, Q8_0, Q4_0, Vq };
/// Storage of the per-group (or per-head) norm. SharedFP16 (vq only): one
/// fp16 scale per token shared by all KV heads of the layer ("shared-fp16").
enum class NormStorage { None, FP16, SharedFP16 };

/// "fp16", "tq-mse-grouped", "tq-mse", "kivi", "quarot", "q8_0", "q4_0", "vq".
const char* codec_kind_name(CodecKind k);
/// Inverse of codec_kind_name; throws Error naming `field` and the valid names.
CodecKind parse_codec_kind(const std::string& s, const std::string& field);

/// One group of channels encoded together by one quantizer instance.
/// Exactly one of `blocks` / `channels` is used, as the kind requires.
struct CodecGroup {
  int bits = 0;                 ///< code bits per channel (0 = dropped)
  std::vector<int> blocks;      ///< RoPE block indices (tq-mse-grouped)
  std::vector<int> channels;    ///< channel indices (other kinds)
  uint32_t seed = 0;            ///< rotation seed of this group (TQ kinds, quarot)
};

/// The codec of one side (K or V) of one (layer, KV head).
struct Codec {
  CodecKind kind = CodecKind::FP16;
  NormStorage norm = NormStorage::None;
  int group_size = 0;  ///< scale group along the head for kivi/quarot/q8_0/q4_0; channels per group for vq; else 0
  int scale_heads = 0; ///< vq with norm shared-fp16: KV heads sharing the per-token scale (= n_kv_heads), else 0
  std::vector<CodecGroup> groups;
  /// tq-mse / tq-mse-grouped: store n/‖c[idx]‖ per group (see the schema comment).
  bool norm_correction = false;
  /// Keys: pre-RoPE offset μ (head_dim fp16 values) subtracted before quantizing; empty = none.
  std::vector<float> offset;

  /// Code bits per element (Σ bits·channels / head_dim; 16 for fp16).
  double code_bits(int head_dim) const;
  /// Stored bits per element (codec_stored_bits / head_dim, format/stored_bytes.h):
  /// codes, metadata and the padding the packed pages allocate (schema comment).
  double effective_bits(int head_dim) const;

  /// Helpers that build valid codecs.
  static Codec fp16();
  /// Whole-head TQ-MSE at `bits` with one fp16 norm.
  static Codec tq_mse(int bits, int head_dim, uint32_t seed);
};

/// Key and value codec of one (layer, KV head).
struct HeadPlan {
  Codec key;
  Codec value;
};

/// A complete plan (see the schema in the file comment).
struct Plan {
  static constexpr int kFormatVersion = 1;

  std::string method;
  ModelIdentity model;
  std::string stats_file;
  std::optional<std::string> tensors_file;  ///< side file, relative to the plan file's directory
  /// Directory of the plan file (set by load(), not serialized; "" = current
  /// directory). tensors_file is resolved against it.
  std::string source_dir;
  /// Optional free-form record of how a fitted plan was made ("fit" in the
  /// JSON; e.g. TaSQ's weighting, normalization, grouping, k-means kind and
  /// seed, calibration tokens). Null when absent. Not interpreted on load.
  nlohmann::json fit;
  uint64_t seed = 0;
  int fp16_window = 0;
  int sink_tokens = 0;
  std::string budget_unit = "effective";  ///< "effective" | "code"
  double budget_k = 0.0;                  ///< requested K bits per element
  double budget_v = 0.0;                  ///< requested V bits per element
  /// [layer][kv head]; n_layers × n_kv_heads.
  std::vector<std::vector<HeadPlan>> layers;

  /// Achieved bits per element over all (layer, head): k, v = stored bits per
  /// element of each side (plan_stored_bytes, format/stored_bytes.h), total
  /// their mean; k_code, v_code = code bits only.
  struct Achieved {
    double k = 0, v = 0, total = 0;  ///< stored ("effective")
    double k_code = 0, v_code = 0;   ///< code only
  };
  Achieved achieved() const;

  /// Serializes (including "achieved", computed).
  nlohmann::json to_json() const;
  /// Parses and validates; `name` (file name) prefixes every error message.
  /// A stored "achieved" that disagrees with the codecs (> 1e-6) is an error.
  static Plan from_json(const nlohmann::json& j, const std::string& name);
  /// Reads and validates a plan file. Throws Error for I/O, JSON syntax,
  /// schema and range errors.
  static Plan load(const std::string& path);
  /// Validates, then writes pretty JSON. Throws Error on I/O failure, and for a loaded plan (source_dir set)
  /// whose relative tensors_file is not beside `path` (the saved JSON would name a missing side file).
  void save(const std::string& path) const;

  /// Checks every structural rule of the schema; throws Error naming `name`
  /// and the field.
  void validate(const std::string& name = "plan") const;
  /// Checks that the plan was made for a model with this arch, n_layers,
  /// n_kv_heads, head_dim and rope layout; throws Error listing each
  /// mismatch ("plan made for n_layers = 30, model has 24").
  void validate_against(const PlanTarget& target, const std::string& name = "plan") const;
};

}  // namespace ratekv
