// model/tokenizer_spm.h — SentencePiece-style (tokenizer.ggml.model "llama")
// score-driven merging over one text fragment, with byte fallback.
//
// Algorithm (Kudo & Richardson 2018, the BPE mode of SentencePiece as
// llama.cpp's llm_tokenizer_spm_session runs it): spaces are first escaped to
// U+2581 "▁"; the fragment starts as one symbol per UTF-8 character (a byte
// that does not start a valid sequence is a symbol of one byte); every
// adjacent pair whose concatenation is a vocabulary text is a candidate with
// that token's score; repeatedly the candidate with the highest score is
// merged (ties: the leftmost), new candidates with its neighbours are added,
// until none is left. Each final symbol that is a token is emitted; any other
// symbol (only possible for a single character missing from the vocabulary) is
// emitted byte by byte as the byte tokens "<0xXX>" (byte fallback), or as the
// one-byte text when there is no such byte token; a byte with neither is
// dropped (counted).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ratekv::tok {

class SpmModel {
 public:
  /// `tokens[i]` is token i's text (with "▁" for spaces), `scores[i]` its
  /// merge priority (tokenizer.ggml.scores). For a text listed twice the last
  /// id counts (as llama.cpp). Sizes must match (checked by the caller).
  SpmModel(const std::vector<std::string>& tokens, const std::vector<float>& scores);
  SpmModel(const SpmModel&) = delete;  // text_to_id_ views into tokens_
  SpmModel& operator=(const SpmModel&) = delete;

  /// Appends the token ids of `text` (raw UTF-8, spaces not yet escaped,
  /// non-empty) to `out`. Returns the number of bytes dropped (no byte token).
  size_t encode(std::string_view text, std::vector<int32_t>& out) const;

  /// Token id of `text`, -1 if it is not in the vocabulary.
  int32_t find(std::string_view text) const;

 private:
  std::unordered_map<std::string_view, int32_t> text_to_id_;  // views into tokens_
  std::vector<std::string> tokens_;
  std::vector<float> scores_;
  int32_t byte_token_[256];  // "<0xXX>" token, else the one-byte text token, else -1
};

/// "▁" (U+2581), SentencePiece's escaped space.
inline constexpr std::string_view kSpmSpace = "\xE2\x96\x81";

/// Replaces every "▁" in `text` by a space (decoding of normal SPM tokens).
std::string spm_unescape(std::string_view text);

}  // namespace ratekv::tok
