// The ChatML prompt of a tokenizer.chat_template (ratekv/model/chat_template.h).
#include "ratekv/model/chat_template.h"

#include "ratekv/common/error.h"

namespace ratekv {

namespace {

constexpr std::string_view kStart = "<|im_start|>system", kEnd = "<|im_end|>";

// Resolves the Jinja string escapes \n \t \' \" \\ of a constant; nullopt-like
// false when another backslash sequence appears.
bool unescape(std::string_view in, std::string& out) {
  out.clear();
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '\\') {
      out.push_back(in[i]);
      continue;
    }
    if (i + 1 >= in.size()) return false;
    switch (in[++i]) {
      case 'n': out.push_back('\n'); break;
      case 't': out.push_back('\t'); break;
      case '\'': out.push_back('\''); break;
      case '"': out.push_back('"'); break;
      case '\\': out.push_back('\\'); break;
      default: return false;
    }
  }
  return true;
}

}  // namespace

bool is_chatml_template(std::string_view tpl) { return tpl.find("<|im_start|>") != std::string_view::npos; }

std::string chatml_default_system(std::string_view tpl) {
  check(is_chatml_template(tpl), "tokenizer.chat_template is not a ChatML (<|im_start|>) template");
  for (size_t at = tpl.find(kStart); at != std::string_view::npos; at = tpl.find(kStart, at + 1)) {
    size_t p = at + kStart.size();
    if (tpl.substr(p, 1) == "\n") {
      p += 1;
    } else if (tpl.substr(p, 2) == "\\n") {
      p += 2;
    } else {
      continue;
    }
    const size_t end = tpl.find(kEnd, p);
    if (end == std::string_view::npos) break;
    const std::string_view content = tpl.substr(p, end - p);
    if (content.empty() || content.find_first_of("{}'\"+<") != std::string_view::npos) continue;
    std::string out;
    if (unescape(content, out)) return out;
  }
  return "";
}

std::string chatml_prompt(std::string_view tpl, std::string_view user) {
  const std::string sys = chatml_default_system(tpl);
  std::string s;
  if (!sys.empty()) s += "<|im_start|>system\n" + sys + "<|im_end|>\n";
  s += "<|im_start|>user\n";
  s += user;
  s += "<|im_end|>\n<|im_start|>assistant\n";
  return s;
}

}  // namespace ratekv
