// The plan format: round trip, effective bits, and bad input (ratekv/format/plan.h).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "ratekv/common/error.h"
#include "ratekv/format/plan.h"

using namespace ratekv;
using nlohmann::json;

namespace {

std::string tmp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("ratekv_test_alloc_" + name)).string();
}

// A 2-layer, 2-head, head_dim 8 plan using every kind where the shape allows.
Plan small_plan() {
  Plan p;
  p.method = "test";
  p.model = {{"llama", 2, 2, 64, "interleaved"}, "m.gguf", "abc"};
  p.stats_file = "s.json";
  p.seed = 5;
  p.budget_k = 3.25;
  p.budget_v = 3.25;
  p.layers.assign(2, std::vector<HeadPlan>(2));
  Codec g;
  g.kind = CodecKind::TqMseGrouped;
  g.norm = NormStorage::FP16;
  std::vector<int> a, b, c;
  for (int i = 0; i < 32; ++i) (i < 8 ? a : i < 30 ? b : c).push_back(i);
  g.groups = {{4, a, {}, 11}, {3, b, {}, 12}, {0, c, {}, 0}};
  p.layers[0][0] = {g, Codec::tq_mse(3, 64, 7)};
  Codec kivi;
  kivi.kind = CodecKind::Kivi;
  kivi.group_size = 32;
  kivi.groups = {{2, {}, {}, 0}};
  for (int i = 0; i < 64; ++i) kivi.groups[0].channels.push_back(63 - i);
  Codec quarot = kivi;
  quarot.kind = CodecKind::QuaRot;
  quarot.groups[0].seed = 99;
  Codec q8 = kivi;
  q8.kind = CodecKind::Q8_0;
  q8.groups[0].bits = 8;
  Codec q4 = q8;
  q4.kind = CodecKind::Q4_0;
  q4.groups[0].bits = 4;
  p.layers[0][1] = {kivi, quarot};
  p.layers[1][0] = {q8, q4};
  p.layers[1][1] = {Codec::fp16(), Codec::tq_mse(1, 64, 0)};
  return p;
}

void write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

// Expects Plan::from_json to fail with exactly `msg` after `edit`.
void expect_error(const std::function<void(json&)>& edit, const std::string& msg) {
  json j = small_plan().to_json();
  j.erase("achieved");
  edit(j);
  try {
    Plan::from_json(j, "plan.json");
    ADD_FAILURE() << "no error, expected: " << msg;
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), msg);
  }
}

}  // namespace

TEST(Plan, EffectiveBitsPerKind) {
  const Plan p = small_plan();
  // grouped: code bits (4·16 + 3·44 + 0·4) / 64; stored: the 44-channel group pads to three
  // 16-channel tiles (48 · 3 bits), + 2 norms · 16.
  EXPECT_DOUBLE_EQ(p.layers[0][0].key.code_bits(64), (64.0 + 132.0) / 64);
  EXPECT_DOUBLE_EQ(p.layers[0][0].key.effective_bits(64), (64.0 + 144.0 + 32.0) / 64);
  EXPECT_DOUBLE_EQ(p.layers[0][0].value.effective_bits(64), 3.25);
  EXPECT_DOUBLE_EQ(p.layers[0][1].key.effective_bits(64), 2.0 + 1.0);  // kivi: scale + zero per 32
  EXPECT_DOUBLE_EQ(p.layers[0][1].value.effective_bits(64), 3.0);
  EXPECT_DOUBLE_EQ(p.layers[1][0].key.effective_bits(64), 8.5);
  EXPECT_DOUBLE_EQ(p.layers[1][0].value.effective_bits(64), 4.5);
  EXPECT_DOUBLE_EQ(p.layers[1][1].key.effective_bits(64), 16.0);
  EXPECT_DOUBLE_EQ(p.layers[1][1].value.effective_bits(64), 1.25);
  const auto a = p.achieved();
  EXPECT_DOUBLE_EQ(a.k, ((240.0 / 64) + 3.0 + 8.5 + 16.0) / 4);
  EXPECT_DOUBLE_EQ(a.v, (3.25 + 3.0 + 4.5 + 1.25) / 4);
  EXPECT_DOUBLE_EQ(a.total, (a.k + a.v) / 2);
}

