// `ratekv calibrate --sensitivity` flag validation: bad --sens-seqs /
// --sens-len end with a clean error naming the flag before the model is read
// (the model file here is not a GGUF file at all).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "../support/assets.h"
#include "../support/temp_dir.h"
#include "cli_runner.h"

using ratekv_test::cli_path;
using ratekv_test::Result;
using ratekv_test::run_cli;
using ratekv_test::TempDir;

TEST(CalibrateSensitivityFlags, BadCountsNameTheFlagBeforeLoading) {
  if (!fs::exists(cli_path())) GTEST_SKIP() << "ratekv CLI not built at " << cli_path();
  const TempDir dir("cli_sens");
  std::ofstream(dir / "m.gguf") << "x";
  std::ofstream(dir / "t.txt") << "hello world";
  const std::string base = "calibrate -m '" + (dir / "m.gguf").string() + "' -f '" + (dir / "t.txt").string() +
                           "' --tokens 8 -o '" + (dir / "s.safetensors").string() + "' --sensitivity ";
  const std::pair<const char*, const char*> cases[] = {
      {"--sens-seqs 0", "--sens-seqs"}, {"--sens-seqs -3", "--sens-seqs"}, {"--sens-seqs 5000", "--sens-seqs"},
      {"--sens-len 1", "--sens-len"},   {"--sens-len 0", "--sens-len"},
  };
  for (const auto& [args, flag] : cases) {
    const Result r = run_cli(base + args);
    EXPECT_EQ(r.status, 1) << args << ": " << r.output;
    EXPECT_NE(r.output.find(std::string("error: ") + flag), std::string::npos) << args << ": " << r.output;
    EXPECT_EQ(r.output.find("GGUF"), std::string::npos) << args << ": " << r.output;  // model never read
  }
  // Without --sensitivity the counts would be unused: refused (they were ignored silently), before the model.
  const Result r = run_cli(base.substr(0, base.size() - std::string("--sensitivity ").size()) + "--sens-len 1");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("error: --sens-seqs/--sens-len: need --sensitivity"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("GGUF"), std::string::npos) << r.output;
}

// The backward pass serves every architecture Model runs: --sensitivity on
// Gemma 3 (QK-norm, GeGLU, sliding windows, two RoPE bases) completes and
// writes statistics with per-head sensitivities (it used to be refused as
// 'llama' only).
TEST(CalibrateSensitivityFlags, GemmaSensitivityRuns) {
  if (!fs::exists(cli_path())) GTEST_SKIP() << "ratekv CLI not built at " << cli_path();
  if (const char* s = std::getenv("RATEKV_SANITIZE_RUN"); s && std::string(s) == "1")
    GTEST_SKIP() << "loads the Gemma 3 weights: skipped in the sanitizer run";
  const fs::path model = ratekv_test::gemma3_path();
  if (!fs::exists(model)) GTEST_SKIP() << "model asset absent: " << model;
  const TempDir dir("cli_sens_gemma");
  {
    std::ofstream t(dir / "t.txt");
    for (int i = 0; i < 40; ++i) t << "The quick brown fox jumps over the lazy dog number " << i << ". ";
  }
  const Result r = run_cli("calibrate -m '" + model.string() + "' -f '" + (dir / "t.txt").string() +
                           "' --tokens 32 --ctx 32 -o '" + (dir / "s.safetensors").string() +
                           "' --sensitivity --sens-seqs 1 --sens-len 16");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.find("error"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir / "s.safetensors")) << r.output;
}
