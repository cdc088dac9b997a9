// First N tokens of a text file (cli/text_tokens.h).
#include "cli/text_tokens.h"

#include <fstream>
#include <sstream>

#include "ratekv/error.h"

namespace ratekv::cli {

std::vector<int32_t> read_text_tokens(const Tokenizer& tok, const std::string& path, int64_t n_tokens, bool add_bos,
                                      const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  check(in.good(), "{} '{}': cannot open the text file", flag, path);
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  check(!text.empty(), "{} '{}': the text file is empty", flag, path);
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
