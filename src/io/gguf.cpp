// io/gguf.cpp — GGUF v2/v3 parser, validator and memory mapping (ratekv/io/gguf.h).
//
// Every length read from the file is checked against the bytes that remain
// BEFORE anything is allocated for it, so memory use is bounded by a small
// multiple of the file size: an element of a metadata array occupies >= 1 byte
// on disk and one GgufValue (sizeof ~48 bytes) in memory.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <numeric>
#include <unordered_map>

#include <fmt/ranges.h>

#include "ratekv/common/error.h"
#include "ratekv/io/gguf.h"

namespace ratekv {
namespace {

constexpr uint64_t kDefaultAlignment = 32;
constexpr int kMaxArrayDepth = 8;   // nesting of metadata arrays
constexpr uint32_t kMaxDims = 4;    // GGML_MAX_DIMS

const char* value_type_name(GgufValueType t) {
  switch (t) {
    case GgufValueType::U8: return "U8";
    case GgufValueType::I8: return "I8";
    case GgufValueType::U16: return "U16";
    case GgufValueType::I16: return "I16";
    case GgufValueType::U32: return "U32";
    case GgufValueType::I32: return "I32";
    case GgufValueType::F32: return "F32";
    case GgufValueType::BOOL: return "BOOL";
    case GgufValueType::STRING: return "STRING";
    case GgufValueType::ARRAY: return "ARRAY";
    case GgufValueType::U64: return "U64";
    case GgufValueType::I64: return "I64";
    case GgufValueType::F64: return "F64";
  }
  return "?";
}

// Smallest on-disk size of one value of type t (used to bound counts).
uint64_t min_value_bytes(GgufValueType t) {
  switch (t) {
    case GgufValueType::U8: case GgufValueType::I8: case GgufValueType::BOOL: return 1;
    case GgufValueType::U16: case GgufValueType::I16: return 2;
    case GgufValueType::U32: case GgufValueType::I32: case GgufValueType::F32: return 4;
    case GgufValueType::U64: case GgufValueType::I64: case GgufValueType::F64: return 8;
    case GgufValueType::STRING: return 8;   // u64 length
    case GgufValueType::ARRAY: return 12;   // u32 type + u64 count
  }
  return 1;
}

bool known_value_type(uint32_t t) { return t <= (uint32_t)GgufValueType::F64; }

// Bounds-checked little-endian reader over the file image.
class Cursor {
 public:
  Cursor(std::span<const uint8_t> b, const std::string& file) : b_(b), file_(file) {}
  size_t pos() const { return pos_; }
  uint64_t left() const { return b_.size() - pos_; }

  // `what` is a callable returning a description; only called on failure.
  template <typename What>
  void need(uint64_t n, What&& what) {
    if (n > left())
      fail("{}: truncated file: {} needs {} bytes at offset {}, but only {} remain (file is {} bytes)", file_,
           what(), n, pos_, left(), b_.size());
  }
  template <typename T, typename What>
  T read(What&& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));  // host is little-endian (x86-64/aarch64)
    pos_ += sizeof(T);
    return v;
  }
  template <typename What>
  std::string str(What&& what) {
    const uint64_t len = read<uint64_t>([&] { return what() + " (string length)"; });
    if (len > left())
      fail("{}: {}: string length {} at offset {} exceeds the {} bytes left in the file", file_, what(), len,
           pos_ - 8, left());
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), (size_t)len);
    pos_ += len;
    return s;
  }

 private:
  std::span<const uint8_t> b_;
  const std::string& file_;
  size_t pos_ = 0;
};

}  // namespace

struct GgufFile::Impl {
  std::string path;
  uint32_t version = 0;
  uint64_t alignment = kDefaultAlignment;
  std::map<std::string, GgufValue> metadata;
  std::vector<GgufTensor> tensors;
  std::unordered_map<std::string, size_t> index;
  void* map = nullptr;  // owned mmap, or nullptr for parse()
  size_t map_size = 0;

  ~Impl() {
    if (map) munmap(map, map_size);
  }

  void parse(std::span<const uint8_t> bytes);
  GgufValue read_value(Cursor& c, GgufValueType type, const std::string& key, int depth);
  const GgufValue& get(const std::string& key) const;
  [[noreturn]] void wrong_type(const std::string& key, const GgufValue& v, const char* expected) const {
    fail("{}: metadata key '{}' has type {}{}, expected {}", path, key, value_type_name(v.type),
         v.type == GgufValueType::ARRAY ? fmt::format(" of {}", value_type_name(v.elem_type)) : "", expected);
  }
  int64_t to_int(const std::string& key, const GgufValue& v) const;
  double to_float(const std::string& key, const GgufValue& v) const;
};

