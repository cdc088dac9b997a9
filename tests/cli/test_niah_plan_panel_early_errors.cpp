// Option errors that need only the model's header (or nothing of the model)
// and used to surface after the weights had loaded (niah: after the whole fp16
// grid had run) or as an internal exception:
//  - niah --plan with a codec the packed cache cannot serve (--cache packed),
//  - niah --ctx too short for a model without a chat template (plain prompt), and an empty --haystack,
//  - niah --max-new shorter than the answer in the model's tokens (Qwen2.5: 8),
//  - plan --method tasq --ctx outside 1..the model's context,
//  - panel --out under a regular file (was std::filesystem::filesystem_error,
//    "internal: unexpected exception", exit 2).
// Each must exit 1 with an "error: ..." naming the flag/file, without the
// weights loaded. Uses the model assets (skips when absent).
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

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


class EarlyErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(cli_path())) GTEST_SKIP() << "ratekv CLI not built at " << cli_path();
    smollm2_ = ratekv_test::smollm2_path();
    if (!fs::exists(smollm2_)) GTEST_SKIP() << "SmolLM2 asset missing: " << smollm2_;
  }
  static std::string q(const fs::path& p) { return ratekv_test::shell_quote(p.string()); }
  fs::path smollm2_;
  TempDir dir_{"early_errors"};
};

TEST_F(EarlyErrors, NiahPlanThePackedCacheCannotServe) {
  // A uniform KIVI plan for SmolLM2 from the committed calibration statistics (no model needed).
  const std::string stats = std::string(RATEKV_SOURCE_DIR) + "/bench/results/niah_plans/ratequant-2.25.stats.json";
  if (!fs::exists(stats)) GTEST_SKIP() << "stats fixture missing: " << stats;
  const fs::path plan = dir_ / "kivi.plan.json";
  const Result made = run_cli("plan --method uniform --quantizer kivi --kbits 2 --vbits 2 --stats " + q(stats) +
                              " -o " + q(plan));
  ASSERT_EQ(made.status, 0) << made.output;
  expect_error_before_weights("niah -m " + q(smollm2_) + " --depths 2 --trials 1 --ctx 128 --plan " + q(plan),
                     {"kivi", "no packed storage", "--cache fake"});
}

TEST_F(EarlyErrors, NiahChatTemplateAndHaystack) {
  const fs::path empty_hay = dir_ / "hay";
  fs::create_directories(empty_hay);
  expect_error_before_weights("niah -m " + q(smollm2_) + " --depths 2 --trials 1 --ctx 128 --haystack " + q(empty_hay),
                     {"haystack: '" + empty_hay.string() + "' holds no .txt files"});
  // Gemma 3 270M (no chat template) gets the plain-text prompt: its --ctx check names its own tokenizer's minimum.
  const std::string gemma = ratekv_test::gemma3_path();
  if (!fs::exists(gemma)) GTEST_SKIP() << "Gemma 3 asset missing: " << gemma;
  expect_error_before_weights("niah -m " + q(gemma) + " --depths 2 --trials 1 --ctx 64", {"--ctx 64", "too short"});
}

TEST_F(EarlyErrors, NiahAnswerCapShorterThanTheAnswer) {
  const std::string qwen = ratekv_test::qwen05_path();
  if (!fs::exists(qwen)) GTEST_SKIP() << "Qwen2.5-Coder-0.5B asset missing: " << qwen;
  expect_error_before_weights("niah -m " + q(qwen) + " --depths 2 --trials 1 --ctx 256 --max-new 4",
                              {"--max-new 4", "up to 8 tokens"});
}

TEST_F(EarlyErrors, NiahDepthListOutOfRangeOrNotIncreasing) {
  expect_error_before_weights("niah -m " + q(smollm2_) + " --depth-list 0.5,1.5 --trials 1 --ctx 128",
                              {"--depth-list 1.5", "[0, 1]"});
  expect_error_before_weights("niah -m " + q(smollm2_) + " --depth-list 0.5,0.25 --trials 1 --ctx 128",
                              {"--depth-list 0.25 after 0.5", "strictly increasing"});
  const Result both = run_cli("niah -m " + q(smollm2_) + " --depth-list 0.5 --depths 3 --trials 1 --ctx 128");
  EXPECT_NE(both.status, 0);
  EXPECT_NE(both.output.find("excludes"), std::string::npos) << both.output;
}

TEST_F(EarlyErrors, PlanTasqContextOutOfRange) {
  const fs::path text = dir_ / "t.txt";
  {
    std::ofstream o(text);
    for (int i = 0; i < 40; ++i) o << "Calibration text line " << i << ", with a few more words in it.\n";
  }
  const std::string base = "plan --method tasq -m " + q(smollm2_) + " -f " + q(text) +
                           " --tokens 64 --centroids 2 --vcentroids 2 -o " + q(dir_ / "p.json") + " --ctx ";
  expect_error_before_weights(base + "0", {"--ctx 0", "1..8192"});
  expect_error_before_weights(base + "8193", {"--ctx 8193", "1..8192"});
}

