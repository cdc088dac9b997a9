// The library names its parameters (ratekv::ParamError: "PlanRequest.k_bits"),
// the CLI names its flags: with_flag_names (cli/flag_names.h) maps one to the
// other, and an error the library raises for a flag's value still reaches the
// user naming the flag ("--kbits 70: ..."), with the library's detail. No
// model is needed: `ratekv plan` reads a JSON statistics file written here.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "../support/temp_dir.h"
#include "cli/flag_names.h"
#include "cli_runner.h"
#include "ratekv/calib/distortion_curves.h"
#include "ratekv/calib/kv_stats.h"
#include "ratekv/common/param_error.h"

using ratekv_test::cli_path;
using ratekv_test::run_cli;
using ratekv_test::shell_quote;
using ratekv_test::TempDir;

namespace {

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ratekv::ParamError& e) {
    return std::string("ParamError[") + e.param() + "] " + e.what();
  } catch (const ratekv::Error& e) {
    return std::string("Error ") + e.what();
  }
  return "(no error)";
}

TEST(FlagNames, ListedParametersBecomeFlags) {
  using ratekv::cli::with_flag_names;
  const ratekv::cli::FlagNames names = {{"PlanRequest.k_bits", "--kbits"}, {"CurveMeasureOptions.bits", "--curve-bits"}};
  EXPECT_EQ(message_of([&] {
              with_flag_names(names, [] { ratekv::fail_param("PlanRequest.k_bits", "{}: expected 0..64", 70); });
            }),
            "Error --kbits 70: expected 0..64");
  // A detail that starts with ':' joins without a space, in the library and in the CLI.
  EXPECT_EQ(message_of([] { ratekv::fail_param("CurveMeasureOptions.bits", ": need two widths"); }),
            "ParamError[CurveMeasureOptions.bits] CurveMeasureOptions.bits: need two widths");
  EXPECT_EQ(message_of([&] {
              with_flag_names(names, [] { ratekv::fail_param("CurveMeasureOptions.bits", ": need two widths"); });
            }),
            "Error --curve-bits: need two widths");
  // Not listed: the library's name stays; other errors pass unchanged; no error, no exception.
  EXPECT_EQ(message_of([&] {
              with_flag_names(names, [] { ratekv::fail_param("PlanRequest.v_bits", "{}: expected 0..64", -1); });
            }),
            "ParamError[PlanRequest.v_bits] PlanRequest.v_bits -1: expected 0..64");
  EXPECT_EQ(message_of([&] { with_flag_names(names, [] { ratekv::fail("plan.json: bad"); }); }),
            "Error plan.json: bad");
  EXPECT_EQ(message_of([&] { with_flag_names(names, [] {}); }), "(no error)");
  // Other listed parameters in the detail are named by their flags too (each occurrence; a name that is a
  // prefix of another listed one is not replaced inside it).
  const ratekv::cli::FlagNames more = {{"PlanRequest.b", "--b"}, {"PlanRequest.b_min", "--bmin"},
                                       {"PlanRequest.avg_bits", "--bits"}};
  EXPECT_EQ(message_of([&] {
              with_flag_names(more, [] {
                ratekv::fail_param("PlanRequest.avg_bits", "{}: below 3 (PlanRequest.b_min); PlanRequest.b_min "
                                   "and PlanRequest.b; PlanRequest.v_bits", 2.5);
              });
            }),
            "Error --bits 2.5: below 3 (--bmin); --bmin and --b; PlanRequest.v_bits");
}

