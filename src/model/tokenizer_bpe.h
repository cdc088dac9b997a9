// model/tokenizer_bpe.h — byte-level BPE over one pre-tokenized word.
//
// Algorithm (Sennrich et al. 2016, GPT-2 variant; merge order exactly as
// llama.cpp's llm_tokenizer_bpe_session): the word starts as one symbol per
// byte; repeatedly the adjacent pair with the lowest merge rank is merged,
// ties going to the leftmost pair, until no adjacent pair has a rank. Each
// final symbol is looked up in the vocabulary; a symbol that is no token is
// emitted byte by byte the way llama.cpp does it: every byte of the symbol's
// byte-level UTF-8 text is looked up as a one-byte token text, and bytes with
// no such token are dropped (counted in the return value).
//
// Internally everything runs on raw bytes: vocabulary texts and merges are
// converted from byte-level characters back to bytes once, at construction,
// and symbols are interned so a merge is one hash lookup on an id pair.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ratekv::tok {

class BpeModel {
 public:
  /// `tokens[i]` is token i's byte-level text; `merges[r]` is "left right"
  /// (byte-level texts separated by the first space after the first
  /// character) with rank r. Throws ratekv::Error naming
  /// tokenizer.ggml.merges[r] when a merge has no separating space. Merges
  /// whose halves are not byte-level text can never apply and are ignored;
  /// for a repeated pair the first (lowest) rank counts.
  BpeModel(const std::vector<std::string>& tokens, const std::vector<std::string>& merges);

  /// Appends the token ids of `word` (raw bytes, non-empty) to `out`.
  /// Returns the number of bytes that had no token and were dropped.
  size_t encode_word(std::string_view word, std::vector<int32_t>& out) const;

  /// Number of merges that can apply (both halves byte-level text).
  size_t n_usable_merges() const { return pair_merge_.size(); }

 private:
  struct Merge {
    int32_t rank;
    int32_t merged;  // symbol id of left+right
  };
  static uint64_t pair_key(int32_t l, int32_t r) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
  }
  int32_t intern(const std::string& raw);
  void emit_symbol(std::string_view raw, int32_t sym, std::vector<int32_t>& out, size_t& dropped) const;

  std::unordered_map<std::string, int32_t> sym_ids_;  // raw bytes -> symbol id (0..255: single bytes)
  std::vector<int32_t> sym_token_;                    // symbol id -> token id, -1 if none
  std::unordered_map<uint64_t, Merge> pair_merge_;
  std::unordered_map<std::string, int32_t> raw_to_token_;  // raw bytes -> token id
  std::vector<int32_t> byte_fallback_[256];                 // see file comment
};

}  // namespace ratekv::tok
