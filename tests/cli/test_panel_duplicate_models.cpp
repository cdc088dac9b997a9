// `ratekv panel` with one model given twice, or two models with the same file
// name in different folders, ran both and let the second overwrite the first's
// <out>/<stem>/ files (panel.md listed the model twice, exit 0); a repeated
// --bits budget likewise. Both are now a clean error naming the flag before
// any model is read (the model files here are not GGUF files at all).
#include <gtest/gtest.h>

#include <fstream>

#include "../support/temp_dir.h"
#include "cli_runner.h"

using ratekv_test::cli_path;
using ratekv_test::Result;
using ratekv_test::shell_quote;
using ratekv_test::run_cli;
using ratekv_test::TempDir;

TEST(PanelFlags, DuplicateModelsAndBudgetsAreErrorsBeforeLoading) {
  if (!fs::exists(cli_path())) GTEST_SKIP() << "ratekv CLI not built at " << cli_path();
  const TempDir dir("cli_panel_dup");
  fs::create_directories(dir / "a");
  fs::create_directories(dir / "b");
  std::ofstream(dir / "a" / "m.gguf") << "x";
  std::ofstream(dir / "b" / "m.gguf") << "y";
  std::ofstream(dir / "t.txt") << "hello world";
  const std::string a = shell_quote((dir / "a" / "m.gguf").string()), b = shell_quote((dir / "b" / "m.gguf").string());
  const std::string base = "panel -o '" + (dir / "out").string() + "' --calib '" + (dir / "t.txt").string() +
                           "' --eval '" + (dir / "t.txt").string() + "' ";
  const std::pair<std::string, const char*> cases[] = {
      {"-m " + a + " -m " + a, "error: --model"},
      {"-m " + a + " -m " + b, "error: --model"},
      {"-m " + a + " --bits 2 3 2", "error: --bits 2: given twice"},
      // A comma list, as the other list flags and --help's default (2,3) show it: "Could not convert" before
      // session 15.
      {"-m " + a + " --bits 2,3,2", "error: --bits 2: given twice"},
  };
  for (const auto& [args, what] : cases) {
    const Result r = run_cli(base + args);
    EXPECT_EQ(r.status, 1) << args << ": " << r.output;
    EXPECT_NE(r.output.find(what), std::string::npos) << args << ": " << r.output;
    EXPECT_EQ(r.output.find("GGUF"), std::string::npos) << args << ": " << r.output;  // model never read
  }
  EXPECT_FALSE(fs::exists(dir / "out" / "m"));
}
