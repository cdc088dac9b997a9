// io/safetensors.cpp — safetensors writer and validating reader (ratekv/io/safetensors.h).
#include "ratekv/io/safetensors.h"

#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"

namespace ratekv {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // same cap as the reference implementation
constexpr const char* kMetadataKey = "__metadata__";

bool dtype_from_name(const std::string& s, StDtype* out) {
  static const std::pair<const char*, StDtype> kTable[] = {
      {"F32", StDtype::F32}, {"F16", StDtype::F16}, {"BF16", StDtype::BF16},
      {"I32", StDtype::I32}, {"I64", StDtype::I64}, {"U8", StDtype::U8}};
  for (const auto& [n, t] : kTable)
    if (s == n) {
      *out = t;
      return true;
    }
  return false;
}

// Product of shape × elem_size, or false on a negative dim or overflow.
bool byte_size(const std::vector<int64_t>& shape, int64_t elem_size, int64_t* n_el, int64_t* nbytes) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return false;
  }
  *n_el = n;
  return !__builtin_mul_overflow(n, elem_size, nbytes);
}

}  // namespace

const char* st_dtype_name(StDtype t) {
  switch (t) {
    case StDtype::F32: return "F32";
    case StDtype::F16: return "F16";
    case StDtype::BF16: return "BF16";
    case StDtype::I32: return "I32";
    case StDtype::I64: return "I64";
    case StDtype::U8: return "U8";
  }
  return "?";
}

int64_t st_dtype_size(StDtype t) {
  switch (t) {
    case StDtype::F32: case StDtype::I32: return 4;
    case StDtype::F16: case StDtype::BF16: return 2;
    case StDtype::I64: return 8;
    case StDtype::U8: return 1;
  }
  return 1;
}

int64_t StTensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated by the reader
  return n;
}

// ---- writer --------------------------------------------------------------------------

void SafetensorsWriter::add(const std::string& name, StDtype dtype, const std::vector<int64_t>& shape,
                            std::span<const uint8_t> bytes) {
  check(!name.empty(), "safetensors writer: empty tensor name");
  check(name != kMetadataKey, "safetensors writer: tensor name '__metadata__' is reserved");
  for (const Entry& e : entries_) check(e.name != name, "safetensors writer: duplicate tensor name '{}'", name);
  int64_t n = 0, nbytes = 0;
  check(byte_size(shape, st_dtype_size(dtype), &n, &nbytes),
        "safetensors writer: tensor '{}': shape [{}] has a negative dimension or overflows", name,
        fmt::join(shape, ", "));
  check((uint64_t)nbytes == bytes.size(),
        "safetensors writer: tensor '{}': {} bytes given, expected {} ({} x {} elements of shape [{}])", name,
        bytes.size(), nbytes, st_dtype_name(dtype), n, fmt::join(shape, ", "));
  entries_.push_back({name, dtype, shape, std::vector<uint8_t>(bytes.begin(), bytes.end())});
}

