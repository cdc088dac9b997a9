// The reverse pass of the forward pass (backward.h) for every architecture
// Model runs — llama, gemma3, qwen2 — switched by the same ModelConfig fields
// as forward.cpp (Q/K/V biases, QK-norm, per-layer RoPE base, sliding
// windows, attention scale, post-norms, GeGLU, embedding scale, final logit
// soft-capping): a taped forward over one sequence, then activation gradients
// from the LM loss back to every layer's cached K/V. Templated on the scalar
// (float: sgemm, double: dgemm). Layers are checkpointed by their residual
// input and recomputed one at a time in the reverse pass.
#include "ratekv/model/backward.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ratekv/common/error.h"

namespace ratekv {

namespace {

// C (M, N) = alpha · op(A) · op(B) + beta · C, row-major.
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N), int(K),
              alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
          const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N), int(K),
              alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

// y (n, out) = x (n, in) · Wᵀ, W row-major (out, in) — as Model::forward.
template <class T>
void linear(const T* x, const T* W, T* y, int64_t n, int64_t in, int64_t out) {
  gemm(false, true, n, out, in, T(1), x, in, W, in, T(0), y, out);
}

// dx (n, in) = dy (n, out) · W: the input gradient of linear().
template <class T>
void linear_backward(const T* dy, const T* W, T* dx, int64_t n, int64_t in, int64_t out) {
  gemm(false, false, n, in, out, T(1), dy, out, W, in, T(0), dx, in);
}

// 1/sqrt(mean(x²) + eps) of one row, rounded to T as rms_norm() rounds it.
template <class T>
T rms_factor(const T* x, int d, float eps) {
  double ss = 0;
  for (int c = 0; c < d; ++c) ss += double{x[c]} * x[c];
  return static_cast<T>(1.0 / std::sqrt(ss / d + eps));
}

// RMSNorm forward; the float path is the model's own rms_norm().
template <class T>
void rms_norm_t(const T* x, const T* w, T* out, int64_t n, int d, float eps) {
  if constexpr (std::is_same_v<T, float>) {
    rms_norm(x, w, out, n, d, eps);
  } else {
#pragma omp parallel for schedule(static) if (n * d >= 32768)
    for (int64_t i = 0; i < n; ++i) {
      const T r = rms_factor(x + i * d, d, eps);
      for (int c = 0; c < d; ++c) out[i * d + c] = x[i * d + c] * r * w[c];
    }
  }
}

// dx += ∂/∂x of y = x·r(x)⊙w applied to dy:
//   dx_c += r w_c dy_c − (r³/d) x_c Σ_j w_j dy_j x_j.
template <class T>
void rms_norm_backward_acc(const T* x, const T* w, const T* dy, T* dx, int64_t n, int d, float eps) {
#pragma omp parallel for schedule(static) if (n * d >= 32768)
  for (int64_t i = 0; i < n; ++i) {
    const T* xi = x + i * d;
    const T* gi = dy + i * d;
    T* o = dx + i * d;
    const double r = rms_factor(xi, d, eps);
    double s = 0;
    for (int c = 0; c < d; ++c) s += double{w[c]} * gi[c] * xi[c];
    const double k = r * r * r * s / d;
    for (int c = 0; c < d; ++c) o[c] += static_cast<T>(r * w[c] * gi[c] - k * xi[c]);
  }
}

// dx = ∂/∂x of per-row RMSNorm y = x·r(x)⊙w applied to dy (overwrites dx):
// n rows of width d (QK-norm: one row per head).
template <class T>
void rms_norm_backward(const T* x, const T* w, const T* dy, T* dx, int64_t n, int d, float eps) {
  std::fill(dx, dx + n * d, T(0));
  rms_norm_backward_acc(x, w, dy, dx, n, d, eps);
}

// Rotates (or, inverse, un-rotates: R_pᵀ) n_vecs vectors of head_dim channels
// at one position; pairs from rope_pairs(), cos/sin from rope_angles().
template <class T>
void rope_rotate(T* x, int64_t n_vecs, int head_dim, const std::vector<std::array<int, 2>>& pairs, const T* cs,
                 const T* sn, bool inverse) {
  const int half = head_dim / 2;
  for (int64_t v = 0; v < n_vecs; ++v) {
    T* xv = x + v * head_dim;
    for (int i = 0; i < half; ++i) {
      const T c = cs[i], s = inverse ? -sn[i] : sn[i];
      const T a = xv[pairs[i][0]], b = xv[pairs[i][1]];
      xv[pairs[i][0]] = a * c - b * s;
      xv[pairs[i][1]] = a * s + b * c;
    }
  }
}

