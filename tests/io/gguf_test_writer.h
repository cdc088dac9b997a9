// tests/io/gguf_test_writer.h — test-only builder of GGUF images in memory.
//
// Writes the on-disk format independently of the reader: header, kv pairs
// (pre-encoded values), tensor infos, padding to the alignment, data section.
// Every field can be overridden to produce hostile files.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace ratekv::testing {

using Bytes = std::vector<uint8_t>;

template <typename T>
void put(Bytes& b, T v) {
  const size_t n = b.size();
  b.resize(n + sizeof(T));
  std::memcpy(b.data() + n, &v, sizeof(T));
}
inline void put_str(Bytes& b, const std::string& s) {
  put<uint64_t>(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}
inline void append(Bytes& b, const Bytes& x) { b.insert(b.end(), x.begin(), x.end()); }

/// An encoded metadata value: its type id and its payload bytes.
struct Val {
  uint32_t type;
  Bytes bytes;
};
template <typename T>
Val scalar(uint32_t type, T v) {
  Val r{type, {}};
  put<T>(r.bytes, v);
  return r;
}
inline Val v_u8(uint8_t v) { return scalar(0, v); }
inline Val v_i8(int8_t v) { return scalar(1, v); }
inline Val v_u16(uint16_t v) { return scalar(2, v); }
inline Val v_i16(int16_t v) { return scalar(3, v); }
inline Val v_u32(uint32_t v) { return scalar(4, v); }
inline Val v_i32(int32_t v) { return scalar(5, v); }
inline Val v_f32(float v) { return scalar(6, v); }
inline Val v_bool(bool v) { return scalar(7, (uint8_t)v); }
inline Val v_str(const std::string& s) {
  Val r{8, {}};
  put_str(r.bytes, s);
  return r;
}
inline Val v_u64(uint64_t v) { return scalar(10, v); }
inline Val v_i64(int64_t v) { return scalar(11, v); }
inline Val v_f64(double v) { return scalar(12, v); }
/// Array of `elems` (all of type elem_type); `count` overrides the length field.
inline Val v_arr(uint32_t elem_type, const std::vector<Val>& elems, std::optional<uint64_t> count = {}) {
  Val r{9, {}};
  put<uint32_t>(r.bytes, elem_type);
  put<uint64_t>(r.bytes, count ? *count : elems.size());
  for (const Val& e : elems) append(r.bytes, e.bytes);
  return r;
}

struct TensorSpec {
  TensorSpec(std::string n, std::vector<uint64_t> shape, uint32_t t, Bytes d, std::optional<uint64_t> off = {})
      : name(std::move(n)), ne(std::move(shape)), type(t), data(std::move(d)), offset(off) {}
  std::string name;
  std::vector<uint64_t> ne;
  uint32_t type;
  Bytes data;
  std::optional<uint64_t> offset;    // default: next aligned position
  std::optional<uint32_t> n_dims;    // default: ne.size()
};

/// Builds a GGUF image. Tensor data are placed at their offsets (default:
/// consecutive, each aligned); general.alignment must be added as a kv by the
/// test if a non-default alignment is wanted (set `alignment` to match).
struct GgufBuilder {
  uint32_t version = 3;
  uint64_t alignment = 32;
  std::optional<uint64_t> n_tensors_override, n_kv_override;
  std::vector<std::pair<std::string, Val>> kvs;
  std::vector<TensorSpec> tensors;

  GgufBuilder& kv(const std::string& key, Val v) {
    kvs.emplace_back(key, std::move(v));
    return *this;
  }
  GgufBuilder& tensor(TensorSpec t) {
    tensors.push_back(std::move(t));
    return *this;
  }

  Bytes build() const {
    Bytes b;
    put<uint32_t>(b, 0x46554747u);  // "GGUF" little-endian
    put<uint32_t>(b, version);
    put<uint64_t>(b, n_tensors_override ? *n_tensors_override : tensors.size());
    put<uint64_t>(b, n_kv_override ? *n_kv_override : kvs.size());
    for (const auto& [k, v] : kvs) {
      put_str(b, k);
      put<uint32_t>(b, v.type);
      append(b, v.bytes);
    }
    std::vector<uint64_t> offs;
    uint64_t next = 0;
    for (const TensorSpec& t : tensors) {
      const uint64_t off = t.offset ? *t.offset : next;
      offs.push_back(off);
      next = (off + t.data.size() + alignment - 1) / alignment * alignment;
      put_str(b, t.name);
      put<uint32_t>(b, t.n_dims ? *t.n_dims : (uint32_t)t.ne.size());
      for (uint64_t d : t.ne) put<uint64_t>(b, d);
      put<uint32_t>(b, t.type);
      put<uint64_t>(b, off);
    }
    if (tensors.empty()) return b;
    while (b.size() % alignment) b.push_back(0);
    const size_t start = b.size();
    for (size_t i = 0; i < tensors.size(); ++i) {
      const Bytes& d = tensors[i].data;
      if (start + offs[i] + d.size() > b.size()) b.resize(start + offs[i] + d.size(), 0);
      if (!d.empty()) std::memcpy(b.data() + start + offs[i], d.data(), d.size());
    }
    return b;
  }
};

/// Raw bytes of a float array (little-endian host).
inline Bytes f32_bytes(const std::vector<float>& v) {
  Bytes b(v.size() * 4);
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

}  // namespace ratekv::testing
