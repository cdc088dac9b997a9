// The GPU engine (ratekv/engine/engine.h): weights, page pool, sequences,
// prefill, decode steps (CUDA graphs), timing.
#include "ratekv/engine/engine.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <tuple>

#include "buffer_sizes.h"
#include "ratekv/common/error.h"
#include "ratekv/cuda/decode_attention.h"
#include "ratekv/cuda/model_kernels.h"
#include "ratekv/cuda/packed_wide.h"
#include "ratekv/cuda/vq_encode.h"
#include "ratekv/engine/page_pool.h"
#include "ratekv/model/sliding_window.h"
#include "ratekv/model/synthetic.h"

#define RATEKV_CUDA_OK(expr)                                                                                     \
  do {                                                                                                           \
    const cudaError_t _e = (expr);                                                                               \
    if (_e != cudaSuccess) ::ratekv::fail("CUDA: {} failed: {} ({}:{})", #expr, cudaGetErrorString(_e), __FILE__, \
                                          __LINE__);                                                             \
  } while (0)
#define RATEKV_CUBLAS_OK(expr)                                                                                 \
  do {                                                                                                         \
    const cublasStatus_t _s = (expr);                                                                          \
    if (_s != CUBLAS_STATUS_SUCCESS)                                                                           \
      ::ratekv::fail("cuBLAS: {} failed: {} ({}:{})", #expr, cublasGetStatusString(_s), __FILE__, __LINE__); \
  } while (0)

namespace ratekv::engine {

namespace {

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

/// Owned device allocation.
struct DevMem {
  void* p = nullptr;
  size_t bytes = 0;
  DevMem() = default;
  explicit DevMem(size_t n) : bytes(n) {
    if (n) RATEKV_CUDA_OK(cudaMalloc(&p, n));
  }
  DevMem(DevMem&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr, o.bytes = 0; }
  DevMem& operator=(DevMem&& o) noexcept {
    std::swap(p, o.p);
    std::swap(bytes, o.bytes);
    return *this;
  }
  ~DevMem() {
    if (p) cudaFree(p);
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// Parts of a decode step (graph pieces for the profile).
enum Part : int { kGemm = 1, kAttn = 2, kAppend = 4, kOther = 8, kAdvance = 16, kAll = 31 };

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

struct Engine::Impl {
  ModelConfig cfg;
  CacheFormat fmt;
  EngineOptions opt;
  MemoryPlan mem;
  bool untied = false;
  int64_t ctx_limit = 0;
  detail::Dims dims;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  DevMem blas_ws;
  // Bytes requested from cudaMalloc so far (make_impl checks the sum against
  // the memory plan).
  size_t allocated = 0;
  DevMem alloc(size_t n) {
    DevMem d(n);
    allocated += n;
    return d;
  }
  // Packed prefill's rotated rows (cuda::PrefillScratch with blas).
  DevMem prefill_rot;
  cuda::PrefillScratch prefill_scratch() const {
    cuda::PrefillScratch s;
    s.cublas = blas;
    s.buffer = prefill_rot.p;
    s.bytes = prefill_rot.bytes;
    return s;
  }

  // weights
  struct Layer {
    DevMem wqkv, wo, wgu, wdown, attn_norm, ffn_norm, bias;
    DevMem q_norm, k_norm, post_attn, post_ffn;  // Gemma 3 (cfg.qk_norm, cfg.post_norms)
  };
  DevMem embd, lm_head_mem, out_norm, inv_freq, inv_freq_swa;  // RoPE frequencies: global / sliding layers
  const uint16_t* lm_head = nullptr;
  std::vector<Layer> layers;

  // cache
  std::vector<std::unique_ptr<cuda::PackedPlan>> plans;  // a vq layer: its tq-mse values, or null
  // TaSQ / CQ layers (CacheFormat::vq): the vq pages' decode and encode tables.
  std::vector<std::unique_ptr<cuda::VqPlan>> vq_plans;
  std::vector<std::unique_ptr<cuda::VqEncodePlan>> vq_enc;
  // The page pool (engine/page_pool.h: free list, sequences, page-table
  // rows) over device memory the engine allocates, one block per layer.
  std::optional<PagePool> pool;
  std::vector<DevMem> pool_mem;
  int max_pages = 0;  // page-table row stride: ⌈context limit / 64⌉ (pool->max_seq_pages())
  uint8_t* pages(int l) const { return pool->layer_base(l); }
  uint16_t* fp16_pages(int l) const { return reinterpret_cast<uint16_t*>(pool->layer_base(l)); }
  // A layer's extension pages (high bits of 5..8-bit groups) follow its pages,
  // a vq layer's vq pages its scalar pages, in the layer's memory (CacheFormat).
  uint8_t* ext_pages(int l) const {
    return pool->layer_base(l) + static_cast<size_t>(pool->pages()) * fmt.layout(l).page_bytes();
  }
  uint8_t* vq_pages(int l) const {
    return pool->layer_base(l) + static_cast<size_t>(pool->pages()) * fmt.scalar_page_bytes(l);
  }

  // activations (rows = max(prefill tokens, batch))
  int64_t rows = 0, lrows = 0;
  DevMem x, xn, qkv, q16, k32, v32, k16, v16, q32, o32, att16, tmp, gu, h16, tok, pos, logits;
  DevMem k_pre32;  // pre-RoPE keys (vq layers' encoder input; allocated for formats with vq layers)
  // decode state
  DevMem d_pos, d_lens, d_hist, d_count, d_pt, d_zero, d_start, attn_ws, probe_sink;
  DevMem d_temp, d_topk, d_topp, d_uni;  // per-row sampling settings (decode_sample)
  std::vector<int> uploaded_batch;
  // prefill
  DevMem p_pt, scores, probs;
  // chunked prefill: a key tile (fp16 K, V) and the rows' softmax state
  int64_t key_tile = 0;
  DevMem tile_k, tile_v, m_stat, l_stat;
  // graphs
  std::map<std::tuple<int, int64_t, int, int, int>, cudaGraphExec_t> graphs;
  cudaEvent_t ev0 = nullptr, ev1 = nullptr;

  explicit Impl(const ModelConfig& c, CacheFormat f, const EngineOptions& o) : cfg(c), fmt(std::move(f)), opt(o), dims(c) {}
  ~Impl() {
    for (auto& [k, g] : graphs) cudaGraphExecDestroy(g);
    if (ev0) cudaEventDestroy(ev0);
    if (ev1) cudaEventDestroy(ev1);
    if (blas) cublasDestroy(blas);
    if (stream) cudaStreamDestroy(stream);
  }

  void sync() { RATEKV_CUDA_OK(cudaStreamSynchronize(stream)); }

  // y (n, out) fp32 = x (n, in) bf16 · Wᵀ, W (out, in) bf16 row-major.
  void gemm(const uint16_t* X, const uint16_t* W, float* Y, int64_t n, int64_t in, int64_t out) {
    const float a = 1.f, b = 0.f;
    RATEKV_CUBLAS_OK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)out, (int)n, (int)in, &a, W, CUDA_R_16BF,
                                  (int)in, X, CUDA_R_16BF, (int)in, &b, Y, CUDA_R_32F, (int)out, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
  }

  const float* next_norm(int l) const {
    return l + 1 < cfg.n_layers ? layers[l + 1].attn_norm.as<float>() : out_norm.as<float>();
  }
  // Layer l's RoPE frequencies (θ or, sliding layers, θ_swa) and QK-norm.
  const double* layer_inv_freq(int l) const {
    return cfg.is_sliding(l) ? inv_freq_swa.as<double>() : inv_freq.as<double>();
  }
  cuda::QkNorm qk_norm(int l) const {
    cuda::QkNorm q;
    if (cfg.qk_norm) q.q = layers[l].q_norm.as<float>(), q.k = layers[l].k_norm.as<float>(), q.eps = cfg.rms_eps;
    return q;
  }
  int layer_window(int l) const { return static_cast<int>(cfg.layer_window(l)); }

  // x (n, d) = embeddings of the n tokens in `tok` (× embd_scale), then the
  // first layer's RMSNorm into xn.
  void embed(int64_t n) {
    cuda::embed_rows(embd.as<uint16_t>(), tok.as<int32_t>(), (int)n, (int)dims.d, x.as<float>(), stream,
                     cfg.embd_scale);
    cuda::add_rms_norm(x.as<float>(), nullptr, layers[0].attn_norm.as<float>(), (int)n, (int)dims.d, cfg.rms_eps,
                       xn.as<uint16_t>(), stream);
  }

  // Q/K/V of n rows from qkv (bias, QK-norm, the layer's RoPE) into `o`.
  void qkv_rope(int l, int64_t n, const int32_t* positions, const cuda::QkvRopeOut& o) {
    cuda::qkv_bias_rope(qkv.as<float>(), layers[l].bias.as<float>(), positions, (int)n, cfg.n_heads, cfg.n_kv_heads,
                        cfg.head_dim, cfg.rope_layout == RopeLayout::NeoX, layer_inv_freq(l), o, stream, qk_norm(l));
  }

  // After the output projection (tmp = attention · Woᵀ) of n rows: [post-norm,]
  // residual add, FFN norm into xn.
  void attn_residual(int l, int64_t n) {
    const Layer& L = layers[l];
    if (cfg.post_norms)
      cuda::rms_norm_f32(tmp.as<float>(), L.post_attn.as<float>(), (int)n, (int)dims.d, cfg.rms_eps, tmp.as<float>(),
                         stream);
    cuda::add_rms_norm(x.as<float>(), tmp.as<float>(), L.ffn_norm.as<float>(), (int)n, (int)dims.d, cfg.rms_eps,
                       xn.as<uint16_t>(), stream);
  }
  // The gated activation of gu into h16 (SwiGLU or GeGLU).
  void ffn_act(int64_t n) {
    if (cfg.ffn_act == FfnActivation::GeluTanh)
      cuda::geglu(gu.as<float>(), (int)n, (int)dims.dff, h16.as<uint16_t>(), stream);
    else
      cuda::swiglu(gu.as<float>(), (int)n, (int)dims.dff, h16.as<uint16_t>(), stream);
  }
  // After the down projection (tmp) of n rows: [post-norm,] residual add, the
  // next layer's (or the output) norm into xn.
  void ffn_residual(int l, int64_t n) {
    if (cfg.post_norms)
      cuda::rms_norm_f32(tmp.as<float>(), layers[l].post_ffn.as<float>(), (int)n, (int)dims.d, cfg.rms_eps,
                         tmp.as<float>(), stream);
    cuda::add_rms_norm(x.as<float>(), tmp.as<float>(), next_norm(l), (int)n, (int)dims.d, cfg.rms_eps,
                       xn.as<uint16_t>(), stream);
  }
  // Final logit soft-capping of n rows of `lg` (cfg.final_logit_softcap).
  void softcap_logits(float* lg, int64_t n) {
    if (cfg.final_logit_softcap > 0) cuda::softcap(lg, n * dims.V, cfg.final_logit_softcap, stream);
  }

  // The rest of layer l for n prompt rows after their attention output o32
  // (n, n_heads·head_dim): output projection + residual + RMSNorm, SwiGLU MLP +
  // residual, then the next layer's (or the output) RMSNorm into xn. Shared by
  // the one-piece and the chunked prefill.
  void prefill_layer_tail(int l, int64_t n) {
    const Layer& L = layers[l];
    const detail::Dims& m = dims;
    cuda::f32_to_bf16(o32.as<float>(), att16.as<uint16_t>(), n * m.qd, stream);
    gemm(att16.as<uint16_t>(), L.wo.as<uint16_t>(), tmp.as<float>(), n, m.qd, m.d);
    attn_residual(l, n);
    gemm(xn.as<uint16_t>(), L.wgu.as<uint16_t>(), gu.as<float>(), n, m.d, 2 * m.dff);
    ffn_act(n);
    gemm(h16.as<uint16_t>(), L.wdown.as<uint16_t>(), tmp.as<float>(), n, m.dff, m.d);
    ffn_residual(l, n);
  }

  // The LM head over the final normed rows xn of a prefill of n rows into
  // `logits` (host): n_vocab floats = the last row only, n·n_vocab = every row;
  // lrows rows per GEMM. Empty: nothing.
  void prefill_logits(int64_t n, std::span<float> logits) {
    if (logits.empty()) return;
    const detail::Dims& m = dims;
    const int64_t first = logits.size() == size_t(m.V) ? n - 1 : 0;
    for (int64_t r = first; r < n; r += lrows) {
      const int64_t nr = std::min(lrows, n - r);
      gemm(xn.as<uint16_t>() + r * m.d, lm_head, this->logits.as<float>(), nr, m.d, m.V);
      softcap_logits(this->logits.as<float>(), nr);
      RATEKV_CUDA_OK(cudaMemcpyAsync(logits.data() + (r - first) * m.V, this->logits.p, 4 * nr * m.V,
                                     cudaMemcpyDeviceToHost, stream));
      sync();
    }
  }

  cuda::DecodeBatch batch_view(const int32_t* lens, int B, int64_t bound) const {
    cuda::DecodeBatch db;
    db.page_table = d_pt.as<int32_t>();
    db.max_pages = max_pages;
    db.seq_lens = lens;
    db.batch = B;
    db.max_seq_len = (int)bound;
    return db;
  }

  cuda::Fp16DecodeVariant fp16_variant(int v) const {
    return v == 1   ? cuda::Fp16DecodeVariant::rows16
           : v == 2 ? cuda::Fp16DecodeVariant::n8
           : v == 3 ? cuda::Fp16DecodeVariant::n8_fused
                    : cuda::Fp16DecodeVariant::automatic;
  }

  // Decode attention of layer l for B rows (q32 → o32); sliding layers
  // attend to their window only (DecodeBatch::window).
  void attention(int l, int B, int64_t bound, int fp16_kernel) {
    cuda::DecodeBatch db = batch_view(d_lens.as<int32_t>(), B, bound);
    db.window = layer_window(l);
    const float scale = cfg.attention_scale();
    if (fmt.is_fp16()) {
      cuda::fp16_decode_attention(cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, db, fp16_pages(l), q32.p,
                                  cuda::DType::f32, scale, o32.as<float>(), attn_ws.p, attn_ws.bytes, 0, stream,
                                  fp16_variant(fp16_kernel));
    } else if (fmt.vq(l)) {
      cuda::vq_decode_attention(*vq_plans[l], db, vq_pages(l), pages(l), q32.p, cuda::DType::f32, scale,
                                o32.as<float>(), attn_ws.p, attn_ws.bytes, 0, stream);
    } else if (fmt.ext_layout(l)) {  // 5..8-bit groups: the generic kernel with the extension pages
      cuda::packed_decode_attention(*plans[l], db, pages(l), ext_pages(l), q32.p, cuda::DType::f32, scale,
                                    o32.as<float>(), attn_ws.p, attn_ws.bytes, 0, stream);
    } else {
      cuda::packed_decode_attention(*plans[l], db, pages(l), q32.p, cuda::DType::f32, scale,
                                    o32.as<float>(), attn_ws.p, attn_ws.bytes, 0, stream);
    }
  }

  // Writes n tokens per sequence of `db` into layer l's packed pages (k pre-
  // and post-RoPE, v: (B, n, Hkv, hd) fp32): a vq layer's vq sides with
  // vq_append, its tq-mse values (if any) with packed_append (decode) /
  // packed_prefill; other layers with packed_append / packed_prefill.
  void write_packed(int l, const cuda::DecodeBatch& db, const float* kpre, const float* k, const float* v, int n,
                    bool decode) {
    if (fmt.vq(l)) cuda::vq_append(*vq_enc[l], db, vq_pages(l), kpre, k, v, n, stream);
    if (!plans[l]) return;
    if (fmt.ext_layout(l)) {  // 5..8-bit groups (decode and prefill alike)
      cuda::packed_write_wide(*plans[l], db, pages(l), ext_pages(l), k, v, n, stream);
    } else if (decode) {
      cuda::packed_append(*plans[l], db, pages(l), k, v, cuda::DType::f32, stream);
    } else {
      const cuda::PrefillScratch scratch = prefill_scratch();  // the engine's handle and buffer: no allocation
      cuda::packed_prefill(*plans[l], db, pages(l), k, v, n, cuda::DType::f32, stream,
                           cuda::PrefillVariant::tensor_cores, &scratch);
    }
  }

  // fp16 K, V (n, Hkv, hd) of n tokens of layer l's packed pages (page-table
  // row pt, positions pos0 …): packed_dequantize, and for a vq layer
  // vq_dequantize after it (its keys, and its values when in the vq pages).
  void dequantize(int l, const int32_t* pt, int n, int pos0, uint16_t* k, uint16_t* v) {
    if (plans[l] && fmt.ext_layout(l))
      cuda::packed_dequantize_wide(*plans[l], pages(l), ext_pages(l), pt, n, k, v, stream);
    else if (plans[l])
      cuda::packed_dequantize(*plans[l], pages(l), pt, n, k, v, stream);
    if (fmt.vq(l)) cuda::vq_dequantize(*vq_plans[l], vq_pages(l), pt, n, pos0, k, v, stream);
  }

  // Throws when a vq key encode since the last check met a shared scale that
  // is not a finite fp16 value (cuda::vq_check_status; synchronizes).
  void check_vq() {
    for (int l = 0; l < cfg.n_layers; ++l)
      if (l < (int)vq_enc.size() && vq_enc[l])
        cuda::vq_check_status(*vq_enc[l], stream, fmt::format("GPU engine: layer {}", l).c_str());
  }

  // One decode step of B sequences (rows 0..B−1 of the buffers), the parts in `mask`.
  void enqueue_step(int B, int64_t bound, int mask, int n_layers, int fp16_kernel) {
    const detail::Dims& m = dims;
    const bool other = mask & kOther;
    if (other) {
      cuda::step_lengths(d_pos.as<int32_t>(), d_lens.as<int32_t>(), B, stream);
      embed(B);
    }
    for (int l = 0; l < n_layers; ++l) {
      const Layer& L = layers[l];
      if (mask & kGemm) gemm(xn.as<uint16_t>(), L.wqkv.as<uint16_t>(), qkv.as<float>(), B, m.d, m.qkvd);
      if (other) {
        cuda::QkvRopeOut o;
        o.q32 = q32.as<float>();
        o.k32 = k32.as<float>();
        o.k_pre32 = k_pre32.as<float>();
        o.v32 = v32.as<float>();
        qkv_rope(l, B, d_pos.as<int32_t>(), o);
      }
      if (mask & kAppend) {
        const cuda::DecodeBatch before = batch_view(d_pos.as<int32_t>(), B, bound);
        if (fmt.is_fp16())
          cuda::fp16_write_tokens(fp16_pages(l), cfg.n_kv_heads, cfg.head_dim, d_pt.as<int32_t>(), max_pages,
                                  d_pos.as<int32_t>(), k32.as<float>(), v32.as<float>(), 1, B, stream);
        else
          write_packed(l, before, k_pre32.as<float>(), k32.as<float>(), v32.as<float>(), 1, true);
      }
      if (mask & kAttn) attention(l, B, bound, fp16_kernel);
      if (other) cuda::f32_to_bf16(o32.as<float>(), att16.as<uint16_t>(), B * m.qd, stream);
      if (mask & kGemm) gemm(att16.as<uint16_t>(), L.wo.as<uint16_t>(), tmp.as<float>(), B, m.qd, m.d);
      if (other) attn_residual(l, B);
      if (mask & kGemm) gemm(xn.as<uint16_t>(), L.wgu.as<uint16_t>(), gu.as<float>(), B, m.d, 2 * m.dff);
      if (other) ffn_act(B);
      if (mask & kGemm) gemm(h16.as<uint16_t>(), L.wdown.as<uint16_t>(), tmp.as<float>(), B, m.dff, m.d);
      if (other) ffn_residual(l, B);
    }
    if (n_layers < cfg.n_layers) return;  // attention-only timing pieces
    if (mask & kGemm) gemm(xn.as<uint16_t>(), lm_head, logits.as<float>(), B, m.d, m.V);
    if (other) softcap_logits(logits.as<float>(), B);
    if (mask & kAdvance) {
      cuda::argmax_rows(logits.as<float>(), B, (int)m.V, tok.as<int32_t>(), stream);
      cuda::step_advance(d_pos.as<int32_t>(), tok.as<int32_t>(), d_hist.as<int32_t>(), d_count.as<int32_t>(),
                         detail::kHistorySteps, B, stream);
    }
  }

  cudaGraphExec_t graph(int B, int64_t bound, int mask, int n_layers, int fp16_kernel) {
    const auto key = std::make_tuple(B, bound, mask, n_layers, fp16_kernel);
    if (auto it = graphs.find(key); it != graphs.end()) return it->second;
    // Once eagerly without the token-changing parts (kernel attributes are set
    // outside the capture), then captured.
    enqueue_step(B, bound, mask & ~kAdvance, n_layers, fp16_kernel);
    sync();
    cudaGraph_t g = nullptr;
    RATEKV_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      enqueue_step(B, bound, mask, n_layers, fp16_kernel);
    } catch (...) {
      cudaStreamEndCapture(stream, &g);
      if (g) cudaGraphDestroy(g);
      throw;
    }
    RATEKV_CUDA_OK(cudaStreamEndCapture(stream, &g));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    RATEKV_CUDA_OK(e);
    graphs[key] = exec;
    return exec;
  }

  void run_step(int B, int64_t bound, int mask, int n_layers, int fp16_kernel) {
    if (opt.cuda_graphs)
      RATEKV_CUDA_OK(cudaGraphLaunch(graph(B, bound, mask, n_layers, fp16_kernel), stream));
    else
      enqueue_step(B, bound, mask, n_layers, fp16_kernel);
  }

  // Uploads the page tables and lengths of a decode batch; returns B.
  int prepare_batch(std::span<const int> ids, int64_t extra) {
    const int B = static_cast<int>(ids.size());
    check(B >= 1 && B <= opt.max_batch, "GPU engine: decode batch of {} sequences; the engine was built for 1..{}", B,
          opt.max_batch);
    std::vector<int32_t> lens(B);
    for (int b = 0; b < B; ++b) {
      for (int c = 0; c < b; ++c) check(ids[c] != ids[b], "GPU engine: sequence {} appears twice in a batch", ids[b]);
      const int64_t len = pool->length(ids[b]);
      check(len >= 1, "GPU engine: sequence {} is empty (prefill or fill it before decoding)", ids[b]);
      pool->check_room(ids[b], extra);
      lens[b] = static_cast<int32_t>(len);
    }
    if (uploaded_batch != std::vector<int>(ids.begin(), ids.end())) {
      std::vector<int32_t> pt(static_cast<size_t>(B) * max_pages);
      pool->page_table(ids, pt);
      RATEKV_CUDA_OK(cudaMemcpyAsync(d_pt.p, pt.data(), pt.size() * 4, cudaMemcpyHostToDevice, stream));
      uploaded_batch.assign(ids.begin(), ids.end());
    }
    RATEKV_CUDA_OK(cudaMemcpyAsync(d_pos.p, lens.data(), B * 4, cudaMemcpyHostToDevice, stream));
    RATEKV_CUDA_OK(cudaMemsetAsync(d_count.p, 0, 4, stream));
    sync();  // lens (host) outlives the copy
    return B;
  }

  int64_t bound_for(std::span<const int> ids, int64_t extra) const {
    int64_t mx = 1;
    for (int id : ids) mx = std::max(mx, pool->length(id) + extra);
    // Coarse steps (a new bound is a new graph): 256 tokens, 4096 past 16K.
    const int64_t q = mx > 16384 ? 4096 : 256;
    const int64_t b = (mx + q - 1) / q * q;
    return std::min<int64_t>(b, static_cast<int64_t>(max_pages) * packed::kPageTokens);
  }

  void upload_tokens(std::span<const int32_t> t) {
    for (size_t i = 0; i < t.size(); ++i)
      check(t[i] >= 0 && t[i] < cfg.n_vocab, "GPU engine: token id {} at index {} outside [0, {})", t[i], i,
            cfg.n_vocab);
    RATEKV_CUDA_OK(cudaMemcpyAsync(tok.p, t.data(), t.size() * 4, cudaMemcpyHostToDevice, stream));
  }

  // Page-table row of one sequence (prefill, fill_synthetic); the pool's
  // page list outlives the copy.
  void upload_seq_pages(int id) {
    const std::vector<int32_t>& pg = pool->seq_pages(id);
    RATEKV_CUDA_OK(cudaMemcpyAsync(p_pt.p, pg.data(), pg.size() * 4, cudaMemcpyHostToDevice, stream));
  }

  // Causal attention of the prompt's n queries (q16) over k16/v16 → o32;
  // window > 0: each query sees the keys of its sliding window only, and a
  // chunk of rows reads the keys from its first row's first visible key on.
  void prefill_attention(int64_t n, int window) {
    const int H = cfg.n_heads, Hkv = cfg.n_kv_heads, g = cfg.gqa_ratio(), hd = cfg.head_dim;
    const int64_t qd = dims.qd, kvd = dims.kvd;
    const int64_t rq = std::clamp<int64_t>(static_cast<int64_t>(opt.prefill_score_bytes / (6 * size_t(H) * n)), 1, n);
    const float one = 1.f, zero = 0.f;
    for (int64_t r0 = 0; r0 < n; r0 += rq) {
      const int64_t k0 = first_visible_key(r0, window);  // 0 without a window
      const int64_t nr = std::min(rq, n - r0), nk = r0 + nr - k0;
      const int64_t stride = nr * nk;
      const uint16_t* kt = k16.as<uint16_t>() + (size_t)k0 * kvd;
      const uint16_t* vt = v16.as<uint16_t>() + (size_t)k0 * kvd;
      for (int hk = 0; hk < Hkv; ++hk) {
        // Sᵀ (nk × nr, column-major) = K_hk · Q_hᵀ for the g query heads of hk.
        RATEKV_CUBLAS_OK(cublasGemmStridedBatchedEx(
            blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nk, (int)nr, hd, &one, kt + (size_t)hk * hd,
            CUDA_R_16F, (int)kvd, 0, q16.as<uint16_t>() + (size_t)r0 * qd + (size_t)hk * g * hd, CUDA_R_16F, (int)qd,
            hd, &zero, scores.as<float>() + (size_t)hk * g * stride, CUDA_R_32F, (int)nk, stride, g,
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      }
      cuda::causal_softmax(scores.as<float>(), H, stride, (int)nr, (int)nk, (int)(r0 - k0), cfg.attention_scale(),
                           probs.as<uint16_t>(), stream, window);
      for (int hk = 0; hk < Hkv; ++hk) {
        // O_hᵀ (hd × nr) = V_hkᵀ · P_hᵀ.
        RATEKV_CUBLAS_OK(cublasGemmStridedBatchedEx(
            blas, CUBLAS_OP_N, CUBLAS_OP_N, hd, (int)nr, (int)nk, &one, vt + (size_t)hk * hd,
            CUDA_R_16F, (int)kvd, 0, probs.as<uint16_t>() + (size_t)hk * g * stride, CUDA_R_16F, (int)nk, stride,
            &zero, o32.as<float>() + (size_t)r0 * qd + (size_t)hk * g * hd, CUDA_R_32F, (int)qd, hd, g,
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      }
    }
  }

  // Attention of a chunk's n queries (q16, absolute positions p0 .. p0+n−1)
  // over keys 0 .. p0+n−1 of the sequence in p_pt → o32, in key tiles of
  // key_tile tokens with the online softmax (prefill_tile_softmax). Keys come
  // from the layer's pages (dequantized, or read from fp16 pages; the chunk's
  // own pages are written already) except, when `own_kv`, the chunk's own
  // keys, which come from k16/v16 (serving mode's full-precision K/V).
  // Sliding layers start at the page holding the first row's first visible
  // key (model/sliding_window.h); the softmax masks the rest.
  void chunk_attention(int l, int64_t p0, int64_t n, bool own_kv) {
    const int window = layer_window(l);
    const int H = cfg.n_heads, Hkv = cfg.n_kv_heads, g = cfg.gqa_ratio(), hd = cfg.head_dim;
    const int64_t qd = dims.qd, kvd = dims.kvd, KT = key_tile;
    const int64_t cap = static_cast<int64_t>(scores.bytes / 4);  // fp32 entries
    const int64_t rq = std::min<int64_t>(n, cap / (int64_t{H} * KT));
    check(rq >= 1, "GPU engine: prefill_score_bytes {} holds no row of a {}-key tile for {} heads",
          opt.prefill_score_bytes, KT, H);
    const float one = 1.f, zero = 0.f;
    const int32_t* pt = p_pt.as<int32_t>();
    for (int64_t r0 = 0; r0 < n; r0 += rq) {
      const int64_t nr = std::min(rq, n - r0), kend = p0 + r0 + nr;
      const int64_t kbegin = window_first_key_aligned(p0 + r0, window, packed::kPageTokens);  // 0 without a window
      for (int64_t t0 = kbegin; t0 < kend; t0 += KT) {
        const int64_t nk = std::min(KT, kend - t0), stride = nr * nk;
        // The tile's keys: pages below `pages_end`, own K/V from there.
        const int64_t pages_end = own_kv ? std::clamp(p0, t0, t0 + nk) : t0 + nk;
        if (pages_end > t0) {
          const int32_t* tpt = pt + t0 / packed::kPageTokens;
          if (fmt.is_fp16())
            cuda::fp16_read_tokens(fp16_pages(l), Hkv, hd, tpt, (int)(pages_end - t0),
                                   tile_k.as<uint16_t>(), tile_v.as<uint16_t>(), stream);
          else
            dequantize(l, tpt, (int)(pages_end - t0), (int)t0, tile_k.as<uint16_t>(), tile_v.as<uint16_t>());
        }
        if (pages_end < t0 + nk) {
          const size_t off = static_cast<size_t>(pages_end - t0) * kvd, src = static_cast<size_t>(pages_end - p0) * kvd;
          const size_t bytes = static_cast<size_t>(t0 + nk - pages_end) * kvd * 2;
          RATEKV_CUDA_OK(cudaMemcpyAsync(tile_k.as<uint16_t>() + off, k16.as<uint16_t>() + src, bytes,
                                         cudaMemcpyDeviceToDevice, stream));
          RATEKV_CUDA_OK(cudaMemcpyAsync(tile_v.as<uint16_t>() + off, v16.as<uint16_t>() + src, bytes,
                                         cudaMemcpyDeviceToDevice, stream));
        }
        for (int hk = 0; hk < Hkv; ++hk) {
          // Sᵀ (nk × nr, column-major) = K_hk · Q_hᵀ for the g query heads of hk.
          RATEKV_CUBLAS_OK(cublasGemmStridedBatchedEx(
              blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)nk, (int)nr, hd, &one, tile_k.as<uint16_t>() + (size_t)hk * hd,
              CUDA_R_16F, (int)kvd, 0, q16.as<uint16_t>() + (size_t)r0 * qd + (size_t)hk * g * hd, CUDA_R_16F,
              (int)qd, hd, &zero, scores.as<float>() + (size_t)hk * g * stride, CUDA_R_32F, (int)nk, stride, g,
              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        }
        float* o = o32.as<float>() + (size_t)r0 * qd;
        cuda::prefill_tile_softmax(scores.as<float>(), H, stride, (int)nr, (int)nk, (int)(p0 + r0), (int)t0,
                                   cfg.attention_scale(), m_stat.as<float>(), l_stat.as<float>(), o, qd, hd,
                                   t0 == kbegin, probs.as<uint16_t>(), stream, window);
        for (int hk = 0; hk < Hkv; ++hk) {
          // O_hᵀ (hd × nr) += V_hkᵀ · P_hᵀ (unnormalized; rescaled by the softmax kernel).
          RATEKV_CUBLAS_OK(cublasGemmStridedBatchedEx(
              blas, CUBLAS_OP_N, CUBLAS_OP_N, hd, (int)nr, (int)nk, &one, tile_v.as<uint16_t>() + (size_t)hk * hd,
              CUDA_R_16F, (int)kvd, 0, probs.as<uint16_t>() + (size_t)hk * g * stride, CUDA_R_16F, (int)nk, stride,
              &one, o + (size_t)hk * g * hd, CUDA_R_32F, (int)qd, hd, g, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        }
      }
      cuda::normalize_rows(o32.as<float>() + (size_t)r0 * qd, qd, (int)nr, H, hd, l_stat.as<float>(), stream);
    }
  }

  double time_graph(cudaGraphExec_t g, int reps, bool flush) {
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
      if (flush) RATEKV_CUDA_OK(cudaMemsetAsync(scores.p, r & 0xff, std::min<size_t>(scores.bytes, 512u << 20), stream));
      RATEKV_CUDA_OK(cudaEventRecord(ev0, stream));
      RATEKV_CUDA_OK(cudaGraphLaunch(g, stream));
      RATEKV_CUDA_OK(cudaEventRecord(ev1, stream));
      RATEKV_CUDA_OK(cudaEventSynchronize(ev1));
      float ms = 0;
      RATEKV_CUDA_OK(cudaEventElapsedTime(&ms, ev0, ev1));
      t.push_back(ms);
    }
    return median(t);
  }
};

// ---------------------------------------------------------------------------

namespace {

// What the GPU forward pass honours: every ModelConfig field of the CPU
// runtime (model.h), so the architectures the CPU runs ("llama", "gemma3",
// "qwen2"); the kernels' limits are checked where they apply (head_dim,
// GQA, sliding windows with the cache format: check_window_support).
void check_supported(const ModelConfig& c) {
  c.validate("GPU engine");
  check(c.arch == "llama" || c.arch == "qwen2" || c.arch == "gemma3",
        "GPU engine: architecture '{}' is not served on the GPU (llama, qwen2 and gemma3 are)", c.arch);
  check(c.head_dim % 2 == 0 && c.head_dim <= 256, "GPU engine: head_dim {} (even, at most 256)", c.head_dim);
}

// Sliding-window layers run on the decode kernels that implement
// cuda::DecodeBatch::window: fp16 (both kernels) and packed GQA ≤ 8 with
// 1..4-bit groups (not vq_decode_attention: TaSQ / CQ keys on a sliding
// layer are refused; nor the generic kernel of 5..8-bit groups). Anything
// else is refused here, before any device work (cuda::packed_decode_attention
// and vq_decode_attention would throw only at the first decode step).
void check_window_support(const ModelConfig& c, const CacheFormat& fmt) {
  bool sliding = false;
  for (int l = 0; l < c.n_layers; ++l) sliding = sliding || c.is_sliding(l);
  if (!sliding) return;
  check(c.sliding_window <= (int64_t{1} << 30), "GPU engine: sliding_window {} exceeds 2^30 tokens", c.sliding_window);
  if (fmt.is_fp16()) return;
  for (int l = 0; l < c.n_layers; ++l)
    check(!c.is_sliding(l) || fmt.vq(l) == nullptr,
          "GPU engine: layer {} slides (sliding_window {}) and its plan keys are vq (TaSQ / CQ): the vq decode kernel "
          "has no window",
          l, c.sliding_window);
  check(c.gqa_ratio() <= 8,
        "GPU engine: sliding_window {} with a packed cache needs GQA <= 8 (the packed decode kernel for GQA {} has "
        "no window); use the fp16 cache",
        c.sliding_window, c.gqa_ratio());
  for (int l = 0; l < c.n_layers; ++l)
    check(!c.is_sliding(l) || fmt.ext_layout(l) == nullptr,
          "GPU engine: layer {} slides (sliding_window {}) and its plan has 5..8-bit groups: their decode kernel "
          "(extension pages) has no window (give sliding layers at most 4 bits)",
          l, c.sliding_window);
}

}  // namespace

std::string cuda_device_name() {
  int dev = 0;
  cudaDeviceProp prop;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return "";
  return prop.name;
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

namespace {

// EngineOptions::fp16_kernel (or time_attention's fp16_kernel, `what`):
// 0 automatic, 1 rows16, 2 n8, 3 n8_fused; the n8 kernels need GQA ≤ 8 when
// the cache is fp16.
void check_fp16_kernel(const ModelConfig& cfg, const CacheFormat& fmt, int k, const char* what) {
  check(k >= 0 && k <= 3, "GPU engine: {} {} (0 automatic, 1 rows16, 2 n8, 3 n8_fused)", what, k);
  check(k < 2 || !fmt.is_fp16() || cfg.gqa_ratio() <= 8,
        "GPU engine: {} {} ({}) needs GQA <= 8; this model has GQA {} (use 0 or 1)", what, k,
        k == 2 ? "n8" : "n8_fused", cfg.gqa_ratio());
}

std::unique_ptr<Engine::Impl> make_impl(const ModelConfig& cfg, bool untied, CacheFormat fmt, const EngineOptions& opt) {
  check_supported(cfg);
  check_window_support(cfg, fmt);
  check_fp16_kernel(cfg, fmt, opt.fp16_kernel, "EngineOptions::fp16_kernel");
  int n_dev = 0;
  check(cudaGetDeviceCount(&n_dev) == cudaSuccess && n_dev > 0, "GPU engine: no CUDA device visible");
  auto I = std::make_unique<Engine::Impl>(cfg, std::move(fmt), opt);
  I->untied = untied;
  I->ctx_limit = detail::context_limit(cfg, opt);
  check(I->ctx_limit <= (int64_t{1} << 31) - 64, "GPU engine: context limit {} exceeds 2^31 positions", I->ctx_limit);
  check(opt.max_prefill_tokens <= I->ctx_limit, "GPU engine: max_prefill_tokens {} exceeds the context limit {}",
        opt.max_prefill_tokens, I->ctx_limit);
  size_t free_b = 0, total_b = 0;
  RATEKV_CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
  I->mem = plan_memory(cfg, untied, I->fmt, opt, free_b);
  RATEKV_CUDA_OK(cudaStreamCreateWithFlags(&I->stream, cudaStreamNonBlocking));
  RATEKV_CUBLAS_OK(cublasCreate(&I->blas));
  RATEKV_CUBLAS_OK(cublasSetStream(I->blas, I->stream));
  I->blas_ws = I->alloc(detail::kCublasWorkspace);
  RATEKV_CUBLAS_OK(cublasSetWorkspace(I->blas, I->blas_ws.p, I->blas_ws.bytes));
  RATEKV_CUDA_OK(cudaEventCreate(&I->ev0));
  RATEKV_CUDA_OK(cudaEventCreate(&I->ev1));
  const detail::Dims& m = I->dims;
  // Weights (filled by the caller).
  I->embd = I->alloc(2 * size_t(m.V * m.d));
  if (untied) I->lm_head_mem = I->alloc(2 * size_t(m.V * m.d));
  I->lm_head = untied ? I->lm_head_mem.as<uint16_t>() : I->embd.as<uint16_t>();
  I->out_norm = I->alloc(4 * size_t(m.d));
  I->layers.resize(cfg.n_layers);
  for (auto& L : I->layers) {
    L.wqkv = I->alloc(2 * size_t(m.qkvd * m.d));
    L.wo = I->alloc(2 * size_t(m.d * m.qd));
    L.wgu = I->alloc(2 * size_t(2 * m.dff * m.d));
    L.wdown = I->alloc(2 * size_t(m.d * m.dff));
    L.attn_norm = I->alloc(4 * size_t(m.d));
    L.ffn_norm = I->alloc(4 * size_t(m.d));
    if (cfg.qkv_bias) L.bias = I->alloc(4 * size_t(m.qkvd));
    if (cfg.qk_norm) L.q_norm = I->alloc(4 * size_t(m.hd)), L.k_norm = I->alloc(4 * size_t(m.hd));
    if (cfg.post_norms) L.post_attn = I->alloc(4 * size_t(m.d)), L.post_ffn = I->alloc(4 * size_t(m.d));
  }
  std::vector<double> inv(cfg.head_dim / 2);
  for (int i = 0; i < cfg.head_dim / 2; ++i) inv[i] = rope_frequency(i, cfg.head_dim, cfg.rope_theta);
  I->inv_freq = I->alloc(8 * inv.size());
  RATEKV_CUDA_OK(cudaMemcpy(I->inv_freq.p, inv.data(), 8 * inv.size(), cudaMemcpyHostToDevice));
  bool any_sliding = false;
  for (int l = 0; l < cfg.n_layers; ++l) any_sliding = any_sliding || cfg.is_sliding(l);
  if (any_sliding) {  // sliding layers' RoPE base (Gemma 3's local θ)
    for (int i = 0; i < cfg.head_dim / 2; ++i) inv[i] = rope_frequency(i, cfg.head_dim, cfg.rope_theta_swa);
    I->inv_freq_swa = I->alloc(8 * inv.size());
    RATEKV_CUDA_OK(cudaMemcpy(I->inv_freq_swa.p, inv.data(), 8 * inv.size(), cudaMemcpyHostToDevice));
  }
  // Activations.
  I->rows = detail::activation_rows(opt);
  I->lrows = detail::logit_rows(opt);
  const size_t R = static_cast<size_t>(I->rows);
  I->x = I->alloc(4 * R * m.d);
  I->xn = I->alloc(2 * R * m.d);
  I->qkv = I->alloc(4 * R * m.qkvd);
  I->q16 = I->alloc(2 * R * m.qd);
  I->k32 = I->alloc(4 * R * m.kvd);
  if (I->fmt.has_vq()) I->k_pre32 = I->alloc(4 * R * m.kvd);
  I->v32 = I->alloc(4 * R * m.kvd);
  I->k16 = I->alloc(2 * R * m.kvd);
  I->v16 = I->alloc(2 * R * m.kvd);
  I->q32 = I->alloc(4 * R * m.qd);
  I->o32 = I->alloc(4 * R * m.qd);
  I->att16 = I->alloc(2 * R * m.qd);
  I->tmp = I->alloc(4 * R * m.d);
  I->gu = I->alloc(8 * R * m.dff);
  I->h16 = I->alloc(2 * R * m.dff);
  I->tok = I->alloc(4 * R);
  I->pos = I->alloc(4 * R);
  I->logits = I->alloc(4 * size_t(I->lrows) * m.V);
  const int B = opt.max_batch;
  I->max_pages = static_cast<int>(PagePool::pages_for(I->ctx_limit));
  I->d_pos = I->alloc(4 * size_t(B));
  I->d_lens = I->alloc(4 * size_t(B));
  I->d_hist = I->alloc(4 * size_t(B) * detail::kHistorySteps);
  I->d_count = I->alloc(4);
  I->d_temp = I->alloc(4 * size_t(B));
  I->d_topk = I->alloc(4 * size_t(B));
  I->d_topp = I->alloc(4 * size_t(B));
  I->d_uni = I->alloc(8 * size_t(B));
  I->d_zero = I->alloc(4);
  I->d_start = I->alloc(4);
  RATEKV_CUDA_OK(cudaMemset(I->d_zero.p, 0, 4));
  I->d_pt = I->alloc(4 * size_t(B) * I->max_pages);
  I->p_pt = I->alloc(4 * size_t(I->max_pages));
  RATEKV_CUDA_OK(cudaMemset(I->d_pt.p, 0, I->d_pt.bytes));
  I->probe_sink = I->alloc(4 * cuda::kReadProbeBlocks);
  I->scores = I->alloc(detail::score_bytes(opt));
  I->probs = I->alloc(detail::prob_bytes(opt));
  I->key_tile = detail::key_tile_tokens(cfg, opt);
  I->tile_k = I->alloc(2 * size_t(I->key_tile) * m.kvd);
  I->tile_v = I->alloc(2 * size_t(I->key_tile) * m.kvd);
  I->m_stat = I->alloc(4 * R * m.H);
  I->l_stat = I->alloc(4 * R * m.H);
  // Packed plans (device tables, the fp32 prefill matrices: the engine's K/V
  // are fp32), the packed prefill's rotated rows, the decode workspace.
  // TaSQ / CQ layers (CacheFormat::vq): their vq pages' decode and encode
  // tables; a vq layer's scalar pages hold its tq-mse values, if any
  // (VqPlan reads them), else it has no PackedPlan.
  if (!I->fmt.is_fp16()) {
    I->plans.resize(cfg.n_layers);
    I->vq_plans.resize(cfg.n_layers);
    I->vq_enc.resize(cfg.n_layers);
    for (int l = 0; l < cfg.n_layers; ++l) {
      const CacheFormat::VqLayer* vq = I->fmt.vq(l);
      if (const packed::LayerLayout* ext = I->fmt.ext_layout(l)) {  // 5..8-bit groups: extension pages
        I->plans[l] = std::make_unique<cuda::PackedPlan>(I->fmt.layout(l), *ext, cfg.n_heads, I->fmt.rotations(l),
                                                         I->fmt.levels(l));
        I->allocated += I->plans[l]->device_bytes();
      } else if (detail::has_packed_plan(I->fmt, l)) {
        I->plans[l] = std::make_unique<cuda::PackedPlan>(I->fmt.layout(l), cfg.n_heads, I->fmt.rotations(l),
                                                         I->fmt.levels(l), cuda::PrefillMatrices::f32);
        I->allocated += I->plans[l]->device_bytes();
      }
      if (!vq) continue;
      I->vq_plans[l] = std::make_unique<cuda::VqPlan>(
          vq->layout, cfg.n_heads, vq->codewords, vq->channels,
          cuda::VqRope{cfg.rope_layout == RopeLayout::NeoX, cfg.layer_rope_theta(l)}, I->plans[l].get());
      I->vq_enc[l] = std::make_unique<cuda::VqEncodePlan>(vq->layout, vq->codebooks, vq->channel_scale,
                                                           vq->channels);
      I->allocated += I->vq_plans[l]->device_bytes() + I->vq_enc[l]->device_bytes();
    }
  }
  I->prefill_rot = I->alloc(detail::prefill_rotation_bytes(cfg, I->fmt, opt));
  I->attn_ws = I->alloc(detail::decode_workspace_bytes(cfg, I->fmt, opt));
  // The page pool: the same number of pages in every layer, its memory ours.
  PagePoolOptions po;
  po.pages = I->mem.pages;
  po.max_seq_pages = I->max_pages;
  po.pages_descending = opt.pages_descending;
  po.owner = "GPU engine";
  I->pool.emplace(PagePool::for_format(I->fmt, po));
  I->pool_mem.reserve(cfg.n_layers);
  for (int l = 0; l < cfg.n_layers; ++l) {
    I->pool_mem.push_back(I->alloc(I->pool->layer_bytes(l)));
    I->pool->bind_layer(l, I->pool_mem.back().p, I->pool_mem.back().bytes);
  }
  // Every allocation is in the plan (a buffer added here without its plan
  // entry is a bug the plan's refusals would miss).
  check(I->allocated == I->mem.allocated(),
        "GPU engine: internal error: the memory plan counts {} bytes (weights {}, activations {}, workspace {}, pool "
        "{}) but construction allocated {}",
        I->mem.allocated(), I->mem.weights, I->mem.activations, I->mem.workspace, I->mem.pool, I->allocated);
  return I;
}

void upload_bf16(DevMem& dst, const std::vector<float>& src, const std::string& what, size_t expect) {
  check(src.size() == expect, "GPU engine: weight {} has {} values, expected {}", what, src.size(), expect);
  std::vector<uint16_t> h(src.size());
  for (size_t i = 0; i < src.size(); ++i) h[i] = to_bf16(src[i]);
  RATEKV_CUDA_OK(cudaMemcpy(dst.p, h.data(), 2 * h.size(), cudaMemcpyHostToDevice));
}
void upload_f32(DevMem& dst, const std::vector<float>& src, const std::string& what, size_t expect) {
  check(src.size() == expect, "GPU engine: weight {} has {} values, expected {}", what, src.size(), expect);
  RATEKV_CUDA_OK(cudaMemcpy(dst.p, src.data(), 4 * src.size(), cudaMemcpyHostToDevice));
}

}  // namespace

std::unique_ptr<Engine> Engine::create(const ModelConfig& cfg, const ModelWeights& w,
                                       CacheFormat fmt, const EngineOptions& opt) {
  check_supported(cfg);
  check(w.layers.size() == size_t(cfg.n_layers), "GPU engine: {} weight layers for {} config layers", w.layers.size(),
        cfg.n_layers);
  auto I = make_impl(cfg, !w.output.empty(), std::move(fmt), opt);
  const detail::Dims& m = I->dims;
  upload_bf16(I->embd, w.token_embd, "token_embd", m.V * m.d);
  if (!w.output.empty()) upload_bf16(I->lm_head_mem, w.output, "output", m.V * m.d);
  upload_f32(I->out_norm, w.output_norm, "output_norm", m.d);
  for (int l = 0; l < cfg.n_layers; ++l) {
    const LayerWeights& L = w.layers[l];
    auto& D = I->layers[l];
    const std::string p = fmt::format("layers[{}].", l);
    upload_bf16(D.wqkv, L.wqkv, p + "wqkv", m.qkvd * m.d);
    upload_bf16(D.wo, L.wo, p + "wo", m.d * m.qd);
    upload_bf16(D.wgu, L.w_gate_up, p + "w_gate_up", 2 * m.dff * m.d);
    upload_bf16(D.wdown, L.w_down, p + "w_down", m.d * m.dff);
    upload_f32(D.attn_norm, L.attn_norm, p + "attn_norm", m.d);
    upload_f32(D.ffn_norm, L.ffn_norm, p + "ffn_norm", m.d);
    if (cfg.qkv_bias) upload_f32(D.bias, L.bqkv, p + "bqkv", m.qkvd);
    if (cfg.qk_norm) {
      upload_f32(D.q_norm, L.attn_q_norm, p + "attn_q_norm", m.hd);
      upload_f32(D.k_norm, L.attn_k_norm, p + "attn_k_norm", m.hd);
    }
    if (cfg.post_norms) {
      upload_f32(D.post_attn, L.attn_post_norm, p + "attn_post_norm", m.d);
      upload_f32(D.post_ffn, L.ffn_post_norm, p + "ffn_post_norm", m.d);
    }
  }
  return std::unique_ptr<Engine>(new Engine(std::move(I)));
}

std::unique_ptr<Engine> Engine::create_synthetic(const ModelConfig& cfg, bool untied_output, uint64_t seed,
                                                 CacheFormat fmt, const EngineOptions& opt) {
  auto I = make_impl(cfg, untied_output, std::move(fmt), opt);
  const detail::Dims& m = I->dims;
  cudaStream_t s = I->stream;
  using T = SyntheticLayerTensor;
  const int lin = static_cast<int>(SyntheticKind::linear), nrm = static_cast<int>(SyntheticKind::norm);
  cuda::synthetic_fill_bf16(I->embd.as<uint16_t>(), m.V * m.d, seed, (uint32_t)SyntheticTensor::token_embd, lin, 0, 0, s);
  if (untied_output)
    cuda::synthetic_fill_bf16(I->lm_head_mem.as<uint16_t>(), m.V * m.d, seed, (uint32_t)SyntheticTensor::output, lin,
                              synthetic_amp_exp(m.d), 0, s);
  cuda::synthetic_fill_f32(I->out_norm.as<float>(), m.d, seed, (uint32_t)SyntheticTensor::output_norm, nrm, 0, 0, s);
  for (int l = 0; l < cfg.n_layers; ++l) {
    auto& D = I->layers[l];
    cuda::synthetic_fill_f32(D.attn_norm.as<float>(), m.d, seed, synthetic_tensor_id(l, T::attn_norm), nrm, 0, 0, s);
    cuda::synthetic_fill_f32(D.ffn_norm.as<float>(), m.d, seed, synthetic_tensor_id(l, T::ffn_norm), nrm, 0, 0, s);
    cuda::synthetic_fill_bf16(D.wqkv.as<uint16_t>(), m.qkvd * m.d, seed, synthetic_tensor_id(l, T::wqkv), lin,
                              synthetic_amp_exp(m.d), 0, s);
    cuda::synthetic_fill_bf16(D.wo.as<uint16_t>(), m.d * m.qd, seed, synthetic_tensor_id(l, T::wo), lin,
                              synthetic_amp_exp(m.qd), 0, s);
    cuda::synthetic_fill_bf16(D.wgu.as<uint16_t>(), 2 * m.dff * m.d, seed, synthetic_tensor_id(l, T::w_gate_up), lin,
                              synthetic_amp_exp(m.d), 0, s);
    cuda::synthetic_fill_bf16(D.wdown.as<uint16_t>(), m.d * m.dff, seed, synthetic_tensor_id(l, T::w_down), lin,
                              synthetic_amp_exp(m.dff), 0, s);
    if (cfg.qkv_bias)
      cuda::synthetic_fill_f32(D.bias.as<float>(), m.qkvd, seed, synthetic_tensor_id(l, T::qkv_bias), lin, -2, 0, s);
    if (cfg.qk_norm) {
      cuda::synthetic_fill_f32(D.q_norm.as<float>(), m.hd, seed, synthetic_tensor_id(l, T::attn_q_norm), nrm, 0, 0, s);
      cuda::synthetic_fill_f32(D.k_norm.as<float>(), m.hd, seed, synthetic_tensor_id(l, T::attn_k_norm), nrm, 0, 0, s);
    }
    if (cfg.post_norms) {
      cuda::synthetic_fill_f32(D.post_attn.as<float>(), m.d, seed, synthetic_tensor_id(l, T::attn_post_norm), nrm, 0,
                               0, s);
      cuda::synthetic_fill_f32(D.post_ffn.as<float>(), m.d, seed, synthetic_tensor_id(l, T::ffn_post_norm), nrm, 0, 0,
                               s);
    }
  }
  I->sync();
  return std::unique_ptr<Engine>(new Engine(std::move(I)));
}

const ModelConfig& Engine::config() const { return impl_->cfg; }
const CacheFormat& Engine::format() const { return impl_->fmt; }
const MemoryPlan& Engine::memory() const { return impl_->mem; }
const EngineOptions& Engine::options() const { return impl_->opt; }
int64_t Engine::context_limit() const { return impl_->ctx_limit; }
int64_t Engine::free_tokens() const { return impl_->pool->free_tokens(); }

int Engine::add_sequence(int64_t max_tokens) {
  Impl& I = *impl_;
  check(max_tokens >= 1, "GPU engine: a sequence needs room for at least 1 token (got {})", max_tokens);
  check(max_tokens <= I.ctx_limit,
        "GPU engine: a request of {} tokens exceeds the context limit {} (the model's trained context is {}; raise "
        "the limit explicitly to extrapolate RoPE)",
        max_tokens, I.ctx_limit, I.cfg.n_ctx_train);
  return I.pool->add_sequence(max_tokens);  // Error, nothing reserved, when the pages are not free
}

void Engine::remove_sequence(int id) {
  Impl& I = *impl_;
  I.pool->remove_sequence(id);
  I.uploaded_batch.clear();
}

int64_t Engine::seq_length(int id) const { return impl_->pool->length(id); }

void Engine::prefill(int id, std::span<const int32_t> tokens, PrefillMode mode, std::span<float> logits) {
  Impl& I = *impl_;
  const int64_t len = I.pool->length(id), cap = I.pool->capacity(id);
  const int64_t n = static_cast<int64_t>(tokens.size());
  const detail::Dims& m = I.dims;
  check(len == 0, "GPU engine: prefill needs a fresh sequence (sequence {} holds {} tokens; chunked prefill is engine "
        "issue 2 of 3)", id, len);
  check(n >= 1, "GPU engine: prefill of an empty prompt");
  check(n <= cap, "GPU engine: a prompt of {} tokens exceeds sequence {}'s reservation of {}", n, id, cap);
  check(n <= I.opt.max_prefill_tokens, "GPU engine: a prompt of {} tokens exceeds max_prefill_tokens {}", n,
        I.opt.max_prefill_tokens);
  check(logits.empty() || logits.size() == size_t(m.V) || logits.size() == size_t(n * m.V),
        "GPU engine: logits span of {} floats; expected 0, n_vocab {} or n·n_vocab {}", logits.size(), m.V, n * m.V);
  I.upload_tokens(tokens);
  std::vector<int32_t> iota(n);
  for (int64_t i = 0; i < n; ++i) iota[i] = static_cast<int32_t>(i);
  RATEKV_CUDA_OK(cudaMemcpyAsync(I.pos.p, iota.data(), 4 * n, cudaMemcpyHostToDevice, I.stream));
  I.upload_seq_pages(id);
  cudaStream_t st = I.stream;
  const bool packed_cache = !I.fmt.is_fp16();
  const bool own_kv = mode == PrefillMode::serving || !packed_cache;  // attend to the fp16 K/V of the prompt
  I.embed(n);
  cuda::DecodeBatch db;
  db.page_table = I.p_pt.as<int32_t>();
  db.max_pages = I.max_pages;
  db.seq_lens = I.d_zero.as<int32_t>();
  db.batch = 1;
  db.max_seq_len = (int)n;
  for (int l = 0; l < I.cfg.n_layers; ++l) {
    const Impl::Layer& L = I.layers[l];
    I.gemm(I.xn.as<uint16_t>(), L.wqkv.as<uint16_t>(), I.qkv.as<float>(), n, m.d, m.qkvd);
    cuda::QkvRopeOut o;
    o.q16 = I.q16.as<uint16_t>();
    o.k32 = I.k32.as<float>();
    o.k_pre32 = I.k_pre32.as<float>();
    o.v32 = I.v32.as<float>();
    if (own_kv) {
      o.k16 = I.k16.as<uint16_t>();
      o.v16 = I.v16.as<uint16_t>();
    }
    I.qkv_rope(l, n, I.pos.as<int32_t>(), o);
    if (packed_cache) {
      I.write_packed(l, db, I.k_pre32.as<float>(), I.k32.as<float>(), I.v32.as<float>(), (int)n, false);
      if (mode == PrefillMode::evaluation)
        I.dequantize(l, I.p_pt.as<int32_t>(), (int)n, 0, I.k16.as<uint16_t>(), I.v16.as<uint16_t>());
    } else {
      cuda::fp16_write_tokens(I.fp16_pages(l), I.cfg.n_kv_heads, I.cfg.head_dim, I.p_pt.as<int32_t>(),
                              I.max_pages, I.d_zero.as<int32_t>(), I.k32.as<float>(), I.v32.as<float>(), (int)n, 1, st);
    }
    I.prefill_attention(n, I.layer_window(l));
    I.prefill_layer_tail(l, n);
  }
  I.prefill_logits(n, logits);
  I.sync();
  I.check_vq();
  I.pool->set_length(id, n);
}

void Engine::prefill_chunk(int id, std::span<const int32_t> tokens, PrefillMode mode, std::span<float> logits) {
  Impl& I = *impl_;
  const int64_t n = static_cast<int64_t>(tokens.size()), p0 = I.pool->length(id), cap = I.pool->capacity(id);
  const detail::Dims& m = I.dims;
  check(p0 % packed::kPageTokens == 0,
        "GPU engine: a prefill chunk continues a sequence at a page boundary (a multiple of {} tokens); sequence {} "
        "holds {}",
        packed::kPageTokens, id, p0);
  check(n >= 1, "GPU engine: prefill of an empty chunk");
  check(p0 + n <= cap, "GPU engine: sequence {} holds {} tokens and room for {}; a chunk of {} does not fit", id, p0,
        cap, n);
  check(n <= I.opt.max_prefill_tokens, "GPU engine: a chunk of {} tokens exceeds max_prefill_tokens {}", n,
        I.opt.max_prefill_tokens);
  check(logits.empty() || logits.size() == size_t(m.V) || logits.size() == size_t(n * m.V),
        "GPU engine: logits span of {} floats; expected 0, n_vocab {} or n·n_vocab {}", logits.size(), m.V, n * m.V);
  I.upload_tokens(tokens);
  std::vector<int32_t> posv(n);
  for (int64_t i = 0; i < n; ++i) posv[i] = static_cast<int32_t>(p0 + i);
  const int32_t start = static_cast<int32_t>(p0);
  cudaStream_t st = I.stream;
  RATEKV_CUDA_OK(cudaMemcpyAsync(I.pos.p, posv.data(), 4 * n, cudaMemcpyHostToDevice, st));
  RATEKV_CUDA_OK(cudaMemcpyAsync(I.d_start.p, &start, 4, cudaMemcpyHostToDevice, st));
  I.upload_seq_pages(id);
  const bool packed_cache = !I.fmt.is_fp16();
  const bool own_kv = mode == PrefillMode::serving && packed_cache;
  I.embed(n);
  cuda::DecodeBatch db;
  db.page_table = I.p_pt.as<int32_t>();
  db.max_pages = I.max_pages;
  db.seq_lens = I.d_start.as<int32_t>();
  db.batch = 1;
  db.max_seq_len = (int)(p0 + n);
  for (int l = 0; l < I.cfg.n_layers; ++l) {
    const Impl::Layer& L = I.layers[l];
    I.gemm(I.xn.as<uint16_t>(), L.wqkv.as<uint16_t>(), I.qkv.as<float>(), n, m.d, m.qkvd);
    cuda::QkvRopeOut o;
    o.q16 = I.q16.as<uint16_t>();
    o.k32 = I.k32.as<float>();
    o.k_pre32 = I.k_pre32.as<float>();
    o.v32 = I.v32.as<float>();
    if (own_kv) {
      o.k16 = I.k16.as<uint16_t>();
      o.v16 = I.v16.as<uint16_t>();
    }
    I.qkv_rope(l, n, I.pos.as<int32_t>(), o);
    if (packed_cache)
      I.write_packed(l, db, I.k_pre32.as<float>(), I.k32.as<float>(), I.v32.as<float>(), (int)n, false);
    else
      cuda::fp16_write_tokens(I.fp16_pages(l), I.cfg.n_kv_heads, I.cfg.head_dim, I.p_pt.as<int32_t>(),
                              I.max_pages, I.d_start.as<int32_t>(), I.k32.as<float>(), I.v32.as<float>(), (int)n, 1,
                              st);
    I.chunk_attention(l, p0, n, own_kv);
    I.prefill_layer_tail(l, n);
  }
  I.prefill_logits(n, logits);
  I.sync();
  I.check_vq();
  I.pool->set_length(id, p0 + n);
}

void Engine::prefill_chunked(int id, std::span<const int32_t> tokens, int64_t chunk, PrefillMode mode,
                             std::span<float> logits) {
  Impl& I = *impl_;
  const int64_t n = static_cast<int64_t>(tokens.size()), V = I.dims.V;
  check(chunk >= packed::kPageTokens && chunk % packed::kPageTokens == 0 && chunk <= I.opt.max_prefill_tokens,
        "GPU engine: prefill chunk of {} tokens; expected a multiple of {} (the page) in [{}, max_prefill_tokens {}]",
        chunk, packed::kPageTokens, packed::kPageTokens, I.opt.max_prefill_tokens);
  check(n >= 1, "GPU engine: prefill of an empty prompt");
  check(I.pool->length(id) == 0,
        "GPU engine: prefill_chunked needs a fresh sequence (sequence {} holds {} tokens)", id, I.pool->length(id));
  check(n <= I.pool->capacity(id), "GPU engine: a prompt of {} tokens exceeds sequence {}'s reservation of {}", n, id,
        I.pool->capacity(id));
  check(logits.empty() || logits.size() == size_t(V) || logits.size() == size_t(n * V),
        "GPU engine: logits span of {} floats; expected 0, n_vocab {} or n·n_vocab {}", logits.size(), V, n * V);
  const bool all = logits.size() == size_t(n * V) && n > 1;
  for (int64_t c0 = 0; c0 < n; c0 += chunk) {
    const int64_t c = std::min(chunk, n - c0);
    std::span<float> lg;
    if (all) lg = logits.subspan(size_t(c0 * V), size_t(c * V));
    else if (!logits.empty() && c0 + c == n) lg = logits;
    prefill_chunk(id, tokens.subspan(size_t(c0), size_t(c)), mode, lg);
  }
}

void Engine::fill_synthetic(int id, int64_t n_tokens, uint64_t seed) {
  Impl& I = *impl_;
  check(n_tokens >= 1, "GPU engine: fill_synthetic of {} tokens", n_tokens);
  I.pool->check_room(id, n_tokens);
  const int64_t len = I.pool->length(id);
  I.upload_seq_pages(id);
  const detail::Dims& m = I.dims;
  cuda::DecodeBatch db;
  db.page_table = I.p_pt.as<int32_t>();
  db.max_pages = I.max_pages;
  db.seq_lens = I.d_start.as<int32_t>();
  db.batch = 1;
  // K and V chunks (fp32) in the prefill score buffer, which is idle here.
  const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>(I.scores.bytes / (8 * size_t(m.kvd))));
  float* kf = I.scores.as<float>();
  float* vf = kf + chunk * m.kvd;
  for (int64_t c0 = 0; c0 < n_tokens; c0 += chunk) {
    const int64_t cnt = std::min(chunk, n_tokens - c0);
    const int32_t start = static_cast<int32_t>(len + c0);
    RATEKV_CUDA_OK(cudaMemcpyAsync(I.d_start.p, &start, 4, cudaMemcpyHostToDevice, I.stream));
    const int lin = static_cast<int>(SyntheticKind::linear);
    cuda::synthetic_fill_f32(kf, cnt * m.kvd, seed, 0x70000000u, lin, 0, uint64_t(start) * m.kvd, I.stream);
    cuda::synthetic_fill_f32(vf, cnt * m.kvd, seed, 0x70000001u, lin, 0, uint64_t(start) * m.kvd, I.stream);
    db.max_seq_len = (int)(start + cnt);
    for (int l = 0; l < I.cfg.n_layers; ++l) {
      if (I.fmt.is_fp16())
        cuda::fp16_write_tokens(I.fp16_pages(l), I.cfg.n_kv_heads, I.cfg.head_dim, I.p_pt.as<int32_t>(),
                                I.max_pages, I.d_start.as<int32_t>(), kf, vf, (int)cnt, 1, I.stream);
      else  // synthetic keys: the same values pre- and post-RoPE
        I.write_packed(l, db, kf, kf, vf, (int)cnt, false);
    }
    I.sync();  // `start` is read by the copy
  }
  I.check_vq();
  I.pool->set_length(id, len + n_tokens);
}

void Engine::decode(std::span<const int> ids, std::span<const int32_t> tokens, int n_steps,
                    std::span<int32_t> out_tokens, std::span<float> last_logits) {
  Impl& I = *impl_;
  check(n_steps >= 1, "GPU engine: decode of {} steps", n_steps);
  check(tokens.size() == ids.size(), "GPU engine: {} tokens for {} sequences", tokens.size(), ids.size());
  check(out_tokens.size() == size_t(n_steps) * ids.size(), "GPU engine: out_tokens holds {}, expected n_steps·B = {}",
        out_tokens.size(), size_t(n_steps) * ids.size());
  check(last_logits.empty() || last_logits.size() == ids.size() * size_t(I.cfg.n_vocab),
        "GPU engine: last_logits holds {}, expected B·n_vocab = {}", last_logits.size(),
        ids.size() * size_t(I.cfg.n_vocab));
  const int B = I.prepare_batch(ids, n_steps);
  I.upload_tokens(tokens);
  const int64_t bound = I.bound_for(ids, n_steps);
  for (int done = 0; done < n_steps;) {
    const int chunk = std::min(detail::kHistorySteps, n_steps - done);
    for (int k = 0; k < chunk; ++k) I.run_step(B, bound, kAll, I.cfg.n_layers, I.opt.fp16_kernel);
    RATEKV_CUDA_OK(cudaMemcpyAsync(out_tokens.data() + size_t(done) * B, I.d_hist.p, 4 * size_t(chunk) * B,
                                   cudaMemcpyDeviceToHost, I.stream));
    RATEKV_CUDA_OK(cudaMemsetAsync(I.d_count.p, 0, 4, I.stream));
    I.sync();
    done += chunk;
  }
  I.check_vq();
  if (!last_logits.empty())
    RATEKV_CUDA_OK(cudaMemcpy(last_logits.data(), I.logits.p, 4 * last_logits.size(), cudaMemcpyDeviceToHost));
  for (int id : ids) I.pool->set_length(id, I.pool->length(id) + n_steps);
}

void Engine::decode_sample(std::span<const int> ids, std::span<const int32_t> tokens,
                           std::span<const SamplingParams> sp, std::span<const double> u, std::span<int32_t> next,
                           std::span<float> last_logits) {
  Impl& I = *impl_;
  const size_t B0 = ids.size();
  check(tokens.size() == B0 && sp.size() == B0 && u.size() == B0 && next.size() == B0,
        "GPU engine: decode_sample of {} sequences with {} tokens, {} sampling settings, {} uniforms, {} outputs", B0,
        tokens.size(), sp.size(), u.size(), next.size());
  check(last_logits.empty() || last_logits.size() == B0 * size_t(I.cfg.n_vocab),
        "GPU engine: last_logits holds {}, expected B·n_vocab = {}", last_logits.size(), B0 * size_t(I.cfg.n_vocab));
  std::vector<float> temp(B0), topp(B0);
  std::vector<int32_t> topk(B0);
  for (size_t b = 0; b < B0; ++b) {
    sp[b].validate();
    check(u[b] >= 0.0 && u[b] < 1.0, "GPU engine: decode_sample: uniform {} of row {} outside [0, 1)", u[b], b);
    temp[b] = sp[b].temperature, topk[b] = sp[b].top_k, topp[b] = sp[b].top_p;
  }
  const int B = I.prepare_batch(ids, 1);
  I.upload_tokens(tokens);
  const int64_t bound = I.bound_for(ids, 1);
  cudaStream_t st = I.stream;
  RATEKV_CUDA_OK(cudaMemcpyAsync(I.d_temp.p, temp.data(), 4 * B0, cudaMemcpyHostToDevice, st));
  RATEKV_CUDA_OK(cudaMemcpyAsync(I.d_topk.p, topk.data(), 4 * B0, cudaMemcpyHostToDevice, st));
  RATEKV_CUDA_OK(cudaMemcpyAsync(I.d_topp.p, topp.data(), 4 * B0, cudaMemcpyHostToDevice, st));
  RATEKV_CUDA_OK(cudaMemcpyAsync(I.d_uni.p, u.data(), 8 * B0, cudaMemcpyHostToDevice, st));
  // The step without its argmax / advance, then the sampler, then the advance.
  I.run_step(B, bound, kAll & ~kAdvance, I.cfg.n_layers, I.opt.fp16_kernel);
  cuda::sample_rows(I.logits.as<float>(), B, (int)I.dims.V, I.d_temp.as<float>(), I.d_topk.as<int32_t>(),
                    I.d_topp.as<float>(), I.d_uni.as<double>(), I.tok.as<int32_t>(), st);
  cuda::step_advance(I.d_pos.as<int32_t>(), I.tok.as<int32_t>(), nullptr, I.d_count.as<int32_t>(), 0, B, st);
  RATEKV_CUDA_OK(cudaMemcpyAsync(next.data(), I.tok.p, 4 * B0, cudaMemcpyDeviceToHost, st));
  if (!last_logits.empty())
    RATEKV_CUDA_OK(cudaMemcpyAsync(last_logits.data(), I.logits.p, 4 * last_logits.size(), cudaMemcpyDeviceToHost, st));
  I.sync();
  I.check_vq();
  for (int id : ids) I.pool->set_length(id, I.pool->length(id) + 1);
}

double Engine::time_decode(std::span<const int> ids, std::span<const int32_t> tokens, int warmup, int n_steps) {
  Impl& I = *impl_;
  check(warmup >= 0 && n_steps >= 1 && n_steps <= detail::kHistorySteps,
        "GPU engine: time_decode warmup {} / steps {} (1..{})", warmup, n_steps, detail::kHistorySteps);
  check(tokens.size() == ids.size(), "GPU engine: {} tokens for {} sequences", tokens.size(), ids.size());
  const int B = I.prepare_batch(ids, warmup + n_steps);
  I.upload_tokens(tokens);
  const int64_t bound = I.bound_for(ids, warmup + n_steps);
  for (int k = 0; k < warmup; ++k) I.run_step(B, bound, kAll, I.cfg.n_layers, I.opt.fp16_kernel);
  if (I.opt.cuda_graphs) I.graph(B, bound, kAll, I.cfg.n_layers, I.opt.fp16_kernel);  // captured before timing
  RATEKV_CUDA_OK(cudaMemsetAsync(I.d_count.p, 0, 4, I.stream));
  RATEKV_CUDA_OK(cudaEventRecord(I.ev0, I.stream));
  for (int k = 0; k < n_steps; ++k) I.run_step(B, bound, kAll, I.cfg.n_layers, I.opt.fp16_kernel);
  RATEKV_CUDA_OK(cudaEventRecord(I.ev1, I.stream));
  RATEKV_CUDA_OK(cudaEventSynchronize(I.ev1));
  float ms = 0;
  RATEKV_CUDA_OK(cudaEventElapsedTime(&ms, I.ev0, I.ev1));
  for (int id : ids) I.pool->set_length(id, I.pool->length(id) + warmup + n_steps);
  return ms / n_steps;
}

DecodeProfile Engine::profile_decode(std::span<const int> ids, int reps) {
  Impl& I = *impl_;
  check(I.opt.cuda_graphs, "GPU engine: profile_decode needs cuda_graphs");
  const int B = I.prepare_batch(ids, 1);
  const int64_t bound = I.bound_for(ids, 1);
  const int L = I.cfg.n_layers, fk = I.opt.fp16_kernel;
  DecodeProfile p;
  // No argmax / position advance in these graphs: every replay is the same
  // step at the same lengths (the append rewrites the same slot).
  p.step = I.time_graph(I.graph(B, bound, kAll & ~kAdvance, L, fk), reps, false);
  p.gemm = I.time_graph(I.graph(B, bound, kGemm, L, fk), reps, false);
  cuda::step_lengths(I.d_pos.as<int32_t>(), I.d_lens.as<int32_t>(), B, I.stream);
  p.attention = I.time_graph(I.graph(B, bound, kAttn, L, fk), reps, false);
  p.append = I.time_graph(I.graph(B, bound, kAppend, L, fk), reps, false);
  p.other = std::max(0.0, p.step - p.gemm - p.attention - p.append);
  return p;
}

double Engine::time_attention(std::span<const int> ids, int reps, int fp16_kernel) {
  Impl& I = *impl_;
  check(I.opt.cuda_graphs, "GPU engine: time_attention needs cuda_graphs");
  if (fp16_kernel >= 0) check_fp16_kernel(I.cfg, I.fmt, fp16_kernel, "time_attention: fp16_kernel");
  const int B = I.prepare_batch(ids, 1);
  const int64_t bound = I.bound_for(ids, 1);
  // Attention over the tokens cached now (every slot written), layer 0 alone.
  RATEKV_CUDA_OK(cudaMemcpyAsync(I.d_lens.p, I.d_pos.p, 4 * size_t(B), cudaMemcpyDeviceToDevice, I.stream));
  return I.time_graph(I.graph(B, bound, kAttn, 1, fp16_kernel < 0 ? I.opt.fp16_kernel : fp16_kernel), reps, true);
}

StepBytes Engine::step_bytes(std::span<const int> ids) const {
  const Impl& I = *impl_;
  StepBytes b;
  const detail::Dims& m = I.dims;
  const double embd = 2.0 * m.V * m.d;
  b.weights = static_cast<double>(detail::weight_bytes(I.cfg, I.untied)) - (I.untied ? embd : 0.0) +
              2.0 * m.d * static_cast<double>(ids.size());
  for (int id : ids) {
    const int64_t len = I.pool->length(id) + 1;
    for (int l = 0; l < I.cfg.n_layers; ++l) {  // sliding layers read their window's pages only
      const int64_t pages = PagePool::pages_for(len) - first_visible_key(len - 1, I.cfg.layer_window(l)) /
                                                          packed::kPageTokens;
      b.cache += static_cast<double>(pages) * static_cast<double>(I.fmt.page_bytes(l));
    }
  }
  return b;
}

double Engine::read_ceiling_gbps(size_t bytes, int reps) {
  Impl& I = *impl_;
  const DevMem* buf = &I.pool_mem[0];
  for (const DevMem& p : I.pool_mem)
    if (p.bytes > buf->bytes) buf = &p;
  if (I.scores.bytes > buf->bytes) buf = &I.scores;
  bytes = std::min(bytes, buf->bytes) / 16 * 16;
  check(bytes > 0, "GPU engine: no buffer to probe");
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    RATEKV_CUDA_OK(cudaEventRecord(I.ev0, I.stream));
    cuda::read_probe(buf->p, bytes, I.probe_sink.as<uint32_t>(), I.stream);
    RATEKV_CUDA_OK(cudaEventRecord(I.ev1, I.stream));
    RATEKV_CUDA_OK(cudaEventSynchronize(I.ev1));
    float ms = 0;
    RATEKV_CUDA_OK(cudaEventElapsedTime(&ms, I.ev0, I.ev1));
    t.push_back(ms);
  }
  return static_cast<double>(bytes) / (median(t) * 1e-3) / 1e9;
}

size_t Engine::device_bytes_in_use() const {
  size_t f = 0, t = 0;
  RATEKV_CUDA_OK(cudaMemGetInfo(&f, &t));
  return t - f;
}

void* Engine::stream() const { return impl_->stream; }
uint8_t* Engine::layer_pool(int layer) const { return impl_->pool->layer_base(layer); }
size_t Engine::page_bytes(int layer) const { return impl_->fmt.page_bytes(layer); }
std::vector<int32_t> Engine::seq_pages(int id) const { return impl_->pool->seq_pages(id); }
const PagePool& Engine::page_pool() const { return *impl_->pool; }

}  // namespace ratekv::engine