template <class T>
bool all_finite(const T* x, int64_t n) {
  bool ok = true;
#pragma omp parallel for reduction(&& : ok) schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) ok = ok && std::isfinite(x[i]);
  return ok;
}

template <class T>
T silu(T x) {
  return x / (T(1) + std::exp(-x));
}

// GELU, tanh approximation, as forward.cpp (float: the same float expression).
constexpr double kGeluK = 0.79788456080286535588, kGeluC = 0.044715;
template <class T>
T gelu_tanh(T x) {
  return T(0.5) * x * (T(1) + std::tanh(T(kGeluK) * x * (T(1) + T(kGeluC) * x * x)));
}
// d/dx of gelu_tanh: 0.5(1 + tanh u) + 0.5 x (1 − tanh² u) k (1 + 3c x²), u = k(x + c x³).
template <class T>
T gelu_tanh_grad(T x) {
  const T th = std::tanh(T(kGeluK) * x * (T(1) + T(kGeluC) * x * x));
  return T(0.5) * (T(1) + th) + T(0.5) * x * (T(1) - th * th) * T(kGeluK) * (T(1) + T(3 * kGeluC) * x * x);
}

// First key query i sees: 0, or i − window + 1 with a sliding window (keys at
// positions > i − window, as DenseKVCache's key_range).
inline int64_t first_key(int64_t i, int64_t window) { return window > 0 ? std::max<int64_t>(0, i - window + 1) : 0; }

// Causal (optionally sliding-window) softmax of row i of S (n, n) in place:
// P_ij = softmax_{j0(i)≤j≤i}(scale·S_ij), P_ij = 0 elsewhere. Same operation
// order as the dense cache's softmax.
template <class T>
void causal_softmax_rows(T* S, int64_t n, T scale, int64_t window) {
#pragma omp parallel for schedule(static) if (n >= 128)
  for (int64_t i = 0; i < n; ++i) {
    T* s = S + i * n;
    const int64_t j0 = first_key(i, window);
    T mx = -std::numeric_limits<T>::infinity();
    for (int64_t j = j0; j <= i; ++j) {
      s[j] *= scale;
      mx = std::max(mx, s[j]);
    }
    T sum = 0;
    for (int64_t j = j0; j <= i; ++j) {
      s[j] = std::exp(s[j] - mx);
      sum += s[j];
    }
    const T inv = T(1) / sum;
    for (int64_t j = j0; j <= i; ++j) s[j] *= inv;
    std::fill(s, s + j0, T(0));
    std::fill(s + i + 1, s + n, T(0));
  }
}


constexpr int64_t kHeadRows = 64;  // LM-head rows per chunk

}  // namespace

template <class T>
struct ModelBackward<T>::Impl {
  struct Layer {
    const T *attn_norm, *wqkv, *bqkv, *wo, *ffn_norm, *w_gate_up, *w_down;
    const T *q_norm, *k_norm, *attn_post_norm, *ffn_post_norm;  // null unless the config has them
  };
  const Model* model = nullptr;
  ModelConfig cfg;
  std::vector<std::vector<T>> owned;  // double: converted weights
  const T* embd = nullptr;
  const T* lm_head = nullptr;
  const T* out_norm = nullptr;
  std::vector<Layer> layers;
  std::vector<std::array<int, 2>> pairs;

  const T* view(const std::vector<float>& w) {
    if (w.empty()) return nullptr;
    if constexpr (std::is_same_v<T, float>) {
      return w.data();
    } else {
      owned.emplace_back(w.begin(), w.end());
      return owned.back().data();
    }
  }

  // One layer's intermediates (recomputed in the reverse pass). q_raw/k_raw:
  // Q/K before QK-norm (empty without it); o_raw / f_raw: the attention and
  // FFN branch outputs before their post-norms (empty without them).
  struct Tape {
    std::vector<T> q_raw, k_raw, q, k_pre, k, v, att, o_raw, x_mid, gu, f_raw;
  };