void SafetensorsWriter::add_f32(const std::string& name, const std::vector<int64_t>& shape, std::span<const float> v) {
  add(name, StDtype::F32, shape, {reinterpret_cast<const uint8_t*>(v.data()), v.size_bytes()});
}
void SafetensorsWriter::add_f16(const std::string& name, const std::vector<int64_t>& shape,
                                std::span<const uint16_t> v) {
  add(name, StDtype::F16, shape, {reinterpret_cast<const uint8_t*>(v.data()), v.size_bytes()});
}
void SafetensorsWriter::add_i32(const std::string& name, const std::vector<int64_t>& shape,
                                std::span<const int32_t> v) {
  add(name, StDtype::I32, shape, {reinterpret_cast<const uint8_t*>(v.data()), v.size_bytes()});
}
void SafetensorsWriter::add_i64(const std::string& name, const std::vector<int64_t>& shape,
                                std::span<const int64_t> v) {
  add(name, StDtype::I64, shape, {reinterpret_cast<const uint8_t*>(v.data()), v.size_bytes()});
}
void SafetensorsWriter::add_u8(const std::string& name, const std::vector<int64_t>& shape,
                               std::span<const uint8_t> v) {
  add(name, StDtype::U8, shape, v);
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

std::vector<uint8_t> SafetensorsWriter::serialize() const {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) m[k] = v;
    h[kMetadataKey] = std::move(m);
  }
  uint64_t off = 0;
  for (const Entry& e : entries_) {
    h[e.name] = {{"dtype", st_dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {off, off + e.bytes.size()}}};
    off += e.bytes.size();
  }
  std::string js;
  try {
    js = h.dump();
  } catch (const nlohmann::json::exception& e) {  // names and metadata must be UTF-8 (JSON)
    fail("safetensors writer: a tensor name or metadata string is not valid UTF-8: {}", e.what());
  }
  js.append((8 - js.size() % 8) % 8, ' ');
  std::vector<uint8_t> out;
  out.reserve(8 + js.size() + off);
  const uint64_t n = js.size();
  for (int i = 0; i < 8; ++i) out.push_back((uint8_t)(n >> (8 * i)));
  out.insert(out.end(), js.begin(), js.end());
  for (const Entry& e : entries_) out.insert(out.end(), e.bytes.begin(), e.bytes.end());
  return out;
}

void SafetensorsWriter::write(const std::string& path) const {
  const std::vector<uint8_t> img = serialize();
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream o(tmp, std::ios::binary | std::ios::trunc);
    check(o.good(), "{}: cannot create file for writing", tmp);
    o.write(reinterpret_cast<const char*>(img.data()), (std::streamsize)img.size());
    o.flush();
    if (!o.good()) {
      std::remove(tmp.c_str());
      fail("{}: write failed", tmp);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    fail("{}: cannot rename temporary file into place: {}", path, std::strerror(err));
  }
}

// ---- reader --------------------------------------------------------------------------

struct SafetensorsFile::Impl {
  std::string path;
  std::vector<uint8_t> bytes;
  std::map<std::string, std::string> metadata;
  std::vector<StTensor> tensors;
  std::unordered_map<std::string, size_t> index;

  void parse();
};

