// Bad flag values an adversarial pass found (session 6), each now refused before any work with an
// error naming the flag and what was expected:
//  - bench -p / -d + -n past the context (was Model::forward's error after the weights loaded, naming
//    Model::set_position_limit),
//  - rd: quantizer-internal messages ("kivi_key: group_size …", "rotation: unknown kind", "q4_0: dim …"),
//    and --group-size 1000 with --n 64 printing a fit of fp16 rounding (no KIVI key group filled),
//  - niah --ctx shorter than the prompt's scaffolding (was an error after the weights loaded),
//  - --seed -1 accepted as 2^64-1 by every command with a --seed,
//  - an output path in a directory that cannot take a file (was an error after the whole run),
//  - plan --method block-gtq --kbits 0 wrote a plan storing no key at all,
//  - a plan's model.sha256 was never compared with the model it is applied to.
// Runs the built CLI; the model-backed cases skip without the SmolLM2 asset.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <vector>

#include "../support/assets.h"
#include "../support/temp_dir.h"
#include "cli_runner.h"
#include "ratekv/io/gguf.h"
#include "ratekv/model/synthetic.h"
#ifdef RATEKV_HAVE_ENGINE
#include "ratekv/engine/engine.h"
#endif

using ratekv_test::cli_path;
using ratekv_test::expect_error_before_weights;
using ratekv_test::Result;
using ratekv_test::run_cli;
using ratekv_test::TempDir;

namespace {

class BadInputFlags : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(cli_path())) GTEST_SKIP() << "ratekv CLI not built at " << cli_path();
  }
  static std::string q(const fs::path& p) { return ratekv_test::shell_quote(p.string()); }
  static void expect(const std::string& args, int status, const std::string& needle) {
    const Result r = run_cli(args);
    EXPECT_EQ(r.status, status) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\nexpected: " << needle << "\n" << r.output;
    EXPECT_EQ(r.output.find("internal"), std::string::npos) << r.output;
  }
  TempDir dir_{"bad_input_flags"};
};

// Negative counts: refused before any work (usage error, exit 2) naming the flag, with what was expected
// — CLI11's NonNegativeNumber printed the top of its range, DBL_MAX, as a 309-digit number.
TEST_F(BadInputFlags, NegativeCountsNameTheFlagWithoutDblMax) {
  const std::pair<std::string, std::string> cases[] = {
      {"bench --synthetic tiny-llama --chunk -64", "--chunk: expected a whole number ≥ 0, got '-64'"},
      {"bench --synthetic tiny-llama -c -5", "--ctx-size: expected a whole number ≥ 0, got '-5'"},
      {"bench --synthetic tiny-llama --requests -1", "--requests: expected a whole number ≥ 0, got '-1'"},
      {"perplexity --chunk -1", "--chunk: expected a whole number ≥ 0, got '-1'"},
      {"niah --chunk -1", "--chunk: expected a whole number ≥ 0, got '-1'"},
      {"generate --top-k -1", "--top-k: expected a whole number ≥ 0, got '-1'"},
      {"generate --chunk 1.5", "--chunk: expected a whole number ≥ 0, got '1.5'"}};
  for (const auto& [args, want] : cases) {
    const Result r = run_cli(args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(want), std::string::npos) << args << "\nexpected: " << want << "\n" << r.output;
    EXPECT_EQ(r.output.find("1797693134862315"), std::string::npos) << args << "\n" << r.output;
  }
  const Result ok = run_cli("bench --help");
  EXPECT_EQ(ok.status, 0) << ok.output;
  EXPECT_NE(ok.output.find("--chunk INT:N >= 0"), std::string::npos) << ok.output;
  EXPECT_NE(run_cli("bench --synthetic tiny-llama --chunk 0 -p 0 -n 0 -r 1").status, 2);  // 0 is valid
}

