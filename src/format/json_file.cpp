#include "format/json_file.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "ratekv/common/error.h"

namespace ratekv::format {

namespace {

// How the start of a non-JSON file reads: its first characters when they are
// printable ASCII, else its first bytes in hex, plus the format when the magic
// is one we know (a model or a safetensors file given in the wrong place).
std::string describe_start(std::string_view s) {
  const std::string_view head = s.substr(0, 16);
  std::string what;
  if (s.substr(0, 4) == "GGUF") {
    what = " (a GGUF model file)";
  } else if (s.size() >= 9 && s[8] == '{' && s.substr(5, 3) == std::string_view("\0\0\0", 3)) {
    what = " (a safetensors file: 8-byte header length, then its JSON header)";
  }
  bool printable = !head.empty();
  for (char c : head) printable = printable && ((c >= 0x20 && c < 0x7f) || c == '\n' || c == '\t' || c == '\r');
  if (printable) {
    std::string line(head.substr(0, head.find_first_of("\r\n")));
    return fmt::format("it starts with '{}'{}", line, what);
  }
  std::string hex;
  for (size_t i = 0; i < std::min<size_t>(s.size(), 8); ++i)
    hex += fmt::format("{}{:02x}", i ? " " : "", static_cast<unsigned char>(s[i]));
  return fmt::format("it starts with bytes {}{}", hex, what);
}

// Index of the first byte of the JSON text: past a UTF-8 byte order mark and
// white space (what the parser skips).
size_t json_start(std::string_view s) {
  size_t i = s.substr(0, 3) == "\xEF\xBB\xBF" ? 3 : 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
  return i;
}

}  // namespace

nlohmann::json read_json_file(const std::string& path, const char* what, const char* expected) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  check(!ec, "{}: cannot read {}: {}", path, what, ec.message());
  check(size <= (uint64_t)1 << 30, "{}: {} file of {} bytes is larger than the 1 GiB limit", path, what, size);
  std::ifstream in(path, std::ios::binary);
  check((bool)in, "{}: cannot open {} for reading", path, what);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  // Every document read here is a JSON object: anything that does not start
  // like one is another kind of file, and a JSON syntax error at column 1
  // would not say so.
  const size_t start = json_start(text);
  check(start < text.size() && text[start] == '{', "{}: not {}: {}", path, expected,
        start < text.size() ? describe_start(text) : std::string("it is empty"));
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range 406: a number beyond double
    fail("{}: invalid JSON: {}", path, e.what());
  }
}

}  // namespace ratekv::format
