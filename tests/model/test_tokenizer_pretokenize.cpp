// The regex pre-tokenizer (src/model/tokenizer_pretokenize.h): hand-checked
// splits for the SmolLM2 ("smollm") and Qwen2 ("qwen2") cascades, and
// randomized comparisons with independent procedural scanners of the same
// rules (llama.cpp's hand-written splitters for the GPT-2 and Qwen2 regexes,
// unicode_regex_split_custom_gpt2 / _qwen2), code point by code point.
#include <gtest/gtest.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cctype>
#include <random>

#include "model/tokenizer_pretokenize.h"
#include "model/tokenizer_utf8.h"
#include "ratekv/common/error.h"

using namespace ratekv;
using namespace ratekv::tok;
using Words = std::vector<std::string>;

namespace {

PreTokenizer smollm() { return PreTokenizer(*pre_tokenizer_regexes("smollm")); }

// --- independent reference -------------------------------------------------
// Unicode category of one code point, asked of PCRE2 with a one-character
// anchored pattern (so only the category tables are shared, not the splitter).
bool has_category(char32_t cp, const std::string& prop) {
  int err;
  PCRE2_SIZE eoff;
  pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(prop.c_str()), PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &err, &eoff, nullptr);
  std::string s;
  utf8_append(s, cp == 0xD800 ? 0xFFFD : cp);
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  const int rc = pcre2_match(re, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, 0, md, nullptr);
  pcre2_match_data_free(md);
  pcre2_code_free(re);
  return rc > 0;
}
bool is_letter(char32_t c) { return has_category(c, letter_class()); }
bool is_number(char32_t c) { return has_category(c, number_class()); }
bool is_space(char32_t c) {  // Unicode White_Space
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// GPT-2 word rules on code points [b, e), appending [start, end) pairs.
void gpt2_scan(const std::vector<char32_t>& cp, size_t b, size_t e, std::vector<std::pair<size_t, size_t>>& out) {
  auto other = [&](size_t i) { return !is_space(cp[i]) && !is_letter(cp[i]) && !is_number(cp[i]); };
  size_t pos = b;
  while (pos < e) {
    const char32_t c = cp[pos];
    if (c == '\'' && pos + 1 < e) {
      const char32_t n1 = cp[pos + 1];
      if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
        out.emplace_back(pos, pos + 2);
        pos += 2;
        continue;
      }
      if (pos + 2 < e) {
        const char32_t n2 = cp[pos + 2];
        if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) {
          out.emplace_back(pos, pos + 3);
          pos += 3;
          continue;
        }
      }
    }
    size_t p = pos + (c == ' ' ? 1 : 0);
    if (p < e && (is_letter(cp[p]) || is_number(cp[p]) || other(p))) {
      const int cls = is_letter(cp[p]) ? 0 : is_number(cp[p]) ? 1 : 2;
      auto same = [&](size_t i) { return cls == 0 ? is_letter(cp[i]) : cls == 1 ? is_number(cp[i]) : other(i); };
      while (p < e && same(p)) ++p;
      out.emplace_back(pos, p);
      pos = p;
      continue;
    }
    size_t q = pos;
    while (q < e && is_space(cp[q])) ++q;
    if (q - pos > 1 && q < e) q -= 1;  // \s+(?!\S): leave the last space to the next word
    if (q == pos) q = pos + 1;
    out.emplace_back(pos, q);
    pos = q;
  }
}

Words reference_smollm(const std::string& text) {
  std::vector<char32_t> cp;
  std::vector<size_t> byte_off;
  for (size_t pos = 0; pos < text.size();) {
    byte_off.push_back(pos);
    cp.push_back(utf8_decode_one(text, pos));
  }
  byte_off.push_back(text.size());
  std::vector<std::pair<size_t, size_t>> spans;
  size_t start = 0;
  for (size_t i = 0; i <= cp.size(); ++i) {  // stage 1: every number alone
    if (i == cp.size() || is_number(cp[i])) {
      gpt2_scan(cp, start, i, spans);
      if (i < cp.size()) spans.emplace_back(i, i + 1);
      start = i + 1;
    }
  }
  Words w;
  for (auto [s, e] : spans) w.push_back(text.substr(byte_off[s], byte_off[e] - byte_off[s]));
  return w;
}

