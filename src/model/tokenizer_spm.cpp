// model/tokenizer_spm.cpp — SentencePiece-style score merging (see tokenizer_spm.h).
#include "model/tokenizer_spm.h"

#include <queue>

namespace ratekv::tok {

namespace {

// Length of the UTF-8 sequence a lead byte announces (1 for continuation or
// invalid bytes), as llama.cpp's unicode_len_utf8.
size_t utf8_len(unsigned char c) {
  static constexpr size_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[c >> 4];
}

struct Symbol {
  int32_t prev, next;
  size_t off, n;  // bytes [off, off + n) of the escaped text; n == 0: merged away
};

struct Bigram {
  int32_t left, right;
  float score;
  size_t size;
};

// Highest score on top; equal scores: the smaller left index.
struct BigramOrder {
  bool operator()(const Bigram& l, const Bigram& r) const {
    return l.score < r.score || (l.score == r.score && l.left > r.left);
  }
};

}  // namespace

SpmModel::SpmModel(const std::vector<std::string>& tokens, const std::vector<float>& scores)
    : tokens_(tokens), scores_(scores) {
  text_to_id_.reserve(tokens_.size());
  for (size_t i = 0; i < tokens_.size(); ++i) text_to_id_[tokens_[i]] = static_cast<int32_t>(i);
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const char hex[6] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
    int32_t id = find(std::string_view(hex, 6));
    if (id < 0) {
      const char one = static_cast<char>(b);
      id = find(std::string_view(&one, 1));
    }
    byte_token_[b] = id;
  }
}

int32_t SpmModel::find(std::string_view text) const {
  const auto it = text_to_id_.find(text);
  return it == text_to_id_.end() ? -1 : it->second;
}

size_t SpmModel::encode(std::string_view raw, std::vector<int32_t>& out) const {
  std::string text;
  text.reserve(raw.size() + raw.size() / 4);
  for (char c : raw) {
    if (c == ' ') text += kSpmSpace;
    else text.push_back(c);
  }
  std::vector<Symbol> sym;
  sym.reserve(text.size());
  for (size_t off = 0; off < text.size();) {
    const size_t n = std::min(utf8_len(static_cast<unsigned char>(text[off])), text.size() - off);
    const auto idx = static_cast<int32_t>(sym.size());
    off += n;
    sym.push_back(Symbol{idx - 1, off == text.size() ? -1 : idx + 1, off - n, n});
  }
  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
  auto try_add = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const std::string_view s(text.data() + sym[l].off, sym[l].n + sym[r].n);
    const int32_t id = find(s);
    if (id < 0) return;
    queue.push(Bigram{l, r, scores_[id], s.size()});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(sym.size()); ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& L = sym[b.left];
    Symbol& R = sym[b.right];
    if (L.n == 0 || R.n == 0 || L.n + R.n != b.size) continue;  // stale candidate
    L.n += R.n;
    R.n = 0;
    L.next = R.next;
    if (R.next >= 0) sym[R.next].prev = b.left;
    try_add(L.prev, b.left);
    try_add(b.left, L.next);
  }
  // Every merged symbol is a vocabulary text by construction; only unmerged
  // single characters can be missing and fall back to bytes.
  size_t dropped = 0;
  for (int32_t i = sym.empty() ? -1 : 0; i != -1; i = sym[i].next) {
    const std::string_view s(text.data() + sym[i].off, sym[i].n);
    const int32_t id = find(s);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    for (unsigned char c : s) {
      if (byte_token_[c] >= 0) out.push_back(byte_token_[c]);
      else ++dropped;
    }
  }
  return dropped;
}

std::string spm_unescape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text.substr(i, kSpmSpace.size()) == kSpmSpace) {
      out.push_back(' ');
      i += kSpmSpace.size();
    } else {
      out.push_back(text[i++]);
    }
  }
  return out;
}

}  // namespace ratekv::tok
