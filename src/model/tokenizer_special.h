// model/tokenizer_special.h — splitting text at special-token texts.
//
// Before pre-tokenization, texts of special tokens (control, user-defined and
// unknown token types) are cut out of the input as whole strings and become
// their token id directly, as llama.cpp's tokenizer_st_partition does: the
// special tokens are taken one at a time, longest text first, and each one
// splits every still-raw fragment at all of its non-overlapping occurrences
// (scanning left to right). Control and unknown tokens are only recognised
// when parse_special is set; user-defined tokens always are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace ratekv::tok {

/// One special token to recognise.
struct SpecialToken {
  int32_t id;
  std::string_view text;  // non-empty
};

/// A piece of the input: a special token (token >= 0) or raw text to be
/// pre-tokenized (token == -1, bytes [offset, offset + length) of the input).
struct Fragment {
  int32_t token;
  size_t offset;
  size_t length;
};

/// Splits `text` at the texts of `specials`, processed in the given order
/// (the caller sorts them longest first). Raw fragments are never empty;
/// empty `text` gives no fragments.
std::vector<Fragment> split_special_tokens(std::string_view text, std::span<const SpecialToken> specials);

}  // namespace ratekv::tok
