// NIAH scoring and needles: exact-digit scoring, deterministic 7-digit needles,
// haystack loading errors; the shared-prefix prefill (clone_cache) continues
// exactly like a one-shot prefill.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>

#include "../support/assets.h"
#include "../support/tiny_model.h"
#include "ratekv/cache/fake_quant_cache.h"
#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/common/error.h"
#include "ratekv/common/param_error.h"
#include "ratekv/io/gguf.h"
#include "ratekv/model/tokenizer.h"
#include "ratekv/eval/niah.h"

using namespace ratekv;
using namespace ratekv::eval;

TEST(Niah, CorrectNeedsTheFirstDigitRunToBeTheCode) {
  EXPECT_TRUE(niah_correct(" 1234567.", "1234567"));
  EXPECT_TRUE(niah_correct("The code is 1234567, I think", "1234567"));
  EXPECT_FALSE(niah_correct(" 12345678", "1234567"));      // longer run
  EXPECT_FALSE(niah_correct(" 123456", "1234567"));        // truncated
  EXPECT_FALSE(niah_correct(" 7 then 1234567", "1234567"));  // first run is another number
  EXPECT_FALSE(niah_correct(" the secret code", "1234567"));
  EXPECT_FALSE(niah_correct("", "1234567"));
}

TEST(Niah, NeedlesAreDeterministicAndVaried) {
  std::set<std::string> codes, cities;
  for (int trial = 0; trial < 10; ++trial) {
    const auto a = niah_needle(0, 1024, 3, trial), b = niah_needle(0, 1024, 3, trial);
    EXPECT_EQ(a, b);
    ASSERT_EQ(a.second.size(), 7u);
    EXPECT_NE(a.second[0], '0');
    codes.insert(a.second);
    cities.insert(a.first);
  }
  EXPECT_EQ(codes.size(), 10u);
  EXPECT_GE(cities.size(), 5u);
  EXPECT_NE(niah_needle(0, 1024, 3, 0), niah_needle(1, 1024, 3, 0));
}

// Qwen2.5's qwen2 pre-tokenizer splits digits one per token: " 2945386" is 8
// tokens (a space, then 7 digits), so a cap of --max-new 4 cut every answer to
// " 294" and scored a model that had retrieved the code 0 % (found running
// `ratekv niah --max-new 4` on Qwen2.5-Coder-0.5B). The cap is now checked.
TEST(Niah, AnswerCapShorterThanTheAnswerIsAnError) {
  const std::string path = ratekv_test::qwen05_path();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "Qwen2.5-Coder-0.5B GGUF not found at " << path;
  const Tokenizer tok = Tokenizer::from_gguf(GgufFile::open(path));
  EXPECT_EQ(tok.encode(" 2945386", false).size(), 8u);
  NiahConfig cfg;
  cfg.context_lengths = {256, 1024};
  cfg.n_depths = 3;
  cfg.trials = 4;
  EXPECT_EQ(niah_answer_tokens(tok, cfg), 8);
  cfg.max_new_tokens = 8;
  EXPECT_NO_THROW(check_niah_answer_length(tok, cfg));
  cfg.max_new_tokens = 7;
  try {
    check_niah_answer_length(tok, cfg);
    ADD_FAILURE() << "max_new_tokens 7 < 8 accepted";
  } catch (const ParamError& e) {
    EXPECT_EQ(e.param(), "NiahConfig.max_new_tokens");
    EXPECT_NE(std::string(e.what()).find("up to 8 tokens"), std::string::npos) << e.what();
  }
}

