// The forward pass: embeddings (× embd_scale) → n_layers × (RMSNorm, QKV
// [+ bias], [QK-norm], RoPE, GQA attention through the KVCache [sliding window],
// output projection, [post-norm], RMSNorm, gated FFN (SwiGLU | GeGLU),
// [post-norm]) → final RMSNorm → LM head [→ soft-cap]. The bracketed parts are
// Gemma 3's and Qwen2's (the bias), switched by ModelConfig fields; with Llama's defaults they are
// skipped and the arithmetic is exactly the plain Llama pass. fp32
// throughout; GEMMs through OpenBLAS.
#include <cblas.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "ratekv/common/error.h"
#include "ratekv/io/gguf.h"
#include "ratekv/model/model.h"

namespace ratekv {

namespace {

// y (n, out) = x (n, in) · Wᵀ, W row-major (out, in).
void linear(const float* x, const float* W, float* y, int64_t n, int64_t in, int64_t out) {
  if (n == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(out), static_cast<int>(in), 1.0f, W,
                static_cast<int>(in), x, 1, 0.0f, y, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(out),
                static_cast<int>(in), 1.0f, x, static_cast<int>(in), W, static_cast<int>(in), 0.0f, y,
                static_cast<int>(out));
  }
}

bool all_finite(const float* x, int64_t n) {
  bool ok = true;
#pragma omp parallel for reduction(&& : ok) schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) ok = ok && std::isfinite(x[i]);
  return ok;
}

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

// GELU, tanh approximation (Hendrycks & Gimpel 2016, eq. in §2).
inline float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f, kCoef = 0.044715f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + kCoef * x * x)));
}

void add_into(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

bool is_supported_arch(const std::string& arch) { return arch == "llama" || arch == "gemma3" || arch == "qwen2"; }

}  // namespace

void rms_norm(const float* x, const float* weight, float* out, int64_t n, int d, float eps) {
#pragma omp parallel for schedule(static) if (n * d >= 32768)
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * d;
    float* oi = out + i * d;
    double ss = 0;
    for (int c = 0; c < d; ++c) ss += double{xi[c]} * xi[c];
    const float r = static_cast<float>(1.0 / std::sqrt(ss / d + eps));
    for (int c = 0; c < d; ++c) oi[c] = xi[c] * r * weight[c];
  }
}

Model Model::load(const GgufFile& f) {
  Model m;
  m.cfg_ = ModelConfig::from_gguf(f);
  check(is_supported_arch(m.cfg_.arch),
        "{}: general.architecture '{}': the forward pass is implemented for 'llama', 'gemma3' and 'qwen2' only "
        "(its RoPE layout may be known, but norms/activations/attention of this family are not)",
        f.path(), m.cfg_.arch);
  m.w_ = ModelWeights::load(f, m.cfg_);
  m.pos_limit_ = m.cfg_.n_ctx_train;
  return m;
}

Model Model::from_weights(ModelConfig cfg, ModelWeights w) {
  cfg.validate("Model::from_weights");
  check(is_supported_arch(cfg.arch),
        "Model::from_weights: arch '{}': only 'llama', 'gemma3' and 'qwen2' are implemented", cfg.arch);
  const size_t d = cfg.d_model, qd = size_t(cfg.n_heads) * cfg.head_dim, kvd = size_t(cfg.n_kv_heads) * cfg.head_dim,
               dff = cfg.d_ff, V = cfg.n_vocab;
  auto need = [](const std::vector<float>& v, size_t n, const std::string& what) {
    check(v.size() == n, "Model::from_weights: {} has {} floats, expected {}", what, v.size(), n);
  };
  need(w.token_embd, V * d, "token_embd");
  if (!w.output.empty()) need(w.output, V * d, "output");
  need(w.output_norm, d, "output_norm");
  check(w.layers.size() == size_t(cfg.n_layers), "Model::from_weights: {} layers given, config has {}",
        w.layers.size(), cfg.n_layers);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& L = w.layers[l];
    const std::string p = "layer " + std::to_string(l) + " ";
    need(L.attn_norm, d, p + "attn_norm");
    need(L.wqkv, (qd + 2 * kvd) * d, p + "wqkv");
    need(L.bqkv, cfg.qkv_bias ? qd + 2 * kvd : 0, p + "bqkv");
    need(L.wo, d * qd, p + "wo");
    need(L.ffn_norm, d, p + "ffn_norm");
    need(L.w_gate_up, 2 * dff * d, p + "w_gate_up");
    need(L.w_down, d * dff, p + "w_down");
    const size_t hd = cfg.qk_norm ? size_t(cfg.head_dim) : 0, pd = cfg.post_norms ? d : 0;
    need(L.attn_q_norm, hd, p + "attn_q_norm");
    need(L.attn_k_norm, hd, p + "attn_k_norm");
    need(L.attn_post_norm, pd, p + "attn_post_norm");
    need(L.ffn_post_norm, pd, p + "ffn_post_norm");
  }
  cfg.rope_layout = rope_layout_for_arch(cfg.arch);
  Model m;
  m.cfg_ = std::move(cfg);
  m.w_ = std::move(w);
  m.pos_limit_ = m.cfg_.n_ctx_train;
  return m;
}

