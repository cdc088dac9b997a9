// Byte-level BPE and the Tokenizer on hand-made tiny vocabularies: merge
// order, ties, byte fallback, special tokens, BOS/EOS, decode, errors; plus a
// randomized comparison with a naive quadratic BPE reference.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "model/tokenizer_bpe.h"
#include "model/tokenizer_byte_level.h"
#include "ratekv/common/error.h"
#include "ratekv/model/tokenizer.h"

using namespace ratekv;
using namespace ratekv::tok;
using Ids = std::vector<int32_t>;

namespace {

// A vocabulary whose tokens are given as raw bytes (converted to byte-level
// text here); merges as raw (left, right) pairs in rank order.
struct TinyVocab {
  std::vector<std::string> raw_tokens;
  std::vector<std::pair<std::string, std::string>> raw_merges;

  int32_t add(const std::string& raw) {
    raw_tokens.push_back(raw);
    return static_cast<int32_t>(raw_tokens.size() - 1);
  }
  int32_t id(const std::string& raw) const {
    for (size_t i = 0; i < raw_tokens.size(); ++i)
      if (raw_tokens[i] == raw) return static_cast<int32_t>(i);
    return -1;
  }
  std::vector<std::string> tokens() const {
    std::vector<std::string> t;
    for (const auto& r : raw_tokens) t.push_back(byte_level_encode(r));
    return t;
  }
  std::vector<std::string> merges() const {
    std::vector<std::string> m;
    for (const auto& [l, r] : raw_merges) m.push_back(byte_level_encode(l) + " " + byte_level_encode(r));
    return m;
  }
  TokenizerVocab vocab(std::string pre = "smollm") const {
    TokenizerVocab v;
    v.pre = std::move(pre);
    v.tokens = tokens();
    v.merges = merges();
    return v;
  }
};

// All 256 single bytes, ids 0..255 equal to the byte value.
TinyVocab with_all_bytes() {
  TinyVocab v;
  for (int b = 0; b < 256; ++b) v.add(std::string(1, static_cast<char>(b)));
  return v;
}

Ids bpe(const TinyVocab& v, const std::string& word, size_t* dropped = nullptr) {
  BpeModel m(v.tokens(), v.merges());
  Ids out;
  const size_t d = m.encode_word(word, out);
  if (dropped) *dropped = d;
  return out;
}

// Naive BPE: rescan all adjacent pairs after every merge.
Ids naive_bpe(const TinyVocab& v, const std::string& word) {
  std::map<std::pair<std::string, std::string>, size_t> rank;
  for (size_t r = 0; r < v.raw_merges.size(); ++r) rank.try_emplace(v.raw_merges[r], r);
  std::vector<std::string> sym;
  for (char c : word) sym.emplace_back(1, c);
  for (;;) {
    size_t best = SIZE_MAX, at = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = rank.find({sym[i], sym[i + 1]});
      if (it != rank.end() && it->second < best) best = it->second, at = i;
    }
    if (best == SIZE_MAX) break;
    sym[at] += sym[at + 1];
    sym.erase(sym.begin() + static_cast<long>(at) + 1);
  }
  Ids out;
  for (const auto& s : sym) {
    const int32_t id = v.id(s);
    if (id >= 0) {
      out.push_back(id);
    } else {
      for (char c : s) out.push_back(v.id(std::string(1, c)));  // byte tokens: all present
    }
  }
  return out;
}

}  // namespace

TEST(Bpe, MergesApplyInRankOrder) {
  TinyVocab v = with_all_bytes();
  const int32_t ab = v.add("ab"), bc = v.add("bc");
  v.raw_merges = {{"b", "c"}, {"a", "b"}};
  EXPECT_EQ(bpe(v, "abc"), (Ids{'a', bc}));
  v.raw_merges = {{"a", "b"}, {"b", "c"}};
  EXPECT_EQ(bpe(v, "abc"), (Ids{ab, 'c'}));
  // A later merge can use an earlier merge's result.
  const int32_t abc = v.add("abc");
  v.raw_merges = {{"b", "c"}, {"a", "b"}, {"a", "bc"}};
  EXPECT_EQ(bpe(v, "abc"), (Ids{abc}));
  EXPECT_EQ(bpe(v, "abcab"), (Ids{abc, ab}));
}

TEST(Bpe, TiesGoToTheLeftmostPair) {
  TinyVocab v = with_all_bytes();
  const int32_t aa = v.add("aa"), aaa = v.add("aaa");
  v.raw_merges = {{"a", "a"}};
  EXPECT_EQ(bpe(v, "aaa"), (Ids{aa, 'a'}));
  EXPECT_EQ(bpe(v, "aaaa"), (Ids{aa, aa}));
  EXPECT_EQ(bpe(v, "aaaaa"), (Ids{aa, aa, 'a'}));
  v.raw_merges = {{"a", "a"}, {"aa", "a"}};
  EXPECT_EQ(bpe(v, "aaa"), (Ids{aaa}));
  // a a a a a -> aa a a a -> aa aa a (rank 0 first, leftmost) -> aa aaa.
  EXPECT_EQ(bpe(v, "aaaaa"), (Ids{aa, aaa}));
}

