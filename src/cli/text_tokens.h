// cli/text_tokens.h — the first N tokens of a text file, as calibrate and
// eval read them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ratekv/model/tokenizer.h"

namespace ratekv::cli {

/// The bytes of the text file at `path`. Throws Error naming `flag` and the
/// path when it is not a regular file (a directory, a FIFO, a device such as
/// /dev/zero, whose read would never end) or cannot be read.
std::string read_text_file(const std::string& path, const std::string& flag);

/// Logs a warning naming `flag`, the file and the first offending byte when
/// `text` is not valid UTF-8 (ratekv/common/utf8.h), once per (flag, file) per process; the tokenizer then takes such
/// bytes as raw bytes (ratekv/model/tokenizer.h), as llama.cpp does.
void warn_if_not_utf8(std::string_view text, const std::string& flag, const std::string& path);

/// Tokenizes a growing prefix of the UTF-8 text at `path` until it yields at
/// least n_tokens + 64 tokens (or the whole file) and returns the first
/// n_tokens (warn_if_not_utf8 first). The 64-token margin keeps the returned tokens equal to those of
/// tokenizing the whole file (a cut can only change the last pre-token).
/// add_bos as Tokenizer::encode. n_tokens ≤ 0 means the whole file.
/// Throws Error naming `flag` and the file when it cannot be read or holds
/// fewer than n_tokens tokens.
std::vector<int32_t> read_text_tokens(const Tokenizer& tok, const std::string& path, int64_t n_tokens, bool add_bos,
                                      const std::string& flag);

}  // namespace ratekv::cli
