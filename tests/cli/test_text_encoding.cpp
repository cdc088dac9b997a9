// Text that is not valid UTF-8: the commands that read -f (and niah its
// --haystack files) warn, naming the flag, the file and the first offending byte, and still run (the tokenizer
// takes such bytes as raw bytes, as llama.cpp does); valid UTF-8 gives no
// warning. Runs the built CLI on the real SmolLM2 model; skips without them.
#include <fmt/format.h>
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

// niah --haystack: a file of random bytes was read without a word (only the tokenizer's count of dropped bytes,
// naming no file). Warned about as -f is, naming the file and the first offending byte, per file; the grid still
// runs (the bytes are tokenized as raw bytes, as for -f). A directory of UTF-8 files gives no warning.
TEST_F(TextEncoding, NiahHaystackNotUtf8WarnsNamingTheFile) {
  std::string noise = "Hay\xFF";
  uint32_t x = 12345;  // a fixed LCG: the same bytes every run
  for (int i = 0; i < 20000; ++i) {
    x = x * 1664525u + 1013904223u;
    noise += static_cast<char>(x >> 24);
  }
  fs::create_directories(dir_ / "hay");
  const fs::path text = write("hay/a.txt", "Caf\xC3\xA9" + kSentence), bytes = write("hay/b.txt", noise);
  const std::string cmd = "niah -m " + shell_quote(model_) + " --depths 2 --trials 1 --ctx 128 --haystack ";
  const Result r = run_cli(cmd + shell_quote((dir_ / "hay").string()));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("--haystack '" + bytes.string() + "': not valid UTF-8 at byte 3 (0xFF)"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("--haystack '" + text.string() + "'"), std::string::npos) << r.output;
  fs::remove(bytes);
  fs::copy_file(text, dir_ / "hay" / "c.txt");
  for (int i = 0; i < 40; ++i) std::ofstream(dir_ / "hay" / fmt::format("t{}.txt", i)) << kSentence;
  const Result ok = run_cli(cmd + shell_quote((dir_ / "hay").string()));
  EXPECT_EQ(ok.status, 0) << ok.output;
  EXPECT_EQ(ok.output.find("UTF-8"), std::string::npos) << ok.output;
}

}  // namespace
