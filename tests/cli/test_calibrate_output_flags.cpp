// `ratekv calibrate` output flags: --curves-json without --curves (nothing
// would be written) and --curves-json naming the -o file (one output silently
// overwrote the other, exit 0) end with a clean error naming the flag before
// the model is read; a text too short for --sensitivity names the
// sensitivity flags.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "../support/assets.h"
#include "../support/temp_dir.h"
#include "cli_runner.h"

using ratekv_test::cli_path;
using ratekv_test::Result;
using ratekv_test::run_cli;
using ratekv_test::TempDir;

TEST(CalibrateOutputFlags, CurvesJsonNeedsCurvesAndItsOwnFile) {
  if (!fs::exists(cli_path())) GTEST_SKIP() << "ratekv CLI not built at " << cli_path();
  const TempDir dir("cli_calib_out");
  fs::create_directories(dir / "sub");
  std::ofstream(dir / "m.gguf") << "x";
  std::ofstream(dir / "t.txt") << "hello world";
  const std::string out = (dir / "s.safetensors").string();
  const std::string base = "calibrate -m '" + (dir / "m.gguf").string() + "' -f '" + (dir / "t.txt").string() +
                           "' --tokens 8 -o '" + out + "' ";
  const std::pair<std::string, const char*> cases[] = {
      {"--curves-json '" + (dir / "c.json").string() + "'", "needs --curves"},
      {"--curves tq-mse --curves-json '" + out + "'", "the same file as -o"},
      {"--curves tq-mse --curves-json '" + (dir / "sub" / ".." / "s.safetensors").string() + "'",
       "the same file as -o"},
  };
  for (const auto& [args, what] : cases) {
    const Result r = run_cli(base + args);
    EXPECT_EQ(r.status, 1) << args << ": " << r.output;
    EXPECT_NE(r.output.find("error: --curves-json"), std::string::npos) << args << ": " << r.output;
    EXPECT_NE(r.output.find(what), std::string::npos) << args << ": " << r.output;
    EXPECT_EQ(r.output.find("GGUF"), std::string::npos) << args << ": " << r.output;  // model never read
  }
  EXPECT_FALSE(fs::exists(out));
}

TEST(CalibrateOutputFlags, TextTooShortForSensitivityNamesTheFlags) {
  if (!fs::exists(cli_path())) GTEST_SKIP() << "ratekv CLI not built at " << cli_path();
  const fs::path model = ratekv_test::smollm2_path();
  if (!fs::exists(model)) GTEST_SKIP() << "model asset absent: " << model;
  const TempDir dir("cli_calib_short");
  std::ofstream(dir / "t.txt") << "short text only a few words.";
  const Result r = run_cli("calibrate -m '" + model.string() + "' -f '" + (dir / "t.txt").string() +
                           "' --tokens 4 --ctx 4 -o '" + (dir / "s.safetensors").string() +
                           "' --sensitivity --sens-seqs 3 --sens-len 16");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("--sens-seqs 3 × --sens-len 16"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("48 requested"), std::string::npos) << r.output;
}