void Model::set_position_limit(int64_t limit) {
  check(limit > 0 && limit <= std::numeric_limits<int32_t>::max(), "position limit {} must be in [1, 2^31)", limit);
  pos_limit_ = limit;
}

DenseKVCache Model::make_dense_cache(int64_t n_ctx) const { return DenseKVCache(cfg_.kv_shape(n_ctx)); }

void Model::forward(std::span<const int32_t> tokens, int64_t pos0, KVCache& cache, float* logits, bool all_logits,
                    const ForwardHooks* hooks) {
  const ModelConfig& c = cfg_;
  const int64_t n = static_cast<int64_t>(tokens.size());
  check(n > 0, "forward: empty token chunk");
  check(pos0 >= 0, "forward: pos0 = {} must be non-negative", pos0);
  check(pos0 + n <= pos_limit_,
        "forward: positions {}..{} exceed the model's limit {} (context_length {}; raise it explicitly with "
        "Model::set_position_limit to extrapolate RoPE)",
        pos0, pos0 + n - 1, pos_limit_, c.n_ctx_train);
  const KVCacheShape& cs = cache.shape();
  check(cs.n_layers == c.n_layers && cs.n_heads == c.n_heads && cs.n_kv_heads == c.n_kv_heads &&
            cs.head_dim == c.head_dim,
        "forward: KV cache shape (layers {}, heads {}, kv heads {}, head_dim {}) does not match the model "
        "(layers {}, heads {}, kv heads {}, head_dim {})",
        cs.n_layers, cs.n_heads, cs.n_kv_heads, cs.head_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim);
  for (int64_t i = 0; i < n; ++i) {
    check(tokens[i] >= 0 && tokens[i] < c.n_vocab, "forward: token id {} at index {} outside [0, {})", tokens[i], i,
          c.n_vocab);
  }

  const int d = c.d_model, hd = c.head_dim, half = hd / 2, H = c.n_heads, Hkv = c.n_kv_heads;
  const int64_t qd = int64_t{H} * hd, kvd = int64_t{Hkv} * hd, qkvd = qd + 2 * kvd, dff = c.d_ff;

  std::vector<int32_t> pos(n);
  std::vector<float> rc(n * half), rs(n * half);
  for (int64_t i = 0; i < n; ++i) {
    pos[i] = static_cast<int32_t>(pos0 + i);
    rope_angles(pos0 + i, hd, c.rope_theta, rc.data() + i * half, rs.data() + i * half);
  }
  // Sliding-window layers may use a second RoPE base (Gemma 3).
  std::vector<float> rc_swa, rs_swa;
  bool any_sliding = false;
  for (int l = 0; l < c.n_layers; ++l) any_sliding = any_sliding || c.is_sliding(l);
  if (any_sliding) {
    rc_swa.resize(n * half);
    rs_swa.resize(n * half);
    for (int64_t i = 0; i < n; ++i)
      rope_angles(pos0 + i, hd, c.rope_theta_swa, rc_swa.data() + i * half, rs_swa.data() + i * half);
  }

  std::vector<float> x(n * d), xn(n * d), qkv(n * qkvd), q(n * qd), k_pre(n * kvd), k(n * kvd), v(n * kvd),
      att(n * qd), tmp(n * d), gu(n * 2 * dff), hbuf(n * dff);
  std::vector<float> q_pre;
  const bool want_hooks = hooks && hooks->on_layer;
  if (want_hooks) q_pre.resize(n * qd);
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(x.data() + i * d, w_.token_embd.data() + int64_t{tokens[i]} * d, sizeof(float) * d);
  }
  if (c.embd_scale != 1.0f)
    for (auto& e : x) e *= c.embd_scale;

  AttnParams ap;
  ap.scale = c.attention_scale();

  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = w_.layers[l];
    const float* lrc = c.is_sliding(l) ? rc_swa.data() : rc.data();
    const float* lrs = c.is_sliding(l) ? rs_swa.data() : rs.data();
    ap.sliding_window = c.layer_window(l);
    // --- attention ---
    rms_norm(x.data(), L.attn_norm.data(), xn.data(), n, d, c.rms_eps);
    linear(xn.data(), L.wqkv.data(), qkv.data(), n, d, qkvd);
