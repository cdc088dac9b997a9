// ratekv/quant/quantizer.h — the one interface every KV quantizer implements
// (docs/design.md §2–§5, §9). The quant module knows vectors, not models or files.
//
// A quantizer is described by a small JSON object (kind, dims, bits, seed and
// kind-specific options; see each codec's header) and can be rebuilt from it
// with make_quantizer(). Its main entry point for the fake-quant cache is
//
//     q.fake_quant(x, T, xhat);   // x, xhat: (T, q.dim()) row-major fp32
//
// which stores and reloads exactly what the packed format would (codes, fp16
// norms/scales/zeros) and writes the reconstruction. What one row means is the
// quantizer's scope():
//   per_vector          one row = one vector (a head, or a channel group, of one
//                       token); rows are independent, so any T and any split of
//                       the rows into calls gives the same result.
//   per_channel_tokens  one row = one token of one head; every channel is
//                       quantized over groups of tokens_per_group() consecutive
//                       rows (KIVI keys). Rows past the last full group are
//                       the fp16 window (stored as fp16). The cache must call
//                       fake_quant on the whole history of the head (or on
//                       group-aligned chunks), keeping the original values of
//                       the window rows until their group fills.
//   per_token_shared    one row = one token across all KV heads of a layer,
//                       dim() = n_kv_heads·head_dim, with per-token metadata
//                       shared across the heads (TaSQ's per-token RMS scale).
// Effective bits per element count everything stored per token: codes, norms,
// scales, zeros and the fp16 window (docs/design.md §9.1: compare at equal effective
// bits).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace ratekv::quant {

/// Every quantizer kind; to_string gives its JSON "kind" name.
enum class QuantKind {
  tq_mse,          // TurboQuant-MSE (tq_mse.h)
  tq_prod,         // TurboQuant-prod: (b−1)-bit MSE + 1-bit QJL (tq_prod.h)
  grouped_tq_mse,  // TQ-MSE over channel subsets, Block-GTQ keys (grouped_tq_mse.h)
  kivi_key,        // per-channel asymmetric int over token groups (kivi.h)
  kivi_value,      // per-token asymmetric int over channel groups (kivi.h)
  quarot,          // Hadamard + per-token int (quarot.h)
  ggml_q8_0,       // llama.cpp q8_0 blocks (ggml_blocks.h)
  ggml_q4_0,       // llama.cpp q4_0 blocks (ggml_blocks.h)
  tasq,            // reserved for TaSQ (per_token_shared; implemented elsewhere)
};

enum class QuantScope { per_vector, per_channel_tokens, per_token_shared };

std::string to_string(QuantKind k);
std::string to_string(QuantScope s);
/// Inverse of to_string(QuantKind); throws Error listing the known kinds.
QuantKind quant_kind_from_string(const std::string& s);

/// How a stored per-vector norm is encoded (room for cheaper encodings).
enum class NormCoding { fp16, fp32 };
/// Bits one stored norm takes: 16 or 32.
int norm_bits(NormCoding c);
/// Rounds a norm to what its encoding stores (fp16: round to nearest even).
float store_norm(NormCoding c, float n);
std::string to_string(NormCoding c);
NormCoding norm_coding_from_string(const std::string& s);

/// Abstract quantizer. Implementations are immutable after construction and
/// safe to call from several threads at once.
class Quantizer {
 public:
  virtual ~Quantizer() = default;

  virtual QuantKind kind() const = 0;
  virtual QuantScope scope() const = 0;
  /// Elements per row of fake_quant (head_dim, group size, or n_kv_heads·head_dim).
  virtual int dim() const = 0;
  /// Rows that share per-channel metadata (1 unless scope() == per_channel_tokens).
  virtual int tokens_per_group() const { return 1; }

  /// Code bits per element, excluding metadata (e.g. 3 for 3-bit TQ-MSE; the
  /// mean over channels for grouped codecs).
  virtual double code_bits_per_element() const = 0;
  /// Exact effective bits per element of a block of T rows: (code bits + every
  /// norm/scale/zero + fp16 window) / (T·dim()). Throws Error if T < 1.
  virtual double bits_per_element(int64_t T) const = 0;
  /// Steady-state effective bits per element (T a multiple of tokens_per_group()).
  double bits_per_element() const { return bits_per_element(tokens_per_group()); }

  /// The description this quantizer is rebuilt from by make_quantizer().
  virtual nlohmann::json to_json() const = 0;

  /// Quantize → dequantize. x, xhat: (T, dim()) row-major fp32; may alias.
  /// Throws Error if T < 0 or x holds non-finite values.
  virtual void fake_quant(const float* x, int64_t T, float* xhat) const = 0;
};

/// What every quantizer configured by one struct with one code width shares:
/// the struct (fields `dim` and `bits`, the code bits per element), its kind
/// and scope. A quantizer derives from ConfiguredQuantizer<XConfig,
/// QuantKind::x> and implements the rest: bits_per_element(T), to_json() and
/// fake_quant() (and a static config_from_json for make_quantizer).
template <typename Config, QuantKind Kind, QuantScope Scope = QuantScope::per_vector>
class ConfiguredQuantizer : public Quantizer {
 public:
  const Config& config() const { return cfg_; }
  QuantKind kind() const final { return Kind; }
  QuantScope scope() const final { return Scope; }
  int dim() const final { return cfg_.dim; }
  double code_bits_per_element() const final { return cfg_.bits; }

 protected:
  explicit ConfiguredQuantizer(const Config& cfg) : cfg_(cfg) {}
  Config cfg_;
};

/// Builds a quantizer from its JSON description (the output of to_json()).
/// Throws Error naming the missing/invalid field. kind "tasq" is rejected here
/// (TaSQ needs fitted codebooks and lives outside this module).
std::unique_ptr<Quantizer> make_quantizer(const nlohmann::json& desc);

/// Normalized distortion Σ‖x − x̂‖² / Σ‖x‖² of q over the rows of x (N, q.dim())
/// (one fake_quant call on the whole block). Throws Error if Σ‖x‖² = 0.
double relative_distortion(const Quantizer& q, const float* x, int64_t N);

namespace detail {
/// JSON field helpers: throw Error "<what>: field '<key>' ..." when missing or mistyped.
int json_int(const nlohmann::json& j, const char* key, const char* what);
uint64_t json_u64(const nlohmann::json& j, const char* key, const char* what, uint64_t def);
/// Throws Error if any of x[0..n) is non-finite, naming `what` and the index.
void check_finite(const float* x, int64_t n, const char* what);
}  // namespace detail

}  // namespace ratekv::quant
