// model/tokenizer_pretokenize.cpp — regex cascade over PCRE2 (see header).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "model/tokenizer_pretokenize.h"

#include <pcre2.h>

#include <array>
#include <cstring>

#include "model/tokenizer_unicode_additions.h"
#include "ratekv/common/error.h"

namespace ratekv::tok {

// Unicode White_Space: U+0009..U+000D, U+0020, U+0085, U+00A0, U+1680,
// U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000.
const char* const kWhiteSpaceClass =
    "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}"
    "\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

std::string letter_class() { return std::string("[\\p{L}") + kExtraLetterClass + "]"; }
std::string number_class() { return std::string("[\\p{N}") + kExtraNumberClass + "]"; }

std::string gpt2_word_regex() {
  const std::string ws = kWhiteSpaceClass;
  const std::string l = std::string("\\p{L}") + kExtraLetterClass, n = std::string("\\p{N}") + kExtraNumberClass;
  return "'s|'t|'re|'ve|'m|'ll|'d| ?[" + l + "]+| ?[" + n + "]+| ?[^" + ws + l + n + "]+|[" + ws + "]+(?![^" + ws +
         "])";
}

std::string qwen2_word_regex() {
  const std::string ws = kWhiteSpaceClass;
  const std::string l = std::string("\\p{L}") + kExtraLetterClass, n = std::string("\\p{N}") + kExtraNumberClass;
  return "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"  // contractions, either case
         "|[^\\r\\n" + l + n + "]?[" + l + "]+"                       // a word, with one leading non-letter
         "|[" + n + "]"                                                 // one digit
         "| ?[^" + ws + l + n + "]+[\\r\\n]*"                         // punctuation run (+ newlines)
         "|[" + ws + "]*[\\r\\n]+"                                    // whitespace ending in newlines
         "|[" + ws + "]+(?![^" + ws + "])"                               // whitespace not before a non-space
         "|[" + ws + "]+";
}

std::optional<std::vector<std::string>> pre_tokenizer_regexes(std::string_view pre) {
  static constexpr std::array<std::string_view, 7> kDigitsThenGpt2 = {
      "smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"};
  static constexpr std::array<std::string_view, 2> kGpt2 = {"gpt-2", "phi-2"};
  for (auto n : kDigitsThenGpt2)
    if (n == pre) return std::vector<std::string>{number_class(), gpt2_word_regex()};
  for (auto n : kGpt2)
    if (n == pre) return std::vector<std::string>{gpt2_word_regex()};
  if (pre == "qwen2") return std::vector<std::string>{qwen2_word_regex()};
  return std::nullopt;
}

namespace {

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};
struct MatchContextDeleter {
  void operator()(pcre2_match_context* m) const { pcre2_match_context_free(m); }
};
struct JitStackDeleter {
  void operator()(pcre2_jit_stack* s) const { pcre2_jit_stack_free(s); }
};
using CodePtr = std::unique_ptr<pcre2_code, CodeDeleter>;

// Length of the UTF-8 sequence starting with lead byte `c` (text is canonical).
inline size_t utf8_len(unsigned char c) {
  return c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : 4;
}

// Per-call matching state: PCRE2 match data and, if JIT ever runs out of its
// default 32 KiB machine stack, a growable JIT stack.
struct MatchState {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md{pcre2_match_data_create(1, nullptr)};
  std::unique_ptr<pcre2_match_context, MatchContextDeleter> mctx{pcre2_match_context_create(nullptr)};
  std::unique_ptr<pcre2_jit_stack, JitStackDeleter> jit_stack;
  size_t jit_stack_size = 0;
};

}  // namespace

struct PreTokenizer::Impl {
  std::vector<std::string> patterns;
  std::vector<CodePtr> codes;

