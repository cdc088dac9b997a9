// model/tokenizer_special.cpp — splitting text at special-token texts.
#include "model/tokenizer_special.h"

namespace ratekv::tok {

std::vector<Fragment> split_special_tokens(std::string_view text, std::span<const SpecialToken> specials) {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back(Fragment{-1, 0, text.size()});
  std::vector<Fragment> next;
  for (const SpecialToken& sp : specials) {
    if (sp.text.empty()) continue;
    next.clear();
    bool changed = false;
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      const std::string_view raw = text.substr(f.offset, f.length);
      size_t pos = 0;
      for (size_t hit; (hit = raw.find(sp.text, pos)) != std::string_view::npos; pos = hit + sp.text.size()) {
        if (hit > pos) next.push_back(Fragment{-1, f.offset + pos, hit - pos});
        next.push_back(Fragment{sp.id, f.offset + hit, sp.text.size()});
        changed = true;
      }
      if (pos < raw.size()) next.push_back(Fragment{-1, f.offset + pos, raw.size() - pos});
    }
    if (changed) frags.swap(next);
  }
  return frags;
}

}  // namespace ratekv::tok