// Depths: n_depths evenly spaced from 0 to 1, or an explicit strictly increasing list in [0, 1]
// (--depth-list: one cell of a long context costs its shared prefix once plus each trial's
// suffix, so a grid at a deep needle fits where 0 % does not).
TEST(Niah, DepthsEvenlySpacedOrAnExplicitList) {
  NiahConfig cfg;
  cfg.n_depths = 5;
  EXPECT_EQ(niah_depths(cfg), (std::vector<double>{0.0, 0.25, 0.5, 0.75, 1.0}));
  cfg.n_depths = 2;
  EXPECT_EQ(niah_depths(cfg), (std::vector<double>{0.0, 1.0}));
  cfg.depth_fractions = {0.5};
  EXPECT_EQ(niah_depths(cfg), (std::vector<double>{0.5}));  // n_depths is ignored with a list
  cfg.depth_fractions = {0.0, 0.3, 1.0};
  EXPECT_EQ(niah_depths(cfg), (std::vector<double>{0.0, 0.3, 1.0}));
  auto param_of = [](const NiahConfig& c) -> std::string {
    try {
      (void)niah_depths(c);
    } catch (const ParamError& e) {
      return e.param() + ": " + e.what();
    }
    return "accepted";
  };
  for (const std::vector<double>& bad : {std::vector<double>{1.5}, std::vector<double>{-0.1, 0.5},
                                         std::vector<double>{0.5, 0.25}, std::vector<double>{0.5, 0.5},
                                         std::vector<double>{std::nan("")}}) {
    NiahConfig c;
    c.depth_fractions = bad;
    EXPECT_EQ(param_of(c).rfind("NiahConfig.depth_fractions", 0), 0u) << param_of(c);
  }
  NiahConfig one;
  one.n_depths = 1;
  EXPECT_EQ(param_of(one).rfind("NiahConfig.n_depths", 0), 0u) << param_of(one);
}

// Needles are drawn per depth index, so the list {0.5} asks the same needles as
// the first depth of any grid at that context (paired across caches and runs).
TEST(Niah, ExplicitDepthsDrawTheirNeedlesPerIndex) {
  const std::string path = ratekv_test::qwen05_path();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "Qwen2.5-Coder-0.5B GGUF not found at " << path;
  const Tokenizer tok = Tokenizer::from_gguf(GgufFile::open(path));
  NiahConfig cfg;
  cfg.context_lengths = {2048};
  cfg.depth_fractions = {0.5, 0.9};
  cfg.trials = 3;
  EXPECT_EQ(niah_answer_tokens(tok, cfg), 8);  // all 6 needles' codes, one digit per token plus the space
}

// Prompt forms: a model without a chat template (Gemma 3 270M's GGUF) gets plain text — the instruction,
// the document with the needle, "Question: …", and the answer primed after "Answer:" — with no ChatML
// text; ChatML models (Qwen) keep the user/assistant turns as control tokens. Checked on the decoded
// prompt, the needle's position, and the prompt length equal to the context.
TEST(Niah, PlainPromptWithoutAChatTemplateChatMLOtherwise) {
  const std::string gemma = ratekv_test::gemma3_path(), qwen = ratekv_test::qwen05_path();
  if (!std::filesystem::exists(gemma) || !std::filesystem::exists(qwen)) GTEST_SKIP() << "Gemma 3 / Qwen GGUF missing";
  std::string text;
  for (int i = 0; i < 60; ++i) text += "Essay sentence number " + std::to_string(i) + " talks about startups. ";
  for (const bool chatml : {false, true}) {
    const Tokenizer tok = Tokenizer::from_gguf(GgufFile::open(chatml ? qwen : gemma));
    const std::vector<int32_t> hay = tok.encode(text, false);
    NiahConfig cfg;
    cfg.context_lengths = {200};
    cfg.n_depths = 3;
    cfg.trials = 2;
    cfg.chatml = chatml;
    const auto prompts = niah_prompts(tok, /*add_bos=*/false, hay, cfg, 200);
    for (const auto& row : prompts)
      for (const NiahPrompt& p : row) {
        SCOPED_TRACE((chatml ? "chatml " : "plain ") + p.city);
        EXPECT_EQ(p.tokens.size(), 200u);
        const std::string s = tok.decode(p.tokens);
        const std::string start = "Read the document below. Somewhere in it is a secret code; remember it.\n\n";
        const std::string end = "What is the secret code for " + p.city + "? Answer with the 7-digit number only." +
                                (chatml ? "<|im_end|>\n<|im_start|>assistant\n" : "\nAnswer: ") +
                                "The secret code for " + p.city + " is";
        EXPECT_EQ(s.rfind((chatml ? "<|im_start|>user\n" : "") + start, 0), 0u) << s.substr(0, 80);
        EXPECT_EQ(s.find("<|im_start|>") == std::string::npos, !chatml);
        EXPECT_EQ(s.find("\nQuestion: ") != std::string::npos, !chatml);
        ASSERT_GE(s.size(), end.size());
        EXPECT_EQ(s.substr(s.size() - end.size()), end);
        const std::string needle = "The secret code for " + p.city + " is " + p.code + ".";
        const std::string from_needle = tok.decode(std::span(p.tokens).subspan(static_cast<size_t>(p.needle_at)));
        EXPECT_EQ(from_needle.find(needle), from_needle.find_first_not_of(' ')) << from_needle.substr(0, 80);
      }
    if (chatml) continue;
    cfg.system_prompt = "You are helpful.";  // a system turn exists only in ChatML
    EXPECT_THROW(niah_prompts(tok, false, hay, cfg, 200), ParamError);
  }
}