class CliFlagNames : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(cli_path())) GTEST_SKIP() << "ratekv CLI not built at " << cli_path();
    // One layer, one KV head, head_dim 4: two RoPE blocks.
    std::ofstream(dir_ / "stats.json") << R"({"format": "ratekv-calib-stats", "version": 1,
      "model": {"arch": "llama", "n_layers": 1, "n_kv_heads": 1, "head_dim": 4, "rope_layout": "interleaved"},
      "q_block_energy": [[[4.0, 1.0]]], "k_block_energy": [[[2.0, 0.5]]],
      "sensitivity": {"grad": {"k": [[2.0]], "v": [[1.0]]}},
      "curves": {"tq-mse": {"bits": [1, 2, 3, 4, 5], "beta_k": 3.5, "beta_v": 3.5, "alpha_k": [[1.0]], "alpha_v": [[1.0]]}}})";
  }
  // `ratekv plan` with these arguments must fail with exit 1 and exactly this error line.
  void expect_error(const std::string& args, const std::string& error, const std::string& stats = "stats.json") {
    const auto r = run_cli(args + " --stats " + shell_quote((dir_ / stats).string()) + " -o " +
                           shell_quote((dir_ / "p.json").string()));
    EXPECT_EQ(r.status, 1) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("error: " + error + "\n"), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find("PlanRequest."), std::string::npos) << "library name leaked: " << r.output;
    EXPECT_FALSE(fs::exists(dir_ / "p.json")) << args;
  }
  // stats.json with its "sensitivity" (and "curves") members replaced.
  void write_stats(const std::string& name, const std::string& sensitivity, const std::string& curves) {
    std::ofstream(dir_ / name) << R"({"format": "ratekv-calib-stats", "version": 1,
      "model": {"arch": "llama", "n_layers": 1, "n_kv_heads": 1, "head_dim": 4, "rope_layout": "interleaved"},
      "q_block_energy": [[[4.0, 1.0]]], "k_block_energy": [[[2.0, 0.5]]], )"
                               << sensitivity << (sensitivity.empty() ? "" : ", ") << R"("curves": )" << curves << "}";
  }
  TempDir dir_{"cli_flag_names"};
};

TEST_F(CliFlagNames, LibraryErrorsNameTheFlag) {
  expect_error("plan --method block-gtq --kbits 70",
               "--kbits 70: expected a finite number of bits per element in 0..64");
  expect_error("plan --method uniform --budget-unit code --kbits 2.5",
               "--kbits 2.5: with budget unit \"code\" a uniform codec needs a whole number of bits");
  expect_error("plan --method uniform --bmin 3 --bmax 2", "--bmax 2: uniform needs a highest width in 3..8");
  expect_error("plan --method ratequant --budget-unit code --bits 3 --sensitivity fisher",
               "--sensitivity \"fisher\": not in the statistics file (it has: grad; \"none\" weighs every component 1)");
  expect_error("plan --method ratequant --bits 3 --key-weight 0",
               "--key-weight 0: expected a factor in 1e-6..1e6 (1 = the sensitivities as measured)");
  expect_error("plan --method block-gtq --key-weight 2",
               "--key-weight: not used by --method block-gtq: it sets RateQuant's allocation (--method ratequant, "
               "ratequant+block-gtq, or uniform with --bits)");
  expect_error("plan --method uniform --quantizer kivi --group-size 3",
               "--group-size 3: expected a divisor of head_dim 4 for kivi");
  expect_error("plan --method uniform --fp16-window -1", "--fp16-window -1: expected >= 0");
  // --bits NaN / negative used to be dropped silently (the plan took (kbits+vbits)/2).
  expect_error("plan --method ratequant --bits nan", "--bits nan: expected a finite number of bits per element in 0..64");
  expect_error("plan --method ratequant --bits -2", "--bits -2: expected a finite number of bits per element in 0..64");
  // Options block-gtq does not use used to be ignored silently.
  expect_error("plan --method block-gtq --quantizer kivi --group-size 4",  // 4: a divisor of head_dim 4
               "--quantizer \"kivi\": block-gtq quantizes with tq-mse only (other codecs: method uniform or ratequant)");
  expect_error("plan --method block-gtq --bits 2",
               "--bits 2: block-gtq takes separate key and value budgets (k_bits, v_bits); an average budget is for "
               "ratequant and the uniform baseline");
  // --log-level is checked by CLI11 now (a usage error, exit 2): BadInputFlags.LogLevelAndRepeatedNiahContext.
  // A negative --bmin / --bmax used to select the method's default silently.
  for (const char* flag : {"--bmin -2", "--bmax -1"}) {
    const auto u = run_cli(std::string("plan --method block-gtq ") + flag + " --stats " +
                           shell_quote((dir_ / "stats.json").string()) + " -o " + shell_quote((dir_ / "p.json").string()));
    EXPECT_EQ(u.status, 2) << flag << "\n" << u.output;
    EXPECT_NE(u.output.find(std::string(flag).substr(0, 6) + ": Value"), std::string::npos) << u.output;
  }
  // The same statistics make a plan when the flags are right (the errors above are the flags').
  // (head_dim 4: the packed format pads a group to a 16-channel tile, so 2-bit values store 16·2 + 16 = 48
  // bits, 12 per element, and 8 bits per element of keys (32 bits) afford one 1-bit tile with its norm.)
  const auto r = run_cli("plan --method block-gtq --kbits 8 --vbits 12 --stats " +
                         shell_quote((dir_ / "stats.json").string()) + " -o " + shell_quote((dir_ / "ok.json").string()));
  EXPECT_EQ(r.status, 0) << r.output;
}