  // RoPE cos/sin tables (n, head_dim/2) of one call: the global base and,
  // when some layer slides, the sliding layers' base.
  struct RopeTable {
    std::vector<T> c, s;
  };
  struct Ropes {
    RopeTable global, swa;
  };
  const RopeTable& rope_of(const Ropes& r, int l) const { return cfg.is_sliding(l) ? r.swa : r.global; }

  // Shapes derived from the config.
  int d() const { return cfg.d_model; }
  int hd() const { return cfg.head_dim; }
  int64_t qd() const { return int64_t{cfg.n_heads} * cfg.head_dim; }
  int64_t kvd() const { return int64_t{cfg.n_kv_heads} * cfg.head_dim; }

  // Layer l forward: x (n, d) → y (n, d); tape gets the intermediates.
  // hooks (float only): on_layer sees q/k before and after RoPE and v, as
  // Model::forward's hook does (positions 0..n−1; "before RoPE" is after QK-norm).
  void layer_forward(int l, const T* x, T* y, int64_t n, const Ropes& ropes, Tape& tp, const KVPerturbation* perturb,
                     const ForwardHooks* hooks = nullptr) const {
    const Layer& L = layers[l];
    const RopeTable& rt = rope_of(ropes, l);
    const int dm = d(), h_d = hd(), half = h_d / 2, H = cfg.n_heads, Hkv = cfg.n_kv_heads, ratio = H / Hkv;
    const int64_t q_d = qd(), kv_d = kvd(), qkvd = q_d + 2 * kv_d, dff = cfg.d_ff, window = cfg.layer_window(l);
    std::vector<T> xn(n * dm), qkv(n * qkvd);
    tp.q.resize(n * q_d);
    tp.k_pre.resize(n * kv_d);
    tp.k.resize(n * kv_d);
    tp.v.resize(n * kv_d);
    tp.att.resize(n * q_d);
    tp.x_mid.resize(n * dm);
    tp.gu.resize(n * 2 * dff);

    rms_norm_t(x, L.attn_norm, xn.data(), n, dm, cfg.rms_eps);
    linear(xn.data(), L.wqkv, qkv.data(), n, dm, qkvd);
    for (int64_t i = 0; i < n; ++i) {
      T* r = qkv.data() + i * qkvd;
      if (L.bqkv)
        for (int64_t c = 0; c < qkvd; ++c) r[c] += L.bqkv[c];
      std::memcpy(tp.q.data() + i * q_d, r, sizeof(T) * q_d);
      std::memcpy(tp.k_pre.data() + i * kv_d, r + q_d, sizeof(T) * kv_d);
      std::memcpy(tp.v.data() + i * kv_d, r + q_d + kv_d, sizeof(T) * kv_d);
    }
    if (cfg.qk_norm) {  // per head, before RoPE
      tp.q_raw = tp.q;
      tp.k_raw = tp.k_pre;
      rms_norm_t(tp.q_raw.data(), L.q_norm, tp.q.data(), n * H, h_d, cfg.rms_eps);
      rms_norm_t(tp.k_raw.data(), L.k_norm, tp.k_pre.data(), n * Hkv, h_d, cfg.rms_eps);
    }
    const bool here = perturb && perturb->layer == l;
    if (here && perturb->tensor == KVTensor::KPre) tp.k_pre[perturb->index] += static_cast<T>(perturb->delta);
    if (here && perturb->tensor == KVTensor::V) tp.v[perturb->index] += static_cast<T>(perturb->delta);
    std::memcpy(tp.k.data(), tp.k_pre.data(), sizeof(T) * n * kv_d);
    const bool hook = hooks && hooks->on_layer;
    std::vector<T> q_pre;
    if (hook) q_pre = tp.q;
    for (int64_t i = 0; i < n; ++i) {
      rope_rotate(tp.q.data() + i * q_d, H, h_d, pairs, rt.c.data() + i * half, rt.s.data() + i * half, false);
      rope_rotate(tp.k.data() + i * kv_d, Hkv, h_d, pairs, rt.c.data() + i * half, rt.s.data() + i * half, false);
    }
    if (here && perturb->tensor == KVTensor::KPost) tp.k[perturb->index] += static_cast<T>(perturb->delta);
    if constexpr (std::is_same_v<T, float>) {
      if (hook) {
        std::vector<int32_t> pos(n);
        for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(i);
        LayerActivations a;
        a.layer = l;
        a.n = n;
        a.pos = pos.data();
        a.n_heads = H;
        a.n_kv_heads = Hkv;
        a.head_dim = h_d;
        a.q_pre = q_pre.data();
        a.q_post = tp.q.data();
        a.k_pre = tp.k_pre.data();
        a.k_post = tp.k.data();
        a.v = tp.v.data();
        hooks->on_layer(a);
      }
    }

    // Causal (sliding-window) GQA attention, one query head at a time (BLAS threads inside).
    const T scale = static_cast<T>(cfg.attention_scale());
    std::vector<T> S(n * n);
    for (int h = 0; h < H; ++h) {
      const int hk = h / ratio;
      gemm(false, true, n, n, h_d, T(1), tp.q.data() + h * h_d, q_d, tp.k.data() + hk * h_d, kv_d, T(0), S.data(),
           n);
      causal_softmax_rows(S.data(), n, scale, window);
      gemm(false, false, n, h_d, n, T(1), S.data(), n, tp.v.data() + hk * h_d, kv_d, T(0), tp.att.data() + h * h_d,
           q_d);
    }
    if (cfg.post_norms) {
      tp.o_raw.resize(n * dm);
      linear(tp.att.data(), L.wo, tp.o_raw.data(), n, q_d, dm);
      rms_norm_t(tp.o_raw.data(), L.attn_post_norm, tp.x_mid.data(), n, dm, cfg.rms_eps);
    } else {
      linear(tp.att.data(), L.wo, tp.x_mid.data(), n, q_d, dm);
    }
    for (int64_t i = 0; i < n * dm; ++i) tp.x_mid[i] += x[i];

    // Gated FFN: SwiGLU or GeGLU.
    rms_norm_t(tp.x_mid.data(), L.ffn_norm, xn.data(), n, dm, cfg.rms_eps);
    linear(xn.data(), L.w_gate_up, tp.gu.data(), n, dm, 2 * dff);
    std::vector<T> hb(n * dff);
    const bool geglu = cfg.ffn_act == FfnActivation::GeluTanh;
#pragma omp parallel for schedule(static) if (n * dff >= 32768)
    for (int64_t i = 0; i < n; ++i) {
      const T* g = tp.gu.data() + i * 2 * dff;
      const T* u = g + dff;
      T* h = hb.data() + i * dff;
      for (int64_t j = 0; j < dff; ++j) h[j] = (geglu ? gelu_tanh(g[j]) : silu(g[j])) * u[j];
    }
    if (cfg.post_norms) {
      tp.f_raw.resize(n * dm);
      linear(hb.data(), L.w_down, tp.f_raw.data(), n, dff, dm);
      rms_norm_t(tp.f_raw.data(), L.ffn_post_norm, y, n, dm, cfg.rms_eps);
    } else {
      linear(hb.data(), L.w_down, y, n, dff, dm);
    }
    for (int64_t i = 0; i < n * dm; ++i) y[i] += tp.x_mid[i];
    check(all_finite(y, n * dm), "backward: non-finite activation (NaN/inf) in the output of layer {}", l);
  }