// Qwen2 word rules on code points [b, e), as llama.cpp's
// unicode_regex_split_custom_qwen2 scans them (a procedural reading of
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|
// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+).
void qwen2_scan(const std::vector<char32_t>& cp, size_t b, size_t e, std::vector<std::pair<size_t, size_t>>& out) {
  auto in = [&](size_t i) { return i < e; };
  auto letter = [&](size_t i) { return in(i) && is_letter(cp[i]); };
  auto number = [&](size_t i) { return in(i) && is_number(cp[i]); };
  auto space = [&](size_t i) { return in(i) && is_space(cp[i]); };
  auto other = [&](size_t i) { return in(i) && !is_space(cp[i]) && !is_letter(cp[i]) && !is_number(cp[i]); };
  auto lower = [&](size_t i) { return in(i) && cp[i] < 128 ? static_cast<char32_t>(std::tolower(int(cp[i]))) : cp[i]; };
  auto nl = [&](size_t i) { return in(i) && (cp[i] == '\r' || cp[i] == '\n'); };
  size_t pos = b;
  auto emit = [&](size_t end) {
    out.emplace_back(pos, end);
    pos = end;
  };
  while (pos < e) {
    const char32_t c = cp[pos];
    if (c == '\'' && in(pos + 1)) {
      const char32_t n1 = lower(pos + 1);
      if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
        emit(pos + 2);
        continue;
      }
      if (in(pos + 2)) {
        const char32_t n2 = lower(pos + 2);
        if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) {
          emit(pos + 3);
          continue;
        }
      }
    }
    if (!nl(pos) && !number(pos) && (letter(pos) || letter(pos + 1))) {  // [^\r\n L N]? L+
      size_t p = pos + 1;
      while (letter(p)) ++p;
      emit(p);
      continue;
    }
    if (number(pos)) {
      emit(pos + 1);
      continue;
    }
    const size_t p0 = pos + (c == ' ' && other(pos + 1) ? 1 : 0);
    if (other(p0)) {  // ' '? [^\s L N]+ [\r\n]*
      size_t p = p0;
      while (other(p)) ++p;
      while (nl(p)) ++p;
      emit(p);
      continue;
    }
    size_t q = pos, last_nl = 0;
    while (space(q)) {
      if (nl(q)) last_nl = q + 1;
      ++q;
    }
    if (last_nl > 0) {  // \s*[\r\n]+
      emit(last_nl);
      continue;
    }
    if (q - pos > 1 && in(q)) {  // \s+(?!\S)
      emit(q - 1);
      continue;
    }
    emit(q > pos ? q : pos + 1);  // \s+, or one character nothing else took
  }
}

Words reference_qwen2(const std::string& text) {
  std::vector<char32_t> cp;
  std::vector<size_t> byte_off;
  for (size_t pos = 0; pos < text.size();) {
    byte_off.push_back(pos);
    cp.push_back(utf8_decode_one(text, pos));
  }
  byte_off.push_back(text.size());
  std::vector<std::pair<size_t, size_t>> spans;
  qwen2_scan(cp, 0, cp.size(), spans);
  Words w;
  for (auto [s, e] : spans) w.push_back(text.substr(byte_off[s], byte_off[e] - byte_off[s]));
  return w;
}

}  // namespace

TEST(PreTokenizer, SmolLMCascade) {
  const auto r = pre_tokenizer_regexes("smollm");
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0], number_class());
  EXPECT_EQ(number_class().rfind("[\\p{N}", 0), 0u);
  EXPECT_EQ((*r)[1], gpt2_word_regex());
  EXPECT_FALSE(pre_tokenizer_regexes("llama-bpe").has_value());
  EXPECT_FALSE(pre_tokenizer_regexes("").has_value());
  EXPECT_EQ(pre_tokenizer_regexes("gpt-2")->size(), 1u);
}