// Issue 22's adversarial pass: RateQuant inputs that gave a degenerate plan (every key at 1 bit, the budget unused,
// a predicted distortion of 0), flags a method ignored silently, and messages that named no flag or read "it
// has: none". Each is refused with exit 1, naming the flag (and the stats file and field, the side, the range).
TEST_F(CliFlagNames, RateQuantDegenerateInputsAndIgnoredFlags) {
  const std::string tq = R"({"tq-mse": {"bits": [1, 2, 3, 4, 5], "beta_k": 3.5, "beta_v": 3.5, "alpha_k": [[1.0]],
                              "alpha_v": [[1.0]]}})";
  const std::string tq_gtq = R"({"tq-mse": {"bits": [1, 2, 3, 4, 5], "beta_k": 3.5, "beta_v": 3.5, "alpha_k": [[1.0]],
                              "alpha_v": [[1.0]]}, "block-gtq": {"bits": [1, 2, 3, 4, 5], "beta_k": 3.5, "beta_v": 3.5,
                              "alpha_k": [[1.0]], "alpha_v": [[1.0]]}})";
  write_stats("zk.json", R"("sensitivity": {"grad": {"k": [[0.0]], "v": [[1.0]]}})", tq);
  write_stats("zv.json", R"("sensitivity": {"grad": {"k": [[2.0]], "v": [[0.0]]}})", tq);
  write_stats("z.json", R"("sensitivity": {"grad": {"k": [[0.0]], "v": [[0.0]]}})", tq);
  write_stats("nosens.json", "", tq);
  write_stats("gtq.json", R"("sensitivity": {"grad": {"k": [[2.0]], "v": [[1.0]]}})", tq_gtq);
  const std::string tail = ": RateQuant would give every key its lowest width and predict no distortion from the "
                           "keys; expected positive sensitivities on both sides (re-measure them, or use \"none\" to "
                           "weigh every component 1)";
  expect_error("plan --method ratequant --budget-unit code --bits 3",
               "--sensitivity \"grad\": every key sensitivity in zk.json is 0 (field sensitivity.grad.k, 1 "
               "components)" + tail,
               "zk.json");
  expect_error("plan --method uniform --bits 2.5 --budget-unit code",  // the uniform split reads them too
               "--sensitivity \"grad\": every key sensitivity in zk.json is 0 (field sensitivity.grad.k, 1 "
               "components)" + tail,
               "zk.json");
  expect_error("plan --method ratequant --budget-unit code --bits 3",
               "--sensitivity \"grad\": every value sensitivity in zv.json is 0 (field sensitivity.grad.v, 1 "
               "components): RateQuant would give every value its lowest width and predict no distortion from the "
               "values; expected positive sensitivities on both sides (re-measure them, or use \"none\" to weigh "
               "every component 1)",
               "zv.json");
  expect_error("plan --method ratequant --budget-unit code --bits 3",
               "--sensitivity \"grad\": every sensitivity in z.json is 0 (fields sensitivity.grad.k and "
               "sensitivity.grad.v, 1 components each): RateQuant would predict no distortion at any width; expected "
               "positive sensitivities (re-measure them, or use \"none\" to weigh every component 1)",
               "z.json");
  // "it has: none" read as the estimator named "none".
  expect_error("plan --method ratequant --budget-unit code --bits 3",
               "--sensitivity \"grad\": not in the statistics file (the file has no sensitivity estimators (ratekv "
               "calibrate --sensitivity measures them); \"none\" weighs every component 1)",
               "nosens.json");
  // --key-weight outside 1e-6..1e6: 1e-300 made every key's weight vanish, 1e308 overflowed into a --bits message.
  for (const char* w : {"1e-300", "1e-7", "1e7", "1e308"})
    expect_error(std::string("plan --method ratequant --budget-unit code --bits 3 --key-weight ") + w,
                 "--key-weight " + std::string(w == std::string("1e-300") ? "1e-300"
                                               : w == std::string("1e-7") ? "1e-07"
                                               : w == std::string("1e7")  ? "10000000"
                                                                          : "1e+308") +
                     ": expected a factor in 1e-6..1e6 (1 = the sensitivities as measured)");
  // Flags of RateQuant's allocation given to a method that allocates without it.
  const std::string why = ": it sets RateQuant's allocation (--method ratequant, ratequant+block-gtq, or uniform "
                          "with --bits)";
  expect_error("plan --method tasq --key-weight 2", "--key-weight: not used by --method tasq" + why);
  expect_error("plan --method cq --sensitivity grad", "--sensitivity: not used by --method cq" + why);
  expect_error("plan --method cq --curves-from kivi", "--curves-from: not used by --method cq" + why);
  expect_error("plan --method block-gtq --sensitivity none", "--sensitivity: not used by --method block-gtq" + why);
  expect_error("plan --method uniform --kbits 3 --vbits 3 --sensitivity none",
               "--sensitivity: not used by --method uniform with --kbits/--vbits" + why);
  expect_error("plan --method uniform --kbits 3 --vbits 3 --curves-from kivi",
               "--curves-from: not used by --method uniform with --kbits/--vbits" + why);
  // A budget below every component at its lowest width names the budget flag (and --bmin when it sets the width).
  expect_error("plan --method ratequant+block-gtq --budget-unit code --bits 0.5",
               "--bits 0.5 (code bits per element): below what ratequant+block-gtq reaches with the \"block-gtq\" "
               "curves: every component at its lowest width, 1 code bits (the curves' lowest fitted width), stores 1 "
               "bits per element; expected at least 1",
               "gtq.json");
  expect_error("plan --method ratequant+block-gtq --budget-unit code --bits 2.5 --bmin 3",
               "--bits 2.5 (code bits per element): below what ratequant+block-gtq reaches with the \"block-gtq\" "
               "curves: every component at its lowest width, 3 code bits (--bmin), stores 3 bits per element; "
               "expected at least 3",
               "gtq.json");
  expect_error("plan --method ratequant+block-gtq --budget-unit code --bits 3 --bmax 2",
               "--bits 3 (code bits per element): above what ratequant+block-gtq reaches with the \"block-gtq\" "
               "curves: every component at its widest width, 2 code bits (--bmax), stores 2 bits per element; "
               "expected at most 2 bits per element",
               "gtq.json");
  expect_error("plan --method ratequant --budget-unit code --kbits 1 --vbits 0",
               "--kbits 1 and --vbits 0: a mean of 0.5 (code bits per element): below what ratequant reaches with the \"tq-mse\" curves: every "
               "component at its lowest width, 1 code bits (the curves' lowest fitted width), stores 1 bits per "
               "element; expected at least 1");
  // The refusals are the inputs': the same flags with good inputs make plans.
  for (const std::string& args :
       {std::string("plan --method ratequant --budget-unit code --bits 3 --sensitivity none --stats ") + shell_quote((dir_ / "z.json").string()),
        std::string("plan --method ratequant --budget-unit code --bits 3 --key-weight 1e-6 --stats ") + shell_quote((dir_ / "stats.json").string()),
        std::string("plan --method ratequant+block-gtq --budget-unit code --bits 3 --bmin 3 --stats ") +
            shell_quote((dir_ / "gtq.json").string())}) {
    const auto r = run_cli(args + " --force -o " + shell_quote((dir_ / "ok.json").string()));
    EXPECT_EQ(r.status, 0) << args << "\n" << r.output;
  }
}


