// model/tokenizer.cpp — ratekv::Tokenizer: vocabulary validation, encode
// (special-token split, then per raw fragment either UTF-8 canonicalization ->
// regex pre-tokenizer -> byte-level BPE per word, cached ("gpt2"), or
// SentencePiece-style score merging ("llama", tokenizer_spm.h)) and decode.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <unordered_map>

#include "model/tokenizer_byte_level.h"
#include "model/tokenizer_impl.h"
#include "model/tokenizer_utf8.h"
#include "ratekv/common/error.h"
#include "ratekv/common/log.h"

namespace ratekv {

namespace {

// Texts llama.cpp treats as end-of-generation tokens (forcing them to control
// type), in addition to the declared EOS / EOT / EOM ids.
constexpr std::string_view kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
    "<EOT>", "<|end_of_text|>", "<end_of_utterance>",
    // Qwen's fill-in-the-middle pad / repository / file-separator tokens
    // (llama.cpp's special_fim_{pad,rep,sep}_id, also end-of-generation).
    "<|fim_pad|>", "<|fim_repo|>", "<|repo_name|>", "<|file_sep|>",
};

void check_id(int32_t id, size_t n, const char* key) {
  check(id >= -1 && id < static_cast<int64_t>(n), "{} = {} is out of range: the vocabulary has {} tokens", key, id, n);
}

TokenizerVocab validate(TokenizerVocab v) {
  check(v.model == "gpt2" || v.model == "llama",
        "tokenizer.ggml.model = '{}' is not supported (expected 'gpt2', byte-level BPE, or 'llama', "
        "SentencePiece-style)",
        v.model);
  if (v.model == "gpt2")
    check(!v.pre.empty(), "tokenizer.ggml.pre is missing or empty; expected a pre-tokenizer name such as 'smollm'");
  check(!v.tokens.empty(), "tokenizer.ggml.tokens is empty");
  check(v.tokens.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()),
        "tokenizer.ggml.tokens has {} entries, more than int32 token ids can address", v.tokens.size());
  const size_t n = v.tokens.size();
  if (v.token_types.empty()) v.token_types.assign(n, static_cast<int32_t>(TokenType::Normal));
  check(v.token_types.size() == n, "tokenizer.ggml.token_type has {} entries, expected {} (one per token)",
        v.token_types.size(), n);
  for (auto& t : v.token_types)
    if (t < 0 || t > static_cast<int32_t>(TokenType::Byte)) t = static_cast<int32_t>(TokenType::Undefined);
  if (v.model == "llama") {
    check(v.scores.size() == n, "tokenizer.ggml.scores has {} entries, expected {} (one per token)", v.scores.size(),
          n);
    for (size_t i = 0; i < n; ++i)
      check(std::isfinite(v.scores[i]), "tokenizer.ggml.scores[{}] = {} is not finite", i, v.scores[i]);
  }
  for (size_t i = 0; i < n; ++i)
    if (v.tokens[i].empty()) v.tokens[i] = "[EMPTY_" + std::to_string(i) + "]";  // as llama.cpp
  check_id(v.bos_id, n, "tokenizer.ggml.bos_token_id");
  check_id(v.eos_id, n, "tokenizer.ggml.eos_token_id");
  check_id(v.unk_id, n, "tokenizer.ggml.unknown_token_id");
  check_id(v.pad_id, n, "tokenizer.ggml.padding_token_id");
  check_id(v.eot_id, n, "tokenizer.ggml.eot_token_id");
  check_id(v.eom_id, n, "tokenizer.ggml.eom_token_id");
  check(!v.add_bos || v.bos_id >= 0, "tokenizer.ggml.add_bos_token is true but tokenizer.ggml.bos_token_id is missing");
  check(!v.add_eos || v.eos_id >= 0, "tokenizer.ggml.add_eos_token is true but tokenizer.ggml.eos_token_id is missing");
  return v;
}

