// Tests of the 2-D float32 .npy reader/writer (ratekv/io/npy.h): bit-exact round
// trips of awkward shapes, agreement with the bytes NumPy itself writes, and
// hostile files, each of which must end in ratekv::Error naming the path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <unistd.h>
#include <vector>

#include "ratekv/common/error.h"
#include "ratekv/io/npy.h"

namespace fs = std::filesystem;

namespace {

class Npy : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ratekv_test_npy_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write_bytes(const std::string& name, const std::string& bytes) const {
    const std::string p = path(name);
    std::ofstream o(p, std::ios::binary);
    o.write(bytes.data(), (std::streamsize)bytes.size());
    return p;
  }
  static std::string read_bytes(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), {});
  }
  fs::path dir_;
};

std::string le_f32(const std::vector<float>& v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.data(), s.size());
  return s;
}

/// A version-1.0 .npy with the given header dict, padded as NumPy pads it
/// (preamble + header a multiple of 64 bytes, ending in '\n'), then `data`.
std::string npy_v1(std::string dict, const std::string& data) {
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string s("\x93NUMPY\x01\x00", 8);
  s.push_back((char)(dict.size() & 0xff));
  s.push_back((char)(dict.size() >> 8));
  return s + dict + data;
}

std::string dict_for(const std::string& shape, const std::string& descr = "'<f4'",
                     const std::string& order = "False") {
  return "{'descr': " + descr + ", 'fortran_order': " + order + ", 'shape': " + shape + ", }";
}

// The exact 144 bytes NumPy 2.4.6 writes for
// np.save(f, np.array([[1.0, -2.5], [0.1, 65504.0]], dtype='<f4')).
std::string numpy_2x2_bytes() {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }";
  dict.append(118 - 1 - dict.size(), ' ');
  dict += '\n';
  std::string s("\x93NUMPY\x01\x00\x76\x00", 10);  // header length 0x76 = 118
  s += dict;
  const unsigned char data[16] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x20, 0xc0,
                                  0xcd, 0xcc, 0xcc, 0x3d, 0x00, 0xe0, 0x7f, 0x47};
  s.append(reinterpret_cast<const char*>(data), 16);
  return s;
}

/// Runs read_npy_f32 on `p`, expecting ratekv::Error whose message names the
/// path, starts with the `what` prefix and contains `phrase`.
void expect_read_error(const std::string& p, const std::string& phrase) {
  try {
    (void)ratekv::read_npy_f32(p, "--data");
    ADD_FAILURE() << "no error for " << p << " (expected '" << phrase << "')";
  } catch (const ratekv::Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("--data: ", 0), 0u) << m;
    EXPECT_NE(m.find(p), std::string::npos) << m;
    EXPECT_NE(m.find(phrase), std::string::npos) << m;
  }
}

TEST_F(Npy, RoundTripAwkwardShapesBitExact) {
  struct Shape {
    int64_t rows, cols;
  };
  uint32_t state = 12345;
  for (const Shape sh : {Shape{1, 1}, Shape{97, 3}, Shape{5, 64}}) {
    std::vector<float> x((size_t)(sh.rows * sh.cols));
    for (size_t i = 0; i < x.size(); ++i) {
      state = state * 1664525u + 1013904223u;  // LCG: values of every sign and magnitude
      x[i] = (float)((int32_t)state) * 1e-6f * (i % 7 == 3 ? 1e-30f : 1.f);
    }
    x[0] = sh.rows == 1 ? -0.0f : 3.1415927f;
    if (x.size() > 2) x[2] = std::numeric_limits<float>::denorm_min();
    if (x.size() > 5) x[5] = std::numeric_limits<float>::max();
    const std::string p = path("rt_" + std::to_string(sh.rows) + "x" + std::to_string(sh.cols) + ".npy");
    ratekv::write_npy_f32(p, x, sh.rows, sh.cols, "-o");
    const std::string bytes = read_bytes(p);
    ASSERT_GE(bytes.size(), 10u);
    const size_t hlen = (unsigned char)bytes[8] | ((size_t)(unsigned char)bytes[9] << 8);
    EXPECT_EQ((10 + hlen) % 64, 0u) << "header not padded to 64 bytes";
    EXPECT_EQ(bytes[10 + hlen - 1], '\n');
    EXPECT_EQ(bytes.size(), 10 + hlen + 4 * x.size());

    const ratekv::NpyMatrix m = ratekv::read_npy_f32(p, "--data");
    EXPECT_EQ(m.rows, sh.rows);
    EXPECT_EQ(m.cols, sh.cols);
    ASSERT_EQ(m.data.size(), x.size());
    EXPECT_EQ(std::memcmp(m.data.data(), x.data(), x.size() * 4), 0) << sh.rows << "x" << sh.cols;
    EXPECT_TRUE(std::signbit(m.data[0]) == std::signbit(x[0]));
  }
}

