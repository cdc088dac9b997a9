// ratekv/io/gguf.h — memory-mapped GGUF (v2/v3) reader.
//
// Spec: the GGUF file format of ggml/llama.cpp. Layout: magic "GGUF", u32
// version, u64 tensor_count, u64 kv_count (v1 used u32; v1 is rejected), kv
// pairs (gguf string key, u32 value type, value), tensor infos (name, u32
// n_dims, u64 ne[n_dims], u32 ggml type, u64 offset), padding to
// `general.alignment` (default 32), then the tensor data section.
//
// Shapes follow ggml: ne[0] is the fastest-varying (contiguous) dimension, so
// a linear weight W of shape (out, in) in math notation has ne = {in, out} and
// row r (one output feature) is the r-th contiguous run of ne[0] elements.
//
// Errors: open() throws ratekv::Error naming the file and the offending
// field/tensor for a bad magic, unsupported version, truncated file, string or
// array lengths past the end of the file, counts that cannot fit the file,
// nested arrays deeper than allowed, misaligned or overlapping tensor data,
// unknown ggml types, and shapes whose byte size overflows. It never allocates
// more than a small multiple of the file size: every count is checked against
// the remaining bytes before allocating; the worst case is a U8/BOOL metadata
// array (1 byte on disk, one GgufValue of ~48 bytes in memory per element).
// Tensor data is never copied; dequantize() allocates <= 7.2x the tensor bytes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

namespace ratekv {

/// ggml tensor types (values are the on-disk enum of ggml.h).
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, BF16 = 30,
};

/// Name of a ggml type ("Q4_1"), or "type#N" for an unknown value.
std::string ggml_type_name(GgmlType t);
/// Elements per quantization block (1 for F32/F16/BF16, 32 for Q4_0.., 256 for K-quants).
/// Throws Error for an unsupported type.
int64_t ggml_block_size(GgmlType t);
/// Bytes per block (e.g. Q4_1: 20 bytes per 32 weights). Throws Error if unsupported.
int64_t ggml_block_bytes(GgmlType t);
/// True for the types dequantize_row() decodes (F32, F16, BF16, Q8_0, Q4_0,
/// Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K). Other known types (Q8_1, Q2_K, Q3_K,
/// Q8_K, I8..I64, F64) can be parsed and sized but not dequantized.
bool ggml_can_dequantize(GgmlType t);

/// GGUF metadata value types (on-disk enum).
enum class GgufValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};

/// One metadata value. Arrays are homogeneous; nested arrays are allowed
/// (bounded depth). Scalars of every integer width are kept as int64/uint64.
struct GgufValue;
using GgufArray = std::vector<GgufValue>;
struct GgufValue {
  GgufValueType type = GgufValueType::U8;
  GgufValueType elem_type = GgufValueType::U8;  // for ARRAY
  std::variant<uint64_t, int64_t, double, bool, std::string, std::shared_ptr<GgufArray>> v;
};

/// One tensor's description and its bytes inside the mapping.
struct GgufTensor {
  std::string name;
  std::vector<int64_t> ne;   // ggml order, ne[0] contiguous
  GgmlType type;
  uint64_t offset;           // from the start of the data section
  uint64_t nbytes;           // exact bytes of the data
  const uint8_t* data;       // points into the mapping (valid while the GgufFile lives)
  int64_t n_elements() const;
  /// Rows = n_elements / ne[0] (1 for a 0-d tensor); a row is ne[0] elements.
  int64_t n_rows() const;
  /// Bytes of one row (ne[0] elements; ne[0] is a multiple of the block size).
  uint64_t row_bytes() const;
};

/// A GGUF file mapped read-only into memory. Move-only.
class GgufFile {
 public:
  /// Maps and validates `path`. Throws Error (see file comment).
  static GgufFile open(const std::string& path);
  /// Parses an in-memory image (used by tests and the fuzzer); `bytes` must
  /// outlive the object. `name` is used in error messages.
  static GgufFile parse(std::span<const uint8_t> bytes, const std::string& name);

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();

  const std::string& path() const;
  uint32_t version() const;
  uint64_t alignment() const;

  const std::map<std::string, GgufValue>& metadata() const;
  bool has(const std::string& key) const;
  /// Typed getters: throw Error naming the file and key if it is missing or
  /// of an incompatible type (any integer type converts to integers if in range).
  std::string get_string(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;  // accepts F32/F64 and integers
  bool get_bool(const std::string& key) const;
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<double> get_float_array(const std::string& key) const;
  std::vector<int64_t> get_int_array(const std::string& key) const;
  /// Value or default when the key is absent (still throws on a wrong type).
  int64_t get_int(const std::string& key, int64_t dflt) const;
  double get_float(const std::string& key, double dflt) const;
  std::string get_string(const std::string& key, const std::string& dflt) const;

  const std::vector<GgufTensor>& tensors() const;
  /// nullptr when absent.
  const GgufTensor* find_tensor(const std::string& name) const;
  /// Throws Error naming the tensor when absent.
  const GgufTensor& tensor(const std::string& name) const;

  /// Whole tensor dequantized to fp32, row-major in ggml order (ne[0] fastest).
  std::vector<float> dequantize(const GgufTensor& t) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  explicit GgufFile(std::unique_ptr<Impl> impl);
};

/// Dequantizes `n` elements (a multiple of ggml_block_size(type)) from `src`
/// to fp32. Supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
/// Q5_K, Q6_K. Scalar reference implementation (defines the format); throws
/// Error for other types or a bad n.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

/// Dequantizes rows [first_row, first_row + n_rows) of `t` (each ne[0]
/// elements) into dst[n_rows * ne[0]], e.g. one token_embd row per token.
/// Throws Error naming the tensor for an out-of-range row or unsupported type.
void dequantize_rows(const GgufTensor& t, int64_t first_row, int64_t n_rows, float* dst);

}  // namespace ratekv