TEST_F(BadInputFlags, BenchTokensPastTheContext) {
  // tiny-llama (synthetic weights): context_length 4096. The read-ceiling probe runs after the weights are
  // made: its absence shows the error came first.
  const Result r = run_cli("bench --synthetic tiny-llama -p 99999 -n 0 -r 1");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("error: -p/--n-prompt 99999: exceeds the context of 4096 tokens (the model's "
                          "context_length; -c/--ctx-size raises it); expected 0..4096"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("read ceiling"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("set_position_limit"), std::string::npos) << r.output;
  // -c lowers the limit; the CPU decode rows prefill max(d, 1) tokens then decode n.
  expect("bench --synthetic tiny-llama -c 128 -p 0 -d 100 -n 29 -r 1", 1,
         "error: -d/--n-depth 100 + -n/--n-gen 29: 129 tokens exceed the context of 128 tokens (-c/--ctx-size)");
  expect("bench --synthetic tiny-llama -c 128 -p 0 -d 0 -n 128 -r 1", 1,
         "error: -d/--n-depth 0 + -n/--n-gen 128: 129 tokens");
  // At the limit it runs.
  const Result ok = run_cli("bench --synthetic tiny-llama -c 128 -p 128 -d 100 -n 28 -r 1 -o csv");
  EXPECT_EQ(ok.status, 0) << ok.output;
  EXPECT_NE(ok.output.find("\"tg28\""), std::string::npos) << ok.output;
}

TEST_F(BadInputFlags, RdFlagsAreNamed) {
  const std::string base = "rd --n 64 --bits 1,2 --n-seeds 1 ";
  expect(base + "--group-size 1000", 1,
         "error: --group-size 1000: kivi_key quantizes groups of that many vectors (tokens), and there are only 64 "
         "(--n / the data's rows): nothing would be quantized; expected --group-size ≤ 64");
  expect(base + "--group-size 0", 1, "error: --group-size 0: expected 1..65536");
  expect(base + "--rotation foo", 1, "error: --rotation 'foo': expected haar, hadamard or identity");
  expect(base + "--side foo", 1, "error: --side 'foo': expected key, value or any");
  expect(base + "--dim 100", 1, "error: --quantizers q4_0: llama.cpp's blocks hold 32 values; --dim / the data has 100");
  expect(base + "--dim 96 --quantizers tq_mse --rotation hadamard", 1,
         "error: --rotation hadamard: the randomized Hadamard transform needs a power-of-two dimension, --dim / the "
         "data has 96");
  expect(base + "--quantizers tq_mse,nope", 1, "error: --quantizers: unknown quantizer 'nope'");
  // A width listed twice (also across repeated --bits) was measured twice and, alone, reached fit_rd's
  // internal "all points have the same bit width"; one width printed an empty fit table (session 15).
  expect("rd --n 64 --quantizers tq_mse --n-seeds 1 --bits 2,2", 1, "error: --bits: 2 is listed twice");
  expect("rd --n 64 --quantizers tq_mse --n-seeds 1 --bits 2,3 --bits 3", 1, "error: --bits: 3 is listed twice");
  expect("rd --n 64 --quantizers tq_mse --n-seeds 1 --bits 3", 0,
         "no fit: D(b) = alpha * beta^(-b) needs at least two --bits widths");
  // Still accepted: a group that fits (64 vectors, groups of 32 tokens / channels), a non-power-of-two dim with
  // the Haar rotation and QuaRot.
  const Result r = run_cli(base + "--quantizers kivi_key,kivi_value,quarot,tq_mse --group-size 32 --dim 96");
  EXPECT_EQ(r.status, 0) << r.output;
  // QuaRot has no 1-bit width: named under the table (it was dropped silently).
  EXPECT_NE(r.output.find("quarot at 1 bit: not measured (symmetric QuaRot needs >= 2 code bits)"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("kivi_key"), std::string::npos) << r.output;
}

TEST_F(BadInputFlags, NegativeSeedsAreRefused) {
  // CLI11 parsed "-1" into a uint64_t as 2^64-1. A usage error (exit 2) naming --seed, for every command.
  const std::string msg = "--seed: a seed is an integer in 0..18446744073709551615, got ";
  for (const std::string cmd : {"bench --synthetic tiny-llama", "generate -p hi", "niah", "plan", "rd"}) {
    expect(cmd + " --seed -1", 2, msg + "'-1'");
    expect(cmd + " --seed 18446744073709551616", 2, msg + "'18446744073709551616'");
    expect(cmd + " --seed 1.5", 2, msg + "'1.5'");
  }
  // The whole range still parses and runs.
  const Result r = run_cli("rd --n 64 --bits 1,2 --quantizers tq_mse --n-seeds 1 --seed 18446744073709551615 --json -");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("\"seed\": 18446744073709551615"), std::string::npos) << r.output;
}

TEST_F(BadInputFlags, OutputDirectoryThatTakesNoFile) {
  // /proc accepts no new files, even for root (a chmod'ed directory would not stop root).
  expect("rd --n 64 --bits 1,2 --quantizers tq_mse --n-seeds 1 --json /proc/ratekv_test.json", 1,
         "error: --json: cannot write '/proc/ratekv_test.json': cannot create a file in '/proc'");
  if (::geteuid() != 0) {
    const fs::path ro = dir_ / "ro";
    fs::create_directories(ro);
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    expect("rd --n 64 --bits 1,2 --quantizers tq_mse --n-seeds 1 --json " + q(ro / "x.json"), 1,
           "cannot create a file in '" + ro.string() + "' (Permission denied)");
    fs::permissions(ro, fs::perms::owner_all);
  }
  // The probe leaves nothing behind.
  const Result ok = run_cli("rd --n 64 --bits 1,2 --quantizers tq_mse --n-seeds 1 --json " + q(dir_ / "ok.json"));
  EXPECT_EQ(ok.status, 0) << ok.output;
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir_.path())) entries += e.path().filename() != "ro";
  EXPECT_EQ(entries, 1);  // ok.json only
}

TEST_F(BadInputFlags, CalibrateOutputCheckedBeforeTheWeights) {
  const std::string smollm2 = ratekv_test::smollm2_path();
  if (!fs::exists(smollm2)) GTEST_SKIP() << "SmolLM2 asset missing: " << smollm2;
  const fs::path text = dir_ / "t.txt";
  std::ofstream(text) << "Some calibration text, long enough for a handful of tokens.\n";
  expect_error_before_weights("calibrate -m " + q(smollm2) + " -f " + q(text) +
                                  " --tokens 8 --ctx 8 -o /proc/ratekv_test.safetensors",
                              {"-o: cannot write '/proc/ratekv_test.safetensors': cannot create a file in '/proc'"});
}