GgufValue GgufFile::Impl::read_value(Cursor& c, GgufValueType type, const std::string& key, int depth) {
  auto what = [&] { return fmt::format("metadata key '{}' value of type {}", key, value_type_name(type)); };
  GgufValue v;
  v.type = type;
  switch (type) {
    case GgufValueType::U8: v.v = (uint64_t)c.read<uint8_t>(what); break;
    case GgufValueType::I8: v.v = (int64_t)c.read<int8_t>(what); break;
    case GgufValueType::U16: v.v = (uint64_t)c.read<uint16_t>(what); break;
    case GgufValueType::I16: v.v = (int64_t)c.read<int16_t>(what); break;
    case GgufValueType::U32: v.v = (uint64_t)c.read<uint32_t>(what); break;
    case GgufValueType::I32: v.v = (int64_t)c.read<int32_t>(what); break;
    case GgufValueType::U64: v.v = c.read<uint64_t>(what); break;
    case GgufValueType::I64: v.v = c.read<int64_t>(what); break;
    case GgufValueType::F32: v.v = (double)c.read<float>(what); break;
    case GgufValueType::F64: v.v = c.read<double>(what); break;
    case GgufValueType::BOOL: {
      const uint8_t b = c.read<uint8_t>(what);
      check(b <= 1, "{}: metadata key '{}': BOOL byte is {} at offset {}, expected 0 or 1", path, key, b,
            c.pos() - 1);
      v.v = b != 0;
      break;
    }
    case GgufValueType::STRING: v.v = c.str(what); break;
    case GgufValueType::ARRAY: {
      check(depth < kMaxArrayDepth, "{}: metadata key '{}': arrays nested deeper than {} levels", path, key,
            kMaxArrayDepth);
      const uint32_t et = c.read<uint32_t>([&] { return fmt::format("metadata key '{}' array element type", key); });
      check(known_value_type(et), "{}: metadata key '{}': unknown array element type {} (expected 0..12)", path, key,
            et);
      v.elem_type = (GgufValueType)et;
      const uint64_t n = c.read<uint64_t>([&] { return fmt::format("metadata key '{}' array length", key); });
      const uint64_t min_bytes = min_value_bytes(v.elem_type);
      if (n > c.left() / min_bytes)
        fail("{}: metadata key '{}': array of {} {} elements needs at least {} bytes, but only {} remain", path, key,
             n, value_type_name(v.elem_type), n > UINT64_MAX / min_bytes ? UINT64_MAX : n * min_bytes, c.left());
      auto arr = std::make_shared<GgufArray>();
      arr->reserve((size_t)n);
      for (uint64_t i = 0; i < n; ++i) arr->push_back(read_value(c, v.elem_type, key, depth + 1));
      v.v = std::move(arr);
      break;
    }
  }
  return v;
}

