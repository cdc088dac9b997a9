// Qwen2.5-Coder-0.5B and -1.5B (Q4_K_M GGUFs) against llama.cpp
// (tests/fixtures/qwen2.5-coder-{0.5b,1.5b}/, made by
// tools/make_reference_fixtures.sh --model qwen05|qwen15): the qwen2
// pre-tokenizer and byte-level BPE (exact ids on 35 cases and a random-bytes
// stress file; the two models share one vocabulary and one fixture), the
// Qwen special tokens, the forward pass (logits within a recorded bound on
// llama.cpp's fp32 run of the same dequantized weights, greedy
// continuations), perplexity within 1 % on the same windows, and the config.
//
// The 0.5B model is in the default asset fetch (CI runs these tests; the
// sanitizer stage skips the model-scale ones). The 1.5B model (7 GB of fp32
// weights once loaded) is opt-in twice: tools/fetch_assets.sh
// --with-qwen-1.5b, and RATEKV_TEST_QWEN15=1 for its model-scale tests (its
// tokenizer tests run whenever the file is present).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>

#include "ratekv/io/gguf.h"
#include "ratekv/model/model.h"
#include "ratekv/model/perplexity.h"
#include "ratekv/model/tokenizer.h"

#include "../support/llamacpp_fixtures.h"

using namespace ratekv;
using testing_support::assets_dir;
namespace fs = std::filesystem;

namespace {

constexpr const char* kSha05 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32";
constexpr const char* kSha15 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046";

bool env_is(const char* name, const char* value) {
  const char* s = std::getenv(name);
  return s && std::string(s) == value;
}

struct QwenCase {
  const char* name;     // test-name suffix
  std::string (*path)();
  const char* fixtures;  // directory under tests/fixtures
  const char* sha256;
  bool opt_in;           // model-scale tests need RATEKV_TEST_QWEN15=1
};

void PrintTo(const QwenCase& c, std::ostream* os) { *os << c.name; }

const QwenCase kQwen05{"Coder05B", ratekv_test::qwen05_path, "qwen2.5-coder-0.5b", kSha05, false};
const QwenCase kQwen15{"Coder15B", ratekv_test::qwen15_path, "qwen2.5-coder-1.5b", kSha15, true};

std::string fixture(const std::string& dir, const std::string& name) {
  return std::string(RATEKV_SOURCE_DIR) + "/tests/fixtures/" + dir + "/" + name;
}

std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += std::to_string(id) + " ";
  return s;
}

// One loaded file + tokenizer per model for the whole suite; the weights
// (2.5 GB / 7.1 GB as fp32) only when a forward test asks.
struct Loaded {
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<Model> model;
};

class Qwen2 : public ::testing::TestWithParam<QwenCase> {
 protected:
  static Loaded& slot(const QwenCase& c) {
    static Loaded l05, l15;
    return c.sha256 == kSha05 ? l05 : l15;
  }
  static void TearDownTestSuite() {
    for (const QwenCase* c : {&kQwen05, &kQwen15}) {
      Loaded& l = slot(*c);
      l.model.reset();
      l.tok.reset();
      l.file.reset();
    }
  }
  void SetUp() override {
    const QwenCase& c = GetParam();
    const std::string p = c.path();
    if (!fs::exists(p))
      GTEST_SKIP() << "Qwen2.5 GGUF not found at " << p << " (run tools/fetch_assets.sh"
                   << (c.opt_in ? " --with-qwen-1.5b)" : ")");
    Loaded& l = slot(c);
    if (!l.file) {
      l.file = std::make_unique<GgufFile>(GgufFile::open(p));
      l.tok = std::make_unique<Tokenizer>(Tokenizer::from_gguf(*l.file));
    }
  }
  // Why a model-scale test of this model must not run here ("" = it may).
  std::string model_scale_skip() const {
    if (env_is("RATEKV_SANITIZE_RUN", "1")) return "model-scale test skipped in the sanitizer run";
    if (GetParam().opt_in && !env_is("RATEKV_TEST_QWEN15", "1"))
      return "the 1.5B model's forward tests are opt-in (RATEKV_TEST_QWEN15=1; 7 GB of fp32 weights)";
    return "";
  }
  Tokenizer& tok() { return *slot(GetParam()).tok; }
  GgufFile& file() { return *slot(GetParam()).file; }
  Model& model() {
    Loaded& l = slot(GetParam());
    if (!l.model) l.model = std::make_unique<Model>(Model::load(*l.file));
    return *l.model;
  }
  nlohmann::json load(const std::string& name) {
    return testing_support::load_json_or_null(fixture(GetParam().fixtures, name));
  }
};

}  // namespace

