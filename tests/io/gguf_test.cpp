// GGUF reader: metadata of every type, v2/v3, alignment, tensor layout, and
// every rejection path of hostile files (message checked).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <functional>

#include "gguf_test_writer.h"
#include "ratekv/common/error.h"
#include "ratekv/io/gguf.h"

using namespace ratekv;
using namespace ratekv::testing;
using ::testing::HasSubstr;

namespace {

GgufFile parse(const Bytes& b, const std::string& name = "t.gguf") {
  return GgufFile::parse({b.data(), b.size()}, name);
}

// Returns the Error message of parsing `b` (fails the test if it parses).
std::string parse_error(const Bytes& b, const std::string& name = "bad.gguf") {
  try {
    parse(b, name);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected ratekv::Error";
  return "";
}

GgufBuilder all_types_builder(uint32_t version) {
  GgufBuilder g;
  g.version = version;
  g.kv("k.u8", v_u8(200))
      .kv("k.i8", v_i8(-7))
      .kv("k.u16", v_u16(65535))
      .kv("k.i16", v_i16(-32768))
      .kv("k.u32", v_u32(4000000000u))
      .kv("k.i32", v_i32(-123456))
      .kv("k.f32", v_f32(0.375f))
      .kv("k.bool", v_bool(true))
      .kv("k.str", v_str(std::string("caf\xc3\xa9 \xff\xfe raw", 12)))  // non-UTF8 bytes allowed
      .kv("k.u64", v_u64(18446744073709551615ull))
      .kv("k.i64", v_i64(-9000000000000000000ll))
      .kv("k.f64", v_f64(-2.5e300))
      .kv("k.arr_i32", v_arr(5, {v_i32(3), v_i32(-1), v_i32(7)}))
      .kv("k.arr_f32", v_arr(6, {v_f32(1.5f), v_f32(-0.25f)}))
      .kv("k.arr_str", v_arr(8, {v_str("a"), v_str(""), v_str("xyz")}))
      .kv("k.arr_empty", v_arr(4, {}))
      .kv("k.nested", v_arr(9, {v_arr(0, {v_u8(1), v_u8(2)}), v_arr(0, {})}))
      .kv("k.arr_bool", v_arr(7, {v_bool(false), v_bool(true)}));
  return g;
}

void check_all_types(const GgufFile& f) {
  EXPECT_EQ(f.metadata().size(), 18u);
  EXPECT_EQ(f.get_int("k.u8"), 200);
  EXPECT_EQ(f.get_int("k.i8"), -7);
  EXPECT_EQ(f.get_int("k.u16"), 65535);
  EXPECT_EQ(f.get_int("k.i16"), -32768);
  EXPECT_EQ(f.get_int("k.u32"), 4000000000ll);
  EXPECT_EQ(f.get_int("k.i32"), -123456);
  EXPECT_EQ(f.get_float("k.f32"), 0.375);
  EXPECT_TRUE(f.get_bool("k.bool"));
  EXPECT_EQ(f.get_string("k.str"), std::string("caf\xc3\xa9 \xff\xfe raw", 12));
  EXPECT_EQ(std::get<uint64_t>(f.metadata().at("k.u64").v), 18446744073709551615ull);
  EXPECT_EQ(f.metadata().at("k.u64").type, GgufValueType::U64);
  EXPECT_EQ(f.get_int("k.i64"), -9000000000000000000ll);
  EXPECT_EQ(f.get_float("k.f64"), -2.5e300);
  EXPECT_EQ(f.get_float("k.i32"), -123456.0);  // integers convert to float
  EXPECT_EQ(f.get_int_array("k.arr_i32"), (std::vector<int64_t>{3, -1, 7}));
  EXPECT_EQ(f.get_float_array("k.arr_f32"), (std::vector<double>{1.5, -0.25}));
  EXPECT_EQ(f.get_float_array("k.arr_i32"), (std::vector<double>{3, -1, 7}));
  EXPECT_EQ(f.get_string_array("k.arr_str"), (std::vector<std::string>{"a", "", "xyz"}));
  EXPECT_TRUE(f.get_int_array("k.arr_empty").empty());
  const GgufValue& nested = f.metadata().at("k.nested");
  ASSERT_EQ(nested.type, GgufValueType::ARRAY);
  EXPECT_EQ(nested.elem_type, GgufValueType::ARRAY);
  const auto& outer = *std::get<std::shared_ptr<GgufArray>>(nested.v);
  ASSERT_EQ(outer.size(), 2u);
  EXPECT_EQ(outer[0].elem_type, GgufValueType::U8);
  const auto& inner = *std::get<std::shared_ptr<GgufArray>>(outer[0].v);
  ASSERT_EQ(inner.size(), 2u);
  EXPECT_EQ(std::get<uint64_t>(inner[1].v), 2u);
  EXPECT_TRUE(std::get<std::shared_ptr<GgufArray>>(outer[1].v)->empty());
  const auto& bools = *std::get<std::shared_ptr<GgufArray>>(f.metadata().at("k.arr_bool").v);
  EXPECT_FALSE(std::get<bool>(bools[0].v));
  EXPECT_TRUE(std::get<bool>(bools[1].v));
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_TRUE(f.tensors().empty());
}

}  // namespace

TEST(Gguf, AllMetadataTypesV3) {
  const Bytes b = all_types_builder(3).build();
  GgufFile f = parse(b);
  EXPECT_EQ(f.version(), 3u);
  check_all_types(f);
}

TEST(Gguf, AllMetadataTypesV2) {
  const Bytes b = all_types_builder(2).build();
  GgufFile f = parse(b);
  EXPECT_EQ(f.version(), 2u);
  check_all_types(f);
}

TEST(Gguf, GetterErrorsAndDefaults) {
  const Bytes b = all_types_builder(3).build();
  GgufFile f = parse(b, "meta.gguf");
  EXPECT_EQ(f.get_int("absent", 42), 42);
  EXPECT_EQ(f.get_float("absent", 1.5), 1.5);
  EXPECT_EQ(f.get_string("absent", "dflt"), "dflt");
  EXPECT_FALSE(f.has("absent"));
  auto msg = [](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(msg([&] { f.get_int("absent"); }), HasSubstr("meta.gguf: metadata key 'absent' is missing"));
  EXPECT_THAT(msg([&] { f.get_int("k.str"); }), HasSubstr("'k.str' has type STRING, expected an integer"));
  EXPECT_THAT(msg([&] { f.get_int("k.u64"); }), HasSubstr("does not fit int64"));
  EXPECT_THAT(msg([&] { f.get_string("k.u8"); }), HasSubstr("'k.u8' has type U8, expected STRING"));
  EXPECT_THAT(msg([&] { f.get_bool("k.u8"); }), HasSubstr("expected BOOL"));
  EXPECT_THAT(msg([&] { f.get_float("k.str"); }), HasSubstr("expected a number"));
  EXPECT_THAT(msg([&] { f.get_string_array("k.arr_i32"); }), HasSubstr("ARRAY of I32, expected ARRAY of STRING"));
  EXPECT_THAT(msg([&] { f.get_int_array("k.arr_f32"); }), HasSubstr("expected ARRAY of integers"));
  EXPECT_THAT(msg([&] { f.get_float_array("k.arr_str"); }), HasSubstr("expected ARRAY of numbers"));
  EXPECT_THAT(msg([&] { f.get_int("absent", 0); f.get_int("k.f32", 0); }), HasSubstr("expected an integer"));
}

TEST(Gguf, TensorsAlignedAndReadable) {
  GgufBuilder g;
  g.alignment = 64;
  g.kv("general.alignment", v_u32(64)).kv("general.architecture", v_str("llama"));
  // 3 x 5 F32 (ne = {5, 3}), a 1-element tensor, and a 97-element F16 vector.
  std::vector<float> a(15);
  for (int i = 0; i < 15; ++i) a[i] = 0.5f * (float)i - 3.0f;
  g.tensor({"a", {5, 3}, 0, f32_bytes(a)});
  g.tensor({"one", {1}, 0, f32_bytes({-7.25f})});
  Bytes h;
  for (int i = 0; i < 97; ++i) put<uint16_t>(h, (uint16_t)(0x3C00 + i));  // 1 + i/1024
  g.tensor({"h", {97}, 1, h});
  const Bytes b = g.build();
  GgufFile f = parse(b);
  EXPECT_EQ(f.alignment(), 64u);
  ASSERT_EQ(f.tensors().size(), 3u);
  const GgufTensor& ta = f.tensor("a");
  EXPECT_EQ(ta.ne, (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(ta.n_elements(), 15);
  EXPECT_EQ(ta.n_rows(), 3);
  EXPECT_EQ(ta.row_bytes(), 20u);
  EXPECT_EQ(ta.nbytes, 60u);
  EXPECT_EQ(ta.offset, 0u);
  EXPECT_EQ((size_t)(ta.data - b.data()) % 64, 0u);
  EXPECT_EQ(f.dequantize(ta), a);
  const GgufTensor& one = f.tensor("one");
  EXPECT_EQ(one.offset, 64u);
  EXPECT_EQ(f.dequantize(one), std::vector<float>{-7.25f});
  const GgufTensor& th = f.tensor("h");
  EXPECT_EQ(th.offset, 128u);
  EXPECT_EQ(th.type, GgmlType::F16);
  std::vector<float> hv = f.dequantize(th);
  ASSERT_EQ(hv.size(), 97u);
  EXPECT_EQ(hv[0], 1.0f);
  EXPECT_EQ(hv[96], 1.0f + 96.0f / 1024.0f);
  float row[5];
  dequantize_rows(ta, 2, 1, row);
  EXPECT_EQ(row[0], a[10]);
  EXPECT_EQ(row[4], a[14]);
  EXPECT_EQ(f.find_tensor("nope"), nullptr);
  try {
    f.tensor("nope");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("t.gguf: tensor 'nope' not found"));
  }
  try {
    dequantize_rows(ta, 2, 2, row);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("tensor 'a': rows [2, 4) out of range (tensor has 3 rows)"));
  }
}

TEST(Gguf, OpenFromDiskMapsFile) {
  GgufBuilder g;
  g.kv("general.name", v_str("disk"));
  g.tensor({"w", {3}, 0, f32_bytes({1.f, 2.f, 3.f})});
  const Bytes b = g.build();
  const std::string path = ::testing::TempDir() + "ratekv_gguf_open_test.gguf";
  {
    std::ofstream o(path, std::ios::binary);
    o.write(reinterpret_cast<const char*>(b.data()), (std::streamsize)b.size());
  }
  {
    GgufFile f = GgufFile::open(path);
    EXPECT_EQ(f.path(), path);
    EXPECT_EQ(f.get_string("general.name"), "disk");
    GgufFile moved = std::move(f);
    EXPECT_EQ(moved.dequantize(moved.tensor("w")), (std::vector<float>{1.f, 2.f, 3.f}));
  }
  std::remove(path.c_str());
  try {
    GgufFile::open(path);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot open GGUF file"));
    EXPECT_THAT(e.what(), HasSubstr(path));
  }
  { std::ofstream o(path, std::ios::binary); }
  try {
    GgufFile::open(path);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("file is empty"));
  }
  std::remove(path.c_str());
}

// ---- hostile files -----------------------------------------------------------------

TEST(GgufHostile, EveryTruncationIsAnError) {
  GgufBuilder g = all_types_builder(3);
  g.tensor({"w", {32}, 2, Bytes(18, 0x11)});  // one Q4_0 block
  const Bytes full = g.build();
  ASSERT_NO_THROW(parse(full));
  for (size_t n = 0; n < full.size(); ++n) {
    Bytes cut(full.begin(), full.begin() + (long)n);
    const std::string m = parse_error(cut, "cut.gguf");
    EXPECT_THAT(m, HasSubstr("cut.gguf: ")) << "prefix " << n;
  }
  // A few cut points with their specific messages.
  EXPECT_THAT(parse_error(Bytes(full.begin(), full.begin() + 2)), HasSubstr("truncated file: magic"));
  EXPECT_THAT(parse_error(Bytes(full.begin(), full.begin() + 10)), HasSubstr("header field 'tensor_count'"));
  EXPECT_THAT(parse_error(Bytes(full.begin(), full.end() - 1)), HasSubstr("tensor 'w': data extends past end"));
}

TEST(GgufHostile, HeaderErrors) {
  Bytes b = GgufBuilder().build();
  b[0] = 'X';
  EXPECT_THAT(parse_error(b), HasSubstr("bad.gguf: not a GGUF file"));
  GgufBuilder g;
  g.version = 1;
  EXPECT_THAT(parse_error(g.build()), HasSubstr("GGUF version 1 is not supported (expected version 2 or 3)"));
  g.version = 4;
  EXPECT_THAT(parse_error(g.build()), HasSubstr("unsupported GGUF version 4 (expected 2 or 3)"));
  g.version = 0x03000000u;
  EXPECT_THAT(parse_error(g.build()), HasSubstr("byte-swapped"));
  GgufBuilder k;
  k.n_kv_override = 1ull << 60;
  EXPECT_THAT(parse_error(k.build()), HasSubstr("header field 'kv_count' = 1152921504606846976 cannot fit"));
  GgufBuilder t;
  t.n_tensors_override = ~0ull;
  EXPECT_THAT(parse_error(t.build()), HasSubstr("header field 'tensor_count' = 18446744073709551615 cannot fit"));
}

TEST(GgufHostile, MetadataErrors) {
  {  // string length past the end, checked before allocating
    GgufBuilder g;
    Val s{8, {}};
    put<uint64_t>(s.bytes, 1ull << 62);
    s.bytes.push_back('x');
    g.kv("big.str", s);
    EXPECT_THAT(parse_error(g.build()), HasSubstr("metadata key 'big.str' value of type STRING: string length "
                                                  "4611686018427387904"));
  }
  {  // key length past the end
    Bytes b = GgufBuilder().build();
    b[16] = 1;  // kv_count = 1
    put<uint64_t>(b, 1000);
    b.resize(b.size() + 20, 'k');
    EXPECT_THAT(parse_error(b), HasSubstr("metadata pair #0 key: string length 1000"));
  }
  {  // array count that cannot fit
    GgufBuilder g;
    g.kv("big.arr", v_arr(10, {v_u64(1)}, 1ull << 61));
    EXPECT_THAT(parse_error(g.build()), HasSubstr("metadata key 'big.arr': array of 2305843009213693952 U64 "
                                                  "elements needs at least"));
  }
  {  // string array whose count fits the bytes only as 1-byte elements
    GgufBuilder g;
    g.kv("s.arr", v_arr(8, {}, 20)).kv("pad", v_str(std::string(100, 'p')));
    EXPECT_THAT(parse_error(g.build()), HasSubstr("'s.arr'"));
  }
  {  // nesting deeper than 8
    Val v = v_arr(0, {v_u8(1)});
    for (int i = 0; i < 9; ++i) v = v_arr(9, {v});
    GgufBuilder g;
    g.kv("deep", v);
    EXPECT_THAT(parse_error(g.build()), HasSubstr("metadata key 'deep': arrays nested deeper than 8 levels"));
    Val ok = v_arr(0, {v_u8(1)});
    for (int i = 0; i < 7; ++i) ok = v_arr(9, {ok});
    GgufBuilder g2;
    g2.kv("deep", ok);
    EXPECT_NO_THROW(parse(g2.build()));
  }
  {
    GgufBuilder g;
    g.kv("weird", Val{13, {0, 0, 0, 0}});
    EXPECT_THAT(parse_error(g.build()), HasSubstr("metadata key 'weird': unknown value type 13 (expected 0..12)"));
  }
  {
    GgufBuilder g;
    g.kv("weird.arr", v_arr(77, {}));
    EXPECT_THAT(parse_error(g.build()), HasSubstr("'weird.arr': unknown array element type 77"));
  }
  {
    GgufBuilder g;
    g.kv("b", Val{7, {2}});
    EXPECT_THAT(parse_error(g.build()), HasSubstr("metadata key 'b': BOOL byte is 2"));
  }
  {
    GgufBuilder g;
    g.kv("dup", v_u8(1)).kv("other", v_u8(2)).kv("dup", v_u8(3));
    EXPECT_THAT(parse_error(g.build()), HasSubstr("bad.gguf: duplicate metadata key 'dup'"));
  }
}

TEST(GgufHostile, AlignmentErrors) {
  for (uint32_t a : {0u, 3u, 48u}) {
    GgufBuilder g;
    g.kv("general.alignment", v_u32(a));
    EXPECT_THAT(parse_error(g.build()), HasSubstr("'general.alignment' = " + std::to_string(a) +
                                                  " is not a nonzero power of two"));
  }
  GgufBuilder n;
  n.kv("general.alignment", v_i32(-8));
  EXPECT_THAT(parse_error(n.build()), HasSubstr("'general.alignment' = -8 is not a nonzero power of two"));
  GgufBuilder s;
  s.kv("general.alignment", v_str("32"));
  EXPECT_THAT(parse_error(s.build()), HasSubstr("'general.alignment' has type STRING, expected an integer"));
  GgufBuilder huge;  // 2^63: the padded data section starts far past the end
  huge.kv("general.alignment", v_u64(1ull << 63));
  huge.tensor({"w", {1}, 0, f32_bytes({1.f}), 0});
  huge.alignment = 8;  // the builder's own padding; the reader must reject before using the data
  EXPECT_THAT(parse_error(huge.build()), HasSubstr("tensor data section starts at offset 9223372036854775808 (after "
                                                   "padding to general.alignment = 9223372036854775808)"));
  GgufBuilder mis;  // tensor offset not a multiple of the alignment
  mis.tensor({"a", {4}, 0, f32_bytes({1, 2, 3, 4})});
  mis.tensor({"b", {1}, 0, f32_bytes({5}), 16});
  EXPECT_THAT(parse_error(mis.build()),
              HasSubstr("tensor 'b': data offset 16 is not a multiple of general.alignment = 32"));
}

TEST(GgufHostile, TensorInfoErrors) {
  auto one = [](TensorSpec t) {
    GgufBuilder g;
    g.tensor(std::move(t));
    return parse_error(g.build());
  };
  EXPECT_THAT(one({"w", {1, 1, 1, 1, 1}, 0, f32_bytes({1})}), HasSubstr("tensor 'w': n_dims = 5, expected at most 4"));
  TensorSpec absurd{"w", {}, 0, {}};
  absurd.n_dims = 0xFFFFFFFFu;
  EXPECT_THAT(one(absurd), HasSubstr("n_dims = 4294967295"));
  EXPECT_THAT(one({"w", {1ull << 40, 1ull << 40}, 0, {}}), HasSubstr("tensor 'w': element count of shape "
                                                                     "[1099511627776, 1099511627776] overflows"));
  EXPECT_THAT(one({"w", {1ull << 62}, 0, {}}), HasSubstr("tensor 'w': byte size of shape [4611686018427387904] (F32) "
                                                         "overflows"));
  EXPECT_THAT(one({"w", {~0ull}, 0, {}}), HasSubstr("ne[0] = 18446744073709551615 does not fit int64"));
  EXPECT_THAT(one({"w", {4}, 19, Bytes(16)}), HasSubstr("tensor 'w': unknown ggml type 19"));
  EXPECT_THAT(one({"w", {48}, 2, Bytes(27)}), HasSubstr("tensor 'w': ne[0] = 48 is not a multiple of the Q4_0 "
                                                        "block size 32"));
  EXPECT_THAT(one({"w", {1ull << 40}, 0, f32_bytes({1})}), HasSubstr("tensor 'w': data extends past end of file"));
  GgufBuilder dup;
  dup.tensor({"w", {1}, 0, f32_bytes({1})}).tensor({"w", {1}, 0, f32_bytes({2})});
  EXPECT_THAT(parse_error(dup.build()), HasSubstr("bad.gguf: duplicate tensor name 'w'"));
  GgufBuilder ov;
  ov.tensor({"a", {16}, 0, Bytes(64, 1)}).tensor({"b", {8}, 0, Bytes(32, 2), 32});
  EXPECT_THAT(parse_error(ov.build()), HasSubstr("tensors 'a' (offset 0, 64 bytes) and 'b' (offset 32, 32 bytes) "
                                                 "overlap"));
  GgufBuilder far;  // data section itself past the end: a tensor info with no data at all
  far.tensor({"w", {0}, 0, {}});
  Bytes b = far.build();
  b.resize(b.size() - 1);  // the builder padded to the alignment; cut one padding byte
  EXPECT_THAT(parse_error(b), HasSubstr("tensor data section starts at offset"));
}

TEST(GgufHostile, UnsupportedTypeParsesButDoesNotDequantize) {
  GgufBuilder g;
  g.tensor({"q2", {256}, 10, Bytes(84, 3)});  // Q2_K: sized, not decoded
  const Bytes b = g.build();
  GgufFile f = parse(b);
  EXPECT_EQ(f.tensor("q2").nbytes, 84u);
  try {
    f.dequantize(f.tensor("q2"));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("t.gguf: tensor 'q2': cannot dequantize ggml type Q2_K"));
  }
}
