// Text that is not valid UTF-8: the commands that read -f warn, naming the
// flag, the file and the first offending byte, and still run (the tokenizer
// takes such bytes as raw bytes, as llama.cpp does); valid UTF-8 gives no
// warning. Runs the built CLI on the real SmolLM2 model; skips without them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "../support/assets.h"
#include "../support/temp_dir.h"
#include "cli_runner.h"

namespace fs = std::filesystem;
using ratekv_test::cli_path;
using ratekv_test::Result;
using ratekv_test::run_cli;
using ratekv_test::shell_quote;
using ratekv_test::TempDir;

namespace {

class TextEncoding : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(cli_path())) GTEST_SKIP() << "ratekv CLI not built at " << cli_path();
    model_ = ratekv_test::smollm2_path();
    if (!fs::exists(model_)) GTEST_SKIP() << "SmolLM2 asset missing: " << model_;
  }
  fs::path write(const std::string& name, const std::string& bytes) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  std::string model_;
  TempDir dir_{"text_encoding"};
};

const std::string kSentence = " au lait, the quick brown fox jumps over the lazy dog again and again.\n";

TEST_F(TextEncoding, Latin1TextWarnsWithTheByteOffsetAndRuns) {
  const fs::path latin1 = write("latin1.txt", "Caf\xE9" + kSentence);
  const Result r = run_cli("perplexity -m " + shell_quote(model_) + " -f " + shell_quote(latin1.string()) +
                           " -c 8 --chunks 1");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("-f '" + latin1.string() + "': not valid UTF-8 at byte 3 (0xE9)"), std::string::npos)
      << r.output;
  const Result c = run_cli("capture -m " + shell_quote(model_) + " -f " + shell_quote(latin1.string()) +
                           " --tokens 4 --ctx 4 --layers 0 -o " + shell_quote((dir_ / "kv").string()));
  EXPECT_EQ(c.status, 0) << c.output;
  EXPECT_NE(c.output.find("not valid UTF-8 at byte 3"), std::string::npos) << c.output;
}

TEST_F(TextEncoding, Utf8TextGivesNoWarning) {
  const fs::path utf8 = write("utf8.txt", "Caf\xC3\xA9" + kSentence);
  const Result r = run_cli("perplexity -m " + shell_quote(model_) + " -f " + shell_quote(utf8.string()) +
                           " -c 8 --chunks 1");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.find("UTF-8"), std::string::npos) << r.output;
}

}  // namespace
