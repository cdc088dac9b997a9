// `ratekv bench --device cpu` (what CI can run of the bench): JSON rows with
// the fields of issue 17 for every (cache, test), a packed cache smaller than
// fp16 at the same depth, and option errors before any work.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "cli_runner.h"

using ratekv_test::cli_path;
using ratekv_test::Result;
using ratekv_test::run_cli;

namespace {

TEST(CliBench, CpuRowsWithTheirFields) {
  if (!fs::exists(cli_path())) GTEST_SKIP() << "ratekv CLI not built at " << cli_path();
  const fs::path out = fs::temp_directory_path() / ("ratekv_bench_" + std::to_string(::getpid()) + ".json");
  const Result r = run_cli("bench --synthetic tiny-llama --device cpu -p 32 -n 4 -d 0,70 -b 1,2 -ctk f16,tq3,q8_0 "
                           "-ctv f16,tq3,q8_0 -r 2 -o json --out " + out.string());
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(out));
  fs::remove(out);
  const auto& rows = j.at("rows");
  ASSERT_EQ(rows.size(), 3u * (1 + 2 * 2)) << j.dump(1);  // per cache: pp32 + tg4 × (B 1, 2) × (depth 0, 70)
  double fp16_bytes = 0, k3_bytes = 0;
  for (const auto& row : rows) {
    EXPECT_EQ(row.at("device"), "cpu");
    if (row.at("test") == "pp32") {
      EXPECT_GT(row.at("prefill_tok_s").get<double>(), 0.0);
      continue;
    }
    EXPECT_EQ(row.at("test"), "tg4");
    for (const char* k : {"decode_tok_s", "decode_tok_s_sd", "step_ms", "roofline_ms", "x_roofline", "peak_mem_gb",
                          "cache_bytes", "read_ceiling_gbps"})
      EXPECT_TRUE(row.contains(k)) << k << " missing in " << row.dump();
    EXPECT_GT(row.at("decode_tok_s").get<double>(), 0.0);
    EXPECT_GT(row.at("roofline_ms").get<double>(), 0.0);
    EXPECT_FALSE(row.at("synthetic_fill").get<bool>());
    if (row.at("depth") == 70 && row.at("B") == 1) {
      if (row.at("cache") == "fp16") fp16_bytes = row.at("cache_bytes");
      if (row.at("cache") == "K3V3") k3_bytes = row.at("cache_bytes");
    }
  }
  // 71 tokens in 2 pages: fp16 8 KiB a page-token row… the packed pages are ~4x smaller.
  EXPECT_GT(fp16_bytes, 3.0 * k3_bytes) << fp16_bytes << " vs " << k3_bytes;
}

// The bytes a CPU decode step reads (the roofline's numerator), against the model's shapes counted here: every
// weight tensor once per forward (the B sequences are B forwards: B times the weights; B = 1 used to be
// counted for every B), the tied Gemma LM head once (it is token_embd: no second copy), plus every cache.
TEST(CliBench, CpuBytesReadFromTheModelShapes) {
  if (!fs::exists(cli_path())) GTEST_SKIP() << "ratekv CLI not built at " << cli_path();
  struct Shape {
    const char* args;
    double d, q, kv, hd, dff, V, L;
    bool untied, gemma;
  };
  for (const Shape& m : {Shape{"--synthetic tiny-llama -b 1,3", 256, 4, 2, 64, 512, 512, 2, true, false},
                         Shape{"--synthetic gemma-3-270m --layers 1 -b 1", 640, 4, 1, 256, 2048, 262144, 1, false,
                               true}}) {
    const double per_layer = m.d /*attn_norm*/ + m.d * (m.q + 2 * m.kv) * m.hd /*wqkv*/ + m.q * m.hd * m.d /*wo*/ +
                             m.d /*ffn_norm*/ + 2 * m.dff * m.d /*gate, up*/ + m.dff * m.d /*down*/ +
                             (m.gemma ? 2 * m.hd /*q, k norms*/ + 2 * m.d /*post-norms*/ : 0.0);
    const double weights = 4.0 * (m.V * m.d * (m.untied ? 2 : 1) + m.d /*output_norm*/ + m.L * per_layer);
    const fs::path out = fs::temp_directory_path() / ("ratekv_bench_bytes_" + std::to_string(::getpid()) + ".json");
    const Result r = run_cli(std::string("bench ") + m.args + " --device cpu -p 0 -n 2 -d 3 -r 1 -o json --out " +
                             out.string());
    ASSERT_EQ(r.status, 0) << r.output;
    const nlohmann::json j = nlohmann::json::parse(std::ifstream(out));
    fs::remove(out);
    ASSERT_FALSE(j.at("rows").empty());
    for (const auto& row : j.at("rows")) {
      const double B = row.at("B").get<double>(), cache = row.at("cache_bytes").get<double>();
      EXPECT_GT(cache, 0.0);
      EXPECT_NEAR(row.at("bytes_read_gb").get<double>() * 1e9, B * weights + cache, 1e-9 * (B * weights + cache))
          << m.args << " B=" << B;
    }
  }
}

TEST(CliBench, OptionErrorsComeFirst) {
  if (!fs::exists(cli_path())) GTEST_SKIP() << "ratekv CLI not built at " << cli_path();
  Result r = run_cli("bench --synthetic tiny-llama -ctk tq3");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("-ctk/-ctv: give both"), std::string::npos) << r.output;
  r = run_cli("bench --synthetic tiny-llama -ctk tq5 -ctv tq3");
  EXPECT_EQ(r.status, 2) << r.output;
  r = run_cli("bench -b 0 --synthetic tiny-llama");
  EXPECT_NE(r.output.find("-b: batch size 0"), std::string::npos) << r.output;
  r = run_cli("bench --synthetic tiny-llama -d 5000 -n 4 -p 0 -r 1");  // past the model's 4096 tokens
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("-d/--n-depth 5000 + -n/--n-gen 4: 5004 tokens exceed the context of 4096 tokens"),
            std::string::npos)
      << r.output;
  r = run_cli("bench --synthetic llama-3.1-8b");  // the default device is cpu: a full 8B is refused
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("--layers N"), std::string::npos) << r.output;
  r = run_cli("bench --synthetic tiny-llama --fill synthetic --device cpu");
  EXPECT_NE(r.output.find("--fill synthetic"), std::string::npos) << r.output;
}

}  // namespace
