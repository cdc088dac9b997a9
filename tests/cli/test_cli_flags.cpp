// Flag and output-path validation of the `ratekv` CLI: every case must end with
// a clean "error: ..." naming the flag, before any model is loaded or any
// work is done (no model file is needed: validation comes first).
#include <gtest/gtest.h>

#include <fstream>

#include "../support/temp_dir.h"
#include "cli_runner.h"

using ratekv_test::cli_path;
using ratekv_test::Result;
using ratekv_test::run_cli;
using ratekv_test::shell_quote;
using ratekv_test::TempDir;

namespace {

class CliFlags : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(cli_path())) GTEST_SKIP() << "ratekv CLI not built at " << cli_path();
    model_ = dir_ / "not_a_model.gguf";  // exists (CLI11 ExistingFile passes) but is never read
    std::ofstream(model_) << "x";
    text_ = dir_ / "t.txt";
    std::ofstream(text_) << "hello world";
  }
  std::string q(const fs::path& p) { return shell_quote(p.string()); }
  fs::path model_, text_;
  TempDir dir_{"cli_flags"};
};

TEST_F(CliFlags, PerplexityChunksMustBePositive) {
  for (const char* n : {"0", "-1"}) {
    const Result r = run_cli("perplexity -m " + q(model_) + " -f " + q(text_) + " -c 64 --chunks " + n);
    EXPECT_NE(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("--chunks"), std::string::npos) << r.output;
  }
}

TEST_F(CliFlags, OutputIntoMissingDirectoryFailsBeforeWork) {
  const fs::path out = dir_ / "no_such_dir" / "ppl.txt";
  const Result r = run_cli("perplexity -m " + q(model_) + " -f " + q(text_) + " -c 64 -o " + q(out));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("error: --output: directory '" + (dir_ / "no_such_dir").string() + "'"), std::string::npos)
      << r.output;
  // Failed before loading the (bogus) model: no GGUF error in the output.
  EXPECT_EQ(r.output.find("GGUF"), std::string::npos) << r.output;
}

TEST_F(CliFlags, ExistingOutputNeedsForce) {
  const fs::path out = dir_ / "exists.json";
  std::ofstream(out) << "user data";
  const Result r = run_cli("rd --data gaussian --dim 8 --n 16 --bits 1 --quantizers tq_mse --json " + q(out));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("already exists"), std::string::npos) << r.output;
  std::ifstream in(out);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "user data");  // untouched
}

TEST_F(CliFlags, NiahBoundsTrialsAndDepths) {
  const Result a = run_cli("niah -m " + q(model_) + " --depths 100000000");
  EXPECT_NE(a.status, 0) << a.output;
  EXPECT_NE(a.output.find("--depths"), std::string::npos) << a.output;
  const Result b = run_cli("niah -m " + q(model_) + " --trials 0");
  EXPECT_NE(b.status, 0) << b.output;
  EXPECT_NE(b.output.find("--trials"), std::string::npos) << b.output;
}

TEST_F(CliFlags, GenerateRejectsNegativeTopK) {
  const Result r = run_cli("generate -m " + q(model_) + " -p hi -n 1 --top-k -3");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("--top-k"), std::string::npos) << r.output;
}

// Usage errors exit 2 with CLI11's message naming the option; --help exits 0
// (not CLI11's own 100+ exit codes).
TEST_F(CliFlags, UsageErrorsExitTwo) {
  const Result bad_type = run_cli("perplexity -m " + q(model_) + " -f " + q(text_) + " --chunks abc");
  EXPECT_EQ(bad_type.status, 2) << bad_type.output;
  EXPECT_NE(bad_type.output.find("--chunks"), std::string::npos) << bad_type.output;
  const Result unknown_flag = run_cli("perplexity -m " + q(model_) + " -f " + q(text_) + " --no-such-flag");
  EXPECT_EQ(unknown_flag.status, 2) << unknown_flag.output;
  EXPECT_NE(unknown_flag.output.find("--no-such-flag"), std::string::npos) << unknown_flag.output;
  const Result unknown_cmd = run_cli("no-such-command");
  EXPECT_EQ(unknown_cmd.status, 2) << unknown_cmd.output;
  const Result help = run_cli("--help");
  EXPECT_EQ(help.status, 0) << help.output;
  EXPECT_NE(help.output.find("Exit status"), std::string::npos) << help.output;
  // The usage line names the program (CLI11 prints "Usage: [OPTIONS]" when the App has no name).
  EXPECT_NE(help.output.find("Usage: ratekv"), std::string::npos) << help.output;
}

}  // namespace