TEST(PreTokenizer, HandCheckedSplits) {
  const PreTokenizer p = smollm();
  EXPECT_EQ(p.split("Hello world"), (Words{"Hello", " world"}));
  EXPECT_EQ(p.split("I'm here, they'll go"), (Words{"I", "'m", " here", ",", " they", "'ll", " go"}));
  EXPECT_EQ(p.split("O'Neil's"), (Words{"O", "'", "Neil", "'s"}));
  // Digits one by one; the space before a number stays a word of its own.
  EXPECT_EQ(p.split("abc 12345 x"), (Words{"abc", " ", "1", "2", "3", "4", "5", " x"}));
  EXPECT_EQ(p.split("3.14"), (Words{"3", ".", "1", "4"}));
  // Whitespace runs: all but the last space, which joins the next word.
  EXPECT_EQ(p.split("a   b"), (Words{"a", "  ", " b"}));
  EXPECT_EQ(p.split("a  "), (Words{"a", "  "}));
  EXPECT_EQ(p.split("\n\nfoo"), (Words{"\n", "\n", "foo"}));
  EXPECT_EQ(p.split("a\r\nb"), (Words{"a", "\r", "\n", "b"}));
  EXPECT_EQ(p.split("x\t\ty"), (Words{"x", "\t", "\t", "y"}));
  // Punctuation runs take one leading space.
  EXPECT_EQ(p.split("Wait!!! ..."), (Words{"Wait", "!!!", " ..."}));
  // Unicode letters and numbers.
  EXPECT_EQ(p.split("na\xC3\xAFve caf\xC3\xA9"), (Words{"na\xC3\xAFve", " caf\xC3\xA9"}));
  EXPECT_EQ(p.split("x\xD9\xA3\xD9\xA4"), (Words{"x", "\xD9\xA3", "\xD9\xA4"}));  // Arabic-Indic 3, 4
  EXPECT_EQ(p.split("\xC2\xBD"), (Words{"\xC2\xBD"}));                            // 1/2 is \p{N}
  // Emoji are neither letters nor numbers: one run with the '!'.
  EXPECT_EQ(p.split("hi \xF0\x9F\x98\x80\xF0\x9F\x98\x80!"), (Words{"hi", " \xF0\x9F\x98\x80\xF0\x9F\x98\x80!"}));
  EXPECT_EQ(p.split(""), Words{});
}

TEST(PreTokenizer, NextLineIsWhitespaceAsInLlamaCpp) {
  // U+0085 is White_Space (llama.cpp's \s) but not in PCRE2's UCP \s.
  const PreTokenizer p = smollm();
  EXPECT_EQ(p.split("a\xC2\x85\xC2\x85" "b"), (Words{"a", "\xC2\x85", "\xC2\x85", "b"}));
  EXPECT_EQ(p.split("a\xE3\x80\x80\xE3\x80\x80"), (Words{"a", "\xE3\x80\x80\xE3\x80\x80"}));  // U+3000 x2 at end
}

TEST(PreTokenizer, UsesUnicode15LettersAndNumbersAsLlamaCpp) {
  // U+11F50 KAWI DIGIT ZERO (Nd) and U+31350 (CJK Ext. H, Lo) were added in
  // Unicode 15.0; PCRE2 10.42 (Unicode 14) sees them as unassigned. llama.cpp
  // (Unicode 15.1) isolates the digit, so "'ve" after it is a contraction.
  const PreTokenizer p = smollm();
  EXPECT_EQ(p.split("a\xF0\x91\xBD\x90've"), (Words{"a", "\xF0\x91\xBD\x90", "'ve"}));
  EXPECT_EQ(p.split("x \xF0\xB1\x8D\x90\xF0\xB1\x8D\x91!"), (Words{"x", " \xF0\xB1\x8D\x90\xF0\xB1\x8D\x91", "!"}));
}

TEST(PreTokenizer, SurrogatesAreOtherCharacters) {
  const PreTokenizer p = smollm();
  EXPECT_EQ(p.split("a\xED\xA0\x80" "b"), (Words{"a", "\xED\xA0\x80", "b"}));
  EXPECT_EQ(p.split(" \xED\xA0\x80!"), (Words{" \xED\xA0\x80!"}));
}

TEST(PreTokenizer, MatchesIndependentScannerOnRandomText) {
  const char32_t alphabet[] = {'a',    'b',    's',    't',    'r',    'e',     'v',     'm',    'l',     'd',
                               'S',    '\'',   ' ',    ' ',    ' ',    '\t',    '\n',    '\r',   '0',     '7',
                               0x663,  0xBD,   0xE9,   0x4E2D, 0x85,   0xA0,    0x3000,  0x2028, '!',     '.',
                               '-',    '_',    0x1F600, 0x200D, 0x301, 0xFFFD, 0x10FFFF, 0xD800, 0xE000, 0x2160, 0x11F50, 0x31350};
  std::mt19937 rng(1234);
  std::uniform_int_distribution<size_t> pick(0, std::size(alphabet) - 1);
  std::uniform_int_distribution<int> len(0, 40);
  const PreTokenizer p = smollm();
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s;
    const int n = len(rng);
    for (int i = 0; i < n; ++i) utf8_append(s, alphabet[pick(rng)]);
    const Words got = p.split(s);
    ASSERT_EQ(got, reference_smollm(s)) << "iteration " << iter;
    std::string joined;
    for (const auto& w : got) {
      ASSERT_FALSE(w.empty());
      joined += w;
    }
    ASSERT_EQ(joined, s);
  }
}