void GgufFile::Impl::parse(std::span<const uint8_t> bytes) {
  Cursor c(bytes, path);
  c.need(4, [] { return std::string("magic"); });
  check(std::memcmp(bytes.data(), "GGUF", 4) == 0, "{}: not a GGUF file (magic is not \"GGUF\")", path);
  c.read<uint32_t>([] { return std::string("magic"); });
  version = c.read<uint32_t>([] { return std::string("header field 'version'"); });
  if (version != 2 && version != 3) {
    if (version == 1) fail("{}: GGUF version 1 is not supported (expected version 2 or 3)", path);
    if (version == 0x02000000u || version == 0x03000000u)
      fail("{}: GGUF version field is byte-swapped (big-endian file); only little-endian GGUF v2/v3 is supported",
           path);
    fail("{}: unsupported GGUF version {} (expected 2 or 3)", path, version);
  }
  const uint64_t n_tensors = c.read<uint64_t>([] { return std::string("header field 'tensor_count'"); });
  const uint64_t n_kv = c.read<uint64_t>([] { return std::string("header field 'kv_count'"); });
  // Minimal encodings: kv = key length (8) + type (4) + 1 byte value;
  // tensor info = name length (8) + n_dims (4) + type (4) + offset (8).
  constexpr uint64_t kMinKv = 13, kMinTensorInfo = 24;
  check(n_kv <= c.left() / kMinKv, "{}: header field 'kv_count' = {} cannot fit in the {} bytes that remain", path,
        n_kv, c.left());
  check(n_tensors <= c.left() / kMinTensorInfo,
        "{}: header field 'tensor_count' = {} cannot fit in the {} bytes that remain", path, n_tensors, c.left());

  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.str([&] { return fmt::format("metadata pair #{} key", i); });
    const uint32_t t = c.read<uint32_t>([&] { return fmt::format("metadata key '{}' value type", key); });
    check(known_value_type(t), "{}: metadata key '{}': unknown value type {} (expected 0..12)", path, key, t);
    GgufValue v = read_value(c, (GgufValueType)t, key, 0);
    check(!metadata.count(key), "{}: duplicate metadata key '{}'", path, key);
    metadata.emplace(std::move(key), std::move(v));
  }

  if (auto it = metadata.find("general.alignment"); it != metadata.end()) {
    const GgufValue& v = it->second;
    const auto* u = std::get_if<uint64_t>(&v.v);
    const auto* s = std::get_if<int64_t>(&v.v);
    check(u || s, "{}: metadata key 'general.alignment' has type {}, expected an integer (U32)", path,
          value_type_name(v.type));
    const uint64_t a = u ? *u : (uint64_t)*s;
    check((u || *s > 0) && a != 0 && (a & (a - 1)) == 0,
          "{}: metadata key 'general.alignment' = {} is not a nonzero power of two", path,
          u ? fmt::format("{}", *u) : fmt::format("{}", *s));
    alignment = a;
  }

  tensors.reserve((size_t)n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t{};
    t.name = c.str([&] { return fmt::format("tensor info #{} name", i); });
    const std::string& nm = t.name;
    const uint32_t n_dims = c.read<uint32_t>([&] { return fmt::format("tensor '{}' n_dims", nm); });
    check(n_dims <= kMaxDims, "{}: tensor '{}': n_dims = {}, expected at most {}", path, nm, n_dims, kMaxDims);
    int64_t n_el = 1;
    bool overflow = false;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = c.read<uint64_t>([&] { return fmt::format("tensor '{}' ne[{}]", nm, d); });
      check(ne <= (uint64_t)std::numeric_limits<int64_t>::max(), "{}: tensor '{}': ne[{}] = {} does not fit int64",
            path, nm, d, ne);
      t.ne.push_back((int64_t)ne);
      overflow = overflow || __builtin_mul_overflow(n_el, (int64_t)ne, &n_el);
    }
    const uint32_t type = c.read<uint32_t>([&] { return fmt::format("tensor '{}' type", nm); });
    t.type = (GgmlType)type;
    check(ggml_type_name(t.type).rfind("type#", 0) != 0,
          "{}: tensor '{}': unknown ggml type {} (expected one of the ggml.h type values)", path, nm, type);
    t.offset = c.read<uint64_t>([&] { return fmt::format("tensor '{}' offset", nm); });
    check(!overflow, "{}: tensor '{}': element count of shape [{}] overflows int64", path, nm,
          fmt::join(t.ne, ", "));
    const int64_t bs = ggml_block_size(t.type), bb = ggml_block_bytes(t.type);
    const int64_t ne0 = t.ne.empty() ? 1 : t.ne[0];
    check(ne0 % bs == 0, "{}: tensor '{}': ne[0] = {} is not a multiple of the {} block size {}", path, nm, ne0,
          ggml_type_name(t.type), bs);
    int64_t nbytes = 0;
    check(!__builtin_mul_overflow(n_el / bs, bb, &nbytes), "{}: tensor '{}': byte size of shape [{}] ({}) overflows",
          path, nm, fmt::join(t.ne, ", "), ggml_type_name(t.type));
    t.nbytes = (uint64_t)nbytes;
    check(t.offset % alignment == 0, "{}: tensor '{}': data offset {} is not a multiple of general.alignment = {}",
          path, nm, t.offset, alignment);
    check(!index.count(nm), "{}: duplicate tensor name '{}'", path, nm);
    index.emplace(nm, tensors.size());
    tensors.push_back(std::move(t));
  }

  // Data section: starts at the next multiple of the alignment.
  const uint64_t end_of_infos = c.pos();
  uint64_t data_start = 0;
  check(!__builtin_add_overflow(end_of_infos, alignment - 1, &data_start),
        "{}: data section offset overflows (general.alignment = {})", path, alignment);
  data_start &= ~(alignment - 1);
  if (tensors.empty()) return;
  check(data_start <= bytes.size(),
        "{}: truncated file: tensor data section starts at offset {} (after padding to general.alignment = {}), "
        "but the file is {} bytes",
        path, data_start, alignment, bytes.size());
  const uint64_t data_size = bytes.size() - data_start;
  for (GgufTensor& t : tensors) {
    check(t.offset <= data_size && t.nbytes <= data_size - t.offset,
          "{}: tensor '{}': data extends past end of file (offset {} + {} bytes in a data section of {} bytes "
          "starting at file offset {})",
          path, t.name, t.offset, t.nbytes, data_size, data_start);
    t.data = bytes.data() + data_start + t.offset;
  }
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return tensors[a].offset != tensors[b].offset ? tensors[a].offset < tensors[b].offset
                                                  : tensors[a].nbytes < tensors[b].nbytes;
  });
  for (size_t k = 1; k < order.size(); ++k) {
    const GgufTensor& a = tensors[order[k - 1]];
    const GgufTensor& b = tensors[order[k]];
    if (a.nbytes == 0 || b.nbytes == 0) continue;
    check(a.offset + a.nbytes <= b.offset,
          "{}: tensors '{}' (offset {}, {} bytes) and '{}' (offset {}, {} bytes) overlap in the data section", path,
          a.name, a.offset, a.nbytes, b.name, b.offset, b.nbytes);
  }
}

