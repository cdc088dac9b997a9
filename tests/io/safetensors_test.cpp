// safetensors writer/reader: exact on-disk bytes, round trips of every dtype
// and awkward shapes, and the hostile-header rejection paths (message checked).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ratekv/common/error.h"
#include "ratekv/io/safetensors.h"

using namespace ratekv;
using ::testing::HasSubstr;

namespace {

// File image from a literal header and data bytes; `len` overrides the length field.
std::vector<uint8_t> image(const std::string& header, const std::vector<uint8_t>& data = {}, int64_t len = -1) {
  std::vector<uint8_t> b;
  const uint64_t n = len < 0 ? header.size() : (uint64_t)len;
  for (int i = 0; i < 8; ++i) b.push_back((uint8_t)(n >> (8 * i)));
  b.insert(b.end(), header.begin(), header.end());
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

std::string parse_error(const std::vector<uint8_t>& b) {
  try {
    SafetensorsFile::parse(b, "bad.safetensors");
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected ratekv::Error";
  return "";
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(Safetensors, ExactBytesOfASmallFile) {
  SafetensorsWriter w;
  const float v[2] = {1.0f, -2.0f};
  w.add_f32("a", {2}, v);
  const std::vector<uint8_t> got = w.serialize();
  // 56-byte header (54 chars + 2 spaces of padding), then 8 data bytes.
  const std::string hdr = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_EQ(hdr.size(), 54u);
  std::vector<uint8_t> want = image(hdr + "  ", {0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x00, 0xC0});
  EXPECT_EQ(got, want);
  EXPECT_EQ(got[0], 56);
}

TEST(Safetensors, RoundTripAllDtypesAndShapes) {
  std::vector<float> f(97);
  for (int i = 0; i < 97; ++i) f[i] = 0.25f * (float)i - 7.0f;
  const std::vector<uint16_t> h = {0x3C00, 0xC000, 0x7BFF};  // 1, -2, 65504
  std::vector<int32_t> i32 = {-2147483647 - 1, 0, 7, 2147483647, -5, 11};
  std::vector<int64_t> i64 = {-(1ll << 62), 1ll << 40, 3};
  std::vector<uint8_t> u8 = {0, 255, 17, 3, 9};
  nlohmann::json doc = {{"layers", 30}, {"bits", {1.5, 2.0, 4.0}}, {"name", "plan"}};

  SafetensorsWriter w;
  w.add_f32("calib.scale", {97}, f);
  w.add_f16("half", {3}, h);
  w.add_i32("codes.l0", {2, 3}, i32);
  w.add_i64("big", {3, 1, 1}, i64);
  w.add_u8("bytes", {5}, u8);
  const float scalar = 3.5f;
  w.add_f32("scalar", {}, {&scalar, 1});
  w.add_f32("empty", {0, 4}, {});
  w.set_metadata("ratekv.plan", doc.dump());
  w.set_metadata("format", "ratekv");
  const std::string path = ::testing::TempDir() + "ratekv_st_roundtrip.safetensors";
  w.write(path);
  SafetensorsFile r = SafetensorsFile::open(path);
  std::remove(path.c_str());

  EXPECT_EQ(r.tensors().size(), 7u);
  EXPECT_EQ(r.read_f32("calib.scale"), f);
  EXPECT_EQ(r.read_f32("half"), (std::vector<float>{1.0f, -2.0f, 65504.0f}));
  EXPECT_EQ(r.read_i32("codes.l0"), i32);
  EXPECT_EQ(r.tensor("codes.l0").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(r.read_i64("big"), i64);
  EXPECT_EQ(r.read_u8("bytes"), u8);
  EXPECT_EQ(r.read_f32("scalar"), std::vector<float>{3.5f});
  EXPECT_TRUE(r.tensor("scalar").shape.empty());
  EXPECT_EQ(r.tensor("scalar").n_elements(), 1);
  EXPECT_TRUE(r.read_f32("empty").empty());
  EXPECT_EQ(r.tensor("empty").shape, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(nlohmann::json::parse(r.metadata_value("ratekv.plan")), doc);
  EXPECT_EQ(r.metadata_value("format"), "ratekv");
  EXPECT_EQ(r.metadata().size(), 2u);
  EXPECT_EQ(&r.expect("big", StDtype::I64, {3, 1, 1}), r.find("big"));
  EXPECT_EQ(r.find("nope"), nullptr);
  // Tensors come back in data order (= insertion order for our writer).
  EXPECT_EQ(r.tensors()[0].name, "calib.scale");
  EXPECT_EQ(r.tensors()[1].name, "half");

  const std::string p = r.path();
  EXPECT_THAT(error_of([&] { r.read_i32("calib.scale"); }), HasSubstr(p + ": tensor 'calib.scale' has dtype F32, "
                                                                         "expected I32"));
  EXPECT_THAT(error_of([&] { r.read_f32("bytes"); }), HasSubstr("has dtype U8, expected F32/F16/BF16"));
  EXPECT_THAT(error_of([&] { r.expect("big", StDtype::I64, {3}); }), HasSubstr("tensor 'big' is I64 [3, 1, 1], "
                                                                              "expected I64 [3]"));
  EXPECT_THAT(error_of([&] { r.tensor("nope"); }), HasSubstr("tensor 'nope' not found"));
  EXPECT_THAT(error_of([&] { r.metadata_value("nope"); }), HasSubstr("metadata key 'nope' is missing"));
}

TEST(Safetensors, WriterErrors) {
  SafetensorsWriter w;
  const float v[3] = {1, 2, 3};
  w.add_f32("x", {3}, v);
  EXPECT_THAT(error_of([&] { w.add_f32("x", {3}, v); }), HasSubstr("duplicate tensor name 'x'"));
  EXPECT_THAT(error_of([&] { w.add_f32("y", {2, 2}, v); }), HasSubstr("tensor 'y': 12 bytes given, expected 16"));
  EXPECT_THAT(error_of([&] { w.add_f32("__metadata__", {3}, v); }), HasSubstr("'__metadata__' is reserved"));
  EXPECT_THAT(error_of([&] { w.add_f32("neg", {-3}, v); }), HasSubstr("negative dimension"));
  w.set_metadata("k", std::string("\xff\xfe", 2));
  EXPECT_THAT(error_of([&] { w.serialize(); }), HasSubstr("not valid UTF-8"));
  EXPECT_THAT(error_of([&] { w.write("/nonexistent-dir/x.safetensors"); }), HasSubstr("not valid UTF-8"));
  SafetensorsWriter ok;
  EXPECT_THAT(error_of([&] { ok.write("/nonexistent-dir/x.safetensors"); }),
              HasSubstr("/nonexistent-dir/x.safetensors.tmp"));
}

TEST(SafetensorsHostile, Header) {
  EXPECT_THAT(parse_error({1, 2, 3}), HasSubstr("bad.safetensors: truncated safetensors file: 3 bytes"));
  EXPECT_THAT(parse_error(image("{}", {}, 1ll << 40)),
              HasSubstr("header length 1099511627776 exceeds the 2 bytes after the length field"));
  EXPECT_THAT(parse_error(image("{\"a\":")), HasSubstr("safetensors header is not valid JSON"));
  EXPECT_THAT(parse_error(image("[1,2]")), HasSubstr("must be a JSON object, got array"));
  EXPECT_THAT(parse_error(image("{")), HasSubstr("header length 1 is too short"));
  EXPECT_TRUE(SafetensorsFile::parse(image("{}  "), "empty.safetensors").tensors().empty());  // no tensors is fine
}

TEST(SafetensorsHostile, Entries) {
  const std::vector<uint8_t> d16(16, 7);
  auto err = [&](const std::string& h) { return parse_error(image(h, d16)); };
  const std::string ok_entry = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";
  EXPECT_THAT(err(R"({"a":{)" + ok_entry + R"(},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})"),
              HasSubstr("bad.safetensors: duplicate tensor name 'a'"));
  EXPECT_THAT(err(R"({"a":{"dtype":"F8","shape":[2],"data_offsets":[0,2]}})"),
              HasSubstr("tensor 'a': unsupported dtype 'F8'"));
  EXPECT_THAT(err(R"({"a":{"shape":[2],"data_offsets":[0,8]}})"), HasSubstr("tensor 'a': missing string field "
                                                                            "'dtype'"));
  EXPECT_THAT(err(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})"),
              HasSubstr("tensor 'a': shape entries must be non-negative integers, got -2"));
  EXPECT_THAT(err(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})"),
              HasSubstr("shape entries must be non-negative integers"));
  EXPECT_THAT(err(R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})"),
              HasSubstr("tensor 'a': byte size of shape [4611686018427387904, 4] overflows"));
  EXPECT_THAT(err(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,24]}})"),
              HasSubstr("tensor 'a': data_offsets [8, 24] past the end of the 16-byte data buffer"));
  EXPECT_THAT(err(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})"), HasSubstr("begin > end"));
  EXPECT_THAT(err(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})"),
              HasSubstr("tensor 'a': F32 x shape [2] is 8 bytes, but data_offsets [0, 4] span 4 bytes"));
  EXPECT_THAT(err(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})"),
              HasSubstr("'data_offsets' must be an array [begin, end]"));
  EXPECT_THAT(err(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})"),
              HasSubstr("data_offsets must be non-negative integers"));
  EXPECT_THAT(err(R"({"a":{)" + ok_entry + R"(},"b":{"dtype":"I32","shape":[2],"data_offsets":[4,12]}})"),
              HasSubstr("tensors 'a' (bytes [0, 8)) and 'b' (bytes [4, 12)) overlap"));
  EXPECT_THAT(err(R"({"a":{)" + ok_entry + R"(,"extra":1}})"), HasSubstr("tensor 'a': unexpected header field "
                                                                         "'extra'"));
  EXPECT_THAT(err(R"({"a":3})"), HasSubstr("tensor 'a': header entry must be an object, got number"));
  EXPECT_THAT(err(R"({"__metadata__":{"k":1}})"), HasSubstr("'__metadata__' key 'k': value must be a string"));
  EXPECT_THAT(err(R"({"__metadata__":[]})"), HasSubstr("'__metadata__' must be an object of strings"));
  // A valid header with two adjacent tensors and metadata parses.
  SafetensorsFile f = SafetensorsFile::parse(
      image(R"({"__metadata__":{"k":"v"},"a":{)" + ok_entry + R"(},"b":{"dtype":"U8","shape":[8],"data_offsets":[8,16]}})",
            d16),
      "ok.safetensors");
  EXPECT_EQ(f.read_u8("b"), std::vector<uint8_t>(8, 7));
  EXPECT_EQ(f.metadata_value("k"), "v");
}

// A directory given where a safetensors file is expected (e.g. a plan's
// "tensors": ".") opened as a stream, reported a huge size and ended in
// "error: out of memory"; now it is an Error naming the path.
TEST(SafetensorsHostile, DirectoryIsAnErrorNamingThePath) {
  const std::string dir = testing::TempDir();
  try {
    SafetensorsFile::open(dir);
    FAIL() << "opening a directory succeeded";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(dir));
    EXPECT_THAT(e.what(), HasSubstr("is a directory"));
  }
}
