// model/tokenizer_gguf.cpp — reading tokenizer.ggml.* metadata into a
// TokenizerVocab (Tokenizer::from_gguf).
#include <limits>

#include "model/tokenizer_impl.h"
#include "ratekv/common/error.h"
#include "ratekv/io/gguf.h"

namespace ratekv {

namespace {

int32_t get_id(const GgufFile& f, const std::string& key) {
  if (!f.has(key)) return -1;
  const int64_t v = f.get_int(key);
  check(v >= 0 && v <= std::numeric_limits<int32_t>::max(), "{}: {} = {} is not a valid token id", f.path(), key, v);
  return static_cast<int32_t>(v);
}

bool get_flag(const GgufFile& f, const std::string& key) { return f.has(key) && f.get_bool(key); }

}  // namespace

Tokenizer Tokenizer::from_gguf(const GgufFile& f) {
  TokenizerVocab v;
  v.model = f.get_string("tokenizer.ggml.model");
  check(v.model == "gpt2" || v.model == "llama",
        "{}: tokenizer.ggml.model = '{}' is not supported (expected 'gpt2', byte-level BPE, or 'llama', "
        "SentencePiece-style)",
        f.path(), v.model);
  v.pre = f.get_string("tokenizer.ggml.pre", "");
  v.tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (f.has("tokenizer.ggml.token_type")) {
    const auto types = f.get_int_array("tokenizer.ggml.token_type");
    v.token_types.reserve(types.size());
    for (int64_t t : types) {
      check(t >= std::numeric_limits<int32_t>::min() && t <= std::numeric_limits<int32_t>::max(),
            "{}: tokenizer.ggml.token_type holds {}, not an int32", f.path(), t);
      v.token_types.push_back(static_cast<int32_t>(t));
    }
  }
  if (v.model == "gpt2") {
    check(f.has("tokenizer.ggml.merges"), "{}: tokenizer.ggml.merges is missing (required for a 'gpt2' tokenizer)",
          f.path());
    v.merges = f.get_string_array("tokenizer.ggml.merges");
  } else {
    check(f.has("tokenizer.ggml.scores"), "{}: tokenizer.ggml.scores is missing (required for a 'llama' tokenizer)",
          f.path());
    for (double x : f.get_float_array("tokenizer.ggml.scores")) v.scores.push_back(static_cast<float>(x));
    // llama.cpp's default for SentencePiece vocabularies is to add the prefix.
    v.add_space_prefix = f.has("tokenizer.ggml.add_space_prefix") ? f.get_bool("tokenizer.ggml.add_space_prefix")
                                                                    : true;
  }
  v.bos_id = get_id(f, "tokenizer.ggml.bos_token_id");
  v.eos_id = get_id(f, "tokenizer.ggml.eos_token_id");
  v.unk_id = get_id(f, "tokenizer.ggml.unknown_token_id");
  v.pad_id = get_id(f, "tokenizer.ggml.padding_token_id");
  v.eot_id = get_id(f, "tokenizer.ggml.eot_token_id");
  v.eom_id = get_id(f, "tokenizer.ggml.eom_token_id");
  v.add_bos = get_flag(f, "tokenizer.ggml.add_bos_token");
  v.add_eos = get_flag(f, "tokenizer.ggml.add_eos_token");
  try {
    return from_vocab(std::move(v));
  } catch (const Error& e) {
    throw Error(f.path() + ": " + e.what());
  }
}

}  // namespace ratekv