std::vector<std::string> regexes_for(const std::string& pre) {
  auto r = tok::pre_tokenizer_regexes(pre);
  check(r.has_value(),
        "tokenizer.ggml.pre = '{}' is not supported (supported: smollm, starcoder, refact, command-r, codeshell, "
        "exaone, minerva-7b, gpt-2, phi-2, qwen2)",
        pre);
  return *r;
}

// What llama.cpp's token_to_piece produces for a normal token whose text has
// a character outside the byte alphabet: the known bytes, and for each
// unknown character "[UNK_BYTE_0x<hex of its UTF-8>" + token text + "]".
std::string decode_normal_text(const std::string& text) {
  if (auto raw = tok::byte_level_decode(text)) return *raw;
  std::string out;
  size_t pos = 0;
  while (pos < text.size()) {
    const char32_t cp = tok::utf8_decode_one(text, pos);
    if (auto b = tok::unicode_to_byte(cp)) {
      out.push_back(static_cast<char>(*b));
      continue;
    }
    std::string utf8;
    tok::utf8_append(utf8, cp);
    out += "[UNK_BYTE_0x";
    for (unsigned char c : utf8) out += fmt::format("{:02x}", c);
    out += text + "]";
  }
  return out;
}

}  // namespace

Tokenizer::Impl::Impl(TokenizerVocab v) : vocab(validate(std::move(v))) {
  const bool is_spm = vocab.model == "llama";
  if (is_spm) {
    spm.emplace(vocab.tokens, vocab.scores);
  } else {
    regexes = regexes_for(vocab.pre);
    pre.emplace(regexes);
    bpe.emplace(vocab.tokens, vocab.merges);
  }
  const size_t n = vocab.tokens.size();
  // End-of-generation set.
  for (int32_t id : {vocab.eos_id, vocab.eot_id, vocab.eom_id})
    if (id >= 0) eog.insert(id);
  for (size_t i = 0; i < n; ++i) {
    for (auto t : kEogTexts) {
      if (vocab.tokens[i] == t) {
        eog.insert(static_cast<int32_t>(i));
        if (type(static_cast<int32_t>(i)) != TokenType::Control)
          vocab.token_types[i] = static_cast<int32_t>(TokenType::Control);
      }
    }
  }
  // Decoded pieces.
  pieces.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& text = vocab.tokens[i];
    switch (type(static_cast<int32_t>(i))) {
      case TokenType::Normal: pieces[i] = is_spm ? tok::spm_unescape(text) : decode_normal_text(text); break;
      case TokenType::Control:
      case TokenType::Unknown:
      case TokenType::UserDefined: pieces[i] = text; break;
      case TokenType::Byte: {
        if (is_spm) {  // "<0xXX>"
          unsigned v = 0;
          const bool ok = text.size() == 6 && text.compare(0, 3, "<0x") == 0 && text[5] == '>' &&
                          std::sscanf(text.c_str() + 3, "%2x", &v) == 1;
          pieces[i] = ok ? std::string(1, static_cast<char>(v)) : text;
          break;
        }
        auto raw = tok::byte_level_decode(text);
        pieces[i] = (raw && raw->size() == 1) ? *raw : text;
        break;
      }
      case TokenType::Unused:
      case TokenType::Undefined: break;  // rendered as nothing (as llama.cpp)
    }
  }
  // Special tokens, longest text first (ties: lower id first).
  for (size_t i = 0; i < n; ++i) {
    const TokenType t = type(static_cast<int32_t>(i));
    if (t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown)
      specials.push_back(tok::SpecialToken{static_cast<int32_t>(i), vocab.tokens[i]});
  }
  std::stable_sort(specials.begin(), specials.end(),
                   [](const tok::SpecialToken& a, const tok::SpecialToken& b) { return a.text.size() > b.text.size(); });
  for (const auto& s : specials)
    if (type(s.id) == TokenType::UserDefined) user_defined.push_back(s);
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_vocab(TokenizerVocab vocab) {
  return Tokenizer(std::make_unique<Impl>(std::move(vocab)));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  const Impl& im = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && im.vocab.add_bos) out.push_back(im.vocab.bos_id);

  size_t dropped = 0;
  const auto frags = tok::split_special_tokens(text, parse_special ? std::span(im.specials) : std::span(im.user_defined));
  bool prev_special = true;  // SPM: a space is prefixed to a fragment after a special token or at the start
  for (const tok::Fragment& f : frags) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    if (im.spm) {
      const std::string_view raw = text.substr(f.offset, f.length);
      if (im.vocab.add_space_prefix && prev_special) {
        std::string spaced;
        spaced.reserve(raw.size() + 1);
        spaced.push_back(' ');
        spaced.append(raw);
        dropped += im.spm->encode(spaced, out);
      } else {
        dropped += im.spm->encode(raw, out);
      }
      prev_special = false;
      continue;
    }
    const std::string canon = tok::utf8_canonicalize(text.substr(f.offset, f.length));
    const std::string_view cv(canon);
    // Per-word cache: word bytes -> [begin, end) in `pool`. Keys view `canon`.
    std::unordered_map<std::string_view, std::pair<uint32_t, uint32_t>> cache;
    std::vector<int32_t> pool;
    // Bounded: at most 2^20 distinct words / 2^24 cached ids (64 MiB) at once.
    constexpr size_t kMaxCacheWords = size_t{1} << 20, kMaxCachedIds = size_t{1} << 24;
    im.pre->split(cv, [&](size_t off, size_t len) {
      const std::string_view word = cv.substr(off, len);
      auto it = cache.find(word);
      if (it == cache.end()) {
        if (cache.size() >= kMaxCacheWords || pool.size() >= kMaxCachedIds) {
          cache.clear();
          pool.clear();
        }
        const auto begin = static_cast<uint32_t>(pool.size());
        dropped += im.bpe->encode_word(word, pool);
        it = cache.emplace(word, std::make_pair(begin, static_cast<uint32_t>(pool.size()))).first;
      }
      out.insert(out.end(), pool.begin() + it->second.first, pool.begin() + it->second.second);
    });
  }
  if (add_bos && im.vocab.add_eos) out.push_back(im.vocab.eos_id);
  if (dropped > 0)
    spdlog::warn("tokenizer: {} input byte(s) have no token in the vocabulary and were dropped (as llama.cpp does)",
                 dropped);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  const Impl& im = *impl_;
  std::string out;
  for (size_t k = 0; k < ids.size(); ++k) {
    const int32_t id = ids[k];
    check(id >= 0 && id < n_vocab(), "tokenizer: token id {} at position {} is out of range [0, {})", id, k, n_vocab());
    const TokenType t = im.type(id);
    if (skip_special && (t == TokenType::Control || t == TokenType::Unknown)) continue;
    out += im.pieces[id];
  }
  return out;
}

const std::string& Tokenizer::token_text(int32_t id) const {
  check(id >= 0 && id < n_vocab(), "tokenizer: token id {} is out of range [0, {})", id, n_vocab());
  return impl_->vocab.tokens[id];
}

int32_t Tokenizer::n_vocab() const { return static_cast<int32_t>(impl_->vocab.tokens.size()); }
int32_t Tokenizer::bos_id() const { return impl_->vocab.bos_id; }
int32_t Tokenizer::eos_id() const { return impl_->vocab.eos_id; }
bool Tokenizer::is_eog(int32_t id) const { return impl_->eog.count(id) > 0; }
const std::string& Tokenizer::pre_type() const { return impl_->vocab.pre; }
const std::vector<std::string>& Tokenizer::pre_tokenizer_regexes() const { return impl_->regexes; }
const std::string& Tokenizer::model_type() const { return impl_->vocab.model; }

}  // namespace ratekv
