// ratekv/model/tokenizer.h — tokenizer built from GGUF metadata (tokenizer.ggml.*).
//
// Supported: tokenizer.ggml.model == "gpt2" (byte-level BPE with merges; the
// pre-tokenizer regexes are chosen by tokenizer.ggml.pre, e.g. "smollm" splits
// digits one by one) and "llama" (SentencePiece-style: spaces escaped to "▁",
// merges by tokenizer.ggml.scores, byte-fallback tokens "<0xXX>"; Gemma 3).
// Token ids match llama.cpp's tokenizer for the same file
// (tests/fixtures/smollm2, tests/fixtures/gemma3). Throws ratekv::Error naming the GGUF key for a
// missing or malformed vocabulary, or an unsupported tokenizer model /
// pre-tokenizer.
//
// Input text is UTF-8. As in llama.cpp, bytes that are not valid UTF-8 are
// each replaced by U+FFFD before tokenization (so decode(encode(s)) == s only
// for valid UTF-8 s), and a byte for which the vocabulary has no token is
// dropped (SmolLM2 lacks e.g. the control bytes 0x04, 0x06; a warning is
// logged).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ratekv {

class GgufFile;

/// A vocabulary as stored under tokenizer.ggml.* (used by from_vocab; from_gguf
/// fills it from the file). Token types follow llama.cpp's enum:
/// 0 undefined, 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
struct TokenizerVocab {
  std::string model = "gpt2";             // tokenizer.ggml.model
  std::string pre;                        // tokenizer.ggml.pre
  std::vector<std::string> tokens;        // tokenizer.ggml.tokens (byte-level texts)
  std::vector<int32_t> token_types;       // tokenizer.ggml.token_type; empty = all normal
  std::vector<std::string> merges;        // tokenizer.ggml.merges, "left right", rank order ("gpt2")
  std::vector<float> scores;              // tokenizer.ggml.scores, one per token ("llama": required)
  bool add_space_prefix = false;          // tokenizer.ggml.add_space_prefix ("llama"; GGUF default true)
  int32_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;  // -1: none
  int32_t eot_id = -1, eom_id = -1;       // optional end-of-turn / end-of-message ids
  bool add_bos = false, add_eos = false;  // tokenizer.ggml.add_bos_token / add_eos_token
};

class Tokenizer {
 public:
  /// Reads tokenizer.ggml.* from `f` (see TokenizerVocab) and builds the
  /// tokenizer. Throws Error naming the key for a missing/ill-typed key or an
  /// unsupported model / pre value.
  static Tokenizer from_gguf(const GgufFile& f);
  /// Builds a tokenizer from an in-memory vocabulary (tests, tools). Throws
  /// Error naming the tokenizer.ggml.* key a bad field corresponds to.
  static Tokenizer from_vocab(TokenizerVocab vocab);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  /// Text (UTF-8; see the file comment for invalid bytes) -> token ids.
  /// add_bos is llama.cpp's add_special: prepend BOS if the model declares
  /// tokenizer.ggml.add_bos_token and append EOS if it declares
  /// add_eos_token (SmolLM2 declares neither, so it adds nothing).
  /// parse_special: recognise control token texts such as "<|im_start|>" in
  /// `text` (as llama.cpp's parse_special); user-defined tokens are always
  /// recognised.
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special = false) const;
  /// Token ids -> UTF-8 text (byte-level decoding; special tokens rendered
  /// as their text unless skip_special). Throws Error for an id out of range.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  /// The raw vocabulary string of one id.
  const std::string& token_text(int32_t id) const;
  int32_t n_vocab() const;
  int32_t bos_id() const;   // -1 if none
  int32_t eos_id() const;   // -1 if none
  /// True for end-of-generation tokens (EOS, EOT, <|im_end|> ...).
  bool is_eog(int32_t id) const;
  /// The tokenizer.ggml.pre value and the pre-tokenizer regex cascade in use
  /// (PCRE2 syntax; see src/model/tokenizer_pretokenize.h). For a "llama"
  /// (SentencePiece-style) tokenizer the cascade is empty.
  const std::string& pre_type() const;
  const std::vector<std::string>& pre_tokenizer_regexes() const;
  /// tokenizer.ggml.model: "gpt2" or "llama".
  const std::string& model_type() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
};

}  // namespace ratekv
