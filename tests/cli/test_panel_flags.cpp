// `ratekv panel` flag validation: bad budgets, seeds, token counts and missing
// files end with a clean error naming the flag before any model is read (the
// model file here is not a GGUF file at all).
#include <gtest/gtest.h>

#include <fstream>

#include "../support/temp_dir.h"
#include "cli_runner.h"

using ratekv_test::cli_path;
using ratekv_test::Result;
using ratekv_test::run_cli;
using ratekv_test::TempDir;

TEST(PanelFlags, BadValuesNameTheFlagBeforeLoading) {
  if (!fs::exists(cli_path())) GTEST_SKIP() << "ratekv CLI not built at " << cli_path();
  const TempDir dir("cli_panel");
  std::ofstream(dir / "m.gguf") << "x";
  std::ofstream(dir / "t.txt") << "hello world";
  const std::string base = "panel -o '" + (dir / "out").string() + "' -m '" + (dir / "m.gguf").string() +
                           "' --calib '" + (dir / "t.txt").string() + "' --eval '" + (dir / "t.txt").string() + "' ";
  const std::pair<const char*, const char*> cases[] = {
      {"--bits 0", "--bits"},          {"--bits 9", "--bits"},       {"--seeds 0", "--seeds"},
      {"--seeds 99", "--seeds"},       {"--ctx 2", "--ctx"},         {"--tokens 100 --ctx 512", "--tokens"},
      {"--calib-tokens 0", "--calib-tokens"},
      {"--calib-tokens 1", "--calib-tokens 1: expected >= 2"},  // ran on one token (a key covariance of 0)
      {"--tokens 512 --ctx 512", "--tokens 512 must be at least 2 × --ctx 512"},  // failed after calibrating
      {"--baseline fp16,q8_0,fp16", "--baseline fp16: given twice"},              // named by eval, after the plans
  };
  for (const auto& [args, flag] : cases) {
    const Result r = run_cli(base + args);
    EXPECT_EQ(r.status, 1) << args << ": " << r.output;
    EXPECT_NE(r.output.find(std::string("error: ") + flag), std::string::npos) << args << ": " << r.output;
    EXPECT_EQ(r.output.find("GGUF"), std::string::npos) << args << ": " << r.output;  // model never read
  }
  // An unknown --baseline used to be found only at the eval step, after the calibration (minutes); eval
  // refused it only after loading the weights.
  for (const std::string& cmd : {base, "eval -m '" + (dir / "m.gguf").string() + "' -f '" + (dir / "t.txt").string() +
                                          "' "}) {
    const Result r = run_cli(cmd + "--baseline fp16 --baseline nope");
    EXPECT_EQ(r.status, 2) << cmd << r.output;
    EXPECT_NE(r.output.find("--baseline: nope not in {fp16,q8_0,q4_0,kivi2,kivi4}"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("GGUF"), std::string::npos) << r.output;  // model never read
    // eval: "two plans are named 'fp16'" after the weights loaded.
    const Result twice = run_cli(cmd + "--baseline fp16 --baseline q4_0 --baseline fp16");
    EXPECT_EQ(twice.status, 1) << cmd << twice.output;
    EXPECT_NE(twice.output.find("error: --baseline fp16: given twice"), std::string::npos) << twice.output;
    EXPECT_EQ(twice.output.find("GGUF"), std::string::npos) << twice.output;
  }
  const Result missing = run_cli("panel -o '" + (dir / "out").string() + "' -m '" + (dir / "m.gguf").string() +
                                 "' --calib '" + (dir / "none.txt").string() + "'");
  EXPECT_EQ(missing.status, 1) << missing.output;
  EXPECT_NE(missing.output.find("error: --calib"), std::string::npos) << missing.output;
}