TEST_F(BadInputFlags, NiahContextShorterThanThePrompt) {
  const std::string smollm2 = ratekv_test::smollm2_path();
  if (!fs::exists(smollm2)) GTEST_SKIP() << "SmolLM2 asset missing: " << smollm2;
  // SmolLM2's prompt scaffolding: 90 tokens at --ctx 64 (the needles depend on the context), + 16 of haystack.
  expect_error_before_weights("niah -m " + q(smollm2) + " --depths 2 --trials 1 --ctx 512,64",
                              {"error: --ctx 64: too short for the prompt", "need ≥ 106"});
}

TEST_F(BadInputFlags, BlockGtqKeyBudgetThatStoresNoKey) {
  // SmolLM2 statistics (committed): head_dim 64, so the cheapest key group (one RoPE block at 1 bit, padded to a
  // 16-channel tile, + its fp16 norm) is 32 bits = 0.5 bits per element; 4 bits on every block: 272 = 4.25.
  const std::string stats = std::string(RATEKV_SOURCE_DIR) + "/bench/results/niah_plans/ratequant-2.25.stats.json";
  if (!fs::exists(stats)) GTEST_SKIP() << "stats fixture missing: " << stats;
  const std::string base = "plan --method block-gtq --vbits 3 --stats " + q(stats) + " -o " + q(dir_ / "p.json");
  for (const std::string k : {"0", "0.49"})
    expect(base + " --kbits " + k, 1,
           "error: --kbits " + k + " (effective): block-gtq would store no key at all (the cheapest key group, one "
           "RoPE block at 1 bit with its fp16 norm and 16-channel tile, takes 32 bits per head at head_dim 64); "
           "expected 0.5..4.25 bits per element (b 0..4)");
  EXPECT_FALSE(fs::exists(dir_ / "p.json"));
  const Result ok = run_cli(base + " --kbits 0.5");
  EXPECT_EQ(ok.status, 0) << ok.output;
  EXPECT_TRUE(fs::exists(dir_ / "p.json"));
}

TEST_F(BadInputFlags, PlanOfAnotherModelFile) {
  const std::string smollm2 = ratekv_test::smollm2_path();
  if (!fs::exists(smollm2)) GTEST_SKIP() << "SmolLM2 asset missing: " << smollm2;
  // The committed Block-GTQ plan records the SmolLM2 asset's sha256 (b179c952…); the same plan with another
  // model's hash must be refused by every command that applies plans, before the weights load.
  const fs::path good = fs::path(RATEKV_SOURCE_DIR) / "bench/results/niah_plans/block-gtq-k3v3.plan.json";
  if (!fs::exists(good)) GTEST_SKIP() << "plan fixture missing: " << good;
  std::stringstream ss;
  ss << std::ifstream(good).rdbuf();
  const std::string real = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
  ASSERT_NE(ss.str().find(real), std::string::npos) << "the fixture's hash changed";
  const std::string other(64, 'a');
  const fs::path bad = dir_ / "other.plan.json";
  std::ofstream(bad) << std::regex_replace(ss.str(), std::regex(real), other);
  const fs::path text = dir_ / "t.txt";
  {
    std::ofstream o(text);
    for (int i = 0; i < 20; ++i) o << "A few words of text for a short perplexity run, line " << i << ".\n";
  }
  const std::string m = " -m " + q(smollm2) + " ";
  const std::string msg = "--plan " + bad.string() + ": the plan was made for the model file "
                          "'SmolLM2-135M-Instruct.Q4_1.gguf' with sha256 " + other + ", but -m '" + smollm2 +
                          "' has sha256 " + real;
  const std::string ppl = "perplexity" + m + "-f " + q(text) + " --cache packed -c 32 --chunks 1 --plan ";
  expect_error_before_weights(ppl + q(bad), {msg, "--no-plan-check"});
  expect_error_before_weights("eval" + m + "-f " + q(text) + " --tokens 64 --ctx 32 --plan " + q(bad), {msg});
  expect_error_before_weights("niah" + m + "--ctx 512 --depths 2 --trials 1 --plan " + q(bad), {msg});
  expect_error_before_weights("generate" + m + "-p hi -n 1 --cache packed --plan " + q(bad), {msg});
  expect("bench" + m + "-p 16 -n 0 -r 1 --plan " + q(bad), 1, msg);
  // The matching plan, and the other one with --no-plan-check, run (model-scale: not in the sanitizer build).
  if (std::getenv("RATEKV_SANITIZE_RUN")) GTEST_SKIP() << "model-scale CLI runs skipped in the sanitizer build";
  for (const std::string& run : {ppl + q(good), ppl + q(bad) + " --no-plan-check"}) {
    const Result r = run_cli(run);
    EXPECT_EQ(r.status, 0) << run << "\n" << r.output;
    EXPECT_NE(r.output.find("PPL = "), std::string::npos) << r.output;
  }
}

