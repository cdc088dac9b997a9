// src/io/npy.cpp — reader and writer of 2-D float32 .npy matrices (ratekv/io/npy.h).
#include "ratekv/io/npy.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "ratekv/common/error.h"

namespace ratekv {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the .npy reader/writer copies '<f4' bytes as-is and needs a little-endian host");

constexpr char kMagic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};
constexpr int64_t kMaxCols = int64_t{1} << 20;

/// The header dict for messages: trailing padding removed, cut to 200 bytes
/// (a hostile header can be up to 4 GiB).
std::string shown(const std::string& h) {
  return h.size() <= 200 ? h : h.substr(0, 200) + "...";
}

/// Splits the header dict h (padding removed) into its keys: h must be a
/// Python dict literal whose keys are exactly 'descr', 'fortran_order' and
/// 'shape', each once (NumPy's reader demands the same set), with values that
/// are a quoted string, a tuple or list, or a bare token (True, False, a
/// number). Sets the offset in h of each key's value; returns false for
/// anything else (an extra, repeated or missing key, a key inside another
/// value's string, bytes such as NUL outside strings).
bool split_dict(const std::string& h, size_t& descr, size_t& order, size_t& shape) {
  descr = order = shape = std::string::npos;
  size_t p = 0;
  auto skip = [&] {
    while (p < h.size() && h[p] == ' ') ++p;
  };
  skip();
  if (p >= h.size() || h[p] != '{') return false;
  ++p;
  for (;;) {
    skip();
    if (p < h.size() && h[p] == '}') break;
    if (p >= h.size() || (h[p] != '\'' && h[p] != '"')) return false;
    const size_t key_end = h.find(h[p], p + 1);
    if (key_end == std::string::npos) return false;
    const std::string key = h.substr(p + 1, key_end - p - 1);
    p = key_end + 1;
    skip();
    if (p >= h.size() || h[p] != ':') return false;
    ++p;
    skip();
    size_t* slot = key == "descr" ? &descr : key == "fortran_order" ? &order : key == "shape" ? &shape : nullptr;
    if (slot == nullptr || *slot != std::string::npos) return false;  // unknown or repeated key
    *slot = p;
    if (p < h.size() && (h[p] == '\'' || h[p] == '"')) {  // a string (NumPy writes no escapes)
      const size_t e = h.find(h[p], p + 1);
      if (e == std::string::npos) return false;
      p = e + 1;
    } else if (p < h.size() && (h[p] == '(' || h[p] == '[')) {  // a tuple or list, possibly nested
      int depth = 0;
      char quote = 0;
      for (; p < h.size(); ++p) {
        const char c = h[p];
        if (quote) {
          if (c == quote) quote = 0;
        } else if (c == '\'' || c == '"') {
          quote = c;
        } else if (c == '(' || c == '[') {
          ++depth;
        } else if (c == ')' || c == ']') {
          if (--depth == 0) break;
        }
      }
      if (p >= h.size()) return false;
      ++p;
    } else {  // True, False, a number
      while (p < h.size() && (std::isalnum((unsigned char)h[p]) || h[p] == '_' || h[p] == '-' || h[p] == '+')) ++p;
      if (p == *slot) return false;
    }
    skip();
    if (p < h.size() && h[p] == ',') {
      ++p;
      continue;
    }
    if (p < h.size() && h[p] == '}') break;
    return false;
  }
  ++p;  // the closing brace
  skip();
  return p == h.size() && descr != std::string::npos && order != std::string::npos && shape != std::string::npos;
}

/// True when h has the token `tok` at p, not followed by an identifier
/// character ('<f4' but not '<f4x', False but not Falsey).
bool token_at(const std::string& h, size_t p, const std::string& tok) {
  if (p == std::string::npos || h.compare(p, tok.size(), tok) != 0) return false;
  const size_t e = p + tok.size();
  return e == h.size() || !(std::isalnum((unsigned char)h[e]) || h[e] == '_');
}

/// Parses the shape tuple starting at h[p] == '(': comma-separated
/// non-negative decimal integers, an optional trailing comma, ')'. Returns
/// false on anything else (including an integer that does not fit int64).
bool parse_shape(const std::string& h, size_t p, std::vector<int64_t>& dims) {
  dims.clear();
  if (p >= h.size() || h[p] != '(') return false;
  ++p;
  for (;;) {
    while (p < h.size() && h[p] == ' ') ++p;
    if (p < h.size() && h[p] == ')') return true;  // "()", "(3,)" or "(3, 4)"
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(h.data() + p, h.data() + h.size(), v);
    if (ec != std::errc() || v < 0) return false;
    dims.push_back(v);
    p = (size_t)(end - h.data());
    while (p < h.size() && h[p] == ' ') ++p;
    if (p < h.size() && h[p] == ',') {
      ++p;
      continue;
    }
    return p < h.size() && h[p] == ')';
  }
}

}  // namespace

