// The SmolLM2 tokenizer built from the real GGUF against llama.cpp's token ids
// (tests/fixtures/smollm2/tokenizer.json, written by
// tools/ref/tokenizer_fixture.py with llama-tokenize). Exact id equality on
// every case, and decode(encode(text)) == text. Skips when the model is absent.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../support/assets.h"
#include "ratekv/io/gguf.h"
#include "ratekv/model/tokenizer.h"

using namespace ratekv;

namespace {

// The SmolLM2 GGUF (tests/support/assets.h), "" when absent.
std::string model_path() {
  const std::string p = ratekv_test::smollm2_path();
  return std::filesystem::exists(p) ? p : "";
}

class SmolLM2Tokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = model_path();
    if (path.empty()) return;
    file_ = new GgufFile(GgufFile::open(path));
    tok_ = new Tokenizer(Tokenizer::from_gguf(*file_));
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete file_;
    tok_ = nullptr;
    file_ = nullptr;
  }
  void SetUp() override {
    if (!tok_) GTEST_SKIP() << "SmolLM2 GGUF not found under $RATEKV_ASSETS/models (run tools/fetch_assets.sh)";
  }
  static GgufFile* file_;
  static Tokenizer* tok_;
};
GgufFile* SmolLM2Tokenizer::file_ = nullptr;
Tokenizer* SmolLM2Tokenizer::tok_ = nullptr;

std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += std::to_string(id) + " ";
  return s;
}

}  // namespace

TEST_F(SmolLM2Tokenizer, Metadata) {
  const Tokenizer& t = *tok_;
  EXPECT_EQ(t.n_vocab(), 49152);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.pre_type(), "smollm");
  EXPECT_EQ(t.token_text(1), "<|im_start|>");
  EXPECT_TRUE(t.is_eog(2));  // <|im_end|>
  EXPECT_TRUE(t.is_eog(0));  // <|endoftext|>
  EXPECT_FALSE(t.is_eog(1));
  // tokenizer.ggml.add_bos_token is false: no BOS even when asked.
  EXPECT_EQ(t.encode("Hello", true), t.encode("Hello", false));
}

TEST_F(SmolLM2Tokenizer, MatchesLlamaCppFixture) {
  const std::string fixture = std::string(RATEKV_SOURCE_DIR) + "/tests/fixtures/smollm2/tokenizer.json";
  std::ifstream in(fixture);
  ASSERT_TRUE(in.good()) << "missing " << fixture << " (tools/make_reference_fixtures.sh writes it)";
  const nlohmann::json j = nlohmann::json::parse(in);
  ASSERT_GE(j.at("cases").size(), 10u);
  for (const auto& c : j.at("cases")) {
    const std::string name = c.at("name");
    const std::string text = c.at("text");
    const bool add_bos = c.at("add_bos");
    const bool parse_special = c.at("parse_special");
    const auto want = c.at("ids").get<std::vector<int32_t>>();
    const auto got = tok_->encode(text, add_bos, parse_special);
    EXPECT_EQ(got, want) << "case " << name << "\n got:  " << show(got) << "\n want: " << show(want);
    EXPECT_EQ(tok_->decode(got), text) << "case " << name;
  }
}

// 10.7 KB of seeded random bytes (tools/ref/tokenizer_stress_fixture.py):
// every Unicode block the pre-tokenizer distinguishes, invalid UTF-8,
// surrogates, control bytes without a token, special-token texts.
TEST_F(SmolLM2Tokenizer, MatchesLlamaCppOnStressBytes) {
  const std::string fixture = std::string(RATEKV_SOURCE_DIR) + "/tests/fixtures/smollm2/tokenizer_stress.json";
  std::ifstream in(fixture);
  ASSERT_TRUE(in.good()) << "missing " << fixture;
  const nlohmann::json j = nlohmann::json::parse(in);
  const std::string hex = j.at("text_hex");
  ASSERT_EQ(hex.size() % 2, 0u);
  std::string text;
  for (size_t i = 0; i < hex.size(); i += 2) text.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  const auto want = j.at("ids").get<std::vector<int32_t>>();
  const auto got = tok_->encode(text, j.at("add_bos"), j.at("parse_special"));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "first difference at id index " << i;
}