TEST_F(EarlyErrors, PanelOutputUnderAFile) {
  const fs::path file = dir_ / "not_a_dir";
  std::ofstream(file) << "user data";
  expect_error_before_weights("panel --model " + q(smollm2_) + " --out " + q(file / "x"),
                     {"--out: cannot create the output directory '" + (file / "x").string() + "'"});
  expect_error_before_weights("panel --model " + q(smollm2_) + " --out " + q(file), {"--out", "is not a directory"});
}

}  // namespace

// niah --device cuda (issue 18): what the GPU engine cannot serve is refused
// from the header, naming the flag — a 5..8-bit group (--plan), q8_0
// (-ctk/-ctv) — and the GPU-only flags on the CPU (--chunk, --prefill-mode
// serving) and the CPU-only --cache fake on the GPU. A build without the
// engine refuses --device cuda itself.
TEST_F(EarlyErrors, NiahOnTheGpuRefusesWhatItCannotServe) {
  const std::string base = "niah -m " + q(smollm2_) + " --depths 2 --trials 1 --ctx 128";
  expect_error_before_weights(base + " --chunk 64", {"--chunk", "--device cuda only"});
  expect_error_before_weights(base + " --prefill-mode serving", {"--prefill-mode serving", "--device cuda only"});
  expect_error_before_weights(base + " --device cuda --cache fake --no-fp16 -ctk tq3 -ctv tq3",
                              {"--cache fake", "CPU only"});
  expect_error_before_weights(base + " -ctk tq3", {"-ctv"});
#ifdef RATEKV_HAVE_ENGINE
  if (ratekv::engine::cuda_device_name().empty())  // no GPU: --device cuda is refused first (require_engine)
    expect_error_before_weights(base + " --device cuda --no-fp16 -ctk q8_0 -ctv q8_0",
                                {"--device cuda: no CUDA device visible"});
  else
    expect_error_before_weights(base + " --device cuda --no-fp16 -ctk q8_0 -ctv q8_0",
                                {"-ctk q8_0 -ctv q8_0 with --device cuda", "'q8_0' is not served on the GPU"});
  // A uniform plan at --vbits 6 (value groups of 5 code bits): served on the GPU since 5..8-bit groups are
  // (extension pages, docs/packed_format.md §6), so the early check lets it through and the run completes.
  // Without a GPU, --device cuda is refused before the plan is read (require_engine, checked above), so
  // this case is observable only on a machine with one.
  if (ratekv::engine::cuda_device_name().empty()) return;
  const std::string stats = std::string(RATEKV_SOURCE_DIR) + "/bench/results/niah_plans/ratequant-2.25.stats.json";
  if (!fs::exists(stats)) GTEST_SKIP() << "stats fixture missing: " << stats;
  const fs::path plan = dir_ / "k6.plan.json";
  const Result made = run_cli("plan --method uniform --kbits 3 --vbits 6 --stats " + q(stats) + " -o " + q(plan));
  ASSERT_EQ(made.status, 0) << made.output;
  const Result wide = run_cli(base + " --device cuda --no-fp16 --plan " + q(plan));
  EXPECT_EQ(wide.output.find("groups only"), std::string::npos) << wide.output;
  EXPECT_EQ(wide.status, 0) << wide.output;
#else
  expect_error_before_weights(base + " --device cuda", {"--device cuda", "no GPU engine"});
#endif
}

// A fake-quant grid reports the bytes of the cache it models (the plan's stored bytes per token: q4_0 at 4.5
// bits, 30 layers x 3 KV heads x 64 x 2 sides = 6480), not the fake cache's fp32 copies (92280 before).
TEST_F(EarlyErrors, NiahFakeCacheReportsThePlansStoredBytes) {
  const Result r = run_cli("niah -m " + q(smollm2_) + " --ctx 128 --depth-list 0 --trials 1 --no-fp16 -ctk q4_0 "
                           "-ctv q4_0 --json " + q(dir_ / "n.json"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("(fake) (6480.0 cache bytes/token"), std::string::npos) << r.output;
  std::ifstream in(dir_ / "n.json");
  const std::string j((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(j.find("\"cache_bytes_per_token\": 6480.0"), std::string::npos) << j;
  EXPECT_NE(j.find("\"evaluation_cache_bytes_per_token\""), std::string::npos) << j;
}

// A haystack with many bytes per token (long whitespace runs) was cut at 13 bytes per context token before
// tokenizing and called too short ("haystack has 90 tokens, context 256 needs 166") though it held thousands.
TEST_F(EarlyErrors, NiahReadsMoreOfASparseHaystack) {
  const fs::path hay = dir_ / "sparse_hay";
  fs::create_directories(hay);
  {
    std::ofstream f(hay / "essay.txt");
    for (int i = 0; i < 400; ++i) f << "Word" << i << " " << std::string(200, ' ') << "\n";  // ~80 KB, ~1K tokens
  }
  const Result r = run_cli("niah -m " + q(smollm2_) + " --ctx 256 --depth-list 0 --trials 1 --no-fp16 -ctk q8_0 "
                           "-ctv q8_0 --haystack " + q(hay));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.find("haystack has"), std::string::npos) << r.output;
}