// ---- GgufTensor ------------------------------------------------------------------

int64_t GgufTensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;  // validated not to overflow by the parser
  return n;
}

int64_t GgufTensor::n_rows() const {
  if (ne.empty()) return 1;
  if (ne[0] == 0) return 0;
  return n_elements() / ne[0];
}

uint64_t GgufTensor::row_bytes() const {
  const int64_t ne0 = ne.empty() ? 1 : ne[0];
  return (uint64_t)(ne0 / ggml_block_size(type) * ggml_block_bytes(type));
}

// ---- GgufFile --------------------------------------------------------------------

GgufFile::GgufFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

GgufFile GgufFile::parse(std::span<const uint8_t> bytes, const std::string& name) {
  auto impl = std::make_unique<Impl>();
  impl->path = name;
  impl->parse(bytes);
  return GgufFile(std::move(impl));
}

GgufFile GgufFile::open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  check(fd >= 0, "{}: cannot open GGUF file: {}", path, std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file (expected a GGUF model file)", path);
  }
  if (st.st_size == 0) {
    ::close(fd);
    fail("{}: file is empty (expected a GGUF header)", path);
  }
  void* m = mmap(nullptr, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  check(m != MAP_FAILED, "{}: mmap of {} bytes failed: {}", path, (int64_t)st.st_size, std::strerror(err));
  impl->map = m;
  impl->map_size = (size_t)st.st_size;
  impl->parse({static_cast<const uint8_t*>(m), (size_t)st.st_size});
  return GgufFile(std::move(impl));
}

const std::string& GgufFile::path() const { return impl_->path; }
uint32_t GgufFile::version() const { return impl_->version; }
uint64_t GgufFile::alignment() const { return impl_->alignment; }
const std::map<std::string, GgufValue>& GgufFile::metadata() const { return impl_->metadata; }
bool GgufFile::has(const std::string& key) const { return impl_->metadata.count(key) != 0; }

const GgufValue& GgufFile::Impl::get(const std::string& key) const {
  auto it = metadata.find(key);
  check(it != metadata.end(), "{}: metadata key '{}' is missing", path, key);
  return it->second;
}

int64_t GgufFile::Impl::to_int(const std::string& key, const GgufValue& v) const {
  if (const auto* s = std::get_if<int64_t>(&v.v)) return *s;
  if (const auto* u = std::get_if<uint64_t>(&v.v)) {
    check(*u <= (uint64_t)std::numeric_limits<int64_t>::max(), "{}: metadata key '{}' = {} does not fit int64", path,
          key, *u);
    return (int64_t)*u;
  }
  wrong_type(key, v, "an integer");
}

double GgufFile::Impl::to_float(const std::string& key, const GgufValue& v) const {
  if (const auto* d = std::get_if<double>(&v.v)) return *d;
  if (const auto* s = std::get_if<int64_t>(&v.v)) return (double)*s;
  if (const auto* u = std::get_if<uint64_t>(&v.v)) return (double)*u;
  wrong_type(key, v, "a number");
}

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = impl_->get(key);
  if (const auto* s = std::get_if<std::string>(&v.v)) return *s;
  impl_->wrong_type(key, v, "STRING");
}
int64_t GgufFile::get_int(const std::string& key) const { return impl_->to_int(key, impl_->get(key)); }
double GgufFile::get_float(const std::string& key) const { return impl_->to_float(key, impl_->get(key)); }
bool GgufFile::get_bool(const std::string& key) const {
  const GgufValue& v = impl_->get(key);
  if (const auto* b = std::get_if<bool>(&v.v)) return *b;
  impl_->wrong_type(key, v, "BOOL");
}

