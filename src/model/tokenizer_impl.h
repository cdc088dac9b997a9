// model/tokenizer_impl.h — the state behind ratekv::Tokenizer (internal).
#pragma once

#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "model/tokenizer_bpe.h"
#include "model/tokenizer_pretokenize.h"
#include "model/tokenizer_special.h"
#include "model/tokenizer_spm.h"
#include "ratekv/model/tokenizer.h"

namespace ratekv {

/// llama.cpp token types (tokenizer.ggml.token_type values).
enum class TokenType : int32_t {
  Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6,
};

struct Tokenizer::Impl {
  /// Validates `v` and builds every table. Throws Error (see from_vocab).
  explicit Impl(TokenizerVocab v);

  TokenizerVocab vocab;              // texts, types (filled to n_vocab), ids, flags
  std::vector<std::string> pieces;   // decoded bytes of each token (what decode emits)
  std::vector<std::string> regexes;  // the pre-tokenizer cascade ("gpt2" only)
  // Exactly one model is set, chosen by vocab.model: "gpt2" -> pre + bpe,
  // "llama" -> spm.
  std::optional<tok::PreTokenizer> pre;
  std::optional<tok::BpeModel> bpe;
  std::optional<tok::SpmModel> spm;
  std::vector<tok::SpecialToken> specials;      // control/user-defined/unknown, longest text first
  std::vector<tok::SpecialToken> user_defined;  // the user-defined subset (always recognised)
  std::unordered_set<int32_t> eog;

  TokenType type(int32_t id) const { return static_cast<TokenType>(vocab.token_types[id]); }
};

}  // namespace ratekv