TEST_P(Qwen2, ConfigFromMetadata) {
  const ModelConfig c = ModelConfig::from_gguf(file());
  const bool small = GetParam().sha256 == kSha05;
  EXPECT_EQ(c.arch, "qwen2");
  EXPECT_EQ(c.n_layers, small ? 24 : 28);
  EXPECT_EQ(c.n_heads, small ? 14 : 12);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, small ? 64 : 128);
  EXPECT_EQ(c.d_model, small ? 896 : 1536);
  EXPECT_EQ(c.d_ff, small ? 4864 : 8960);
  EXPECT_EQ(c.n_vocab, 151936);
  EXPECT_EQ(c.n_ctx_train, 32768);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_layout, RopeLayout::NeoX);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.post_norms);
  EXPECT_TRUE(c.layer_sliding.empty());
  EXPECT_EQ(c.ffn_act, FfnActivation::SiLU);
  EXPECT_FLOAT_EQ(c.embd_scale, 1.0f);
  EXPECT_FLOAT_EQ(c.attention_scale(), 1.0f / std::sqrt(static_cast<float>(c.head_dim)));
  EXPECT_NEAR(c.rms_eps, 1e-6f, 1e-12f);
  // Untied LM head: both files carry output.weight.
  EXPECT_NE(file().find_tensor("output.weight"), nullptr);
}

TEST_P(Qwen2, TokenizerMetadata) {
  const Tokenizer& t = tok();
  EXPECT_EQ(t.model_type(), "gpt2");
  EXPECT_EQ(t.pre_type(), "qwen2");
  EXPECT_EQ(t.n_vocab(), 151936);
  EXPECT_EQ(t.bos_id(), 151643);
  EXPECT_EQ(t.eos_id(), 151645);
  EXPECT_EQ(t.token_text(151644), "<|im_start|>");
  EXPECT_EQ(t.token_text(151645), "<|im_end|>");
  // End of generation: EOS <|im_end|>, <|endoftext|>, and the FIM pad /
  // repository / file-separator tokens (llama.cpp's EOG set for Qwen).
  for (int32_t id : {151643, 151645, 151662, 151663, 151664}) EXPECT_TRUE(t.is_eog(id)) << id;
  for (int32_t id : {151644, 151659, 151660, 151661, 151657, 198}) EXPECT_FALSE(t.is_eog(id)) << id;
  // add_bos_token is false: nothing is prepended either way.
  EXPECT_EQ(t.encode("Hello world", true), t.encode("Hello world", false));
  EXPECT_EQ(t.encode("Hello world", false), (std::vector<int32_t>{9707, 1879}));
  // Digits one at a time (\p{N} single), a word keeps one leading non-letter.
  EXPECT_EQ(t.decode(t.encode("x=12345;\tfoo", false)), "x=12345;\tfoo");
  EXPECT_EQ(t.encode("12345", false).size(), 5u);
}

TEST_P(Qwen2, TokenizerMatchesLlamaCppFixture) {
  // One fixture for both models (same vocabulary and merges; the generator
  // checked that llama-tokenize gives the 1.5B file the same ids).
  const auto j = testing_support::load_json_or_null(fixture("qwen2.5-coder-0.5b", "tokenizer.json"));
  ASSERT_FALSE(j.is_null()) << "missing tests/fixtures/qwen2.5-coder-0.5b/tokenizer.json";
  ASSERT_EQ(j.at("model_sha256").get<std::string>(), kSha05);
  if (GetParam().sha256 == kSha15) {
    ASSERT_TRUE(j.contains("also_checked"));
    ASSERT_EQ(j.at("also_checked").at(0).get<std::string>(), kSha15);
  }
  ASSERT_GE(j.at("cases").size(), 30u);
  for (const auto& c : j.at("cases")) {
    const std::string name = c.at("name");
    const std::string text = c.at("text");
    const auto want = c.at("ids").get<std::vector<int32_t>>();
    const auto got = tok().encode(text, c.at("add_bos").get<bool>(), c.at("parse_special").get<bool>());
    EXPECT_EQ(got, want) << "case " << name << "\n got:  " << show(got) << "\n want: " << show(want);
    EXPECT_EQ(tok().decode(got), text) << "case " << name;
  }
}

// 10.7 KB of seeded random bytes incl. invalid UTF-8, control bytes and
// special-token texts (tools/ref/tokenizer_stress_fixture.py on this vocabulary).
TEST_P(Qwen2, TokenizerMatchesLlamaCppOnStressBytes) {
  const auto j = testing_support::load_json_or_null(fixture("qwen2.5-coder-0.5b", "tokenizer_stress.json"));
  ASSERT_FALSE(j.is_null()) << "missing tests/fixtures/qwen2.5-coder-0.5b/tokenizer_stress.json";
  if (GetParam().sha256 == kSha15) {
    ASSERT_EQ(j.at("also_checked").at(0).get<std::string>(), kSha15);
  }
  const std::string hex = j.at("text_hex");
  std::string text;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    text.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  const auto want = j.at("ids").get<std::vector<int32_t>>();
  const auto got = tok().encode(text, j.at("add_bos"), j.at("parse_special"));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "first difference at id index " << i;
}