TEST(Niah, MissingHaystackIsAnError) {
  EXPECT_THROW(load_haystack("/nonexistent/haystack"), Error);
}

// What run_niah does with share_prefix: prefill a prefix once, copy the cache,
// forward the rest from the copy. Same logits as one-shot prefill of the whole
// prompt (fp32 rounding of the chunked products only), for the packed cache,
// the fake-quant cache and the fp32 cache, on a tiny random model; the prefix
// cache itself is left unchanged by the copy's use.
TEST(Niah, SharedPrefixCopyContinuesLikeOneShotPrefill) {
  Model model = ratekv_test::tiny_model(3);  // head_dim 6: one padded 16-channel tile per group
  const ModelConfig& cfg = model.config();
  Plan p;
  p.method = "test";
  static_cast<PlanTarget&>(p.model) = cache::plan_target(cfg);
  p.layers.assign(cfg.n_layers, std::vector<HeadPlan>(cfg.n_kv_heads));
  for (int l = 0; l < cfg.n_layers; ++l)
    for (int h = 0; h < cfg.n_kv_heads; ++h)
      p.layers[l][h] = {Codec::tq_mse(2 + (l + h) % 3, cfg.head_dim, 10 + l * 4 + h),
                        Codec::tq_mse(1 + (l + 2 * h) % 4, cfg.head_dim, 50 + l * 4 + h)};
  auto codecs = std::make_shared<const cache::PlanCodecs>(p, cfg);
  std::vector<int32_t> prompt(50);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7 + 3) % cfg.n_vocab);
  const int64_t split = 29;
  for (int kind = 0; kind < 3; ++kind) {
    auto make = [&]() -> std::unique_ptr<KVCache> {
      if (kind == 0) return std::make_unique<cache::PackedKVCache>(cfg.kv_shape(64), codecs);
      if (kind == 1) return std::make_unique<cache::FakeQuantKVCache>(cfg.kv_shape(64), codecs);
      return std::make_unique<DenseKVCache>(cfg.kv_shape(64));
    };
    std::vector<float> one(cfg.n_vocab), two(cfg.n_vocab), again(cfg.n_vocab);
    auto whole = make();
    model.forward(prompt, 0, *whole, one.data(), false);
    auto prefix = make();
    model.forward(std::span<const int32_t>(prompt.data(), split), 0, *prefix, nullptr, false);
    for (std::vector<float>* out : {&two, &again}) {  // twice from the same prefix
      std::unique_ptr<KVCache> c = clone_cache(*prefix);
      ASSERT_NE(c, nullptr) << "cache kind " << kind;
      model.forward(std::span<const int32_t>(prompt.data() + split, prompt.size() - split), split, *c, out->data(),
                    false);
      EXPECT_EQ(c->n_tokens(), static_cast<int64_t>(prompt.size()));
    }
    EXPECT_EQ(prefix->n_tokens(), split);
    double num = 0, den = 0;
    for (int i = 0; i < cfg.n_vocab; ++i) {
      num += (double(two[i]) - one[i]) * (double(two[i]) - one[i]);
      den += double(one[i]) * one[i];
      ASSERT_EQ(two[i], again[i]) << "copies of one prefix must agree bit for bit";
    }
    EXPECT_LT(std::sqrt(num / den), 1e-5) << "cache kind " << kind;
  }
  // A cache with an fp16 window quantizes a token differently once later
  // tokens arrive in the same call: not copied.
  cache::PackedCacheOptions po;
  po.fp16_window = 4;
  EXPECT_EQ(clone_cache(cache::PackedKVCache(cfg.kv_shape(64), codecs, po)), nullptr);
}