TEST(Bpe, DuplicateMergeKeepsTheFirstRank) {
  TinyVocab v = with_all_bytes();
  const int32_t ab = v.add("ab");
  v.add("bc");
  v.raw_merges = {{"a", "b"}, {"b", "c"}, {"a", "b"}};
  EXPECT_EQ(bpe(v, "abc"), (Ids{ab, 'c'}));
}

TEST(Bpe, SymbolsWithoutTokenFallBackToBytes) {
  TinyVocab v = with_all_bytes();
  v.raw_merges = {{"x", "y"}};  // "xy" is no token
  size_t dropped = 9;
  EXPECT_EQ(bpe(v, "xyz", &dropped), (Ids{'x', 'y', 'z'}));
  EXPECT_EQ(dropped, 0u);
}

TEST(Bpe, BytesWithoutTokenAreDroppedAndCounted) {
  TinyVocab v;
  const int32_t a = v.add("a"), b = v.add("b");
  size_t dropped = 0;
  EXPECT_EQ(bpe(v, std::string("a\x04" "b"), &dropped), (Ids{a, b}));
  EXPECT_EQ(dropped, 1u);
  EXPECT_EQ(bpe(v, std::string("\x04"), &dropped), Ids{});
  EXPECT_EQ(dropped, 1u);
}

TEST(Bpe, MalformedMergeIsAnError) {
  TinyVocab v = with_all_bytes();
  auto merges = v.merges();
  merges.push_back("ab");
  try {
    BpeModel m(v.tokens(), merges);
    FAIL() << "expected ratekv::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.merges[0] = 'ab'"), std::string::npos) << e.what();
  }
}

TEST(Bpe, MatchesNaiveReferenceOnRandomVocabularies) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    TinyVocab v = with_all_bytes();
    std::vector<std::string> syms = {"a", "b", "c", "d"};
    std::uniform_int_distribution<int> coin(0, 9);
    for (int m = 0; m < 30; ++m) {
      std::uniform_int_distribution<size_t> pick(0, syms.size() - 1);
      const std::string l = syms[pick(rng)], r = syms[pick(rng)];
      v.raw_merges.emplace_back(l, r);
      if (v.id(l + r) < 0) {
        if (coin(rng) > 0) v.add(l + r);  // 1 in 10 merge results is no token
        syms.push_back(l + r);
      }
    }
    BpeModel model(v.tokens(), v.merges());
    for (int w = 0; w < 50; ++w) {
      std::uniform_int_distribution<int> len(1, 30), ch(0, 3);
      std::string word;
      for (int i = len(rng); i > 0; --i) word.push_back(static_cast<char>('a' + ch(rng)));
      Ids got;
      model.encode_word(word, got);
      ASSERT_EQ(got, naive_bpe(v, word)) << "trial " << trial << " word " << word;
    }
  }
}

// ---- Tokenizer on tiny vocabularies -------------------------------------------

namespace {

// Bytes + a few merged words + special tokens.
struct ChatVocab {
  TinyVocab v = with_all_bytes();
  int32_t sp_hi, he, ll, hell, hello, end, start, user;
  ChatVocab() {
    sp_hi = v.add(" hi");
    he = v.add("he");
    ll = v.add("ll");
    hell = v.add("hell");
    hello = v.add("hello");
    v.raw_merges = {{" ", "h"}, {" h", "i"}, {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}};
    v.add(" h");
    end = v.add("<|end|>");
    start = v.add("<|start|>");
    user = v.add("<user>");
  }
  Tokenizer make(bool add_bos = false, bool add_eos = false) const {
    TokenizerVocab tv = v.vocab();
    tv.token_types.assign(tv.tokens.size(), 1);
    tv.token_types[end] = 3;    // control
    tv.token_types[start] = 3;  // control
    tv.token_types[user] = 4;   // user-defined
    tv.bos_id = start;
    tv.eos_id = end;
    tv.add_bos = add_bos;
    tv.add_eos = add_eos;
    return Tokenizer::from_vocab(tv);
  }
};

}  // namespace

TEST(Tokenizer, EmptyInput) {
  const ChatVocab c;
  const Tokenizer t = c.make(true, true);
  EXPECT_EQ(t.encode("", false), Ids{});
  EXPECT_EQ(t.encode("", true), (Ids{c.start, c.end}));
  EXPECT_EQ(t.decode(Ids{}), "");
}

TEST(Tokenizer, WordsThenBpe) {
  const ChatVocab c;
  const Tokenizer t = c.make();
  EXPECT_EQ(t.encode("hello hi", false), (Ids{c.hello, c.sp_hi}));
  // Digits are words of one character; the space before them stays alone.
  EXPECT_EQ(t.encode("hello 42", false), (Ids{c.hello, ' ', '4', '2'}));
  EXPECT_EQ(t.decode(t.encode("hello 42", false)), "hello 42");
}