// Issue 22's adversarial pass on `ratekv bench` (synthetic models, nothing loaded):
//  - --layers past the model named the library (synthetic_config), not the flag and the model's layers;
//  - -p 0 -n 0 without --requests ran an empty table;
//  - --synthetic's help omitted the Gemma 3 models the flag accepts.
TEST_F(BadInputFlags, BenchLayersEmptyRunAndSyntheticHelp) {
  expect("bench --synthetic gemma-3-270m --layers 999", 1,
         "error: --layers 999: gemma-3-270m has 18 layers; expected 0..18 (0 = all)");
  EXPECT_EQ(run_cli("bench --synthetic gemma-3-270m --layers 999").output.find("synthetic_config"), std::string::npos);
  expect("bench --synthetic tiny-llama -p 0 -n 0 -r 1", 1,
         "error: -p/-n: every -p and -n is 0: no pp row and no tg row to run; expected a prompt length or a number of "
         "tokens to generate above 0 (or --requests)");
  const Result help = run_cli("bench --help");
  ASSERT_EQ(help.status, 0) << help.output;
  // The description (not CLI11's {choices} column, which lists them from the same table anyway).
  const size_t at = help.output.find("seeded random weights:");
  ASSERT_NE(at, std::string::npos) << help.output;
  const std::string line = help.output.substr(at, help.output.find('\n', at) - at);
  for (const std::string& name : ratekv::synthetic_model_names())
    EXPECT_NE(line.find(name), std::string::npos) << name << " missing from: " << line;
}

// Every comma-list flag refuses an empty item (CLI11's own splitting dropped it silently: "-p 16,," ran pp16
// only), naming the flag and the list; a good list of the same flag is read whole.
TEST_F(BadInputFlags, ListFlagsRefuseEmptyItems) {
  expect("bench --synthetic tiny-llama -p 16,, -n 0 -r 1", 2,
         "-p/--n-prompt: '16,,': item 2 is empty; expected values separated by single commas (e.g. 16,32)");
  expect("bench --synthetic tiny-llama -p 16 -n ,4 -r 1", 2, "-n/--n-gen: ',4': item 1 is empty");
  expect("bench --synthetic tiny-llama -p 16 -n 0 -b 1,,2 -r 1", 2, "-b/--batch: '1,,2': item 2 is empty");
  expect("bench --synthetic tiny-llama -p 16 -n 0 -ctk f16, -ctv f16 -r 1", 2,
         "--cache-type-k: 'f16,': item 2 is empty");
  expect("bench --synthetic tiny-llama -p 16,x -n 0 -r 1", 2, "-p/--n-prompt: 'x': expected an integer");
  expect("bench --synthetic tiny-llama -p 16 -n 0 -ctk f16,tq9 -ctv f16,f16 -r 1", 2, "--cache-type-k: tq9");
  expect("rd --bits 1,,3", 2, "--bits: '1,,3': item 2 is empty");
  const std::string any = q(cli_path());  // an existing file for -m / -f: the list is refused before it is read
  expect("calibrate --curves kivi, -m " + any + " -f " + any + " -o z", 2, "--curves: 'kivi,': item 2 is empty");
  expect("niah --ctx 128,,256 -m " + any, 2, "--ctx: '128,,256': item 2 is empty");
  expect("plan --method tasq --also cq,,tasq -o x", 2, "--also: 'cq,,tasq': item 2 is empty");
  // The same flags with good lists: -p 16,32 gives both rows, and repeating the flag adds to the list.
  const Result r = run_cli("bench --synthetic tiny-llama -p 16,32 -p 8 -n 0 -r 1 -o csv");
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* row : {"pp16", "pp32", "pp8"}) EXPECT_NE(r.output.find(row), std::string::npos) << r.output;
}

// --device cuda where it cannot run (issue 22's adversarial pass): one check (require_engine) in every command
// with --device, before anything loads, naming --device. A CUDA build without a visible GPU used to load the
// model first (bench: the synthetic weights; the others: the GGUF) and fail in the engine with "GPU engine: no
// CUDA device visible", naming no flag.
TEST_F(BadInputFlags, DeviceCudaWithoutAGpuIsRefusedBeforeAnythingLoads) {
#ifdef RATEKV_HAVE_ENGINE
  if (!ratekv::engine::cuda_device_name().empty()) GTEST_SKIP() << "a CUDA device is visible";
  const std::string why = "error: --device cuda: no CUDA device visible";
#else
  const std::string why = "error: --device cuda: this build of ratekv has no GPU engine (built without CUDA); use "
                          "--device cpu";
#endif
  const Result b = run_cli("bench --synthetic tiny-llama -p 16 -n 0 -r 1 --device cuda");
  EXPECT_EQ(b.status, 1) << b.output;
  EXPECT_NE(b.output.find(why), std::string::npos) << b.output;
  EXPECT_EQ(b.output.find("GPU engine:"), std::string::npos) << b.output;  // not the engine's, after the load
  const std::string smollm2 = ratekv_test::smollm2_path();
  if (!fs::exists(smollm2)) GTEST_SKIP() << "SmolLM2 asset missing: " << smollm2;
  const fs::path text = dir_ / "t.txt";
  std::ofstream(text) << "Some text to read. " << std::string(2000, 'a') << "\n";
  for (const std::string& cmd : std::vector<std::string>{"perplexity -f " + q(text) + " -c 64", "generate -p hi -n 2",
                                                         "niah --depths 2 --trials 1 --ctx 128", "bench -p 16 -n 0 -r 1"})
    expect_error_before_weights(cmd + " -m " + q(smollm2) + " --device cuda", {why});
}


