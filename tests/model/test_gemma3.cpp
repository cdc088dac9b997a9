// Gemma 3 270M (Q4_K_M GGUF) against llama.cpp (tests/fixtures/gemma3/, made
// by tools/make_reference_fixtures.sh --model gemma3): the SentencePiece-style
// tokenizer (exact ids), the forward pass (logits within a recorded bound,
// greedy continuations), perplexity within 1 %, and the configuration read
// from the GGUF (sliding-window pattern, two RoPE bases). Skips when the model
// is absent (tools/fetch_assets.sh).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "ratekv/io/gguf.h"
#include "ratekv/model/model.h"
#include "ratekv/model/perplexity.h"
#include "ratekv/model/tokenizer.h"

#include "../support/llamacpp_fixtures.h"

using namespace ratekv;
using testing_support::assets_dir;
namespace fs = std::filesystem;

namespace {

// Bound on max |Δlogit| vs llama.cpp over the stored entries (32 top + 256
// fixed ids per position, 3 prompts). llama.cpp evaluates GELU through an
// fp16 lookup table (ggml_vec_geglu_f32 with GGML_GELU_FP16: input and output
// rounded to fp16), we compute it in fp32, so the bound is looser than
// SmolLM2's (SwiGLU, 1e-3).
constexpr double kMaxAbsLogitDiffLlama = 0.05;  // measured 0.0318 (chat), 0.0128, 0.0072

std::string model_path() { return ratekv_test::gemma3_path(); }

std::string fixture(const std::string& name) {
  return std::string(RATEKV_SOURCE_DIR) + "/tests/fixtures/gemma3/" + name;
}

nlohmann::json load_fixture(const std::string& name) { return testing_support::load_json_or_null(fixture(name)); }

std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += std::to_string(id) + " ";
  return s;
}

// The file and its tokenizer for the whole suite; the model (dequantized,
// ~1.1 GB fp32) only for the forward tests.
class Gemma3 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(model_path())) return;
    file_ = std::make_unique<GgufFile>(GgufFile::open(model_path()));
    tok_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(*file_));
  }
  static void TearDownTestSuite() {
    model_.reset();
    tok_.reset();
    file_.reset();
  }
  void SetUp() override {
    if (!file_) GTEST_SKIP() << "Gemma 3 GGUF not found at " << model_path() << " (run tools/fetch_assets.sh)";
  }
  static Model& model() {
    if (!model_) model_ = std::make_unique<Model>(Model::load(*file_));
    return *model_;
  }
  static std::unique_ptr<GgufFile> file_;
  static std::unique_ptr<Tokenizer> tok_;
  static std::unique_ptr<Model> model_;
};
std::unique_ptr<GgufFile> Gemma3::file_;
std::unique_ptr<Tokenizer> Gemma3::tok_;
std::unique_ptr<Model> Gemma3::model_;

}  // namespace

TEST_F(Gemma3, ConfigFromMetadata) {
  const ModelConfig c = ModelConfig::from_gguf(*file_);
  EXPECT_EQ(c.arch, "gemma3");
  EXPECT_EQ(c.n_layers, 18);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 1);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.d_model, 640);
  EXPECT_EQ(c.d_ff, 2048);
  EXPECT_EQ(c.n_vocab, 262144);
  EXPECT_EQ(c.rope_layout, RopeLayout::NeoX);
  EXPECT_EQ(c.ffn_act, FfnActivation::GeluTanh);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.post_norms);
  EXPECT_FLOAT_EQ(c.embd_scale, std::sqrt(640.0f));
  EXPECT_FLOAT_EQ(c.attention_scale(), 1.0f / 16.0f);
  EXPECT_EQ(c.final_logit_softcap, 0.0f);  // the file has no final_logit_softcapping
  EXPECT_EQ(c.sliding_window, 512);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c.rope_theta_swa, 1e4);
  // Period 6: layers 5, 11, 17 global, the rest sliding (llama.cpp's pattern).
  for (int l = 0; l < c.n_layers; ++l) {
    const bool global = l % 6 == 5;
    EXPECT_EQ(c.is_sliding(l), !global) << "layer " << l;
    EXPECT_EQ(c.layer_window(l), global ? 0 : 512) << "layer " << l;
    EXPECT_DOUBLE_EQ(c.layer_rope_theta(l), global ? 1e6 : 1e4) << "layer " << l;
  }
}

TEST_F(Gemma3, TokenizerMetadata) {
  const Tokenizer& t = *tok_;
  EXPECT_EQ(t.model_type(), "llama");
  EXPECT_EQ(t.n_vocab(), 262144);
  EXPECT_EQ(t.bos_id(), 2);
  EXPECT_EQ(t.eos_id(), 1);
  EXPECT_TRUE(t.pre_tokenizer_regexes().empty());
  EXPECT_TRUE(t.is_eog(1));
  EXPECT_TRUE(t.is_eog(106));  // <end_of_turn>
  EXPECT_EQ(t.token_text(106), "<end_of_turn>");
  // add_bos_token is true: BOS first when asked, never otherwise.
  const auto with = t.encode("Hello world", true), without = t.encode("Hello world", false);
  ASSERT_EQ(with.size(), without.size() + 1);
  EXPECT_EQ(with[0], 2);
  EXPECT_EQ(std::vector<int32_t>(with.begin() + 1, with.end()), without);
  EXPECT_EQ(t.decode(without), "Hello world");
  // Byte fallback: BEL (0x07) has no piece; its byte token "<0x07>" is 238 + 7.
  EXPECT_EQ(t.token_text(245), "<0x07>");
  EXPECT_EQ(t.encode("\x07", false), std::vector<int32_t>{245});
  EXPECT_EQ(t.decode(std::vector<int32_t>{245}), "\x07");
}

