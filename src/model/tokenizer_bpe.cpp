// model/tokenizer_bpe.cpp — byte-level BPE (see tokenizer_bpe.h).
#include "model/tokenizer_bpe.h"

#include <queue>

#include "model/tokenizer_byte_level.h"
#include "ratekv/common/error.h"

namespace ratekv::tok {

BpeModel::BpeModel(const std::vector<std::string>& tokens, const std::vector<std::string>& merges) {
  // Vocabulary in raw-byte space. As in llama.cpp's token_to_id, a later
  // token with the same text replaces an earlier one.
  std::unordered_map<std::string_view, int32_t> one_byte_texts;
  raw_to_token_.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (auto raw = byte_level_decode(tokens[i])) raw_to_token_[*raw] = static_cast<int32_t>(i);
    if (tokens[i].size() == 1) one_byte_texts[tokens[i]] = static_cast<int32_t>(i);
  }
  for (int b = 0; b < 256; ++b) {
    intern(std::string(1, static_cast<char>(b)));
    std::string enc = byte_level_encode(std::string(1, static_cast<char>(b)));
    for (char c : enc) {
      auto it = one_byte_texts.find(std::string_view(&c, 1));
      if (it != one_byte_texts.end()) byte_fallback_[b].push_back(it->second);
    }
  }
  pair_merge_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string& m = merges[r];
    const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    check(sp != std::string::npos, "tokenizer.ggml.merges[{}] = '{}': expected two token texts separated by a space",
          r, m);
    auto left = byte_level_decode(std::string_view(m).substr(0, sp));
    auto right = byte_level_decode(std::string_view(m).substr(sp + 1));
    if (!left || !right || left->empty() || right->empty()) continue;  // can never apply
    const int32_t l = intern(*left), rr = intern(*right), merged = intern(*left + *right);
    pair_merge_.try_emplace(pair_key(l, rr), Merge{static_cast<int32_t>(r), merged});
  }
}

int32_t BpeModel::intern(const std::string& raw) {
  auto [it, inserted] = sym_ids_.try_emplace(raw, static_cast<int32_t>(sym_token_.size()));
  if (inserted) {
    auto t = raw_to_token_.find(raw);
    sym_token_.push_back(t == raw_to_token_.end() ? -1 : t->second);
  }
  return it->second;
}

void BpeModel::emit_symbol(std::string_view raw, int32_t sym, std::vector<int32_t>& out, size_t& dropped) const {
  if (sym_token_[sym] >= 0) {
    out.push_back(sym_token_[sym]);
    return;
  }
  for (unsigned char b : raw) {
    if (byte_fallback_[b].empty()) ++dropped;
    out.insert(out.end(), byte_fallback_[b].begin(), byte_fallback_[b].end());
  }
}

size_t BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  size_t dropped = 0;
  const auto n = static_cast<int32_t>(word.size());
  if (n == 0) return 0;
  if (n == 1) {
    emit_symbol(word, static_cast<unsigned char>(word[0]), out, dropped);
    return dropped;
  }
  struct Symbol {
    int32_t id;  // -1 once merged into its left neighbour
    int32_t prev, next;
    int32_t start, len;  // bytes of `word`
  };
  struct Candidate {
    int32_t rank, left, right, lsym, rsym, merged;
  };
  // Lowest rank first; on equal rank the leftmost pair (smaller index).
  auto worse = [](const Candidate& a, const Candidate& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  };
  std::vector<Symbol> sym(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i)
    sym[i] = Symbol{static_cast<unsigned char>(word[i]), i - 1, i + 1 < n ? i + 1 : -1, i, 1};
  std::vector<Candidate> heap_storage;
  heap_storage.reserve(static_cast<size_t>(n));
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(worse)> heap(worse, std::move(heap_storage));
  auto consider = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    auto it = pair_merge_.find(pair_key(sym[l].id, sym[r].id));
    if (it != pair_merge_.end()) heap.push(Candidate{it->second.rank, l, r, sym[l].id, sym[r].id, it->second.merged});
  };
  for (int32_t i = 1; i < n; ++i) consider(i - 1, i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    // Stale if either side changed since the candidate was queued (symbols
    // only grow, so an unchanged id means an unchanged symbol).
    if (sym[c.left].id != c.lsym || sym[c.right].id != c.rsym) continue;
    Symbol& l = sym[c.left];
    Symbol& r = sym[c.right];
    l.id = c.merged;
    l.len += r.len;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = c.left;
    r.id = -1;
    consider(l.prev, c.left);
    consider(c.left, l.next);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) emit_symbol(word.substr(sym[i].start, sym[i].len), sym[i].id, out, dropped);
  return dropped;
}

}  // namespace ratekv::tok
