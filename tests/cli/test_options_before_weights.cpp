// Option errors of the model-running subcommands that need the model's header
// (context length, tokenizer, chat template, architecture) but not its
// weights: each must end with a clean "error: ..." naming the flag before the
// weights are dequantized, i.e. without load_model's "... fp32 weights ..."
// log line. Uses the real model assets (skips when absent).
#include <gtest/gtest.h>

#include <fstream>

#include "../support/assets.h"
#include "../support/temp_dir.h"
#include "cli_runner.h"
#ifdef RATEKV_HAVE_ENGINE
#include "ratekv/engine/engine.h"
#endif

using ratekv_test::cli_path;
using ratekv_test::Result;
using ratekv_test::run_cli;
using ratekv_test::TempDir;
using ratekv_test::expect_error_before_weights;
using ratekv_test::kWeightsLoaded;

namespace {

// The log line load_model() prints once the weights are loaded.

class OptionsBeforeWeights : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(cli_path())) GTEST_SKIP() << "ratekv CLI not built at " << cli_path();
    smollm2_ = ratekv_test::smollm2_path();
    gemma3_ = ratekv_test::gemma3_path();
    if (!fs::exists(smollm2_)) GTEST_SKIP() << "model asset absent: " << smollm2_;
    text_ = dir_ / "t.txt";
    std::ofstream(text_) << "A short text of a few dozen tokens, far fewer than two chunks of 512.";
  }
  static std::string q(const fs::path& p) { return ratekv_test::shell_quote(p.string()); }
  fs::path smollm2_, gemma3_, text_;
  TempDir dir_{"cli_before_weights"};
};

TEST_F(OptionsBeforeWeights, Generate) {
  const std::string base = "generate -m " + q(smollm2_) + " -p 'Hello there' ";
  // The marker is what a load prints: a run with good options loads and prints it.
  const Result ok = run_cli(base + "-n 1");
  ASSERT_EQ(ok.status, 0) << ok.output;
  ASSERT_NE(ok.output.find(kWeightsLoaded), std::string::npos) << ok.output;
  // --plan without a plan cache (the plan file exists; its content is never read).
  expect_error_before_weights(base + "-n 4 --plan " + q(text_), {"--plan", "--cache fp32"});
  expect_error_before_weights(base + "-n 4 --cache fake", {"--cache fake: needs --plan"});
  expect_error_before_weights(base + "-n 4 --cache packed", {"--cache packed: needs --plan"});
  // SmolLM2's context is 8192 tokens.
  expect_error_before_weights(base + "-n 9000", {"-p/-n", "9000 new tokens", "8192"});
}

// Chunked prefill and many requests (engine issue 2 of 3): bad --chunk sizes,
// --chunk / --prompts-file off the GPU, -p together with --prompts-file and
// bad JSON lines are refused before the weights load.
TEST_F(OptionsBeforeWeights, GenerateChunkAndPromptsFile) {
  const std::string base = "generate -m " + q(smollm2_) + " ";
  expect_error_before_weights(base + "-p hi -n 4 --chunk 100 --device cuda", {"--chunk 100", "multiple of 64"});
  expect_error_before_weights(base + "-p hi -n 4 --chunk 64", {"--chunk", "--device cuda only"});
  const fs::path good = dir_ / "p.txt", bad = dir_ / "p.jsonl";
  std::ofstream(good) << "Hello there\n\n{\"prompt\": \"Once upon\", \"n_predict\": 3}\n";
  std::ofstream(bad) << "Hello\n{\"prompt\": \"x\", \"n_predict\": 3, \"temp\": 1}\n";
  expect_error_before_weights(base + "-n 4 --prompts-file " + q(good), {"--prompts-file", "--device cuda only"});
  expect_error_before_weights(base + "-p hi -n 4 --prompts-file " + q(good) + " --device cuda",
                              {"one of -p", "--prompts-file"});
  expect_error_before_weights(base + "-n 4 --prompts-file " + q(good) + " --device cuda --top-p 0",
                              {"--top-p", "(0, 1]"});
  // A single prompt samples on the host (temperature, top-k): top-p there
  // would be silently ignored, on either device.
  for (const char* dev : {"cpu", "cuda"})
    expect_error_before_weights(base + "-p hi -n 4 --temp 0.8 --top-p 0.9 --device " + dev,
                                {"--top-p", "only with --prompts-file"});
#ifdef RATEKV_HAVE_ENGINE
  if (ratekv::engine::cuda_device_name().empty())  // no GPU: --device cuda is refused first (require_engine)
    expect_error_before_weights(base + "-n 4 --prompts-file " + q(bad) + " --device cuda",
                                {"--device cuda: no CUDA device visible"});
  else
    expect_error_before_weights(base + "-n 4 --prompts-file " + q(bad) + " --device cuda",
                                {"line 2", "unknown key \"temp\""});
#endif
  expect_error_before_weights("perplexity -m " + q(smollm2_) + " -f " + q(text_) + " --chunk 32 --device cuda",
                              {"--chunk 32", "multiple of 64"});
}

TEST_F(OptionsBeforeWeights, GenerateChatNeedsChatMLTemplate) {
  if (!fs::exists(gemma3_)) GTEST_SKIP() << "model asset absent: " << gemma3_;
  expect_error_before_weights("generate -m " + q(gemma3_) + " -p hi -n 4 --chat", {"--chat", "ChatML"});
}

TEST_F(OptionsBeforeWeights, Perplexity) {
  const std::string base = "perplexity -m " + q(smollm2_) + " -f " + q(text_) + " ";
  expect_error_before_weights(base + "-c 10000", {"-c: context 10000", "8192"});
  expect_error_before_weights(base + "-c 64 --plan " + q(text_), {"--plan", "--cache fp32"});
  expect_error_before_weights(base + "-c 64 --cache fake", {"--cache fake: needs --plan"});
  expect_error_before_weights(base + "-c 512", {"-f/-c", "need at least 2·CTX = 1024"});
}

TEST_F(OptionsBeforeWeights, Capture) {
  const std::string base = "capture -m " + q(smollm2_) + " -f " + q(text_) + " --tokens 8 ";
  expect_error_before_weights(base + "--ctx 9000 -o " + q(dir_ / "kv"), {"--ctx 9000", "8192"});
  expect_error_before_weights(base + "--ctx 8 --layers 0,30 -o " + q(dir_ / "kv"), {"--layers", "30", "0..29"});
  fs::create_directories(dir_ / "kv2");
  std::ofstream(dir_ / "kv2" / "q_layer0.npy") << "user data";
  expect_error_before_weights(base + "--ctx 8 --layers 0 --queries -o " + q(dir_ / "kv2"), {"q_layer0.npy", "already exists"});
}

TEST_F(OptionsBeforeWeights, Niah) {
  const std::string base = "niah -m " + q(smollm2_) + " --depths 2 --trials 1 ";
  expect_error_before_weights(base + "--ctx 9000", {"--ctx", "9000", "8192"});
  // A plan that is not a plan is rejected from the header's config, before the weights.
  expect_error_before_weights(base + "--ctx 128 --plan " + q(text_), {"t.txt"});
}

}  // namespace