TEST_F(Gemma3, TokenizerMatchesLlamaCppFixture) {
  const auto j = load_fixture("tokenizer.json");
  ASSERT_FALSE(j.is_null()) << "missing " << fixture("tokenizer.json");
  ASSERT_EQ(j.at("model_sha256").get<std::string>(), "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818");
  ASSERT_GE(j.at("cases").size(), 20u);
  for (const auto& c : j.at("cases")) {
    const std::string name = c.at("name");
    const std::string text = c.at("text");
    const auto want = c.at("ids").get<std::vector<int32_t>>();
    const auto got = tok_->encode(text, c.at("add_bos").get<bool>(), c.at("parse_special").get<bool>());
    EXPECT_EQ(got, want) << "case " << name << "\n got:  " << show(got) << "\n want: " << show(want);
    ASSERT_FALSE(got.empty());
    EXPECT_EQ(got[0], 2) << "case " << name << ": BOS first";
    EXPECT_EQ(tok_->decode(std::span<const int32_t>(got).subspan(1)), text) << "case " << name;
  }
}

// 10.7 KB of seeded random bytes incl. invalid UTF-8, control bytes and
// special-token texts (tools/ref/tokenizer_stress_fixture.py on this model).
TEST_F(Gemma3, TokenizerMatchesLlamaCppOnStressBytes) {
  const auto j = load_fixture("tokenizer_stress.json");
  ASSERT_FALSE(j.is_null()) << "missing " << fixture("tokenizer_stress.json");
  const std::string hex = j.at("text_hex");
  std::string text;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    text.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  const auto want = j.at("ids").get<std::vector<int32_t>>();
  const auto got = tok_->encode(text, j.at("add_bos"), j.at("parse_special"));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "first difference at id index " << i;
}

TEST_F(Gemma3, MatchesLlamaCppLogits) {
  const auto j = load_fixture("logits.json");
  ASSERT_FALSE(j.is_null()) << "missing " << fixture("logits.json");
  const auto r = testing_support::check_llamacpp_logits(model(), j, 2 * kMaxAbsLogitDiffLlama, tok_.get());
  EXPECT_LE(r.max_abs_diff, kMaxAbsLogitDiffLlama);
  EXPECT_GE(r.top1_checked, 20);
}

TEST_F(Gemma3, MatchesLlamaCppGreedy) {
  if (const char* s = std::getenv("RATEKV_SANITIZE_RUN"); s && std::string(s) == "1")
    GTEST_SKIP() << "96 decode steps over a 262144-row LM head: skipped in the sanitizer run";
  const auto j = load_fixture("greedy.json");
  ASSERT_FALSE(j.is_null()) << "missing " << fixture("greedy.json");
  testing_support::check_llamacpp_greedy(model(), j, kMaxAbsLogitDiffLlama, tok_.get());
}

// llama-perplexity -c 512 --chunks 4 on the evaluation text (BOS replaces the
// first token of every window): ours within 1 % of llama.cpp's fp32 run on the
// same dequantized weights.
TEST_F(Gemma3, PerplexityWithinOnePercentOfLlamaCpp) {
  if (const char* s = std::getenv("RATEKV_SANITIZE_RUN"); s && std::string(s) == "1")
    GTEST_SKIP() << "model-scale perplexity skipped in the sanitizer run";
  const auto j = load_fixture("perplexity.json");
  ASSERT_FALSE(j.is_null()) << "missing " << fixture("perplexity.json");
  const std::string text_path = assets_dir() + "/" + j.at("eval_text").get<std::string>();
  std::ifstream in(text_path, std::ios::binary);
  if (!in) GTEST_SKIP() << "no evaluation text at " << text_path;
  std::string text(48 * 1024, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  std::vector<int32_t> tokens = tok_->encode(text, /*add_bos=*/true);
  ASSERT_GE(tokens.size(), 4u * 512u + 100u);
  tokens.resize(4 * 512 + 100);
  const nlohmann::json* ref = nullptr;
  for (const auto& r : j.at("runs"))
    if (r.at("n_ctx") == 512 && r.at("n_chunks") == 4 && r.at("name") == "f32_weights_kv_f32") ref = &r;
  ASSERT_NE(ref, nullptr) << "perplexity.json has no f32_weights_kv_f32 run at n_ctx 512, 4 chunks";
  Model& m = model();
  auto cache = m.make_dense_cache(512);
  const PerplexityResult r = perplexity(m, cache, tokens, 512, 4, /*add_bos=*/true, tok_->bos_id());
  const double want = ref->at("ppl").get<double>();
  std::printf("perplexity c=512 x4: ours %.4f +/- %.4f (%lld scored), llama.cpp fp32 %.4f\n", r.ppl, r.ppl_err,
              static_cast<long long>(r.n_scored), want);
  EXPECT_EQ(r.n_scored, ref->at("scored_tokens").get<int64_t>());
  EXPECT_NEAR(r.ppl, want, 0.01 * want);
}
