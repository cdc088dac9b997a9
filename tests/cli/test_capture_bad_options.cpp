// `ratekv capture` on careless options: an -o that is a file or lies under a
// file, a layer given twice, an empty --layers value, a text that is empty or
// shorter than --tokens. Each must end with a clean error naming the flag
// (exit 1; 2 for a value CLI11 rejects), before the weights load, and must not
// leave an output directory behind. Uses the SmolLM2 asset (skips when absent);
// only the model's header is read, so each run takes well under a second.
#include <gtest/gtest.h>

#include <fstream>
#include <unistd.h>

#include "../support/assets.h"
#include "cli_runner.h"

using ratekv_test::cli_path;
using ratekv_test::Result;
using ratekv_test::run_cli;

namespace {

constexpr const char* kWeightsLoaded = "fp32 weights";  // load_model's log line once the weights are in

class CaptureBadOptions : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(cli_path())) GTEST_SKIP() << "ratekv CLI not built at " << cli_path();
    model_ = ratekv_test::smollm2_path();
    if (!fs::exists(model_)) GTEST_SKIP() << "SmolLM2 asset missing: " << model_;
    dir_ = fs::temp_directory_path() / ("ratekv_capture_bad_options_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    text_ = dir_ / "t.txt";
    std::ofstream(text_) << "A short text: a dozen or so tokens of plain English.\n";
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }
  static std::string q(const fs::path& p) { return ratekv_test::shell_quote(p.string()); }
  std::string base(const fs::path& text) const { return "capture -m " + q(model_) + " -f " + q(text) + " "; }
  // Expects `status`, each needle in the output, and no weights loaded.
  static void expect_error(const std::string& args, int status, std::initializer_list<std::string> needles) {
    const Result r = run_cli(args);
    EXPECT_EQ(r.status, status) << args << "\n" << r.output;
    for (const auto& n : needles) EXPECT_NE(r.output.find(n), std::string::npos) << n << "\n" << r.output;
    EXPECT_EQ(r.output.find(kWeightsLoaded), std::string::npos) << "weights were loaded first:\n" << r.output;
    EXPECT_EQ(r.output.find("internal"), std::string::npos) << r.output;
  }
  fs::path model_, dir_, text_;
};

TEST_F(CaptureBadOptions, OutputThatIsAFileOrUnderAFile) {
  // Used to escape as std::filesystem::filesystem_error: "internal: unexpected exception", exit 2.
  const fs::path file = dir_ / "not_a_dir";
  std::ofstream(file) << "user data";
  expect_error(base(text_) + "--tokens 4 --layers 0 -o " + q(file), 1,
               {"error: -o: '" + file.string() + "' exists and is not a directory"});
  expect_error(base(text_) + "--tokens 4 --layers 0 -o " + q(file / "sub"), 1,
               {"error: -o: cannot create the output directory '" + (file / "sub").string() + "'"});
  std::ifstream in(file);
  std::string content((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(content, "user data");
}

TEST_F(CaptureBadOptions, LayerGivenTwiceOrEmpty) {
  // `--layers 0,0` used to capture layer 0 twice, write its files twice and report "2 layer(s)".
  const fs::path out = dir_ / "kv_twice";
  expect_error(base(text_) + "--tokens 4 --layers 3,0,3 -o " + q(out), 1,
               {"error: --layers: layer 3 given twice"});
  EXPECT_FALSE(fs::exists(out));
  // `--layers ''` used to capture layer 0.
  const fs::path out2 = dir_ / "kv_empty";
  expect_error(base(text_) + "--tokens 4 --layers '' -o " + q(out2), 2, {"--layers", "empty layer number"});
  EXPECT_FALSE(fs::exists(out2));
}

TEST_F(CaptureBadOptions, TextErrorsComeBeforeTheWeightsAndLeaveNoDirectory) {
  // The text used to be read after the weights, and the (empty) output directory was left behind.
  const fs::path out = dir_ / "kv_short" / "nested";
  expect_error(base(text_) + "--tokens 100000 --layers 0 -o " + q(out), 1,
               {"error: -f '" + text_.string() + "': the text has only", "100000 requested"});
  EXPECT_FALSE(fs::exists(dir_ / "kv_short"));
  const fs::path empty = dir_ / "empty.txt";
  std::ofstream(empty).flush();
  expect_error(base(empty) + "--tokens 4 --layers 0 -o " + q(out), 1, {"the text file is empty"});
  EXPECT_FALSE(fs::exists(dir_ / "kv_short"));
}

}  // namespace
