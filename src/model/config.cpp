// ModelConfig from GGUF metadata (<arch>.* keys) and its validation.
#include <cmath>
#include <limits>

#include "ratekv/error.h"
#include "ratekv/gguf.h"
#include "ratekv/model.h"

namespace ratekv {

namespace {

// Reads an integer key that must fit a positive int.
int get_pos_int(const GgufFile& f, const std::string& key) {
  const int64_t v = f.get_int(key);
  check(v > 0 && v <= std::numeric_limits<int>::max(), "{}: metadata '{}' = {}: expected a positive integer",
        f.path(), key, v);
  return static_cast<int>(v);
}

}  // namespace

ModelConfig ModelConfig::from_gguf(const GgufFile& f) {
  ModelConfig c;
  c.arch = f.get_string("general.architecture");
  const std::string a = c.arch + ".";
  c.rope_layout = rope_layout_for_arch(c.arch);
  c.n_layers = get_pos_int(f, a + "block_count");
  c.n_heads = get_pos_int(f, a + "attention.head_count");
  c.n_kv_heads = f.has(a + "attention.head_count_kv") ? get_pos_int(f, a + "attention.head_count_kv") : c.n_heads;
  c.d_model = get_pos_int(f, a + "embedding_length");
  c.d_ff = get_pos_int(f, a + "feed_forward_length");
  c.n_ctx_train = f.get_int(a + "context_length");
  check(c.n_ctx_train > 0 && c.n_ctx_train <= (int64_t{1} << 30),
        "{}: metadata '{}context_length' = {}: expected a positive integer <= 2^30", f.path(), a, c.n_ctx_train);
  c.rope_theta = f.get_float(a + "rope.freq_base", 10000.0);
  c.rms_eps = static_cast<float>(f.get_float(a + "attention.layer_norm_rms_epsilon"));
  if (f.has(a + "attention.key_length")) {
    c.head_dim = get_pos_int(f, a + "attention.key_length");
    if (f.has(a + "attention.value_length")) {
      const int vl = get_pos_int(f, a + "attention.value_length");
      check(vl == c.head_dim, "{}: metadata '{}attention.value_length' = {} differs from key_length {}: unsupported",
            f.path(), a, vl, c.head_dim);
    }
  } else {
    check(c.d_model % c.n_heads == 0,
          "{}: metadata '{}embedding_length' = {} is not a multiple of '{}attention.head_count' = {} "
          "(and no '{}attention.key_length' is given)",
          f.path(), a, c.d_model, a, c.n_heads, a);
    c.head_dim = c.d_model / c.n_heads;
  }
  if (f.has(a + "rope.dimension_count")) {
    const int64_t rd = f.get_int(a + "rope.dimension_count");
    check(rd == c.head_dim,
          "{}: metadata '{}rope.dimension_count' = {} differs from head_dim {}: partial rotary embeddings are unsupported",
          f.path(), a, rd, c.head_dim);
  }
  const GgufTensor& emb = f.tensor("token_embd.weight");
  check(emb.ne.size() == 2 && emb.ne[0] == c.d_model && emb.ne[1] > 0 &&
            emb.ne[1] <= std::numeric_limits<int>::max(),
        "{}: tensor 'token_embd.weight': expected shape (ne0 = {}, ne1 = n_vocab)", f.path(), c.d_model);
  c.n_vocab = static_cast<int>(emb.ne[1]);
  c.validate(f.path());
  return c;
}

void ModelConfig::validate(const std::string& source) const {
  const std::string a = arch + ".";
  check(n_layers > 0, "{}: '{}block_count' must be positive (got {})", source, a, n_layers);
  check(n_heads > 0, "{}: '{}attention.head_count' must be positive (got {})", source, a, n_heads);
  check(n_kv_heads > 0 && n_heads % n_kv_heads == 0,
        "{}: '{}attention.head_count_kv' = {} must be positive and divide '{}attention.head_count' = {}", source, a,
        n_kv_heads, a, n_heads);
  check(head_dim > 0 && head_dim % 2 == 0, "{}: head_dim ('{}attention.key_length' or embedding_length/head_count) = {} "
        "must be positive and even for RoPE", source, a, head_dim);
  check(d_model > 0, "{}: '{}embedding_length' must be positive (got {})", source, a, d_model);
  check(d_ff > 0, "{}: '{}feed_forward_length' must be positive (got {})", source, a, d_ff);
  check(n_vocab > 0, "{}: n_vocab (rows of token_embd.weight) must be positive (got {})", source, n_vocab);
  check(n_ctx_train > 0, "{}: '{}context_length' must be positive (got {})", source, a, n_ctx_train);
  check(std::isfinite(rope_theta) && rope_theta > 0, "{}: '{}rope.freq_base' = {} must be finite and positive",
        source, a, rope_theta);
  check(std::isfinite(rms_eps) && rms_eps > 0, "{}: '{}attention.layer_norm_rms_epsilon' = {} must be finite and positive",
        source, a, rms_eps);
  // Bound sizes so later allocations (n_heads·head_dim·d_model ...) cannot overflow.
  check(static_cast<int64_t>(n_heads) * head_dim <= (1 << 20) && d_model <= (1 << 20) && d_ff <= (1 << 22),
        "{}: implausibly large dimensions (n_heads·head_dim = {}, d_model = {}, d_ff = {})", source,
        static_cast<int64_t>(n_heads) * head_dim, d_model, d_ff);
}

KVCacheShape ModelConfig::kv_shape(int64_t n_ctx) const {
  KVCacheShape s;
  s.n_layers = n_layers;
  s.n_heads = n_heads;
  s.n_kv_heads = n_kv_heads;
  s.head_dim = head_dim;
  s.n_ctx = n_ctx;
  return s;
}

int64_t ModelConfig::kv_bytes_per_token_fp16() const {
  return int64_t{2} * n_layers * n_kv_heads * head_dim * 2;
}

}  // namespace ratekv