TEST(PreTokenizer, Qwen2HandCheckedSplits) {
  const auto r = pre_tokenizer_regexes("qwen2");
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->size(), 1u);
  const PreTokenizer p(*r);
  EXPECT_EQ(p.split("Hello world"), (Words{"Hello", " world"}));
  // Contractions in either case; a quote before letters joins them.
  EXPECT_EQ(p.split("I'LL we'Ve x'y"), (Words{"I", "'LL", " we", "'Ve", " x", "'y"}));
  // One digit per word; a space before a digit is a word of its own.
  EXPECT_EQ(p.split("abc 12345"), (Words{"abc", " ", "1", "2", "3", "4", "5"}));
  // A word takes one leading non-letter that is not a newline: tab, '(', '_'.
  EXPECT_EQ(p.split("\tfoo(bar_baz"), (Words{"\tfoo", "(bar", "_baz"}));
  EXPECT_EQ(p.split("\nfoo"), (Words{"\n", "foo"}));
  // Punctuation runs keep one leading space and swallow following newlines.
  EXPECT_EQ(p.split("x);\n\n  y"), (Words{"x", ");\n\n", " ", " y"}));
  // Whitespace up to the last newline of a run is one word.
  EXPECT_EQ(p.split("a \n \n  b"), (Words{"a", " \n \n", " ", " b"}));
  EXPECT_EQ(p.split("a\r\n\r\nb"), (Words{"a", "\r\n\r\n", "b"}));
  // Without newlines: all but the last space, which joins the next word.
  EXPECT_EQ(p.split("a   b"), (Words{"a", "  ", " b"}));
  EXPECT_EQ(p.split("a  "), (Words{"a", "  "}));
  // A combining mark (\p{M}) is not a letter: it ends the word.
  EXPECT_EQ(p.split("e\xCC\x81t"), (Words{"e", "\xCC\x81t"}));
  EXPECT_EQ(p.split(""), Words{});
}

TEST(PreTokenizer, Qwen2MatchesIndependentScannerOnRandomText) {
  const char32_t alphabet[] = {'a',    'b',    's',    't',    'r',    'e',     'v',     'm',    'l',     'd',
                               'S',    'L',    'E',    '\'',   ' ',    ' ',     ' ',     '\t',   '\n',    '\r',
                               '0',    '7',    0x663,  0xBD,   0xE9,   0x4E2D,  0x85,    0xA0,   0x3000,  0x2028,
                               '!',    '.',    '(',    '_',    0x1F600, 0x200D, 0x301,   0xFFFD, 0x10FFFF, 0xD800,
                               0xE000, 0x2160, 0x11F50, 0x31350};
  std::mt19937 rng(4321);
  std::uniform_int_distribution<size_t> pick(0, std::size(alphabet) - 1);
  std::uniform_int_distribution<int> len(0, 40);
  const PreTokenizer p(*pre_tokenizer_regexes("qwen2"));
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s;
    const int n = len(rng);
    for (int i = 0; i < n; ++i) utf8_append(s, alphabet[pick(rng)]);
    const Words got = p.split(s);
    ASSERT_EQ(got, reference_qwen2(s)) << "iteration " << iter;
    std::string joined;
    for (const auto& w : got) {
      ASSERT_FALSE(w.empty());
      joined += w;
    }
    ASSERT_EQ(joined, s);
  }
  // Long runs stay linear and whole.
  const std::string spaces(1 << 20, ' ');
  EXPECT_EQ(p.split(spaces + "x"), (Words{std::string((1 << 20) - 1, ' '), " x"}));
  EXPECT_EQ(p.split(std::string(1 << 20, '\n')), Words{std::string(1 << 20, '\n')});
}

TEST(PreTokenizer, LongRunsDoNotExhaustTheMatcher) {
  const PreTokenizer p = smollm();
  const std::string spaces(1 << 20, ' ');
  EXPECT_EQ(p.split(spaces), Words{spaces});
  EXPECT_EQ(p.split(spaces + "x"), (Words{std::string((1 << 20) - 1, ' '), " x"}));
  const std::string letters(1 << 20, 'q');
  EXPECT_EQ(p.split(letters), Words{letters});
  std::string digits(1000, '9');
  EXPECT_EQ(p.split(digits).size(), 1000u);
}

TEST(PreTokenizer, BadPatternIsAnError) {
  try {
    PreTokenizer bad({"(unclosed"});
    FAIL() << "expected ratekv::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(unclosed"), std::string::npos) << e.what();
  }
}