TEST(Plan, RoundTripThroughAFile) {
  const Plan p = small_plan();
  const std::string path = tmp_path("roundtrip.json");
  p.save(path);
  const Plan q = Plan::load(path);
  EXPECT_EQ(q.to_json(), p.to_json());
  EXPECT_EQ(q.layers[0][0].key.groups[1].blocks.size(), 22u);
  EXPECT_EQ(q.layers[0][0].key.groups[0].seed, 11u);
  EXPECT_EQ(q.layers[0][1].value.groups[0].seed, 99u);
  EXPECT_EQ(q.layers[0][1].key.groups[0].channels.front(), 63);
  EXPECT_FALSE(q.tensors_file.has_value());
  Plan t = p;
  t.tensors_file = "codebooks.safetensors";
  t.fp16_window = 128;
  t.sink_tokens = 4;
  t.save(path);
  const Plan u = Plan::load(path);
  EXPECT_EQ(u.tensors_file.value_or(""), "codebooks.safetensors");
  EXPECT_EQ(u.fp16_window, 128);
  EXPECT_EQ(u.sink_tokens, 4);
  std::filesystem::remove(path);
}

// A write that fails only when the file is closed (a full disk: /dev/full
// accepts the open and fails the flush) is an error, not a plan silently lost.
TEST(Plan, SaveOnAFullDiskIsAnError) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  try {
    small_plan().save("/dev/full");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "/dev/full: write failed");
  }
}

