// First N tokens of a text file (cli/text_tokens.h).
#include "cli/text_tokens.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "ratekv/common/error.h"
#include "ratekv/common/log.h"
#include "ratekv/common/utf8.h"

namespace ratekv::cli {

std::string read_text_file(const std::string& path, const std::string& flag) {
  std::error_code ec;
  check(std::filesystem::is_regular_file(path, ec), "{} '{}': not a regular file (expected a text file)", flag, path);
  std::ifstream in(path, std::ios::binary);
  check(in.good(), "{} '{}': cannot open the text file", flag, path);
  std::ostringstream ss;
  ss << in.rdbuf();
  check(!in.bad(), "{} '{}': read failed", flag, path);
  return std::move(ss).str();
}

void warn_if_not_utf8(std::string_view text, const std::string& flag, const std::string& path) {
  const size_t at = first_invalid_utf8(text);
  if (at == std::string_view::npos) return;
  // Once per file and flag per process (panel reads its texts once per model).
  static std::set<std::string> warned;
  if (!warned.insert(flag + '\n' + path).second) return;
  // A UTF-16 byte-order mark (FF FE / FE FF) names the likely encoding; otherwise Latin-1 is the usual culprit.
  const bool utf16 = text.size() >= 2 && ((text[0] == '\xFF' && text[1] == '\xFE') ||
                                          (text[0] == '\xFE' && text[1] == '\xFF'));
  spdlog::warn(
      "{} '{}': not valid UTF-8 at byte {} (0x{:02X}); such bytes are tokenized as raw bytes, as "
      "llama.cpp does, which is rarely meaningful text (convert the file, e.g. {})",
      flag, path, at, static_cast<unsigned>(static_cast<unsigned char>(text[at])),
      utf16 ? "iconv -f utf-16 -t utf-8: it starts with a UTF-16 byte-order mark" : "iconv -f latin1 -t utf-8");
}

std::vector<int32_t> read_text_tokens(const Tokenizer& tok, const std::string& path, int64_t n_tokens, bool add_bos,
                                      const std::string& flag) {
  const std::string text = read_text_file(path, flag);
  check(!text.empty(), "{} '{}': the text file is empty", flag, path);
  warn_if_not_utf8(text, flag, path);
  if (n_tokens <= 0) return tok.encode(text, add_bos);
  // A token covers at least one byte (BOS aside), so more tokens than bytes means the whole file; this also
  // keeps n_tokens · 6 and n_tokens + 64 below from overflowing for a huge --tokens.
  size_t len = n_tokens >= static_cast<int64_t>(text.size())
                   ? text.size()
                   : std::min<size_t>(text.size(), static_cast<size_t>(n_tokens) * 6 + 4096);
  for (;;) {
    // Cut at a line break so the prefix ends where the pre-tokenizer splits anyway.
    size_t cut = len;
    if (cut < text.size()) {
      const size_t nl = text.rfind('\n', cut);
      if (nl != std::string::npos && nl > cut / 2) cut = nl + 1;
    }
    std::vector<int32_t> ids = tok.encode(std::string_view(text).substr(0, cut), add_bos);
    if (static_cast<int64_t>(ids.size()) - 64 >= n_tokens || cut == text.size()) {
      check(static_cast<int64_t>(ids.size()) >= n_tokens, "{} '{}': the text has only {} tokens, {} requested", flag,
            path, ids.size(), n_tokens);
      ids.resize(static_cast<size_t>(n_tokens));
      return ids;
    }
    len = std::min(text.size(), len * 2);
  }
}

}  // namespace ratekv::cli
