// ModelConfig from GGUF metadata (<arch>.* keys) and its validation; the
// Gemma 3 differences (sliding-window layer pattern, two RoPE bases, QK-norm,
// post-norms, GeGLU, embedding scale, logit soft-capping) and the Qwen2 ones
// (Q/K/V biases) as configuration.
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "ratekv/common/error.h"
#include "ratekv/io/gguf.h"
#include "ratekv/model/model.h"

namespace ratekv {

namespace {

// Reads an integer key that must fit a positive int.
int get_pos_int(const GgufFile& f, const std::string& key) {
  const int64_t v = f.get_int(key);
  check(v > 0 && v <= std::numeric_limits<int>::max(), "{}: metadata '{}' = {}: expected a positive integer",
        f.path(), key, v);
  return static_cast<int>(v);
}

// Gemma 3 fields, following llama.cpp's reading of the same keys
// (src/models/gemma3.cpp, llama_hparams::set_swa_pattern):
//  * sliding layers: only if <arch>.attention.sliding_window > 0; the layer
//    pattern is <arch>.attention.sliding_window_pattern, either a bool array
//    (one per layer) or a period p (default 6): layer l slides iff
//    l mod p < p − 1 (p = 0: every layer), i.e. every p-th layer is global;
//  * sliding layers use <arch>.rope.freq_base_swa (default 10000), global
//    ones <arch>.rope.freq_base;
//  * attention scale: <arch>.attention.scale if present, else
//    1/sqrt(head_dim) (Gemma's query_pre_attn_scalar = head_dim), except the
//    62-layer 27B model whose scalar is d_model / n_heads.
//  * the converter already added 1 to Gemma's RMSNorm weights (its
//    (1 + w) convention), so the norms are plain x̂ ⊙ w here.
void read_gemma3(const GgufFile& f, ModelConfig& c) {
  const std::string a = c.arch + ".";
  c.ffn_act = FfnActivation::GeluTanh;
  c.embd_scale = std::sqrt(static_cast<float>(c.d_model));
  c.qk_norm = true;
  c.post_norms = true;
  c.final_logit_softcap = static_cast<float>(f.get_float(a + "final_logit_softcapping", 0.0));
  if (f.has(a + "attention.scale")) {
    c.attn_scale = static_cast<float>(f.get_float(a + "attention.scale"));
  } else if (c.n_layers == 62) {
    c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.d_model / c.n_heads));
  }
  const int64_t window = f.get_int(a + "attention.sliding_window", 0);
  check(window >= 0 && window <= (int64_t{1} << 30), "{}: metadata '{}attention.sliding_window' = {}: expected 0..2^30",
        f.path(), a, window);
  if (window == 0) return;
  c.sliding_window = window;
  c.rope_theta_swa = f.get_float(a + "rope.freq_base_swa", 10000.0);
  c.layer_sliding.assign(c.n_layers, 0);
  const std::string pk = a + "attention.sliding_window_pattern";
  const auto it = f.metadata().find(pk);
  if (it != f.metadata().end() && it->second.type == GgufValueType::ARRAY) {
    check(it->second.elem_type == GgufValueType::BOOL, "{}: metadata '{}': expected an array of bool (one per layer)",
          f.path(), pk);
    const auto& arr = *std::get<std::shared_ptr<GgufArray>>(it->second.v);
    check(arr.size() == static_cast<size_t>(c.n_layers), "{}: metadata '{}' has {} entries, expected {} (block_count)",
          f.path(), pk, arr.size(), c.n_layers);
    for (int l = 0; l < c.n_layers; ++l) c.layer_sliding[l] = std::get<bool>(arr[l].v) ? 1 : 0;
    return;
  }
  const int64_t p = f.get_int(pk, 6);
  check(p >= 0 && p <= c.n_layers + 1, "{}: metadata '{}' = {}: expected a period in 0..block_count", f.path(), pk, p);
  for (int l = 0; l < c.n_layers; ++l) c.layer_sliding[l] = (p == 0 || l % p < p - 1) ? 1 : 0;
}

// Every architecture: RoPE frequency scaling (linear, YaRN) is not
// implemented, so a factor other than 1 is refused rather than ignored.
void check_no_rope_scaling(const GgufFile& f, const std::string& a) {
  for (const char* k : {"rope.scaling.factor", "rope.scale_linear"}) {
    if (f.has(a + k)) {
      const double v = f.get_float(a + k);
      check(v == 1.0 || v == 0.0, "{}: metadata '{}{}' = {}: RoPE frequency scaling is not supported", f.path(), a, k,
            v);
    }
  }
}