  // Layer l reverse pass: dy (n, d) → dx (n, d), and the K/V gradients.
  void layer_backward(int l, const T* x, const T* dy, T* dx, int64_t n, const Ropes& ropes, const Tape& tp,
                      LayerKVGrad<T>& g) const {
    const Layer& L = layers[l];
    const RopeTable& rt = rope_of(ropes, l);
    const int dm = d(), h_d = hd(), half = h_d / 2, H = cfg.n_heads, Hkv = cfg.n_kv_heads, ratio = H / Hkv;
    const int64_t q_d = qd(), kv_d = kvd(), qkvd = q_d + 2 * kv_d, dff = cfg.d_ff, window = cfg.layer_window(l);

    // FFN: y = x_mid + [post-norm](W_down (act(g) ⊙ u)), [g u] = W_gu · RMSNorm(x_mid).
    std::vector<T> dh(n * dff), dgu(n * 2 * dff), dxn(n * dm), dx_mid(dy, dy + n * dm);
    std::vector<T> dbranch;  // gradient at the branch output before its post-norm
    const T* df = dy;
    if (cfg.post_norms) {
      dbranch.resize(n * dm);
      rms_norm_backward(tp.f_raw.data(), L.ffn_post_norm, dy, dbranch.data(), n, dm, cfg.rms_eps);
      df = dbranch.data();
    }
    linear_backward(df, L.w_down, dh.data(), n, dff, dm);
    const bool geglu = cfg.ffn_act == FfnActivation::GeluTanh;
#pragma omp parallel for schedule(static) if (n * dff >= 32768)
    for (int64_t i = 0; i < n; ++i) {
      const T* gg = tp.gu.data() + i * 2 * dff;
      const T* u = gg + dff;
      const T* dhi = dh.data() + i * dff;
      T* dgi = dgu.data() + i * 2 * dff;
      T* dui = dgi + dff;
      for (int64_t j = 0; j < dff; ++j) {
        if (geglu) {
          dgi[j] = dhi[j] * u[j] * gelu_tanh_grad(gg[j]);
          dui[j] = dhi[j] * gelu_tanh(gg[j]);
        } else {
          const T sg = T(1) / (T(1) + std::exp(-gg[j]));
          dgi[j] = dhi[j] * u[j] * sg * (T(1) + gg[j] * (T(1) - sg));
          dui[j] = dhi[j] * gg[j] * sg;
        }
      }
    }
    linear_backward(dgu.data(), L.w_gate_up, dxn.data(), n, dm, 2 * dff);
    rms_norm_backward_acc(tp.x_mid.data(), L.ffn_norm, dxn.data(), dx_mid.data(), n, dm, cfg.rms_eps);

    // Attention output projection (and its post-norm).
    const T* dout = dx_mid.data();
    if (cfg.post_norms) {
      rms_norm_backward(tp.o_raw.data(), L.attn_post_norm, dx_mid.data(), dbranch.data(), n, dm, cfg.rms_eps);
      dout = dbranch.data();
    }
    std::vector<T> datt(n * q_d), dq(n * q_d, T(0));
    linear_backward(dout, L.wo, datt.data(), n, q_d, dm);
    g.layer = l;
    g.dk_post.assign(n * kv_d, T(0));
    g.dv.assign(n * kv_d, T(0));

    // Softmax attention per query head h (KV head hk = h / ratio):
    //   dP = dO Vᵀ, dV += Pᵀ dO, dS = P ⊙ (dP − rowsum(dO ⊙ O)) · scale,
    //   dQ = dS K, dK += dSᵀ Q. P is 0 outside the causal window, so is dS.
    //   Heads run in order (GQA sums are deterministic).
    const T scale = static_cast<T>(cfg.attention_scale());
    std::vector<T> P(n * n), dP(n * n), D(n);
    for (int h = 0; h < H; ++h) {
      const int hk = h / ratio;
      const T* qh = tp.q.data() + h * h_d;
      const T* kh = tp.k.data() + hk * h_d;
      const T* vh = tp.v.data() + hk * h_d;
      const T* dO = datt.data() + h * h_d;
      const T* O = tp.att.data() + h * h_d;
      gemm(false, true, n, n, h_d, T(1), qh, q_d, kh, kv_d, T(0), P.data(), n);
      causal_softmax_rows(P.data(), n, scale, window);
      gemm(false, true, n, n, h_d, T(1), dO, q_d, vh, kv_d, T(0), dP.data(), n);
      gemm(true, false, n, h_d, n, T(1), P.data(), n, dO, q_d, T(1), g.dv.data() + hk * h_d, kv_d);
#pragma omp parallel for schedule(static) if (n >= 128)
      for (int64_t i = 0; i < n; ++i) {
        double di = 0;
        for (int c = 0; c < h_d; ++c) di += double{dO[i * q_d + c]} * O[i * q_d + c];
        const T Di = static_cast<T>(di);
        T* pr = P.data() + i * n;
        const T* dpr = dP.data() + i * n;
        for (int64_t j = first_key(i, window); j <= i; ++j) pr[j] = pr[j] * (dpr[j] - Di) * scale;  // P row → dS row
      }
      gemm(false, false, n, h_d, n, T(1), P.data(), n, kh, kv_d, T(0), dq.data() + h * h_d, q_d);
      gemm(true, false, n, h_d, n, T(1), P.data(), n, qh, q_d, T(1), g.dk_post.data() + hk * h_d, kv_d);
    }

    // RoPE: ∂L/∂x_pre = R_pᵀ ∂L/∂x_post (with this layer's base).
    g.dk_pre = g.dk_post;
    for (int64_t i = 0; i < n; ++i) {
      rope_rotate(dq.data() + i * q_d, H, h_d, pairs, rt.c.data() + i * half, rt.s.data() + i * half, true);
      rope_rotate(g.dk_pre.data() + i * kv_d, Hkv, h_d, pairs, rt.c.data() + i * half, rt.s.data() + i * half, true);
    }

    // QK-norm (per head), then the Q/K/V projection (its bias has no input
    // gradient) and the attention RMSNorm.
    std::vector<T> dqkv(n * qkvd), dq_raw, dk_raw;
    const T* dqs = dq.data();
    const T* dks = g.dk_pre.data();
    if (cfg.qk_norm) {
      dq_raw.resize(n * q_d);
      dk_raw.resize(n * kv_d);
      rms_norm_backward(tp.q_raw.data(), L.q_norm, dq.data(), dq_raw.data(), n * H, h_d, cfg.rms_eps);
      rms_norm_backward(tp.k_raw.data(), L.k_norm, g.dk_pre.data(), dk_raw.data(), n * Hkv, h_d, cfg.rms_eps);
      dqs = dq_raw.data();
      dks = dk_raw.data();
    }
    for (int64_t i = 0; i < n; ++i) {
      T* r = dqkv.data() + i * qkvd;
      std::memcpy(r, dqs + i * q_d, sizeof(T) * q_d);
      std::memcpy(r + q_d, dks + i * kv_d, sizeof(T) * kv_d);
      std::memcpy(r + q_d + kv_d, g.dv.data() + i * kv_d, sizeof(T) * kv_d);
    }
    linear_backward(dqkv.data(), L.wqkv, dxn.data(), n, dm, qkvd);
    std::memcpy(dx, dx_mid.data(), sizeof(T) * n * dm);
    rms_norm_backward_acc(x, L.attn_norm, dxn.data(), dx, n, dm, cfg.rms_eps);
  }