// The same refusal on a safetensors statistics file (what `ratekv calibrate` writes) names the tensors the
// sensitivities are sums of, not the JSON form's fields (sensitivity.grad.k is no name in that file). One layer,
// one KV head, head_dim 4, written through KVStats::save; tq-mse curves measured as 4^-b and fitted.
TEST_F(CliFlagNames, RateQuantDegenerateSensitivitiesNameTheSafetensorsTensors) {
  auto write = [&](const std::string& name, double gk, double gv, double kbe) {
    ratekv::calib::KVStats s;
    s.model.arch = "llama";
    s.model.n_layers = 1;
    s.model.n_kv_heads = 1;
    s.model.head_dim = 4;
    s.model.rope_layout = "interleaved";
    s.n_heads = 1;
    s.text_file = "calib.txt";
    s.n_tokens = 8;
    s.ctx = 8;
    s.q_block_energy = {4.0, 1.0};
    s.k_block_energy = {kbe, kbe};
    s.k_pre_mean = std::vector<double>(4, 0.0);
    s.k_pre_cov = std::vector<double>(16, 0.0);
    s.q_pre_sq = std::vector<double>(4, 1.0);
    s.v_sq = std::vector<double>(4, 1.0);
    s.grad = {.n_sequences = 1, .seq_len = 8, .mean_loss = 2.0, .k_pre_sq = std::vector<double>(4, gk),
              .k_post_sq = std::vector<double>(4, gk), .v_sq = std::vector<double>(4, gv)};
    ratekv::calib::QuantizerCurves c;
    c.bits = {1, 2, 3, 4, 5};
    for (double b : c.bits) c.mse_k.push_back(std::pow(4.0, -b));
    c.mse_v = c.mse_k;
    ratekv::calib::fit_curves(c, 1);
    s.curves["tq-mse"] = c;
    s.save((dir_ / name).string());
  };
  write("zk.safetensors", 0.0, 1.0, 1.0);
  write("zv.safetensors", 2.0, 0.0, 1.0);
  write("z.safetensors", 0.0, 0.0, 1.0);
  write("za.safetensors", 2.0, 1.0, 0.0);  // activation sensitivity of the keys: the sums of k_block_energy
  const std::string rq = "plan --method ratequant --budget-unit code --bits 3";
  expect_error(rq,
               "--sensitivity \"grad\": every key sensitivity in zk.safetensors is 0 (tensor grad_sq_k_post, 1 "
               "components): RateQuant would give every key its lowest width and predict no distortion from the "
               "keys; expected positive sensitivities on both sides (re-measure them, or use \"none\" to weigh every "
               "component 1)",
               "zk.safetensors");
  expect_error(rq,
               "--sensitivity \"grad\": every value sensitivity in zv.safetensors is 0 (tensor grad_sq_v, 1 "
               "components): RateQuant would give every value its lowest width and predict no distortion from the "
               "values; expected positive sensitivities on both sides (re-measure them, or use \"none\" to weigh "
               "every component 1)",
               "zv.safetensors");
  expect_error(rq,
               "--sensitivity \"grad\": every sensitivity in z.safetensors is 0 (tensors grad_sq_k_post and "
               "grad_sq_v, 1 components each): RateQuant would predict no distortion at any width; expected positive "
               "sensitivities (re-measure them, or use \"none\" to weigh every component 1)",
               "z.safetensors");
  expect_error(rq + " --sensitivity activation",
               "--sensitivity \"activation\": every key sensitivity in za.safetensors is 0 (tensor k_block_energy, 1 "
               "components): RateQuant would give every key its lowest width and predict no distortion from the "
               "keys; expected positive sensitivities on both sides (re-measure them, or use \"none\" to weigh every "
               "component 1)",
               "za.safetensors");
  // Control: the same file format with positive sensitivities makes a plan.
  write("ok.safetensors", 2.0, 1.0, 1.0);
  const auto r = run_cli(rq + " --stats " + shell_quote((dir_ / "ok.safetensors").string()) + " -o " +
                         shell_quote((dir_ / "ok.json").string()));
  EXPECT_EQ(r.status, 0) << r.output;
}