// Projection biases, decided by the tensors present, as llama.cpp does
// (llama_model_base::create_tensor_qkv loads blk.*.attn_{q,k,v}.bias as
// optional for every architecture and build_qkv adds whichever exist; the
// qwen2 converter always writes all three). Here the three come together or
// not at all; biases ratekv does not apply are refused, not ignored.
void read_biases(const GgufFile& f, ModelConfig& c) {
  const char* names[3] = {"attn_q.bias", "attn_k.bias", "attn_v.bias"};
  int present = 0;
  for (const char* n : names) present += f.find_tensor(std::string("blk.0.") + n) != nullptr;
  check(present == 0 || present == 3,
        "{}: blk.0 has {} of the 3 tensors attn_q.bias, attn_k.bias, attn_v.bias: only all or none is supported",
        f.path(), present);
  c.qkv_bias = present == 3;
  for (const char* n : {"output.bias", "blk.0.attn_output.bias", "blk.0.attn_qkv.bias", "blk.0.attn_qkv.weight",
                        "blk.0.ffn_down.bias", "blk.0.ffn_up.bias", "blk.0.ffn_gate.bias"}) {
    check(f.find_tensor(n) == nullptr, "{}: tensor '{}' is present: this layout is not supported (ratekv reads "
          "separate Q/K/V projections with optional Q/K/V biases only)", f.path(), n);
  }
}

}  // namespace

float ModelConfig::attention_scale() const {
  return attn_scale > 0 ? attn_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

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
  check_no_rope_scaling(f, a);
  read_biases(f, c);
  if (c.arch == "gemma3") read_gemma3(f, c);
  c.validate(f.path());
  return c;
}

void ModelConfig::validate(const std::string& source) const {
  const std::string a = arch + ".";
  // The ModelConfig field, and the GGUF key it comes from where the config has an arch (a config built by
  // hand, e.g. in Python, used to be named by GGUF keys without their prefix: '.block_count').
  auto key = [&](const char* field, const char* gguf) {
    return arch.empty() ? fmt::format("{}", field) : fmt::format("{} ('{}{}')", field, a, gguf);
  };
  check(n_layers > 0, "{}: {} must be positive (got {})", source, key("n_layers", "block_count"), n_layers);
  check(n_heads > 0, "{}: {} must be positive (got {})", source, key("n_heads", "attention.head_count"), n_heads);
  check(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "{}: {} = {} must be positive and divide {} = {}", source,
        key("n_kv_heads", "attention.head_count_kv"), n_kv_heads, key("n_heads", "attention.head_count"), n_heads);
  check(head_dim > 0 && head_dim % 2 == 0, "{}: {} = {} must be positive and even for RoPE", source,
        key("head_dim", "attention.key_length"), head_dim);
  check(d_model > 0, "{}: {} must be positive (got {})", source, key("d_model", "embedding_length"), d_model);
  check(d_ff > 0, "{}: {} must be positive (got {})", source, key("d_ff", "feed_forward_length"), d_ff);
  check(n_vocab > 0, "{}: n_vocab (rows of token_embd.weight) must be positive (got {})", source, n_vocab);
  check(n_ctx_train > 0, "{}: {} must be positive (got {})", source, key("n_ctx_train", "context_length"),
        n_ctx_train);
  check(std::isfinite(rope_theta) && rope_theta > 0, "{}: {} = {} must be finite and positive", source,
        key("rope_theta", "rope.freq_base"), rope_theta);
  check(std::isfinite(rms_eps) && rms_eps > 0, "{}: {} = {} must be finite and positive", source,
        key("rms_eps", "attention.layer_norm_rms_epsilon"), rms_eps);
  check(layer_sliding.empty() || layer_sliding.size() == static_cast<size_t>(n_layers),
        "{}: layer_sliding has {} entries, expected 0 or n_layers = {}", source, layer_sliding.size(), n_layers);
  bool any_sliding = false;
  for (uint8_t s : layer_sliding) any_sliding = any_sliding || s != 0;
  if (any_sliding) {
    check(sliding_window > 0, "{}: '{}attention.sliding_window' = {} must be positive when layers slide", source, a,
          sliding_window);
    check(std::isfinite(rope_theta_swa) && rope_theta_swa > 0,
          "{}: '{}rope.freq_base_swa' = {} must be finite and positive", source, a, rope_theta_swa);
  }
  check(std::isfinite(embd_scale) && embd_scale > 0, "{}: embedding scale {} must be finite and positive", source,
        embd_scale);
  check(std::isfinite(attn_scale) && attn_scale >= 0, "{}: '{}attention.scale' = {} must be finite and >= 0", source,
        a, attn_scale);
  check(std::isfinite(final_logit_softcap) && final_logit_softcap >= 0,
        "{}: '{}final_logit_softcapping' = {} must be finite and >= 0", source, a, final_logit_softcap);
  // The statistics files' bound (KVStats::validate): per-layer tensors of a config with 10^8 layers were allocated
  // (Python's uniform_plan: MemoryError) before anything refused it.
  check(n_layers <= 4096 && n_heads <= 4096 && head_dim <= 4096,
        "{}: implausibly large model ({} = {}, {} = {}, {} = {}; expected ≤ 4096 each)", source,
        key("n_layers", "block_count"), n_layers, key("n_heads", "attention.head_count"), n_heads,
        key("head_dim", "attention.key_length"), head_dim);
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