TEST_F(Npy, ReadsNumpyWrittenFile) {
  const std::string p = write_bytes("numpy.npy", numpy_2x2_bytes());
  const ratekv::NpyMatrix m = ratekv::read_npy_f32(p, "--data");
  ASSERT_EQ(m.rows, 2);
  ASSERT_EQ(m.cols, 2);
  ASSERT_EQ(m.data.size(), 4u);
  EXPECT_EQ(m.data[0 * 2 + 0], 1.0f);
  EXPECT_EQ(m.data[0 * 2 + 1], -2.5f);
  EXPECT_EQ(m.data[1 * 2 + 0], 0.1f);
  EXPECT_EQ(m.data[1 * 2 + 1], 65504.0f);
}

TEST_F(Npy, WriterMatchesNumpyBytes) {
  const std::vector<float> x = {1.0f, -2.5f, 0.1f, 65504.0f};
  const std::string p = path("ours.npy");
  ratekv::write_npy_f32(p, x, 2, 2, "-o");
  EXPECT_EQ(read_bytes(p), numpy_2x2_bytes());
}

TEST_F(Npy, ReadsVersion2And3Headers) {
  // Same matrix with the 4-byte header length of format 2.0 / 3.0 (as NumPy writes for huge headers).
  const std::vector<float> x = {0.5f, -7.0f, 1e-3f, 2.0f, 3.0f, -0.25f};  // (3, 2)
  for (const char ver : {'\x02', '\x03'}) {
    std::string dict = dict_for("(3, 2)");
    while ((12 + dict.size() + 1) % 64 != 0) dict += ' ';
    dict += '\n';
    std::string s("\x93NUMPY", 6);
    s += ver;
    s += '\0';
    const uint32_t n = (uint32_t)dict.size();
    for (int i = 0; i < 4; ++i) s.push_back((char)((n >> (8 * i)) & 0xff));
    const std::string p = write_bytes(std::string("v") + (char)('0' + ver) + ".npy", s + dict + le_f32(x));
    const ratekv::NpyMatrix m = ratekv::read_npy_f32(p, "--data");
    EXPECT_EQ(m.rows, 3);
    EXPECT_EQ(m.cols, 2);
    EXPECT_EQ(m.data, x);
  }
}

TEST_F(Npy, TruncatedHeader) {
  expect_read_error(write_bytes("t7.npy", std::string("\x93NUMPY\x01", 7)), "truncated .npy header");
  expect_read_error(write_bytes("t11.npy", std::string("\x93NUMPY\x02\x00\x10\x00\x00", 11)), "truncated .npy header");
}

TEST_F(Npy, HeaderLengthPastEndOfFile) {
  const std::string full = npy_v1(dict_for("(2, 2)"), le_f32({1, 2, 3, 4}));
  expect_read_error(write_bytes("cut.npy", full.substr(0, 40)), "header length 118 runs past the file");
}

TEST_F(Npy, DtypeFloat64) {
  expect_read_error(write_bytes("f8.npy", npy_v1(dict_for("(2, 1)", "'<f8'"), le_f32({1, 2, 3, 4}))),
                    "dtype must be '<f4'");
  expect_read_error(write_bytes("be.npy", npy_v1(dict_for("(2, 2)", "'>f4'"), le_f32({1, 2, 3, 4}))),
                    "dtype must be '<f4'");
}

TEST_F(Npy, FortranOrder) {
  expect_read_error(write_bytes("fo.npy", npy_v1(dict_for("(2, 2)", "'<f4'", "True"), le_f32({1, 2, 3, 4}))),
                    "must be C-ordered");
}

TEST_F(Npy, ShapeNotTwoDimensional) {
  // (2, 2, 2) with exactly 8 floats: a parser that reads only the first two numbers would accept (2, 2)
  // and then fail on size, or (had the data been 4 floats) silently read a slice.
  expect_read_error(write_bytes("3d.npy", npy_v1(dict_for("(2, 2, 2)"), le_f32({1, 2, 3, 4, 5, 6, 7, 8}))),
                    "shape must be 2-D");
  expect_read_error(write_bytes("3d4.npy", npy_v1(dict_for("(2, 2, 1)"), le_f32({1, 2, 3, 4}))), "shape must be 2-D");
  expect_read_error(write_bytes("1d.npy", npy_v1(dict_for("(4,)"), le_f32({1, 2, 3, 4}))), "shape must be 2-D");
  expect_read_error(write_bytes("0r.npy", npy_v1(dict_for("(0, 4)"), "")), "shape must be 2-D");
  expect_read_error(write_bytes("neg.npy", npy_v1(dict_for("(-1, 4)"), le_f32({1, 2, 3, 4}))), "shape must be 2-D");
  expect_read_error(write_bytes("wide.npy", npy_v1(dict_for("(1, 2000000)"), le_f32({1}))), "is too large");
}