// Issue 22's second adversarial pass: flags accepted where they do nothing, and calibrate's curve options refused
// only after the whole forward pass. m.gguf is not a model: every refusal here comes before anything is read.
TEST_F(BadInputFlags, FlagsThatDoNotApplyAreRefusedBeforeLoading) {
  std::ofstream(dir_ / "m.gguf") << "x";
  std::ofstream(dir_ / "t.txt") << "Some calibration text, long enough for a handful of tokens.\n";
  const std::string m = " -m " + q(dir_ / "m.gguf") + " ", f = " -f " + q(dir_ / "t.txt") + " ";
  // perplexity on the CPU: the report said "evaluation mode" for --prefill-mode serving.
  expect("perplexity" + m + f + "-c 32 --prefill-mode serving", 1,
         "error: --prefill-mode serving: the CPU caches always quantize before attention (evaluation); serving runs "
         "on --device cuda only");
  // bench: --layers with -m (it keeps the first N layers of --synthetic only), CUDA-only flags on the CPU.
  expect("bench" + m + "--layers 2 -p 16 -n 0 -r 1", 1,
         "error: --layers: applies to --synthetic only (-m " + (dir_ / "m.gguf").string() +
             " runs every layer of the model)");
  expect("bench --synthetic tiny-llama -p 16 -n 0 -r 1 --profile", 1,
         "error: --profile: the decode-step profile runs on --device cuda only");
  expect("bench --synthetic tiny-llama -p 16 -n 0 -r 1 --fp16-kernel 2", 1,
         "error: --fp16-kernel: selects the CUDA fp16 decode kernel; runs on --device cuda only");
  // --layers -1 printed CLI11's NonNegativeNumber range, DBL_MAX in full.
  const Result neg = run_cli("bench --synthetic tiny-llama -p 16 -n 0 -r 1 --layers -1");
  EXPECT_EQ(neg.status, 2) << neg.output;
  EXPECT_NE(neg.output.find("--layers: expected a whole number of layers ≥ 0 (0 = all), got '-1'"), std::string::npos)
      << neg.output;
  EXPECT_EQ(neg.output.find("1.79769"), std::string::npos) << neg.output;
#ifdef RATEKV_HAVE_TASQ
  // plan: --also-kmeans-seeds sets the --also variants' seeds; without --also it was ignored silently.
  expect("plan --method tasq" + m + f + "--kmeans-seeds 3 --also-kmeans-seeds 2 -o " + q(dir_ / "t.json"), 1,
         "error: --also-kmeans-seeds 2: needs --also");
#endif
  // calibrate: curve options before the model loads; --curve-bits without --curves, --sens-seqs/--sens-len
  // without --sensitivity; --tokens ≥ 2.
  const std::string cal = "calibrate" + m + f + "-o " + q(dir_ / "s.safetensors") + " ";
  expect(cal + "--tokens 8 --curves kivi,kivi", 1, "error: --curves: \"kivi\" given twice");
  expect(cal + "--tokens 8 --curves kivi --curve-bits 3", 1, "error: --curve-bits: need at least two widths, got 1");
  expect(cal + "--tokens 8 --curves kivi --curve-bits 2,2", 1, "error: --curve-bits: widths must be distinct");
  expect(cal + "--tokens 8 --curves kivi --curve-bits 0,1", 1, "error: --curve-bits: widths must be in 1..8 (got 0..1)");
  expect(cal + "--tokens 8 --curves kivi --curve-bits 9,10", 1,
         "error: --curve-bits: widths must be in 1..8 (got 9..10)");
  expect(cal + "--tokens 8 --curve-bits 2,3", 1,
         "error: --curve-bits: needs --curves (no distortion curves are measured without it)");
  for (const char* sens : {"--sens-seqs 4", "--sens-len 64"})
    expect(cal + "--tokens 8 " + sens, 1,
           "error: --sens-seqs/--sens-len: need --sensitivity (no gradient sensitivity is measured without it)");
  expect(cal + "--tokens 1", 1, "error: --tokens 1: expected ≥ 2 (the key covariance of one token is 0)");
  // The same command with good options gets as far as the model (which is not one).
  const Result r = run_cli(cal + "--tokens 8 --curves kivi --curve-bits 2,3");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(r.output.find("--curve"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("--tokens"), std::string::npos) << r.output;
}

// --prefill-mode serving on the CPU: bench and generate (default serving, which applies to cuda) accepted it and
// ignored it — bench's rows said prefill_mode "evaluation". Given, it is checked as perplexity and niah check it;
// evaluation (what the CPU runs) and the flag left out still run.
TEST_F(BadInputFlags, PrefillModeServingOnTheCpuIsRefused) {
  const std::string want =
      "error: --prefill-mode serving: the CPU caches always quantize before attention (evaluation); serving runs "
      "on --device cuda only";
  expect("bench --synthetic tiny-llama --device cpu --prefill-mode serving -p 16 -n 2 -r 1", 1, want);
  expect("bench --synthetic tiny-llama --prefill-mode serving -p 16 -n 2 -r 1", 1, want);  // cpu by default
  std::ofstream(dir_ / "m.gguf") << "x";  // not a model: the refusal comes before anything is read
  expect("generate -m " + q(dir_ / "m.gguf") + " -p hi --prefill-mode serving", 1, want);
  for (const std::string& mode : {std::string(" --prefill-mode evaluation"), std::string()}) {
    const fs::path out = dir_ / "rows.json";
    const Result r = run_cli("bench --synthetic tiny-llama --device cpu -p 16 -n 2 -r 1 -o json --force --out " +
                             q(out) + mode);
    ASSERT_EQ(r.status, 0) << mode << "\n" << r.output;
    const nlohmann::json j = nlohmann::json::parse(std::ifstream(out));
    ASSERT_EQ(j.at("rows").size(), 2u) << j.dump(1);
    for (const auto& row : j.at("rows")) EXPECT_EQ(row.at("prefill_mode"), "evaluation") << row.dump();
  }
}

// An empty path argument was read as the flag left out: niah --haystack '' took the default haystack, panel --calib ''
// ran the whole panel on the default text, bench --out '' / inspect -o '' / perplexity -o '' printed to stdout,
// rd --json '' and the other optional outputs wrote nothing. Each is now a usage error naming the flag and what
// it expects, before any work.
TEST_F(BadInputFlags, EmptyPathArgumentsAreRefused) {
  std::ofstream(dir_ / "m.gguf") << "x";  // not a model: the refusal comes before anything is read
  std::ofstream(dir_ / "t.txt") << "Some text.\n";
  const std::string m = " -m " + q(dir_ / "m.gguf") + " ", f = " -f " + q(dir_ / "t.txt") + " ";
  const std::pair<std::string, std::string> cases[] = {
      {"niah" + m + "--haystack ''",
       "--haystack: empty path; expected a directory of .txt files (without --haystack: $RATEKV_ASSETS/text/haystack)"},
      {"niah" + m + "--json ''", "--json: empty path; expected a file to write the JSON to"},
      {"bench --synthetic tiny-llama -p 16 -n 0 -r 1 --out ''",
       "--out: empty path; expected a file to write the table to (without --out: stdout)"},
      {"perplexity" + m + f + "-o ''",
       "--output: empty path; expected a file to write the report to (without -o: stdout)"},
      {"inspect" + m + "-o ''", "--output: empty path; expected a file to write the report to (without -o: stdout)"},
      {"eval" + m + f + "--json ''", "--json: empty path; expected a file to write the JSON report to"},
      {"eval" + m + f + "--json " + q(dir_ / "r.json") + " --plot ''",
       "--plot: empty path; expected a PNG file to write the plot to"},
      {"eval" + m + f + "--reference-cache ''",
       "--reference-cache: empty path; expected a directory of cached reference passes"},
      {"calibrate" + m + f + "--tokens 8 -o " + q(dir_ / "s.safetensors") + " --curves-json ''",
       "--curves-json: empty path; expected a file to write the JSON to"},
      {"panel -o " + q(dir_ / "panel") + " --calib ''",
       "--calib: empty path; expected a text file (without --calib: $RATEKV_ASSETS/text/calib.txt)"},
      {"panel -o " + q(dir_ / "panel") + " --eval ''",
       "--eval: empty path; expected a text file (without --eval: $RATEKV_ASSETS/text/eval.txt)"},
      {"rd --json ''", "--json: empty path; expected a file to write the JSON to, or - for stdout"}};
  // No assets for the children: a build that reads '' as the default fails on the missing default file (exit 1)
  // instead of running the panel or niah on the real assets for minutes.
  const char* had = std::getenv("RATEKV_ASSETS");
  const std::string saved = had ? had : "";
  ::setenv("RATEKV_ASSETS", (dir_ / "no_assets").c_str(), 1);
  for (const auto& [args, want] : cases) expect(args, 2, want);
  if (had) ::setenv("RATEKV_ASSETS", saved.c_str(), 1);
  else ::unsetenv("RATEKV_ASSETS");
  EXPECT_FALSE(fs::exists(dir_ / "panel"));
  // Left out, the defaults still apply: bench prints its table on stdout.
  const Result r = run_cli("bench --synthetic tiny-llama -p 16 -n 0 -r 1");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("| pp16 |"), std::string::npos) << r.output;
}