  // RoPE angles for positions 0..n−1 of base θ: float as rope_angles() (so
  // the forward matches Model::forward), double exact.
  RopeTable make_rope(int64_t n, double theta) const {
    const int h_d = hd(), half = h_d / 2;
    RopeTable t;
    t.c.resize(n * half);
    t.s.resize(n * half);
    for (int64_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<T, float>) {
        rope_angles(i, h_d, theta, t.c.data() + i * half, t.s.data() + i * half);
      } else {
        for (int b = 0; b < half; ++b) {
          const double a = static_cast<double>(i) * rope_frequency(b, h_d, theta);
          t.c[i * half + b] = std::cos(a);
          t.s[i * half + b] = std::sin(a);
        }
      }
    }
    return t;
  }

  // The whole pass. on_layer == nullptr: forward and loss only.
  double run(std::span<const int32_t> tokens, const std::function<void(const LayerKVGrad<T>&)>* on_layer, T* logits,
             const KVPerturbation* perturb, const ForwardHooks* hooks = nullptr) const {
    const int64_t n = static_cast<int64_t>(tokens.size());
    const int dm = d(), h_d = hd(), NL = cfg.n_layers;
    const int64_t V = cfg.n_vocab;
    check(n >= 2, "backward: {} token(s): the causal LM loss needs at least 2", n);
    check(n <= model->position_limit(), "backward: {} tokens exceed the model's position limit {}", n,
          model->position_limit());
    for (int64_t i = 0; i < n; ++i) {
      check(tokens[i] >= 0 && tokens[i] < V, "backward: token id {} at index {} outside [0, {})", tokens[i], i, V);
    }
    if (perturb) {
      check(perturb->layer >= 0 && perturb->layer < NL, "backward: perturbation layer {} outside [0, {})",
            perturb->layer, NL);
      check(perturb->index >= 0 && perturb->index < n * kvd(),
            "backward: perturbation index {} outside the (n = {}, n_kv_heads = {}, head_dim = {}) tensor",
            perturb->index, n, cfg.n_kv_heads, h_d);
      check(std::isfinite(perturb->delta), "backward: perturbation delta must be finite");
    }

    Ropes ropes;
    ropes.global = make_rope(n, cfg.rope_theta);
    bool any_sliding = false;
    for (int l = 0; l < NL; ++l) any_sliding = any_sliding || cfg.is_sliding(l);
    if (any_sliding) ropes.swa = make_rope(n, cfg.rope_theta_swa);

    // Forward, checkpointing each layer's input: xs[l] is layer l's input, xs[NL] the output.
    std::vector<std::vector<T>> xs(NL + 1, std::vector<T>(n * dm));
    for (int64_t i = 0; i < n; ++i) {
      T* xi = xs[0].data() + i * dm;
      std::memcpy(xi, embd + int64_t{tokens[i]} * dm, sizeof(T) * dm);
      if (cfg.embd_scale != 1.0f)
        for (int c = 0; c < dm; ++c) xi[c] *= static_cast<T>(cfg.embd_scale);
    }
    Tape tp;
    for (int l = 0; l < NL; ++l) layer_forward(l, xs[l].data(), xs[l + 1].data(), n, ropes, tp, perturb, hooks);

    // Final RMSNorm, LM head [soft-cap] and loss in chunks of rows;
    // dxf = ∂L/∂(normed final state).
    std::vector<T> xf(n * dm), dxf(on_layer ? n * dm : 0);
    rms_norm_t(xs[NL].data(), out_norm, xf.data(), n, dm, cfg.rms_eps);
    const double inv_count = 1.0 / static_cast<double>(n - 1);
    const double cap = cfg.final_logit_softcap;
    double loss_sum = 0;
    std::vector<T> lg(std::min(n, kHeadRows) * V);
    for (int64_t r0 = 0; r0 < n; r0 += kHeadRows) {
      const int64_t rows = std::min(kHeadRows, n - r0);
      linear(xf.data() + r0 * dm, lm_head, lg.data(), rows, dm, V);
      if (cap > 0) {  // logit = c·tanh(z/c), as Model::forward (float: the same float expression)
        const T c = static_cast<T>(cap);
        for (int64_t i = 0; i < rows * V; ++i) lg[i] = c * std::tanh(lg[i] / c);
      }
      check(all_finite(lg.data(), rows * V), "backward: non-finite logits (NaN/inf) after the LM head");
      if (logits) std::memcpy(logits + r0 * V, lg.data(), sizeof(T) * rows * V);
      std::vector<double> row_loss(rows, 0.0);  // summed in order below: deterministic
#pragma omp parallel for schedule(static) if (rows * V >= 65536)
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t t = r0 + i;
        T* row = lg.data() + i * V;
        if (t == n - 1) {  // the last position predicts nothing
          std::fill(row, row + V, T(0));
          continue;
        }
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < V; ++j) mx = std::max(mx, double{row[j]});
        double z = 0;
        for (int64_t j = 0; j < V; ++j) z += std::exp(double{row[j]} - mx);
        const double lse = mx + std::log(z);
        const int32_t target = tokens[t + 1];
        row_loss[i] = lse - double{row[target]};
        // ∂L/∂logit_j = (softmax_j − [j = target]) / (n − 1); through the
        // soft-cap ∂logit/∂z = 1 − (logit/c)².
        for (int64_t j = 0; j < V; ++j) {
          double gj = std::exp(double{row[j]} - lse) * inv_count - (j == target ? inv_count : 0.0);
          if (cap > 0) {
            const double th = double{row[j]} / cap;
            gj *= 1.0 - th * th;
          }
          row[j] = static_cast<T>(gj);
        }
      }
      for (double x : row_loss) loss_sum += x;
      if (on_layer) linear_backward(lg.data(), lm_head, dxf.data() + r0 * dm, rows, dm, V);
    }
    const double loss = loss_sum * inv_count;
    if (!on_layer) return loss;

    // Reverse pass.
    std::vector<T> dx(n * dm, T(0)), dnext(n * dm);
    rms_norm_backward_acc(xs[NL].data(), out_norm, dxf.data(), dx.data(), n, dm, cfg.rms_eps);
    LayerKVGrad<T> g;
    std::vector<T> y_scratch(n * dm);
    for (int l = NL - 1; l >= 0; --l) {
      // The tape still holds the last layer; recompute the others from their checkpoint.
      if (l != NL - 1) layer_forward(l, xs[l].data(), y_scratch.data(), n, ropes, tp, perturb);
      layer_backward(l, xs[l].data(), dx.data(), dnext.data(), n, ropes, tp, g);
      check(all_finite(g.dk_post.data(), static_cast<int64_t>(g.dk_post.size())) &&
                all_finite(g.dv.data(), static_cast<int64_t>(g.dv.size())),
            "backward: non-finite K/V gradient (NaN/inf) in layer {}", l);
      (*on_layer)(g);
      std::swap(dx, dnext);
    }
    return loss;
  }
};

