// model/tokenizer_pretokenize.h — regex pre-tokenization ("word" splitting)
// before byte-level BPE.
//
// A pre-tokenizer is a cascade of regexes, applied as llama.cpp applies them
// (unicode_regex_split): the text starts as one piece; each regex in turn
// splits every current piece into its matches AND the unmatched gaps between
// them (gaps are kept as pieces of their own, nothing is dropped). The pieces
// left after the last regex are the BPE words; they cover the input exactly.
// Regexes see one piece at a time: a lookahead at a piece's end sees the end
// of the subject.
//
// The cascades (PCRE2 syntax, compiled with PCRE2_UTF | PCRE2_UCP) follow
// llama.cpp's table for each tokenizer.ggml.pre value, with one adjustment:
// llama.cpp's "\s" is the Unicode White_Space property (25 code points,
// including U+0085), while PCRE2's UCP "\s" omits U+0085, so we spell the
// class out (kWhiteSpaceClass). Letters / numbers are Unicode general
// categories L* / N*: PCRE2's \p{L} / \p{N} plus the code points that became
// letters / numbers by Unicode 15.1 (llama.cpp's table version) but are missing
// from PCRE2 10.42's Unicode 14 tables (tokenizer_unicode_additions.h,
// generated): letter_class(), number_class().
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ratekv::tok {

/// The contents of a character class matching llama.cpp's whitespace set
/// (Unicode White_Space), for use inside [...] in a PCRE2 pattern.
extern const char* const kWhiteSpaceClass;

/// "[\p{L}...]": Unicode 15.1 letters. "[\p{N}...]": Unicode 15.1 numbers.
std::string letter_class();
std::string number_class();

/// The GPT-2 word regex ('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
/// ?[^\s\p{L}\p{N}]+|\s+(?!\S)) in PCRE2 syntax with kWhiteSpaceClass,
/// letter_class() and number_class().
std::string gpt2_word_regex();

/// The Qwen2 word regex, llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN2 (Qwen2's
/// tokenizer.json regex with the case-insensitive contractions spelled out):
///   (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])
///   |[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*
///   |\s*[\r\n]+|\s+(?!\S)|\s+
/// — digits one at a time, a word takes one leading non-letter (a space,
/// tab, quote ...), newlines end punctuation runs and whitespace runs. In
/// PCRE2 syntax with kWhiteSpaceClass, letter_class() and number_class(),
/// equivalent to llama.cpp's hand-written splitter for it
/// (unicode_regex_split_custom_qwen2; tests/fixtures/qwen2.5-0.5b).
std::string qwen2_word_regex();

/// The regex cascade llama.cpp uses for tokenizer.ggml.pre == `pre`, or
/// nullopt when `pre` is not supported here. Supported:
///   "smollm" (and "starcoder", "refact", "command-r", "codeshell", "exaone",
///   "minerva-7b", which share it): {number_class(), gpt2_word_regex()} — every
///   digit is its own word, then GPT-2 words;
///   "gpt-2", "phi-2": {gpt2_word_regex()};
///   "qwen2": {qwen2_word_regex()}.
std::optional<std::vector<std::string>> pre_tokenizer_regexes(std::string_view pre);

/// A compiled regex cascade. Thread-safe: split() may run concurrently.
class PreTokenizer {
 public:
  /// Compiles `patterns` (PCRE2, UTF + UCP, JIT when available). Throws
  /// ratekv::Error naming the pattern and the PCRE2 message on a bad pattern.
  explicit PreTokenizer(std::vector<std::string> patterns);
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

  /// Splits `text` — which must be canonical UTF-8 (utf8_canonicalize) — and
  /// calls emit(offset, length) for every word, in order. Empty text emits
  /// nothing. Encoded surrogates are matched as if they were U+FFFD (both are
  /// "other" characters, neither letter, number nor space).
  void split(std::string_view text, const std::function<void(size_t, size_t)>& emit) const;
  /// Convenience: the words as strings.
  std::vector<std::string> split(std::string_view text) const;

  const std::vector<std::string>& patterns() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ratekv::tok
