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