// An empty string where text is expected is a usage error naming the flag: generate -p '' said "give one of -p
// or --prompts-file" (as if -p were missing), plan --vquantizer '' silently meant "the --quantizer codec".
TEST_F(BadInputFlags, EmptyTextArgumentsAreRefused) {
  std::ofstream(dir_ / "m.gguf") << "x";  // not a model: the refusal comes before anything is read
  expect("generate -m " + q(dir_ / "m.gguf") + " -p ''", 2,
         "--prompt: empty; expected the prompt text (or --prompts-file for many)");
  expect("plan --method uniform --bits 3 --quantizer tq-mse --vquantizer '' -o " + q(dir_ / "p.json"), 2,
         "--vquantizer: empty; expected a codec name (leave --vquantizer out for the --quantizer codec)");
  EXPECT_FALSE(fs::exists(dir_ / "p.json"));
}

// CLI11 2.1 read integers with strtoll base 0 and floats with strtold: "064" was octal 52, "0x40" 64, an integer
// past int64 the saturated 9223372036854775807 (`-c 99999999999999999999` ran as that context) and "" the number 0
// (`--kbits ""` planned at 0 bits). Every integer or floating-point flag, and the items of list flags, now reads
// decimal only and in range (strict_number_options, parse_number).
TEST_F(BadInputFlags, NumbersAreDecimalAndInRange) {
  expect("rd --n 99999999999999999999", 2,
         "error: --n: '99999999999999999999' is out of range (expected -9223372036854775808..9223372036854775807)");
  expect("rd --n 0x40", 2, "error: --n: expected a decimal integer, got '0x40'");
  expect("rd --dim 12abc", 2, "error: --dim: expected a decimal integer, got '12abc'");
  expect("rd --bits 1,0x2", 2, "error: --bits: '0x2': expected an integer (decimal, in range)");
  expect("rd --bits 1,99999999999", 2, "error: --bits: '99999999999': expected an integer (decimal, in range)");
  expect("plan --method uniform --kbits '' --vbits 3 -o " + q(dir_ / "p.json"), 2,
         "error: --kbits: expected a decimal number, got ''");
  expect("plan --method uniform --kbits 0x1p1 --vbits 3 -o " + q(dir_ / "p.json"), 2,
         "error: --kbits: expected a decimal number, got '0x1p1'");
  EXPECT_FALSE(fs::exists(dir_ / "p.json"));
  expect("rd --n +-5", 2, "error: --n: expected a decimal integer, got '+-5'");
  // Within int64 but past a 32-bit flag: CLI11 said only "Could not convert: --dim = 2147483648".
  expect("rd --dim 2147483648", 2,
         "error: --dim: '2147483648' is out of range for this flag (expected an integer in -2147483648..2147483647)");
  // A finite number that passed a >= 0 test, then overflowed size_t as bytes.
  for (const char* gib : {"inf", "1e300"})
    expect(std::string("bench --synthetic tiny-llama -p 16 -n 0 -r 1 --pool-gib ") + gib, 1,
           "--pool-gib " + std::string(gib == std::string("inf") ? "inf" : "1e+300") +
               ": expected a number of GiB in 0..1048576");
  // Leading zeros and a plus sign read as decimal: 064 vectors are 64 (octal 52 before), +2 is 2.
  const Result r = run_cli("rd --n 064 --bits +1,02 --quantizers tq_mse --n-seeds 1 --json -");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("\"n_vectors\": 64,"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"bits_max\": 2.0"), std::string::npos) << r.output;
}