// Fractional curve widths (issue 22's adversarial pass): curves fitted "at 1.5..5.5 bits" were accepted and rounded
// inward (RateQuant then handed out 2..5), though widths are whole code bits. Refused, naming the file and the
// field as the file spells it: the JSON form's curves.<q>.bits[i], the safetensors metadata's
// __metadata__ curves.<q>.bits[i] (that file: a good one written by KVStats::save, its metadata patched in place).
TEST_F(CliFlagNames, FractionalCurveWidthsAreRefused) {
  const std::string sens = R"("sensitivity": {"grad": {"k": [[2.0]], "v": [[1.0]]}})";
  write_stats("frac.json", sens, R"({"tq-mse": {"bits": [1, 2.5, 3, 4, 5], "beta_k": 3.5, "beta_v": 3.5,
                                     "alpha_k": [[1.0]], "alpha_v": [[1.0]]}})");
  write_stats("range.json", sens, R"({"tq-mse": {"bits": [1, 2, 3, 4, 17], "beta_k": 3.5, "beta_v": 3.5,
                                      "alpha_k": [[1.0]], "alpha_v": [[1.0]]}})");
  const std::string rq = "plan --method ratequant --budget-unit code --bits 3";
  expect_error(rq,
               "frac.json: curves.tq-mse.bits[1] = 2.5: expected ascending distinct integer code widths in 0..16",
               "frac.json");
  expect_error(rq, "range.json: curves.tq-mse.bits[4] = 17: expected ascending distinct integer code widths in 0..16",
               "range.json");
  ratekv::calib::KVStats s;
  s.model.arch = "llama";
  s.model.n_layers = 1;
  s.model.n_kv_heads = 1;
  s.model.head_dim = 4;
  s.model.rope_layout = "interleaved";
  s.n_heads = 1;
  s.text_file = "calib.txt";
  s.n_tokens = 8;
  s.ctx = 8;
  s.q_block_energy = {4.0, 1.0};
  s.k_block_energy = {2.0, 0.5};
  s.k_pre_mean = std::vector<double>(4, 0.0);
  s.k_pre_cov = std::vector<double>(16, 0.0);
  s.q_pre_sq = std::vector<double>(4, 1.0);
  s.v_sq = std::vector<double>(4, 1.0);
  ratekv::calib::QuantizerCurves c;
  c.bits = {1, 2, 3, 4, 5};
  for (double b : c.bits) c.mse_k.push_back(std::pow(4.0, -b));
  c.mse_v = c.mse_k;
  ratekv::calib::fit_curves(c, 1);
  s.curves["tq-mse"] = c;
  const fs::path good = dir_ / "good.safetensors", frac = dir_ / "frac.safetensors";
  s.save(good.string());
  std::string bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::string from = "[1.0,2.0,3.0,4.0,5.0]", to = "[1.0,2.5,3.0,4.0,5.0]";  // same length: header intact
  const size_t at = bytes.find(from);
  ASSERT_NE(at, std::string::npos) << "the widths as KVStats::save writes them";
  bytes.replace(at, from.size(), to);
  std::ofstream(frac, std::ios::binary) << bytes;
  expect_error(rq,
               frac.string() + ": __metadata__ curves.tq-mse.bits[1] = 2.5: expected ascending distinct integer code "
               "widths in 0..16",
               "frac.safetensors");
  // Control: the unpatched file makes a plan (it has no gradient sensitivity: the activation one).
  const auto r = run_cli(rq + " --sensitivity activation --stats " + shell_quote(good.string()) + " -o " +
                         shell_quote((dir_ / "ok.json").string()));
  EXPECT_EQ(r.status, 0) << r.output;
}