#pragma omp parallel for schedule(static) if (n >= 32)
    for (int64_t i = 0; i < n; ++i) {
      float* r = qkv.data() + i * qkvd;
      if (c.qkv_bias) add_into(r, L.bqkv.data(), qkvd);  // Qwen2: before QK-norm and RoPE
      float* qi = q.data() + i * qd;
      float* ki = k.data() + i * kvd;
      std::memcpy(qi, r, sizeof(float) * qd);
      std::memcpy(ki, r + qd, sizeof(float) * kvd);
      std::memcpy(v.data() + i * kvd, r + qd + kvd, sizeof(float) * kvd);
      if (c.qk_norm) {  // per head, before RoPE (Gemma 3)
        rms_norm(qi, L.attn_q_norm.data(), qi, H, hd, c.rms_eps);
        rms_norm(ki, L.attn_k_norm.data(), ki, Hkv, hd, c.rms_eps);
      }
      std::memcpy(k_pre.data() + i * kvd, ki, sizeof(float) * kvd);
      if (want_hooks) std::memcpy(q_pre.data() + i * qd, qi, sizeof(float) * qd);
      apply_rope(qi, H, hd, c.rope_layout, lrc + i * half, lrs + i * half, false);
      apply_rope(ki, Hkv, hd, c.rope_layout, lrc + i * half, lrs + i * half, false);
    }
    if (want_hooks) {
      LayerActivations a;
      a.layer = l;
      a.n = n;
      a.pos = pos.data();
      a.n_heads = H;
      a.n_kv_heads = Hkv;
      a.head_dim = hd;
      a.q_pre = q_pre.data();
      a.q_post = q.data();
      a.k_pre = k_pre.data();
      a.k_post = k.data();
      a.v = v.data();
      hooks->on_layer(a);
    }
    cache.append(l, n, pos.data(), k_pre.data(), k.data(), v.data());
    cache.attend(l, n, pos.data(), q.data(), att.data(), ap);
    linear(att.data(), L.wo.data(), tmp.data(), n, qd, d);
    if (c.post_norms) rms_norm(tmp.data(), L.attn_post_norm.data(), tmp.data(), n, d, c.rms_eps);
    add_into(x.data(), tmp.data(), n * d);
    // --- gated FFN: down(act(gate·x) ⊙ up·x), act = SiLU (SwiGLU) or GELU-tanh (GeGLU) ---
    rms_norm(x.data(), L.ffn_norm.data(), xn.data(), n, d, c.rms_eps);
    linear(xn.data(), L.w_gate_up.data(), gu.data(), n, d, 2 * dff);
    const bool geglu = c.ffn_act == FfnActivation::GeluTanh;
#pragma omp parallel for schedule(static) if (n * dff >= 32768)
    for (int64_t i = 0; i < n; ++i) {
      const float* g = gu.data() + i * 2 * dff;
      const float* u = g + dff;
      float* h = hbuf.data() + i * dff;
      if (geglu) {
        for (int64_t j = 0; j < dff; ++j) h[j] = gelu_tanh(g[j]) * u[j];
      } else {
        for (int64_t j = 0; j < dff; ++j) h[j] = silu(g[j]) * u[j];
      }
    }
    linear(hbuf.data(), L.w_down.data(), tmp.data(), n, dff, d);
    if (c.post_norms) rms_norm(tmp.data(), L.ffn_post_norm.data(), tmp.data(), n, d, c.rms_eps);
    add_into(x.data(), tmp.data(), n * d);
    check(all_finite(x.data(), n * d), "forward: non-finite activation (NaN/inf) in the output of layer {}", l);
  }

  if (!logits) return;
  const int64_t first = all_logits ? 0 : n - 1, rows = n - first;
  rms_norm(x.data() + first * d, w_.output_norm.data(), xn.data(), rows, d, c.rms_eps);
  linear(xn.data(), w_.lm_head(), logits, rows, d, c.n_vocab);
  if (const float cap = c.final_logit_softcap; cap > 0) {
    for (int64_t i = 0; i < rows * c.n_vocab; ++i) logits[i] = cap * std::tanh(logits[i] / cap);
  }
  check(all_finite(logits, rows * c.n_vocab), "forward: non-finite logits (NaN/inf) after the LM head");
}

}  // namespace ratekv