// Usage errors print on an 'error: ' line like every other error (CLI11's bare message before), and a
// first argument that is no command is named, with the commands (CLI11: "A subcommand is required").
TEST_F(BadInputFlags, UsageErrorsAndUnknownCommands) {
  expect("zz", 2, "error: unknown command 'zz' (expected one of: bench calibrate capture");
  expect("generate -m x -n 1e12", 2, "error: ");
  const Result none = run_cli("");
  EXPECT_EQ(none.status, 2) << none.output;
  EXPECT_NE(none.output.find("error: A subcommand is required"), std::string::npos) << none.output;
  EXPECT_EQ(run_cli("--help").status, 0);
}

// A batch no machine holds (bench -b 2147483647) allocated caches until it was killed (adversarial pass,
// session 15): refused after the first sequence's cache, from what that one holds.
TEST_F(BadInputFlags, BenchBatchBeyondMemory) {
  expect("bench --synthetic tiny-llama -p 0 -n 2 -b 2147483647 -r 1", 1,
         "error: -b 2147483647: 2147483647 sequences (fp16 cache, depth 1) need at least ");
  const Result ok = run_cli("bench --synthetic tiny-llama -p 0 -n 2 -b 2 -r 1");  // control: a batch that fits
  EXPECT_EQ(ok.status, 0) << ok.output;
}

// eval --ctx past the model's trained context failed after the reference pass had started (4.8 s, 3.7 GB
// in), naming Model::set_position_limit, a C++ API; now refused right after the model loads (session 15).
TEST_F(BadInputFlags, EvalContextPastTheModelsContext) {
  const std::string smollm2 = ratekv_test::smollm2_path();
  const std::string text = ratekv_test::assets_dir() + "/text/eval.txt";
  if (!fs::exists(smollm2) || !fs::exists(text)) GTEST_SKIP() << "SmolLM2 asset missing: " << smollm2;
  expect("eval -m " + q(smollm2) + " -f " + q(text) + " --baseline q8_0 --tokens 20000 --ctx 10000 --seeds 1", 1,
         "error: --ctx 10000: exceeds the model's context 8192 (-m '" + smollm2 + "')");
}

