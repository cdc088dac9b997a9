// The SentencePiece-style tokenizer (tokenizer.ggml.model "llama") on small
// hand-made vocabularies: merge order by score (ties leftmost), space
// escaping, byte fallback, add_space_prefix, special tokens, decoding. The
// real Gemma 3 vocabulary against llama.cpp is in test_gemma3.cpp.
#include <gtest/gtest.h>

#include <limits>

#include "ratekv/common/error.h"
#include "ratekv/model/tokenizer.h"

using namespace ratekv;
using Ids = std::vector<int32_t>;

namespace {

// ids: 0 <unk>(2) 1 <s>(3) 2 </s>(3) 3..5 "a" "b" "c" 6 "ab" 7 "bc" 8 "abc"
// 9 "▁" 10 "▁a" 11 "<0x41>"(6) 12 "<0x0A>"(6) 13 "<t>"(4)
TokenizerVocab spm_vocab() {
  TokenizerVocab v;
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>", "a", "b", "c", "ab", "bc", "abc", "\xE2\x96\x81", "\xE2\x96\x81" "a",
              "<0x41>", "<0x0A>", "<t>"};
  v.token_types = {2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 6, 6, 4};
  v.scores = {0, 0, 0, -1, -1, -1, -5, -3, -2, -1, -4, 0, 0, 0};
  v.unk_id = 0;
  v.bos_id = 1;
  v.eos_id = 2;
  v.add_bos = true;
  return v;
}

}  // namespace

TEST(TokenizerSpm, HighestScoreMergesFirst) {
  const Tokenizer t = Tokenizer::from_vocab(spm_vocab());
  EXPECT_EQ(t.model_type(), "llama");
  // "abc": candidates ab (−5), bc (−3) → bc first; then a+bc = "abc" (−2).
  EXPECT_EQ(t.encode("abc", false), (Ids{8}));
  // "abab": ab twice, equal scores → leftmost first, both merge; "abab" is no token.
  EXPECT_EQ(t.encode("abab", false), (Ids{6, 6}));
  // "bcab": bc (−3) and ab (−5) do not overlap.
  EXPECT_EQ(t.encode("bcab", false), (Ids{7, 6}));
}

TEST(TokenizerSpm, SpacesAreEscapedAndByteFallback) {
  const Tokenizer t = Tokenizer::from_vocab(spm_vocab());
  EXPECT_EQ(t.encode(" a b", false), (Ids{10, 9, 4}));
  // 'A' and '\n' have no piece: their byte tokens; 'Z' has neither: dropped.
  EXPECT_EQ(t.encode("aA\nZ", false), (Ids{3, 11, 12}));
  EXPECT_EQ(t.decode(Ids{10, 9, 4, 11, 12}), " a bA\n");
  EXPECT_EQ(t.encode("a", true), (Ids{1, 3}));
  EXPECT_EQ(t.decode(Ids{1, 3}, /*skip_special=*/true), "a");
}

TEST(TokenizerSpm, UserDefinedTokensSplitFirstAndSpacePrefix) {
  TokenizerVocab v = spm_vocab();
  const Tokenizer t = Tokenizer::from_vocab(v);
  EXPECT_EQ(t.encode("ab<t>c", false), (Ids{6, 13, 5}));
  v.add_space_prefix = true;  // a space before the text and after every special token
  const Tokenizer p = Tokenizer::from_vocab(v);
  EXPECT_EQ(p.encode("a<t>a", false), (Ids{10, 13, 10}));
}

TEST(TokenizerSpm, BadScoresAreErrors) {
  TokenizerVocab v = spm_vocab();
  v.scores.pop_back();
  EXPECT_THROW(Tokenizer::from_vocab(v), Error);
  v = spm_vocab();
  v.scores[4] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(Tokenizer::from_vocab(v), Error);
}