// ---------------------------------------------------------------------------
// Forward pass against llama.cpp's fp32 run of the same dequantized weights
// ---------------------------------------------------------------------------

namespace {

// Bound on max |Δlogit| vs llama.cpp over the stored entries (32 top + 256
// fixed ids per position, 3 prompts); both sides are fp32 on the same
// weights (SwiGLU: no lookup table as for Gemma's GELU), so only summation
// order differs.
constexpr double kMaxAbsLogitDiffLlama = 2e-4;  // measured 3.4e-5 (0.5B)

}  // namespace

TEST_P(Qwen2, MatchesLlamaCppLogits) {
  if (const std::string why = model_scale_skip(); !why.empty()) GTEST_SKIP() << why;
  const auto j = load("logits.json");
  ASSERT_FALSE(j.is_null()) << "missing " << fixture(GetParam().fixtures, "logits.json");
  ASSERT_EQ(j.at("model_sha256").get<std::string>(), GetParam().sha256);
  const auto r = testing_support::check_llamacpp_logits(model(), j, 2 * kMaxAbsLogitDiffLlama, &tok());
  EXPECT_LE(r.max_abs_diff, kMaxAbsLogitDiffLlama);
  EXPECT_GE(r.top1_checked, 40);
}

TEST_P(Qwen2, MatchesLlamaCppGreedy) {
  if (const std::string why = model_scale_skip(); !why.empty()) GTEST_SKIP() << why;
  const auto j = load("greedy.json");
  ASSERT_FALSE(j.is_null()) << "missing " << fixture(GetParam().fixtures, "greedy.json");
  ASSERT_EQ(j.at("model_sha256").get<std::string>(), GetParam().sha256);
  testing_support::check_llamacpp_greedy(model(), j, kMaxAbsLogitDiffLlama, &tok());
}

// llama-perplexity -c 512 --chunks 4 on the evaluation text (no BOS): ours
// on its first two windows within 0.1 % of llama.cpp's fp32 run on the same
// weights over the same two windows (its running PPL after chunk 2; two
// windows, not four, to keep CI's time: `ratekv perplexity` gives all four).
TEST_P(Qwen2, PerplexityMatchesLlamaCpp) {
  if (const std::string why = model_scale_skip(); !why.empty()) GTEST_SKIP() << why;
  const auto j = load("perplexity.json");
  ASSERT_FALSE(j.is_null()) << "missing " << fixture(GetParam().fixtures, "perplexity.json");
  ASSERT_EQ(j.at("model_sha256").get<std::string>(), GetParam().sha256);
  const std::string text_path = assets_dir() + "/" + j.at("eval_text").get<std::string>();
  std::ifstream in(text_path, std::ios::binary);
  if (!in) GTEST_SKIP() << "no evaluation text at " << text_path;
  std::string text(24 * 1024, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  std::vector<int32_t> tokens = tok().encode(text, /*add_bos=*/true);
  ASSERT_GE(tokens.size(), 2u * 512u + 100u);
  tokens.resize(2 * 512 + 100);
  const nlohmann::json* ref = nullptr;
  for (const auto& r : j.at("runs"))
    if (r.at("n_ctx") == 512 && r.at("n_chunks") == 4 && r.at("name") == "f32_weights_kv_f32") ref = &r;
  ASSERT_NE(ref, nullptr) << "perplexity.json has no f32_weights_kv_f32 run at n_ctx 512, 4 chunks";
  Model& m = model();
  auto cache = m.make_dense_cache(512);
  const PerplexityResult r = perplexity(m, cache, tokens, 512, 2, /*add_bos=*/false, tok().bos_id());
  const double want = ref->at("running_ppl_per_chunk").at(1).get<double>();
  std::printf("perplexity c=512 x2: ours %.4f +/- %.4f (%lld scored), llama.cpp fp32 %.4f (4 windows: %.4f)\n", r.ppl,
              r.ppl_err, static_cast<long long>(r.n_scored), want, ref->at("ppl").get<double>());
  EXPECT_EQ(r.n_scored, ref->at("scored_tokens").get<int64_t>() / 2);
  EXPECT_NEAR(r.ppl, want, 0.001 * want);
}

INSTANTIATE_TEST_SUITE_P(Models, Qwen2, ::testing::Values(kQwen05, kQwen15),
                         [](const ::testing::TestParamInfo<QwenCase>& i) { return std::string(i.param.name); });