// A model whose logits overflow (SmolLM2 with output_norm.weight scaled to 1e6: finite weights, a mean NLL
// of ~1e31 nats) printed "PPL = inf +/- inf" with exit status 0 (adversarial pass, session 15); it is an
// error naming the model, the text and the non-finite value.
TEST_F(BadInputFlags, PerplexityThatOverflowsIsAnError) {
  const std::string smollm2 = ratekv_test::smollm2_path();
  const std::string text = ratekv_test::assets_dir() + "/text/eval.txt";
  if (!fs::exists(smollm2) || !fs::exists(text)) GTEST_SKIP() << "SmolLM2 asset missing: " << smollm2;
  std::vector<uint8_t> bytes;
  {
    std::ifstream in(smollm2, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  size_t at = 0, n = 0;
  {
    const ratekv::GgufFile g = ratekv::GgufFile::parse(bytes, smollm2);
    const ratekv::GgufTensor& t = g.tensor("output_norm.weight");
    ASSERT_EQ(t.type, ratekv::GgmlType::F32);
    at = static_cast<size_t>(t.data - bytes.data());
    n = static_cast<size_t>(t.n_elements());
  }
  for (size_t i = 0; i < n; ++i) {
    const float big = 1e6f;
    std::memcpy(bytes.data() + at + 4 * i, &big, 4);
  }
  const fs::path model = dir_ / "overflow.gguf", small = dir_ / "small.txt";
  std::ofstream(model, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                                static_cast<std::streamsize>(bytes.size()));
  {
    std::ifstream in(text, std::ios::binary);
    std::string head(4000, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    std::ofstream(small, std::ios::binary) << head.substr(0, static_cast<size_t>(in.gcount()));
  }
  const Result r = run_cli("perplexity -m " + q(model) + " -f " + q(small) + " -c 64 --chunks 1");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("error: perplexity of -m '" + model.string() + "' on -f '" + small.string() +
                          "' is not finite"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("PPL = "), std::string::npos) << r.output;
  // Control: the unpatched model on the same text gives a finite perplexity and exit status 0.
  const Result ok = run_cli("perplexity -m " + q(smollm2) + " -f " + q(small) + " -c 64 --chunks 1");
  EXPECT_EQ(ok.status, 0) << ok.output;
  EXPECT_NE(ok.output.find("PPL = "), std::string::npos) << ok.output;
}

// generate --json (and --max-batch) without --prompts-file were accepted and ignored (adversarial pass, session 16):
// both shape the many-request run (one JSON report of every request; the sequences decoded together), and a
// single -p prompt prints its continuation as text. Refused before the model is read, naming the flag.
TEST_F(BadInputFlags, GenerateManyRequestFlagsNeedPromptsFile) {
  std::ofstream(dir_ / "m.gguf") << "x";  // not a model: the refusal comes before anything is read
  const std::string g = "generate -m " + q(dir_ / "m.gguf") + " -p hi -n 1 ";
  expect(g + "--json", 1,
         "error: --json: needs --prompts-file (the JSON report of many requests); a single -p prompt prints its "
         "continuation as text");
  expect(g + "--max-batch 4", 1,
         "error: --max-batch: needs --prompts-file (the sequences of many requests decoded together); a single -p "
         "prompt is one sequence");
  // Control: without them the command gets as far as the model (which is not one).
  const Result r = run_cli(g);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(r.output.find("--json"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("--max-batch"), std::string::npos) << r.output;
}

// generate --top-k / --top-p with greedy decoding (--temp 0, the default) were accepted and silently unused
// (adversarial pass, session 16). Harmless, so a warning on stderr, not an error: only for a flag given on the
// command line (not its default), and not when --temp samples.
TEST_F(BadInputFlags, SamplingFlagsUnderGreedyDecodingWarn) {
  std::ofstream(dir_ / "m.gguf") << "x";  // not a model: the warning comes before it is read
  const std::string g = "generate -m " + q(dir_ / "m.gguf") + " -p hi -n 1 ";
  const std::pair<std::string, std::string> cases[] = {
      {"--top-k 5", "[warning] --top-k 5: no effect with --temp 0 (greedy decoding takes the most likely token)"},
      {"--top-k 5 --temp 0",
       "[warning] --top-k 5: no effect with --temp 0 (greedy decoding takes the most likely token)"},
      {"--top-p 0.9", "[warning] --top-p 0.9: no effect with --temp 0 (greedy decoding takes the most likely token)"},
      {"--top-k 40", "[warning] --top-k 40: no effect"}};  // the default value, given explicitly
  for (const auto& [args, want] : cases) {
    const Result r = run_cli(g + args);
    EXPECT_NE(r.output.find(want), std::string::npos) << args << "\nexpected: " << want << "\n" << r.output;
    EXPECT_EQ(r.output.find("internal"), std::string::npos) << r.output;
  }
  for (const std::string args : {"", "--temp 0", "--temp 0.7 --top-k 5"}) {
    const Result r = run_cli(g + args);
    EXPECT_EQ(r.output.find("no effect"), std::string::npos) << args << "\n" << r.output;
  }
  // A real run: the warning once, the text still generated (exit 0).
  const std::string smollm2 = ratekv_test::smollm2_path();
  if (!fs::exists(smollm2)) GTEST_SKIP() << "SmolLM2 asset missing: " << smollm2;
  const Result ok = run_cli("generate -m " + q(smollm2) + " -p hi -n 2 --top-k 5");
  EXPECT_EQ(ok.status, 0) << ok.output;
  const std::string w = "[warning] --top-k 5: no effect";
  const size_t at = ok.output.find(w);
  EXPECT_NE(at, std::string::npos) << ok.output;
  if (at != std::string::npos) {
    EXPECT_EQ(ok.output.find(w, at + 1), std::string::npos) << ok.output;
  }
}

}  // namespace

// A bad --log-level is a usage error (exit 2, as the help's exit-status footer says), not a run failure; a
// repeated niah --ctx ran the same grid row twice.
TEST_F(BadInputFlags, LogLevelAndRepeatedNiahContext) {
  expect("--log-level bogus rd --n 64 --bits 1,2", 2, "error: --log-level: bogus not in {trace,debug,info,warn,error,off}");
  std::ofstream(dir_ / "m.gguf") << "x";  // not a model: the refusal comes before anything is read
  expect("niah -m " + q(dir_ / "m.gguf") + " --ctx 128,256,128", 1,
         "error: --ctx: 128 is listed twice (each context length is one row of the grid)");
}