// Issue 22's second adversarial pass. (A) statistics whose query/key block energies are all 0 gave a Block-GTQ
// plan with every key block dropped (exit 0, a warning naming the budget); (B) flags the method or codec ignores
// were accepted silently (exit 0): each is refused naming the flag and what it does not apply to.
TEST_F(CliFlagNames, DegenerateBlockEnergiesAndIgnoredFlags) {
  std::ofstream(dir_ / "zero.json") << R"({"format": "ratekv-calib-stats", "version": 1,
      "model": {"arch": "llama", "n_layers": 1, "n_kv_heads": 1, "head_dim": 4, "rope_layout": "interleaved"},
      "q_block_energy": [[[0.0, 0.0]]], "k_block_energy": [[[0.0, 0.0]]],
      "sensitivity": {"grad": {"k": [[2.0]], "v": [[1.0]]}},
      "curves": {"tq-mse": {"bits": [1, 2, 3, 4, 5], "beta_k": 3.5, "beta_v": 3.5, "alpha_k": [[1.0]], "alpha_v": [[1.0]]}}})";
  expect_error("plan --method block-gtq --kbits 8 --vbits 12",
               "--stats zero.json: fields q_block_energy and k_block_energy are 0 in every RoPE block of 1 of 1 "
               "(layer, KV head)s (first: layer 0 KV head 0): block-gtq's objective J = Σ s_i 4^(−b_i) over the block "
               "energies s_i = (E q_i² + E k_i²)/2 is 0 at every allocation there, so every key block would be "
               "dropped; expected statistics with positive query/key energies (re-run ratekv calibrate)",
               "zero.json");
  // --bits is the average budget of both sides: with --kbits / --vbits it is a conflict (the budget stayed K3V3).
  expect_error("plan --method ratequant --bits 3 --kbits 2 --vbits 5",
               "--kbits: conflicts with --bits (the average budget of keys and values); give --bits alone, or "
               "--kbits and --vbits");
  expect_error("plan --method uniform --bits 3 --vbits 2",
               "--vbits: conflicts with --bits (the average budget of keys and values); give --bits alone, or "
               "--kbits and --vbits");
  expect_error("plan --method ratequant --bits 3 --curves-from ''",
               "--curves-from: empty; expected the quantizer whose distortion curves to allocate with");
  // Codec options on codecs that have no such option.
  expect_error("plan --method uniform --quantizer kivi --group-size 4 --norm-correction",
               "--norm-correction: not used by --method uniform with --quantizer kivi: it applies to TQ-MSE codecs "
               "(tq-mse, block-gtq)");
  expect_error("plan --method uniform --quantizer q8_0 --vquantizer fp16 --bmin 3",
               "--bmin: not used by --method uniform with --quantizer q8_0 --vquantizer fp16: fixed-width codecs "
               "(q8_0, q4_0, fp16) take no width bounds");
  expect_error("plan --method uniform --quantizer q8_0 --bmax 8",
               "--bmax: not used by --method uniform with --quantizer q8_0: fixed-width codecs (q8_0, q4_0, fp16) "
               "take no width bounds");
  expect_error("plan --method uniform --quantizer fp16 --seed 3",
               "--seed: not used by --method uniform with --quantizer fp16: it seeds the rotations of tq-mse, "
               "block-gtq and quarot codecs");
  expect_error("plan --method uniform --quantizer fp16 --norm-correction",
               "--norm-correction: not used by --method uniform with --quantizer fp16: it applies to TQ-MSE codecs "
               "(tq-mse, block-gtq)");
  expect_error("plan --method block-gtq --group-size 4",
               "--group-size: not used by --method block-gtq: it is the scale group of kivi and quarot codecs");
  // TaSQ / CQ fitting flags on the methods that allocate from statistics.
  for (const char* f : {"--group 4", "--tokens 100", "--also cq", "--fisher", "--centroids 16", "--ctx 64",
                        "--kmeans-seeds 2", "--no-grouping"})
    for (const char* m : {"uniform", "block-gtq"}) {
      const std::string flag = std::string(f).substr(0, std::string(f).find(' '));
      expect_error(std::string("plan --method ") + m + " " + f,
                   flag + ": not used by --method " + m + ": it applies to --method tasq and cq (vector-quantized "
                   "keys fitted on -f text)");
    }
  // The codecs with those options still take them.
  const auto ok = run_cli("plan --method uniform --quantizer kivi --vquantizer tq-mse --norm-correction --group-size 2 "
                          "--seed 5 --bmin 2 --budget-unit code --stats " + shell_quote((dir_ / "stats.json").string()) + " -o " +
                          shell_quote((dir_ / "ok.json").string()));
  EXPECT_EQ(ok.status, 0) << ok.output;
}