TEST(Plan, BadFieldsAreNamed) {
  expect_error([](json& j) { j["layers"][1]["heads"][1]["value"]["groups"][0]["bits"] = 9; },
               "plan.json: layers[1].heads[1].value.groups[0].bits = 9: expected 1..8");
  expect_error([](json& j) { j["layers"][0]["heads"][0]["key"]["groups"][0]["bits"] = 9; },
               "plan.json: layers[0].heads[0].key.groups[0].bits = 9: expected 0..8");
  expect_error([](json& j) { j["layers"][0]["heads"][0]["key"]["groups"][1]["blocks"][0] = 0; },
               "plan.json: layers[0].heads[0].key.groups[1].blocks[0] = 0: already in groups[0]");
  expect_error([](json& j) { j["layers"][0]["heads"][0]["key"]["groups"][2]["blocks"] = json::array({30}); },
               "plan.json: layers[0].heads[0].key: RoPE block 31 is in no group (every one of the 32 must be "
               "covered)");
  expect_error([](json& j) { j["layers"][0]["heads"][0]["key"]["groups"][2]["blocks"][0] = 32; },
               "plan.json: layers[0].heads[0].key.groups[2].blocks[0] = 32: expected 0..31");
  expect_error([](json& j) { j["layers"][1]["heads"][0]["key"]["groups"][0]["bits"] = 4; },
               "plan.json: layers[1].heads[0].key.groups[0].bits = 4: expected 8 for kind q8_0");
  expect_error([](json& j) { j["layers"][0]["heads"][1]["key"]["group_size"] = 24; },
               "plan.json: layers[0].heads[1].key.group_size = 24: expected a divisor of head_dim 64");
  expect_error([](json& j) { j["layers"][0]["heads"][1]["key"]["kind"] = "tasq"; },
               "plan.json: layers[0].heads[1].key.kind = \"tasq\": expected one of fp16, tq-mse-grouped, tq-mse, "
               "kivi, quarot, q8_0, q4_0, vq");
  expect_error([](json& j) { j["layers"][0]["heads"].erase(1); },
               "plan.json: layers[0].heads: 1 entries, expected model.n_kv_heads = 2");
  expect_error([](json& j) { j["layers"][1]["heads"][0].erase("value"); },
               "plan.json: layers[1].heads[0].value: missing");
  expect_error([](json& j) { j["model"]["head_dim"] = "64"; },
               "plan.json: model.head_dim is a string: expected an integer");
  expect_error([](json& j) { j["model"]["rope_layout"] = "gptj"; },
               "plan.json: model.rope_layout = \"gptj\": expected \"interleaved\" or \"neox\"");
  expect_error([](json& j) { j["version"] = 2; }, "plan.json: version = 2: this build reads plan format version 1");
  expect_error([](json& j) { j["format"] = "gguf"; }, "plan.json: format = \"gguf\": expected \"ratekv-plan\"");
  expect_error([](json& j) { j["fp16_window"] = -1; }, "plan.json: fp16_window = -1: expected 0..2147483647");
  expect_error([](json& j) { j["budget"]["unit"] = "bytes"; },
               "plan.json: budget.unit = \"bytes\": expected \"effective\" or \"code\"");
  expect_error([](json& j) { j["achieved"] = {{"k", 3.0}}; },
               "plan.json: achieved.k = 3: the codecs store 7.8125 bits per element (edited by hand, or written "
               "before achieved counted every stored byte: tile padding, extension norms, vq segment rounding?)");
  // Keys this build does not read are errors naming the key (they were silently ignored).
  expect_error([](json& j) { j["layers"][0]["heads"][0]["key"]["norm_corection"] = true; },
               "plan.json: layers[0].heads[0].key.norm_corection: unknown key (this build reads kind, norm, "
               "group_size, scale_heads, groups, norm_correction, offset); it would be ignored");
  expect_error([](json& j) { j["layers"][0]["heads"][0]["key"]["groups"][0]["rotation"] = "hadamard"; },
               "plan.json: layers[0].heads[0].key.groups[0].rotation: unknown key (this build reads bits, blocks, "
               "channels, seed); it would be ignored");
  expect_error([](json& j) { j["sinks"] = 4; },
               "plan.json: sinks: unknown key (this build reads format, version, method, model, stats, tensors, fit, "
               "seed, fp16_window, sink_tokens, budget, achieved, layers); it would be ignored");
  expect_error([](json& j) { j["model"]["n_heads"] = 9; },
               "plan.json: model.n_heads: unknown key (this build reads arch, n_layers, n_kv_heads, head_dim, "
               "rope_layout, file, sha256); it would be ignored");
  expect_error([](json& j) { j["budget"]["avg"] = 3; },
               "plan.json: budget.avg: unknown key (this build reads unit, k, v); it would be ignored");
  expect_error([](json& j) { j["layers"][1]["heads"][0]["vaule"] = j["layers"][1]["heads"][0]["value"]; },
               "plan.json: layers[1].heads[0].vaule: unknown key (this build reads key, value); it would be ignored");
  expect_error([](json& j) { j["layers"][1]["window"] = 3; },
               "plan.json: layers[1].window: unknown key (this build reads heads); it would be ignored");
  expect_error([](json& j) { j["layers"][1]["heads"][1]["key"]["groups"] = json::array({{{"bits", 2}, {"channels", {0}}}}); },
               "plan.json: layers[1].heads[1].key.groups: kind fp16 has no groups (found 1)");
  expect_error([](json& j) { j["layers"][1]["heads"][1]["value"]["groups"][0]["channels"][5] = 4; },
               "plan.json: layers[1].heads[1].value.groups[0].channels[5] = 4: already in groups[0]");
  expect_error([](json& j) { j["layers"] = 3; }, "plan.json: layers is an integer: expected an array");
  // A NUL inside a string cut every message that quoted it ("…gguf, lla").
  expect_error([](json& j) { j["model"]["arch"] = std::string("lla\0ma", 5); },
               "plan.json: model.arch: a NUL character (U+0000) at byte 3: expected text without one");
  // A tab or newline is a legal file-name character, and calibrate/plan write file names into plans.
  json ok = small_plan().to_json();
  ok.erase("achieved");
  ok["model"]["file"] = "tiny\tmodel\n.gguf";
  EXPECT_EQ(Plan::from_json(ok, "plan.json").model.file, "tiny\tmodel\n.gguf");
}

