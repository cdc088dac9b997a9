// First N tokens of a text file (cli/text_tokens.h).
#include "cli/text_tokens.h"

#include <fstream>
#include <sstream>

#include "ratekv/error.h"
#include "ratekv/log.h"
#include "ratekv/utf8.h"

namespace ratekv::cli {

void warn_if_not_utf8(std::string_view text, const std::string& flag, const std::string& path) {
  const size_t at = first_invalid_utf8(text);
  if (at == std::string_view::npos) return;
  spdlog::warn(
      "{} '{}': not valid UTF-8 at byte {} (0x{:02X}); such bytes are tokenized as raw bytes, as "
      "llama.cpp does, which is rarely meaningful text (convert the file, e.g. iconv -f latin1 -t utf-8)",
      flag, path, at, static_cast<unsigned>(static_cast<unsigned char>(text[at])));
}

std::vector<int32_t> read_text_tokens(const Tokenizer& tok, const std::string& path, int64_t n_tokens, bool add_bos,
                                      const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  check(in.good(), "{} '{}': cannot open the text file", flag, path);
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  check(!text.empty(), "{} '{}': the text file is empty", flag, path);
  warn_if_not_utf8(text, flag, path);
  if (n_tokens <= 0) return tok.encode(text, add_bos);
  size_t len = std::min<size_t>(text.size(), static_cast<size_t>(n_tokens) * 6 + 4096);
  for (;;) {
    // Cut at a line break so the prefix ends where the pre-tokenizer splits anyway.
    size_t cut = len;
    if (cut < text.size()) {
      const size_t nl = text.rfind('\n', cut);
      if (nl != std::string::npos && nl > cut / 2) cut = nl + 1;
    }
    std::vector<int32_t> ids = tok.encode(std::string_view(text).substr(0, cut), add_bos);
    if (static_cast<int64_t>(ids.size()) >= n_tokens + 64 || cut == text.size()) {
      check(static_cast<int64_t>(ids.size()) >= n_tokens, "{} '{}': the text has only {} tokens, {} requested", flag,
            path, ids.size(), n_tokens);
      ids.resize(static_cast<size_t>(n_tokens));
      return ids;
    }
    len = std::min(text.size(), len * 2);
  }
}

}  // namespace ratekv::cli