void SafetensorsFile::Impl::parse() {
  check(bytes.size() >= 8, "{}: truncated safetensors file: {} bytes, expected at least the 8-byte header length",
        path, bytes.size());
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= (uint64_t)bytes[i] << (8 * i);
  check(n <= bytes.size() - 8, "{}: safetensors header length {} exceeds the {} bytes after the length field", path,
        n, bytes.size() - 8);
  check(n <= kMaxHeaderBytes, "{}: safetensors header length {} exceeds the {} byte limit", path, n,
        kMaxHeaderBytes);
  check(n >= 2, "{}: safetensors header length {} is too short for a JSON object", path, n);
  const char* js = reinterpret_cast<const char*>(bytes.data() + 8);

  // Duplicate top-level names are rejected (the JSON library would keep the last).
  std::set<std::string> seen;
  std::string dup;
  auto cb = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    if (ev == nlohmann::json::parse_event_t::key && depth == 1 && dup.empty()) {
      const std::string k = parsed.get<std::string>();
      if (!seen.insert(k).second) dup = k;
    }
    return true;
  };
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(js, js + n, cb);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: safetensors header is not valid JSON: {}", path, e.what());
  }
  check(dup.empty(), "{}: duplicate tensor name '{}' in the safetensors header", path, dup);
  check(h.is_object(), "{}: safetensors header must be a JSON object, got {}", path, h.type_name());

  const uint64_t data_size = bytes.size() - 8 - n;
  const uint8_t* data = bytes.data() + 8 + n;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == kMetadataKey) {
      check(v.is_object(), "{}: '__metadata__' must be an object of strings, got {}", path, v.type_name());
      for (auto m = v.begin(); m != v.end(); ++m) {
        check(m.value().is_string(), "{}: '__metadata__' key '{}': value must be a string, got {}", path, m.key(),
              m.value().type_name());
        metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    check(v.is_object(), "{}: tensor '{}': header entry must be an object, got {}", path, name, v.type_name());
    for (auto f = v.begin(); f != v.end(); ++f)
      check(f.key() == "dtype" || f.key() == "shape" || f.key() == "data_offsets",
            "{}: tensor '{}': unexpected header field '{}' (expected dtype, shape, data_offsets)", path, name, f.key());
    check(v.contains("dtype") && v["dtype"].is_string(), "{}: tensor '{}': missing string field 'dtype'", path, name);
    StTensor t;
    t.name = name;
    const std::string ds = v["dtype"].get<std::string>();
    check(dtype_from_name(ds, &t.dtype), "{}: tensor '{}': unsupported dtype '{}' (expected F32, F16, BF16, I32, "
          "I64 or U8)", path, name, ds);
    check(v.contains("shape") && v["shape"].is_array(), "{}: tensor '{}': missing array field 'shape'", path, name);
    for (const auto& d : v["shape"]) {
      check(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
            "{}: tensor '{}': shape entries must be non-negative integers, got {}", path, name, d.dump());
      check(d.get<uint64_t>() <= (uint64_t)std::numeric_limits<int64_t>::max(),
            "{}: tensor '{}': shape entry {} does not fit int64", path, name, d.dump());
      t.shape.push_back(d.get<int64_t>());
    }
    check(v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2,
          "{}: tensor '{}': 'data_offsets' must be an array [begin, end]", path, name);
    const auto& o = v["data_offsets"];
    check(o[0].is_number_unsigned() && o[1].is_number_unsigned(),
          "{}: tensor '{}': data_offsets must be non-negative integers, got {}", path, name, o.dump());
    const uint64_t begin = o[0].get<uint64_t>(), end = o[1].get<uint64_t>();
    check(begin <= end, "{}: tensor '{}': data_offsets [{}, {}] has begin > end", path, name, begin, end);
    check(end <= data_size, "{}: tensor '{}': data_offsets [{}, {}] past the end of the {}-byte data buffer", path,
          name, begin, end, data_size);
    int64_t n_el = 0, nbytes = 0;
    check(byte_size(t.shape, st_dtype_size(t.dtype), &n_el, &nbytes),
          "{}: tensor '{}': byte size of shape [{}] overflows", path, name, fmt::join(t.shape, ", "));
    check((uint64_t)nbytes == end - begin,
          "{}: tensor '{}': {} x shape [{}] is {} bytes, but data_offsets [{}, {}] span {} bytes", path, name,
          ds, fmt::join(t.shape, ", "), nbytes, begin, end, end - begin);
    t.bytes = {data + begin, (size_t)(end - begin)};
    tensors.push_back(std::move(t));
  }
  std::sort(tensors.begin(), tensors.end(), [&](const StTensor& a, const StTensor& b) {
    return a.bytes.data() != b.bytes.data() ? a.bytes.data() < b.bytes.data() : a.bytes.size() < b.bytes.size();
  });
  for (size_t k = 1; k < tensors.size(); ++k) {
    const StTensor& a = tensors[k - 1];
    const StTensor& b = tensors[k];
    if (a.bytes.empty() || b.bytes.empty()) continue;
    check(a.bytes.data() + a.bytes.size() <= b.bytes.data(),
          "{}: tensors '{}' (bytes [{}, {})) and '{}' (bytes [{}, {})) overlap", path, a.name,
          a.bytes.data() - data, a.bytes.data() - data + (int64_t)a.bytes.size(), b.name, b.bytes.data() - data,
          b.bytes.data() - data + (int64_t)b.bytes.size());
  }
  for (size_t k = 0; k < tensors.size(); ++k) index.emplace(tensors[k].name, k);
}

SafetensorsFile::SafetensorsFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