  // Finds the next match of regex `level` in subject[off, len); returns false
  // when there is none. Throws Error on a PCRE2 runtime failure.
  bool next_match(size_t level, const char* subject, size_t len, size_t off, MatchState& st, size_t& mb,
                  size_t& me) const {
    for (;;) {
      const int rc = pcre2_match(codes[level].get(), reinterpret_cast<PCRE2_SPTR>(subject), len, off,
                                 PCRE2_NO_UTF_CHECK, st.md.get(), st.mctx.get());
      if (rc == PCRE2_ERROR_NOMATCH) return false;
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT && st.jit_stack_size < (size_t{64} << 20)) {
        st.jit_stack_size = st.jit_stack_size ? st.jit_stack_size * 4 : (size_t{1} << 20);
        st.jit_stack.reset(pcre2_jit_stack_create(32 * 1024, st.jit_stack_size, nullptr));
        check(st.jit_stack != nullptr, "tokenizer: cannot allocate a PCRE2 JIT stack of {} bytes", st.jit_stack_size);
        pcre2_jit_stack_assign(st.mctx.get(), nullptr, st.jit_stack.get());
        continue;
      }
      if (rc < 0) {
        std::array<PCRE2_UCHAR, 256> buf{};
        pcre2_get_error_message(rc, buf.data(), buf.size());
        fail("tokenizer: pre-tokenizer regex '{}' failed on a {}-byte piece: {}", patterns[level], len,
             reinterpret_cast<const char*>(buf.data()));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md.get());
      mb = ov[0];
      me = ov[1];
      if (me > mb) return true;
      // An empty match splits nothing: search again one character later.
      if (mb >= len) return false;
      off = mb + utf8_len(static_cast<unsigned char>(subject[mb]));
    }
  }

  // Splits piece [b, e) of `subject` with regex `level` and recurses.
  void split_piece(size_t level, const char* subject, size_t b, size_t e, MatchState& st,
                   const std::function<void(size_t, size_t)>& emit) const {
    if (level == codes.size()) {
      emit(b, e - b);
      return;
    }
    const char* piece = subject + b;
    const size_t len = e - b;
    size_t prev = 0, off = 0, mb = 0, me = 0;
    while (off < len && next_match(level, piece, len, off, st, mb, me)) {
      if (mb > prev) split_piece(level + 1, subject, b + prev, b + mb, st, emit);
      split_piece(level + 1, subject, b + mb, b + me, st, emit);
      prev = off = me;
    }
    if (prev < len) split_piece(level + 1, subject, b + prev, e, st, emit);
  }
};

PreTokenizer::PreTokenizer(std::vector<std::string> patterns) : impl_(std::make_unique<Impl>()) {
  impl_->patterns = std::move(patterns);
  for (const auto& p : impl_->patterns) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    CodePtr code(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), PCRE2_UTF | PCRE2_UCP, &err,
                               &err_off, nullptr));
    if (!code) {
      std::array<PCRE2_UCHAR, 256> buf{};
      pcre2_get_error_message(err, buf.data(), buf.size());
      fail("tokenizer: cannot compile pre-tokenizer regex '{}' at offset {}: {}", p, err_off,
           reinterpret_cast<const char*>(buf.data()));
    }
    // JIT is an optimisation only; the interpreter is used if it is unavailable.
    (void)pcre2_jit_compile(code.get(), PCRE2_JIT_COMPLETE);
    impl_->codes.push_back(std::move(code));
  }
}

PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

const std::vector<std::string>& PreTokenizer::patterns() const { return impl_->patterns; }

void PreTokenizer::split(std::string_view text, const std::function<void(size_t, size_t)>& emit) const {
  if (text.empty()) return;
  // PCRE2 rejects encoded surrogates (ED A0..BF xx) in UTF mode; match on a
  // copy where each is replaced by U+FFFD (EF BF BD, same length).
  std::string shadow;
  const char* subject = text.data();
  for (size_t i = 0; i + 1 < text.size(); ++i) {
    if (static_cast<unsigned char>(text[i]) == 0xED && (static_cast<unsigned char>(text[i + 1]) & 0xE0) == 0xA0) {
      if (shadow.empty()) shadow.assign(text);
      std::memcpy(&shadow[i], "\xEF\xBF\xBD", 3);
      i += 2;
    }
  }
  if (!shadow.empty()) subject = shadow.data();
  MatchState st;
  check(st.md != nullptr && st.mctx != nullptr, "tokenizer: out of memory allocating PCRE2 match data");
  impl_->split_piece(0, subject, 0, text.size(), st, emit);
}

std::vector<std::string> PreTokenizer::split(std::string_view text) const {
  std::vector<std::string> words;
  split(text, [&](size_t off, size_t len) { words.emplace_back(text.substr(off, len)); });
  return words;
}

}  // namespace ratekv::tok