TEST_F(Npy, HeaderDictMustHaveExactlyTheThreeKeys) {
  const std::string data = le_f32({1, 2, 3, 4});
  const char* kDict = "must be a dict of exactly 'descr', 'fortran_order' and 'shape'";
  // A key inside another value's string: the old key search found 'descr': '<f4' there and read this '<f8'
  // file as float32. NumPy itself rejects the extra key.
  expect_read_error(
      write_bytes("hidden.npy", npy_v1("{'x': \"'descr': '<f4'\", 'descr': '<f8', 'fortran_order': False, "
                                       "'shape': (2, 2), }",
                                       data)),
      kDict);
  expect_read_error(
      write_bytes("extra.npy",
                  npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), 'extra': (1, 2, 3), }", data)),
      kDict);
  expect_read_error(
      write_bytes("twice.npy",
                  npy_v1("{'descr': '<f8', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", data)),
      kDict);
  expect_read_error(write_bytes("noshape.npy", npy_v1("{'descr': '<f4', 'fortran_order': False, }", data)), kDict);
  expect_read_error(write_bytes("nul.npy", npy_v1(std::string("{'descr': '<f4'\0, 'fortran_order': False, "
                                                              "'shape': (2, 2), }",
                                                              60),
                                                  data)),
                    kDict);
  expect_read_error(write_bytes("unclosed.npy", npy_v1("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2)", data)),
                    kDict);
  // A structured dtype (a list value) is parsed as a value and named as a dtype error.
  expect_read_error(write_bytes("struct.npy", npy_v1(dict_for("(2, 2)", "[('a', '<f4')]"), data)),
                    "dtype must be '<f4'");
  // Any key order and double-quoted keys are a valid dict literal: read as written.
  const std::string p = write_bytes(
      "order.npy", npy_v1("{\"shape\": (2, 2), \"fortran_order\": False, 'descr': '<f4'}", data));
  const ratekv::NpyMatrix m = ratekv::read_npy_f32(p, "--data");
  EXPECT_EQ(m.rows, 2);
  EXPECT_EQ(m.cols, 2);
  EXPECT_EQ(m.data, (std::vector<float>{1, 2, 3, 4}));
}

TEST_F(Npy, DataShorterThanShape) {
  expect_read_error(write_bytes("short.npy", npy_v1(dict_for("(2, 2)"), le_f32({1, 2, 3}))),
                    "shape (2, 2) needs more data than the 12 bytes after the header");
  // 2^62 rows: rows · cols · 4 wraps to 0 in 64 bits; must be rejected before any allocation.
  expect_read_error(write_bytes("wrap.npy", npy_v1(dict_for("(4611686018427387904, 1)"), "")),
                    "needs more data than the 0 bytes");
}

TEST_F(Npy, DataLongerThanShape) {
  expect_read_error(write_bytes("long.npy", npy_v1(dict_for("(2, 2)"), le_f32({1, 2, 3, 4, 5}))),
                    "data is 20 bytes, shape (2, 2) needs 16");
}

TEST_F(Npy, NonFiniteValueNamesRowAndColumn) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  expect_read_error(write_bytes("nan.npy", npy_v1(dict_for("(3, 2)"), le_f32({1, 2, 3, 4, nan, 6}))),
                    "non-finite value at row 2, column 0");
  expect_read_error(write_bytes("inf.npy", npy_v1(dict_for("(3, 2)"), le_f32({1, 2, 3, -inf, 5, 6}))),
                    "non-finite value at row 1, column 1");
}

TEST_F(Npy, DirectoryMissingAndNotNpy) {
  const std::string d = path("dir.npy");
  fs::create_directories(d);
  expect_read_error(d, "is not a regular file");
  expect_read_error(path("absent.npy"), "does not exist");
  expect_read_error(write_bytes("raw.f32", le_f32({1, 2, 3, 4})), "not a .npy file");
  std::string v4 = npy_v1(dict_for("(2, 2)"), le_f32({1, 2, 3, 4}));
  v4[6] = '\x04';
  expect_read_error(write_bytes("v4.npy", v4), "unsupported .npy version 4");
}

TEST_F(Npy, WriterRejectsBadShapeAndUnwritablePath) {
  const std::vector<float> x = {1, 2, 3, 4, 5, 6};
  EXPECT_THROW(ratekv::write_npy_f32(path("bad.npy"), x, 4, 2, "-o"), ratekv::Error);
  EXPECT_THROW(ratekv::write_npy_f32(path("bad.npy"), x, 0, 6, "-o"), ratekv::Error);
  const std::string p = path("no_such_dir/out.npy");
  try {
    ratekv::write_npy_f32(p, x, 3, 2, "-o");
    ADD_FAILURE() << "no error writing " << p;
  } catch (const ratekv::Error& e) {
    EXPECT_NE(std::string(e.what()).find("-o: cannot write '" + p + "'"), std::string::npos) << e.what();
  }
}

}  // namespace