SafetensorsFile SafetensorsFile::parse(std::vector<uint8_t> bytes, const std::string& name) {
  auto impl = std::make_unique<Impl>();
  impl->path = name;
  impl->bytes = std::move(bytes);
  impl->parse();
  return SafetensorsFile(std::move(impl));
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  // A directory opens as a stream on Linux and reports a huge size: refuse it
  // before sizing a buffer from tellg().
  std::error_code ec;
  check(!std::filesystem::is_directory(path, ec), "{}: is a directory, expected a safetensors file", path);
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  check(in.good(), "{}: cannot open safetensors file", path);
  const std::streamoff size = in.tellg();
  check(size >= 0, "{}: cannot determine file size", path);
  std::vector<uint8_t> bytes((size_t)size);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(bytes.data()), size);
  check(in.good() || size == 0, "{}: read failed", path);
  return parse(std::move(bytes), path);
}

const std::string& SafetensorsFile::path() const { return impl_->path; }
const std::map<std::string, std::string>& SafetensorsFile::metadata() const { return impl_->metadata; }

const std::string& SafetensorsFile::metadata_value(const std::string& key) const {
  auto it = impl_->metadata.find(key);
  check(it != impl_->metadata.end(), "{}: metadata key '{}' is missing", impl_->path, key);
  return it->second;
}

const std::vector<StTensor>& SafetensorsFile::tensors() const { return impl_->tensors; }

const StTensor* SafetensorsFile::find(const std::string& name) const {
  auto it = impl_->index.find(name);
  return it == impl_->index.end() ? nullptr : &impl_->tensors[it->second];
}

const StTensor& SafetensorsFile::tensor(const std::string& name) const {
  const StTensor* t = find(name);
  check(t != nullptr, "{}: tensor '{}' not found", impl_->path, name);
  return *t;
}

const StTensor& SafetensorsFile::expect(const std::string& name, StDtype dtype,
                                        const std::vector<int64_t>& shape) const {
  const StTensor& t = tensor(name);
  check(t.dtype == dtype && t.shape == shape, "{}: tensor '{}' is {} [{}], expected {} [{}]", impl_->path, name,
        st_dtype_name(t.dtype), fmt::join(t.shape, ", "), st_dtype_name(dtype), fmt::join(shape, ", "));
  return t;
}

namespace {
template <typename T>
std::vector<T> copy_out(const StTensor& t) {
  std::vector<T> v(t.bytes.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
  return v;
}
}  // namespace

std::vector<float> SafetensorsFile::read_f32(const std::string& name) const {
  const StTensor& t = tensor(name);
  if (t.dtype == StDtype::F32) return copy_out<float>(t);
  check(t.dtype == StDtype::F16 || t.dtype == StDtype::BF16, "{}: tensor '{}' has dtype {}, expected F32/F16/BF16",
        impl_->path, name, st_dtype_name(t.dtype));
  const std::vector<uint16_t> h = copy_out<uint16_t>(t);
  std::vector<float> v(h.size());
  for (size_t i = 0; i < h.size(); ++i) v[i] = t.dtype == StDtype::F16 ? fp16_to_fp32(h[i]) : bf16_to_fp32(h[i]);
  return v;
}

#define RATEKV_ST_READ(fn, T, DT)                                                                             \
  std::vector<T> SafetensorsFile::fn(const std::string& name) const {                                         \
    const StTensor& t = tensor(name);                                                                         \
    check(t.dtype == StDtype::DT, "{}: tensor '{}' has dtype {}, expected " #DT, impl_->path, name,            \
          st_dtype_name(t.dtype));                                                                            \
    return copy_out<T>(t);                                                                                    \
  }
RATEKV_ST_READ(read_i32, int32_t, I32)
RATEKV_ST_READ(read_i64, int64_t, I64)
RATEKV_ST_READ(read_u8, uint8_t, U8)
#undef RATEKV_ST_READ

}  // namespace ratekv