NpyMatrix read_npy_f32(const std::string& path, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  check(fs::exists(path, ec), "{}: '{}' does not exist", what, path);
  check(fs::is_regular_file(path, ec), "{}: '{}' is not a regular file", what, path);
  const uint64_t size = fs::file_size(path, ec);
  check(!ec, "{}: cannot get the size of '{}': {}", what, path, ec.message());
  std::ifstream f(path, std::ios::binary);
  check((bool)f, "{}: cannot open '{}'", what, path);

  // Preamble: magic (6), version (2), header length (2 for 1.0, 4 for 2.0 / 3.0).
  unsigned char pre[12] = {};
  const size_t npre = (size_t)std::min<uint64_t>(size, sizeof pre);
  f.read(reinterpret_cast<char*>(pre), (std::streamsize)npre);
  check((size_t)f.gcount() == npre, "{}: '{}': read failed", what, path);
  check(npre >= 6 && std::memcmp(pre, kMagic, 6) == 0, "{}: '{}': not a .npy file (no \\x93NUMPY magic)", what, path);
  check(npre >= 10, "{}: '{}': truncated .npy header ({} bytes)", what, path, size);
  const int major = pre[6];
  uint64_t hlen = 0, hstart = 0;
  if (major == 1) {
    hlen = (uint64_t)pre[8] | ((uint64_t)pre[9] << 8);
    hstart = 10;
  } else {
    check(major == 2 || major == 3, "{}: '{}': unsupported .npy version {} (expected 1, 2 or 3)", what, path, major);
    check(npre >= 12, "{}: '{}': truncated .npy header ({} bytes)", what, path, size);
    hlen = (uint64_t)pre[8] | ((uint64_t)pre[9] << 8) | ((uint64_t)pre[10] << 16) | ((uint64_t)pre[11] << 24);
    hstart = 12;
  }
  check(hstart + hlen <= size, "{}: '{}': .npy header length {} runs past the file ({} bytes)", what, path, hlen, size);

  // hlen ≤ size here, so this allocation is bounded by the file itself.
  std::string h((size_t)hlen, '\0');
  f.seekg((std::streamoff)hstart);
  f.read(h.data(), (std::streamsize)hlen);
  check((uint64_t)f.gcount() == hlen, "{}: '{}': read of the .npy header failed", what, path);
  while (!h.empty() && (h.back() == ' ' || h.back() == '\n')) h.pop_back();

  size_t d = 0, fo = 0, s = 0;
  check(split_dict(h, d, fo, s),
        "{}: '{}': .npy header must be a dict of exactly 'descr', 'fortran_order' and 'shape' (each once), header {}",
        what, path, shown(h));
  check(token_at(h, d, "'<f4'"),
        "{}: '{}': .npy dtype must be '<f4' (little-endian float32), header {}", what, path, shown(h));
  check(token_at(h, fo, "False"),
        "{}: '{}': .npy must be C-ordered ('fortran_order': False), header {}", what, path, shown(h));
  std::vector<int64_t> dims;
  check(parse_shape(h, s, dims) && dims.size() == 2 && dims[0] >= 1 && dims[1] >= 1,
        "{}: '{}': .npy shape must be 2-D (rows, cols) with rows, cols ≥ 1, header {}", what, path, shown(h));
  const int64_t rows = dims[0], cols = dims[1];
  check(cols <= kMaxCols, "{}: '{}': column count {} is too large (at most 2^20)", what, path, cols);

  // Bound the row count by the bytes present before multiplying (rows · cols · 4 could overflow).
  const uint64_t data_bytes = size - (hstart + hlen);
  check((uint64_t)rows <= data_bytes / 4 / (uint64_t)cols,
        "{}: '{}': shape ({}, {}) needs more data than the {} bytes after the header", what, path, rows, cols,
        data_bytes);
  const uint64_t need = (uint64_t)rows * (uint64_t)cols * 4;
  check(data_bytes == need, "{}: '{}': data is {} bytes, shape ({}, {}) needs {}", what, path, data_bytes, rows, cols,
        need);

  NpyMatrix m;
  m.rows = rows;
  m.cols = cols;
  m.data.resize((size_t)(rows * cols));
  f.read(reinterpret_cast<char*>(m.data.data()), (std::streamsize)need);
  check((uint64_t)f.gcount() == need, "{}: '{}': read of {} data bytes failed", what, path, need);
  for (size_t i = 0; i < m.data.size(); ++i)
    check(std::isfinite(m.data[i]), "{}: '{}': non-finite value at row {}, column {}", what, path,
          (int64_t)i / cols, (int64_t)i % cols);
  return m;
}

void write_npy_f32(const std::string& path, std::span<const float> data, int64_t rows, int64_t cols,
                   const std::string& what) {
  check(rows >= 1 && cols >= 1 && (uint64_t)data.size() / (uint64_t)cols == (uint64_t)rows &&
            data.size() % (uint64_t)cols == 0,
        "{}: '{}': {} floats do not make a ({}, {}) matrix with rows, cols ≥ 1", what, path, data.size(), rows, cols);
  std::string header = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}", rows, cols);
  constexpr size_t pre = 10;  // magic (6) + version (2) + header length (2)
  const size_t total = (pre + header.size() + 1 + 63) / 64 * 64;
  header.append(total - pre - header.size() - 1, ' ');
  header.push_back('\n');
  const uint16_t hl = (uint16_t)header.size();  // < 200 bytes: two int64 fit easily
  const unsigned char preamble[pre] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hl & 0xff),
                                       (unsigned char)(hl >> 8)};

  std::FILE* f = std::fopen(path.c_str(), "wb");
  check(f != nullptr, "{}: cannot write '{}': {}", what, path, std::strerror(errno));
  bool ok = std::fwrite(preamble, 1, pre, f) == pre && std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
            std::fwrite(data.data(), sizeof(float), data.size(), f) == data.size();
  ok = (std::fclose(f) == 0) && ok;
  check(ok, "{}: short write to '{}'", what, path);
}

}  // namespace ratekv