std::vector<std::string> GgufFile::get_string_array(const std::string& key) const {
  const GgufValue& v = impl_->get(key);
  if (v.type != GgufValueType::ARRAY || v.elem_type != GgufValueType::STRING)
    impl_->wrong_type(key, v, "ARRAY of STRING");
  std::vector<std::string> out;
  const auto& arr = *std::get<std::shared_ptr<GgufArray>>(v.v);
  out.reserve(arr.size());
  for (const GgufValue& e : arr) out.push_back(std::get<std::string>(e.v));
  return out;
}

std::vector<double> GgufFile::get_float_array(const std::string& key) const {
  const GgufValue& v = impl_->get(key);
  if (v.type != GgufValueType::ARRAY || v.elem_type == GgufValueType::STRING ||
      v.elem_type == GgufValueType::ARRAY || v.elem_type == GgufValueType::BOOL)
    impl_->wrong_type(key, v, "ARRAY of numbers");
  std::vector<double> out;
  const auto& arr = *std::get<std::shared_ptr<GgufArray>>(v.v);
  out.reserve(arr.size());
  for (const GgufValue& e : arr) out.push_back(impl_->to_float(key, e));
  return out;
}

std::vector<int64_t> GgufFile::get_int_array(const std::string& key) const {
  const GgufValue& v = impl_->get(key);
  const GgufValueType et = v.elem_type;
  if (v.type != GgufValueType::ARRAY || et == GgufValueType::STRING || et == GgufValueType::ARRAY ||
      et == GgufValueType::BOOL || et == GgufValueType::F32 || et == GgufValueType::F64)
    impl_->wrong_type(key, v, "ARRAY of integers");
  std::vector<int64_t> out;
  const auto& arr = *std::get<std::shared_ptr<GgufArray>>(v.v);
  out.reserve(arr.size());
  for (const GgufValue& e : arr) out.push_back(impl_->to_int(key, e));
  return out;
}

int64_t GgufFile::get_int(const std::string& key, int64_t dflt) const { return has(key) ? get_int(key) : dflt; }
double GgufFile::get_float(const std::string& key, double dflt) const { return has(key) ? get_float(key) : dflt; }
std::string GgufFile::get_string(const std::string& key, const std::string& dflt) const {
  return has(key) ? get_string(key) : dflt;
}

const std::vector<GgufTensor>& GgufFile::tensors() const { return impl_->tensors; }

const GgufTensor* GgufFile::find_tensor(const std::string& name) const {
  auto it = impl_->index.find(name);
  return it == impl_->index.end() ? nullptr : &impl_->tensors[it->second];
}

const GgufTensor& GgufFile::tensor(const std::string& name) const {
  const GgufTensor* t = find_tensor(name);
  check(t != nullptr, "{}: tensor '{}' not found", impl_->path, name);
  return *t;
}

std::vector<float> GgufFile::dequantize(const GgufTensor& t) const {
  check(ggml_can_dequantize(t.type), "{}: tensor '{}': cannot dequantize ggml type {}", impl_->path, t.name,
        ggml_type_name(t.type));
  std::vector<float> out((size_t)t.n_elements());
  dequantize_row(t.type, t.data, out.data(), t.n_elements());
  return out;
}

void dequantize_rows(const GgufTensor& t, int64_t first_row, int64_t n_rows, float* dst) {
  const int64_t rows = t.n_rows();
  check(first_row >= 0 && n_rows >= 0 && first_row <= rows && n_rows <= rows - first_row,
        "tensor '{}': rows [{}, {}) out of range (tensor has {} rows)", t.name, first_row, first_row + n_rows, rows);
  check(ggml_can_dequantize(t.type), "tensor '{}': cannot dequantize ggml type {}", t.name, ggml_type_name(t.type));
  const int64_t ne0 = t.ne.empty() ? 1 : t.ne[0];
  dequantize_row(t.type, t.data + (uint64_t)first_row * t.row_bytes(), dst, n_rows * ne0);
}

}  // namespace ratekv