TEST(Tokenizer, SpecialTokensOnlyWhenParsed) {
  const ChatVocab c;
  const Tokenizer t = c.make();
  const std::string s = "<|start|>hello<|end|>";
  EXPECT_EQ(t.encode(s, false, true), (Ids{c.start, c.hello, c.end}));
  const Ids plain = t.encode(s, false, false);
  EXPECT_EQ(plain, (Ids{'<', '|', 's', 't', 'a', 'r', 't', '|', '>', c.hello, '<', '|', 'e', 'n', 'd', '|', '>'}));
  // User-defined tokens are recognised either way.
  EXPECT_EQ(t.encode("hi<user>hi", false, false), (Ids{'h', 'i', c.user, 'h', 'i'}));
  // Decode renders control tokens unless skipped; user-defined always.
  EXPECT_EQ(t.decode(Ids{c.start, c.hello, c.user, c.end}), "<|start|>hello<user><|end|>");
  EXPECT_EQ(t.decode(Ids{c.start, c.hello, c.user, c.end}, true), "hello<user>");
}

TEST(Tokenizer, LongestSpecialTokenWins) {
  TinyVocab v = with_all_bytes();
  const int32_t ab = v.add("<ab>"), abc = v.add("<ab><c>");
  TokenizerVocab tv = v.vocab();
  tv.token_types.assign(tv.tokens.size(), 1);
  tv.token_types[ab] = 3;
  tv.token_types[abc] = 3;
  const Tokenizer t = Tokenizer::from_vocab(tv);
  EXPECT_EQ(t.encode("<ab><c><ab>", false, true), (Ids{abc, ab}));
}

TEST(Tokenizer, BosAndEosFollowTheModelFlags) {
  const ChatVocab c;
  EXPECT_EQ(c.make(false, false).encode("hi", true), (Ids{'h', 'i'}));
  EXPECT_EQ(c.make(true, false).encode("hi", true), (Ids{c.start, 'h', 'i'}));
  EXPECT_EQ(c.make(true, false).encode("hi", false), (Ids{'h', 'i'}));
  EXPECT_EQ(c.make(true, true).encode("hi", true), (Ids{c.start, 'h', 'i', c.end}));
  EXPECT_EQ(c.make().bos_id(), c.start);
  EXPECT_EQ(c.make().eos_id(), c.end);
  EXPECT_TRUE(c.make().is_eog(c.end));  // EOS and "<|end|>"
  EXPECT_FALSE(c.make().is_eog(c.start));
}

TEST(Tokenizer, InvalidUtf8BecomesReplacementCharacter) {
  const ChatVocab c;
  const Tokenizer t = c.make();
  // 0xFF is no UTF-8: U+FFFD (EF BF BD) is tokenized instead, byte by byte here.
  const Ids ids = t.encode(std::string("hi\xFF" "hi"), false);
  EXPECT_EQ(ids, (Ids{'h', 'i', 0xEF, 0xBF, 0xBD, 'h', 'i'}));
  EXPECT_EQ(t.decode(ids), "hi\xEF\xBF\xBDhi");
  // Valid multi-byte text round-trips.
  const std::string s = "caf\xC3\xA9 \xF0\x9F\xA6\x99 hello";
  EXPECT_EQ(t.decode(t.encode(s, false)), s);
}

TEST(Tokenizer, DecodeAndTokenTextCheckIds) {
  const ChatVocab c;
  const Tokenizer t = c.make();
  EXPECT_EQ(t.token_text(c.sp_hi), "\xC4\xA0hi");
  EXPECT_EQ(t.decode(Ids{c.sp_hi}), " hi");
  EXPECT_THROW(t.decode(Ids{c.hello, t.n_vocab()}), Error);
  EXPECT_THROW(t.decode(Ids{-1}), Error);
  EXPECT_THROW(t.token_text(t.n_vocab()), Error);
}

TEST(Tokenizer, UnsupportedModelOrPreNamesKeyAndValue) {
  const ChatVocab c;
  auto expect_error = [](TokenizerVocab v, const std::vector<std::string>& parts) {
    try {
      (void)Tokenizer::from_vocab(std::move(v));
      ADD_FAILURE() << "expected ratekv::Error";
    } catch (const Error& e) {
      for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  };
  TokenizerVocab v = c.v.vocab();
  v.model = "bert";
  expect_error(v, {"tokenizer.ggml.model", "'bert'"});
  v = c.v.vocab();
  v.model = "llama";  // SentencePiece-style: needs one score per token
  expect_error(v, {"tokenizer.ggml.scores", "0 entries"});
  v = c.v.vocab("qwen35");
  expect_error(v, {"tokenizer.ggml.pre", "'qwen35'"});
  v = c.v.vocab("");
  expect_error(v, {"tokenizer.ggml.pre"});
  v = c.v.vocab();
  v.bos_id = 100000;
  expect_error(v, {"tokenizer.ggml.bos_token_id", "100000"});
  v = c.v.vocab();
  v.token_types = {1, 1};
  expect_error(v, {"tokenizer.ggml.token_type", "2 entries"});
  v = c.v.vocab();
  v.tokens.clear();
  expect_error(v, {"tokenizer.ggml.tokens"});
  v = c.v.vocab();
  v.add_bos = true;
  expect_error(v, {"tokenizer.ggml.add_bos_token", "bos_token_id"});
}