// Flags --method cq / tasq ignore (the fit takes its widths from --group/--centroids, its values from --vquantizer):
// the adversarial line "--vquantizer fp16 --kbits 2 --vbits 7 --bmin 3 --budget-unit code --group-size 16
// --quantizer kivi" exited 0. Refused before the model loads (no -m needed to see it).
TEST_F(CliFlagNames, VqMethodsRefuseTheAllocationFlags) {
  for (const char* f : {"--kbits 2", "--vbits 7", "--bits 3", "--bmin 3", "--bmax 4", "--budget-unit code",
                        "--group-size 16", "--quantizer kivi"})
    for (const char* m : {"cq", "tasq"}) {
      const std::string flag = std::string(f).substr(0, std::string(f).find(' '));
      const auto r = run_cli(std::string("plan --method ") + m + " --vquantizer fp16 " + f + " -o " +
                             shell_quote((dir_ / "p.json").string()));
      EXPECT_EQ(r.status, 1) << f << "\n" << r.output;
      EXPECT_NE(r.output.find("error: " + flag + ": not used by --method " + m +
                              ": it fits vector-quantized keys on -f text (widths from --group and --centroids, values "
                              "from --vquantizer)\n"),
                std::string::npos)
          << f << "\n" << r.output;
    }
}

}  // namespace