void check_backward_arch(const ModelConfig& cfg, const std::string& context) {
  check(cfg.arch == "llama" || cfg.arch == "gemma3" || cfg.arch == "qwen2",
        "{}: arch '{}': the backward pass is implemented for 'llama', 'gemma3' and 'qwen2' (the architectures Model "
        "runs)",
        context, cfg.arch);
}

template <class T>
ModelBackward<T>::ModelBackward(const Model& model) : impl_(std::make_unique<Impl>()) {
  const ModelConfig& c = model.config();
  check_backward_arch(c, "ModelBackward");
  Impl& m = *impl_;
  m.model = &model;
  m.cfg = c;
  m.pairs = rope_pairs(c.rope_layout, c.head_dim);
  const ModelWeights& w = model.weights();
  if constexpr (!std::is_same_v<T, float>) m.owned.reserve(4 + 11 * w.layers.size());
  m.embd = m.view(w.token_embd);
  m.lm_head = w.output.empty() ? m.embd : m.view(w.output);
  m.out_norm = m.view(w.output_norm);
  for (const LayerWeights& L : w.layers) {
    m.layers.push_back({m.view(L.attn_norm), m.view(L.wqkv), c.qkv_bias ? m.view(L.bqkv) : nullptr, m.view(L.wo),
                        m.view(L.ffn_norm), m.view(L.w_gate_up), m.view(L.w_down),
                        c.qk_norm ? m.view(L.attn_q_norm) : nullptr, c.qk_norm ? m.view(L.attn_k_norm) : nullptr,
                        c.post_norms ? m.view(L.attn_post_norm) : nullptr,
                        c.post_norms ? m.view(L.ffn_post_norm) : nullptr});
  }
}

