// Model weights: every tensor dequantized to fp32 at load (GgufFile::dequantize).
#include "ratekv/common/error.h"
#include "ratekv/io/gguf.h"
#include "ratekv/model/model.h"

namespace ratekv {

namespace {

// Dequantizes `name` after checking its ggml shape ne == {ne0, ne1} (ne1 = 0:
// a 1-D tensor of ne0 elements).
std::vector<float> load_tensor(const GgufFile& f, const std::string& name, int64_t ne0, int64_t ne1) {
  const GgufTensor& t = f.tensor(name);
  const bool ok = ne1 == 0 ? (t.ne.size() == 1 && t.ne[0] == ne0)
                           : (t.ne.size() == 2 && t.ne[0] == ne0 && t.ne[1] == ne1);
  if (!ok) {
    std::string got;
    for (size_t i = 0; i < t.ne.size(); ++i) got += (i ? ", " : "") + std::to_string(t.ne[i]);
    if (ne1 == 0) {
      fail("{}: tensor '{}': expected shape ne = [{}], got [{}]", f.path(), name, ne0, got);
    }
    fail("{}: tensor '{}': expected shape ne = [{}, {}], got [{}]", f.path(), name, ne0, ne1, got);
  }
  return f.dequantize(t);
}

// Appends `src` to `dst` and frees `src`.
void append_rows(std::vector<float>& dst, std::vector<float>&& src) {
  dst.insert(dst.end(), src.begin(), src.end());
  std::vector<float>().swap(src);
}

}  // namespace

size_t ModelWeights::bytes() const {
  size_t b = (token_embd.size() + output.size() + output_norm.size()) * sizeof(float);
  for (const auto& l : layers) {
    b += (l.attn_norm.size() + l.wqkv.size() + l.bqkv.size() + l.wo.size() + l.ffn_norm.size() + l.w_gate_up.size() +
          l.w_down.size() + l.attn_q_norm.size() + l.attn_k_norm.size() + l.attn_post_norm.size() +
          l.ffn_post_norm.size()) * sizeof(float);
  }
  return b;
}

ModelWeights ModelWeights::load(const GgufFile& f, const ModelConfig& c) {
  std::vector<int> all(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) all[l] = l;
  return load_blocks(f, c, all);
}

ModelWeights ModelWeights::load_blocks(const GgufFile& f, const ModelConfig& c, std::span<const int> blocks) {
  ModelWeights w;
  const int64_t d = c.d_model, q_dim = int64_t{c.n_heads} * c.head_dim, kv_dim = int64_t{c.n_kv_heads} * c.head_dim;
  w.token_embd = load_tensor(f, "token_embd.weight", d, c.n_vocab);
  w.output_norm = load_tensor(f, "output_norm.weight", d, 0);
  if (f.find_tensor("output.weight")) w.output = load_tensor(f, "output.weight", d, c.n_vocab);
  w.layers.resize(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    const int l = blocks[i];
    check(l >= 0 && l < c.n_layers, "{}: block {} requested: the model has blocks 0..{}", f.path(), l, c.n_layers - 1);
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights& L = w.layers[i];
    L.attn_norm = load_tensor(f, p + "attn_norm.weight", d, 0);
    L.ffn_norm = load_tensor(f, p + "ffn_norm.weight", d, 0);
    L.wqkv.reserve((q_dim + 2 * kv_dim) * d);
    append_rows(L.wqkv, load_tensor(f, p + "attn_q.weight", d, q_dim));
    append_rows(L.wqkv, load_tensor(f, p + "attn_k.weight", d, kv_dim));
    append_rows(L.wqkv, load_tensor(f, p + "attn_v.weight", d, kv_dim));
    if (c.qkv_bias) {
      L.bqkv.reserve(q_dim + 2 * kv_dim);
      append_rows(L.bqkv, load_tensor(f, p + "attn_q.bias", q_dim, 0));
      append_rows(L.bqkv, load_tensor(f, p + "attn_k.bias", kv_dim, 0));
      append_rows(L.bqkv, load_tensor(f, p + "attn_v.bias", kv_dim, 0));
    }
    L.wo = load_tensor(f, p + "attn_output.weight", q_dim, d);
    L.w_gate_up.reserve(2 * int64_t{c.d_ff} * d);
    append_rows(L.w_gate_up, load_tensor(f, p + "ffn_gate.weight", d, c.d_ff));
    append_rows(L.w_gate_up, load_tensor(f, p + "ffn_up.weight", d, c.d_ff));
    L.w_down = load_tensor(f, p + "ffn_down.weight", c.d_ff, d);
    if (c.qk_norm) {
      L.attn_q_norm = load_tensor(f, p + "attn_q_norm.weight", c.head_dim, 0);
      L.attn_k_norm = load_tensor(f, p + "attn_k_norm.weight", c.head_dim, 0);
    }
    if (c.post_norms) {
      L.attn_post_norm = load_tensor(f, p + "post_attention_norm.weight", d, 0);
      L.ffn_post_norm = load_tensor(f, p + "post_ffw_norm.weight", d, 0);
    }
  }
  return w;
}

}  // namespace ratekv