TEST(Plan, LoadRejectsBadFiles) {
  const std::string path = tmp_path("bad.json");
  const auto load_error = [&] {  // Plan::load's Error message ("(no error)" when it loads)
    try {
      Plan::load(path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  write(path, "{\"format\": \"ratekv-plan\", ");
  std::string e = load_error();
  EXPECT_EQ(e.rfind(path + ": invalid JSON:", 0), 0u) << e;
  write(path, "[1, 2]");
  EXPECT_THROW(Plan::load(path), Error);
  // A number beyond double's range (found by fuzz_plan): nlohmann throws out_of_range, not parse_error — it
  // escaped read_json_file and terminated the program.
  write(path, "{\"format\": \"ratekv-plan\", \"model\": {\"n_layers\": 3333333333333E33333333332}}");
  e = load_error();
  EXPECT_EQ(e.rfind(path + ": invalid JSON:", 0), 0u) << e;
  EXPECT_NE(e.find("number overflow"), std::string::npos) << e;
  std::filesystem::remove(path);
  e = load_error();
  EXPECT_EQ(e.rfind(path + ": cannot read plan:", 0), 0u) << e;
}

// A file that is not JSON at all (a model, a side file, random bytes) is named
// as "not a JSON plan", with its first bytes, not as a JSON syntax error.
TEST(Plan, LoadNamesANonJsonFile) {
  const std::string path = tmp_path("binary_plan.bin");
  auto error_of = [&](const std::string& bytes) {
    write(path, bytes);
    try {
      Plan::load(path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  std::string e = error_of(std::string("GGUF\x03\x00\x00\x00\x01\x00", 10));
  EXPECT_EQ(e.rfind(path + ": not a JSON plan", 0), 0u) << e;
  EXPECT_NE(e.find("47 47 55 46 03 00 00 00"), std::string::npos) << e;
  EXPECT_NE(e.find("GGUF model file"), std::string::npos) << e;
  // A safetensors file (8-byte header length, then its JSON header), e.g. a vq plan's side file.
  e = error_of(std::string("\x02\x00\x00\x00\x00\x00\x00\x00{}", 10));
  EXPECT_EQ(e.rfind(path + ": not a JSON plan", 0), 0u) << e;
  EXPECT_NE(e.find("safetensors"), std::string::npos) << e;
  // Plain text.
  e = error_of("hello, world\n");
  EXPECT_EQ(e.rfind(path + ": not a JSON plan", 0), 0u) << e;
  EXPECT_NE(e.find("'hello, world'"), std::string::npos) << e;
  // Leading white space and a UTF-8 byte order mark do not count: truncated JSON is still a syntax error.
  e = error_of("\xEF\xBB\xBF \n {\"format\": ");
  EXPECT_EQ(e.rfind(path + ": invalid JSON:", 0), 0u) << e;
  std::filesystem::remove(path);
}

TEST(Plan, ValidateAgainstTheModel) {
  const Plan p = small_plan();
  EXPECT_NO_THROW(p.validate_against({"llama", 2, 2, 64, "interleaved"}));
  try {
    p.validate_against({"llama", 30, 2, 128, "neox"}, "k3.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "k3.json: plan was made for a different model (m.gguf, llama): n_layers = 2 vs model 30; head_dim "
                 "= 64 vs model 128; rope_layout \"interleaved\" vs model \"neox\"");
  }
  EXPECT_THROW(p.validate_against({"gemma3", 2, 2, 64, "interleaved"}), Error);
  EXPECT_THROW(p.validate_against({"llama", 2, 3, 64, "interleaved"}), Error);
}