template <class T>
ModelBackward<T>::~ModelBackward() = default;
template <class T>
ModelBackward<T>::ModelBackward(ModelBackward&&) noexcept = default;
template <class T>
ModelBackward<T>& ModelBackward<T>::operator=(ModelBackward&&) noexcept = default;

template <class T>
const ModelConfig& ModelBackward<T>::config() const {
  return impl_->cfg;
}

template <class T>
double ModelBackward<T>::loss(std::span<const int32_t> tokens, T* logits, const KVPerturbation* perturb) const {
  return impl_->run(tokens, nullptr, logits, perturb);
}

template <class T>
double ModelBackward<T>::backward(std::span<const int32_t> tokens,
                                  const std::function<void(const LayerKVGrad<T>&)>& on_layer, T* logits,
                                  const KVPerturbation* perturb, const ForwardHooks* hooks) const {
  check(static_cast<bool>(on_layer), "ModelBackward::backward: empty on_layer callback");
  check(hooks == nullptr || std::is_same_v<T, float>, "ModelBackward<double>::backward: forward hooks need float");
  return impl_->run(tokens, &on_layer, logits, perturb, hooks);
}

template <class T>
KVGradients<T> ModelBackward<T>::gradients(std::span<const int32_t> tokens) const {
  KVGradients<T> r;
  r.n = static_cast<int64_t>(tokens.size());
  r.n_kv_heads = impl_->cfg.n_kv_heads;
  r.head_dim = impl_->cfg.head_dim;
  r.layers.resize(impl_->cfg.n_layers);
  r.loss = backward(tokens, [&](const LayerKVGrad<T>& g) { r.layers[g.layer] = g; });
  return r;
}

template class ModelBackward<float>;
template class ModelBackward<double>;

void kv_gradients_batch(const Model& model, std::span<const std::vector<int32_t>> sequences,
                        const std::function<void(size_t seq, const KVGradients<float>&)>& fn) {
  const ModelBackward<float> bw(model);
  for (size_t s = 0; s < sequences.size(); ++s) {
    KVGradients<float> g;
    try {
      g = bw.gradients(sequences[s]);
    } catch (const Error& e) {
      fail("kv_gradients_batch: sequence {}: {}", s, e.what());
    }
    fn(s, g);
  }
}

}  // namespace ratekv
