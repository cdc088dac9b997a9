// ratekv/io/safetensors.h — safetensors writer and validating reader.
//
// Format (huggingface safetensors): u64 little-endian N, then N bytes of a
// UTF-8 JSON object (the header), then the data buffer. Header entries:
//   "<tensor name>": {"dtype": "F32", "shape": [d0, d1, ...],
//                     "data_offsets": [begin, end]}   // bytes, relative to the buffer
//   "__metadata__": {"key": "string value", ...}     // optional, strings only
// Shapes are row-major (C order, last dimension contiguous), unlike GGUF's ne.
// ratekv stores calibration statistics and plans in this format; structured
// metadata goes in a metadata string holding a JSON document.
//
// The writer pads the header with spaces to a multiple of 8 bytes and lays the
// tensors out in insertion order, contiguously. The reader checks: header
// length within the file, valid JSON object, no duplicate names, known dtype,
// non-negative shape whose element count and byte size do not overflow,
// dtype size × elements == end − begin, offsets within the buffer, no
// overlapping tensors, metadata values are strings. Every failure is a
// ratekv::Error naming the file and the tensor/field.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ratekv {

/// Element types supported by ratekv's safetensors files.
enum class StDtype { F32, F16, BF16, I32, I64, U8 };

/// "F32", "F16", "BF16", "I32", "I64", "U8" (the safetensors dtype strings).
const char* st_dtype_name(StDtype t);
/// Bytes per element (4, 2, 2, 4, 8, 1).
int64_t st_dtype_size(StDtype t);

/// A tensor inside a SafetensorsFile (bytes point into the file's buffer;
/// valid while the file object lives; not necessarily aligned — copy out
/// with the read_* helpers or memcpy).
struct StTensor {
  std::string name;
  StDtype dtype;
  std::vector<int64_t> shape;          // row-major
  std::span<const uint8_t> bytes;      // exactly n_elements() * st_dtype_size(dtype)
  int64_t n_elements() const;          // product of shape (1 for a scalar)
};

/// Collects named tensors and metadata, then writes one safetensors file.
class SafetensorsWriter {
 public:
  /// Adds a tensor (bytes are copied). Throws Error for a duplicate or empty
  /// name, the reserved name "__metadata__", a negative dimension, or a byte
  /// count != product(shape) * st_dtype_size(dtype).
  void add(const std::string& name, StDtype dtype, const std::vector<int64_t>& shape,
           std::span<const uint8_t> bytes);
  void add_f32(const std::string& name, const std::vector<int64_t>& shape, std::span<const float> v);
  /// fp16 values given as binary16 bit patterns (see fp16.h).
  void add_f16(const std::string& name, const std::vector<int64_t>& shape, std::span<const uint16_t> bits);
  void add_i32(const std::string& name, const std::vector<int64_t>& shape, std::span<const int32_t> v);
  void add_i64(const std::string& name, const std::vector<int64_t>& shape, std::span<const int64_t> v);
  void add_u8(const std::string& name, const std::vector<int64_t>& shape, std::span<const uint8_t> v);
  /// Sets "__metadata__"[key] = value (e.g. value = a JSON document's dump()).
  void set_metadata(const std::string& key, const std::string& value);

  /// The complete file image.
  std::vector<uint8_t> serialize() const;
  /// Writes serialize() to `path` atomically (temp file + rename). Throws
  /// Error naming the path on I/O failure.
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    StDtype dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

/// A validated safetensors file held in memory. Move-only.
class SafetensorsFile {
 public:
  /// Reads and validates `path` (see file comment). Throws Error.
  static SafetensorsFile open(const std::string& path);
  /// Validates an in-memory image; `name` is used in error messages.
  static SafetensorsFile parse(std::vector<uint8_t> bytes, const std::string& name);

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::string& path() const;
  /// The "__metadata__" map (empty if absent).
  const std::map<std::string, std::string>& metadata() const;
  /// metadata()[key]; throws Error naming the file and key when absent.
  const std::string& metadata_value(const std::string& key) const;
  /// Tensors in data-offset order.
  const std::vector<StTensor>& tensors() const;
  /// nullptr when absent.
  const StTensor* find(const std::string& name) const;
  /// Throws Error naming the file and tensor when absent.
  const StTensor& tensor(const std::string& name) const;

  /// Copies a tensor out. read_f32 accepts F32, F16 and BF16 (widened
  /// exactly); the integer readers need that exact dtype. Throws Error naming
  /// the file and tensor when absent or on a dtype mismatch.
  std::vector<float> read_f32(const std::string& name) const;
  std::vector<int32_t> read_i32(const std::string& name) const;
  std::vector<int64_t> read_i64(const std::string& name) const;
  std::vector<uint8_t> read_u8(const std::string& name) const;
  /// Throws Error unless tensor `name` exists with exactly this dtype and shape.
  const StTensor& expect(const std::string& name, StDtype dtype, const std::vector<int64_t>& shape) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  explicit SafetensorsFile(std::unique_ptr<Impl> impl);
};

}  // namespace ratekv
