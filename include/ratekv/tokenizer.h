// ratekv/tokenizer.h — tokenizer built from GGUF metadata (tokenizer.ggml.*).
//
// Supported: tokenizer.ggml.model == "gpt2" (byte-level BPE with merges; the
// pre-tokenizer regexes are chosen by tokenizer.ggml.pre, e.g. "smollm" splits
// digits one by one). Token ids match llama.cpp's tokenizer for the same file
// (tests/fixtures). Throws ratekv::Error naming the GGUF key for a missing or
// malformed vocabulary, or an unsupported tokenizer model / pre-tokenizer.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ratekv {

class GgufFile;

class Tokenizer {
 public:
  static Tokenizer from_gguf(const GgufFile& f);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  /// Text (UTF-8; invalid bytes are encoded byte-wise) -> token ids.
  /// add_bos: prepend BOS if the model declares tokenizer.ggml.add_bos_token
  /// (or always when force). parse_special: recognise special/control token
  /// texts such as "<|im_start|>" in `text` (as llama.cpp's parse_special).
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

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
};

}  // namespace ratekv
