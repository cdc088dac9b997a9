// ratekv/engine/engine.h — whole models on one NVIDIA Hopper GPU with the
// packed (or fp16) KV cache (docs/design.md §10, issues 17 and 18): one page
// pool for all sequences, one-piece or chunked prefill in evaluation or
// serving mode, decode of a batch of sequences of unequal lengths (the step in
// a CUDA graph), greedy or sampled on the GPU. Continuous batching over it:
// ratekv/engine/scheduler.h with engine_executor.h.
//
// One configuration-driven forward pass (ModelConfig, the CPU runtime's
// fields and arithmetic order, model/forward.cpp): arch "llama" (interleaved
// RoPE), "qwen2" (Q/K/V biases, NeoX RoPE) and "gemma3" (embedding scale,
// QK-norm, per-layer RoPE base, pre/post norms, GeGLU, attention scale, final
// logit soft-cap, sliding-window layers); other architectures are refused
// with the reason. With Llama's neutral fields none of Gemma's kernels is
// launched.
//
// Sliding-window layers (ModelConfig::is_sliding, model/sliding_window.h): a
// query at p attends to keys p − W < t ≤ p. Decode: the attention kernels get
// the window (cuda::DecodeBatch::window) and read only the pages from the one
// holding a sequence's first visible key, masking the keys before it in that
// page; prefill (one piece) multiplies each block of queries with the keys
// from its first visible key on and masks per row; chunked prefill starts its
// key tiles at the page holding the chunk's first visible key. Pages that
// left every window are NOT freed: a sequence keeps its whole reservation
// (add_sequence) until remove_sequence, so memory per sequence is that of a
// global-attention model of the same length — only the bytes read shrink
// (step_bytes). A window is implemented by the fp16 decode kernels and the
// packed ones for GQA ≤ 8 (every Gemma 3 model); a packed cache at GQA > 8
// with sliding layers, or vq (TaSQ / CQ) keys on a sliding layer, is refused
// at create, naming sliding_window.
//
// Numbers. Weights are uploaded once as bf16 (not fp16: bf16 has fp32's
// range, so a model with outlier activations — Qwen2.5's reach the thousands
// in the FFN — cannot overflow a GEMM operand; its 8-bit mantissa costs
// ~2^-9 relative per rounding, which the GPU-vs-CPU tests bound). The
// residual stream, norms' inputs and every GEMM output are fp32; GEMM inputs
// (normalized activations, SwiGLU output, attention output) are bf16 with
// fp32 accumulation (cuBLAS). Attention operands are fp16 (Q, K, V, P; fp16
// is what the fp16 cache stores), scores and softmax fp32.
//
// Modes of prefill (docs/design.md §9.2): evaluation — the prompt's K/V are
// written to the cache first and attention reads their reconstructions, as
// the CPU packed cache does; serving — the prompt attends to its own
// full-precision (fp16) K/V, the cache holds codes from then on. Decode is
// the same in both: quantize-append, then attention from the codes.
//
// TaSQ / CQ plans (CacheFormat's vq layers, issue 18 item 4): the keys leave
// the Q/K/V kernel pre-RoPE as well (QkvRopeOut::k_pre32) and are encoded on
// the GPU into the layer's vq pages (cuda::vq_append, byte for byte the CPU
// reference encoder's indices); decode attends over the vq pages
// (cuda::vq_decode_attention: RoPE applied at each key's position; the
// correctness path, fp32, no tensor cores), evaluation and chunked prefill
// over their fp16 reconstructions (cuda::vq_dequantize). A key whose shared
// scale overflows fp16 makes prefill / decode throw after the step (the CPU
// packed cache refuses it too). Plans with 5..8-bit groups (RateQuant) keep
// the high bits in each layer's extension pages: cuda::packed_write_wide in
// append and prefill, the generic decode kernel, cuda::packed_dequantize_wide
// for evaluation / chunked prefill (correctness paths, fp32).
//
// Memory (EngineOptions, plan_memory): weights, activations for max_batch
// decode rows and a max_prefill_tokens prompt, workspaces, a reserve; the rest
// is the page pool (engine/page_pool.h, the bookkeeping the Python CUDA cache
// shares) — the same number of pages in every layer, one page table per
// sequence for all layers. add_sequence reserves the pages of a request's
// whole length up front: a request past the pool or past the context limit
// (the model's trained context unless raised explicitly) is an Error before
// any work. Device memory is never allocated after construction except for
// the CUDA graphs.
//
// This header has no CUDA types: device pointers are plain pointers, the
// stream is a void* (a cudaStream_t), for bindings (the Python package).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ratekv/engine/cache_format.h"
#include "ratekv/engine/page_pool.h"
#include "ratekv/engine/sampling.h"
#include "ratekv/model/model.h"

namespace ratekv::engine {

/// What a prompt attends to during prefill (file comment).
enum class PrefillMode { evaluation, serving };
/// "evaluation" | "serving".
const char* prefill_mode_name(PrefillMode m);

/// Sizes and switches fixed at construction.
struct EngineOptions {
  int max_batch = 1;                   ///< sequences per decode step (≥ 1)
  int64_t max_prefill_tokens = 2048;   ///< longest prompt prefilled in one piece (≥ 1)
  int64_t context_limit = 0;           ///< 0: the model's n_ctx_train; more: an explicit RoPE extrapolation
  size_t reserve_bytes = size_t{1} << 30;  ///< device memory left out of the plan (context, graphs)
  size_t pool_bytes = 0;               ///< 0: every byte left; else at most this much for pages
  size_t prefill_score_bytes = size_t{1} << 30;  ///< prefill attention scores + probabilities per chunk
  int max_logit_rows = 0;              ///< LM-head rows per launch in prefill (0: max(max_batch, 512))
  bool cuda_graphs = true;             ///< decode steps as CUDA graph replays
  bool pages_descending = false;       ///< hand out the highest pages first (tests of 64-bit offsets)
  int fp16_kernel = 0;                 ///< fp16 decode kernel: 0 automatic, 1 rows16, 2 n8, 3 n8_fused (cuda::Fp16DecodeVariant; 2, 3 need GQA ≤ 8 with an fp16 cache; else create throws)
};

/// The memory plan (bytes). weights + activations + workspace + pool is
/// every byte the engine requests from cudaMalloc (its own buffers, the
/// packed plans' tables and the packed prefill's rotation buffer and cuBLAS
/// handle — the engine's); nothing is allocated after construction except
/// CUDA graphs. Outside the plan, inside `reserve`: the CUDA context, loaded
/// kernel modules, cuBLAS's handle state, graphs and cudaMalloc's rounding.
struct MemoryPlan {
  size_t device_free = 0;    ///< free device memory when the plan was made
  size_t weights = 0;        ///< bf16 matrices and embeddings, fp32 norms and biases
  size_t activations = 0;    ///< decode rows, prefill rows, logits, decode state and page tables
  size_t workspace = 0;      ///< cuBLAS, decode split states, prefill scores and key tiles, tables, prefill rotation
  size_t tables = 0;         ///< of workspace: packed plans' device tables, RoPE frequencies, probe sink
  size_t prefill_rotation = 0;  ///< of workspace: packed prefill's rotated rows (cuda::PrefillScratch)
  size_t reserve = 0;
  size_t pool = 0;           ///< pages · Σ_l page_bytes(l)
  int64_t pages = 0;         ///< pages per layer
  int64_t capacity_tokens = 0;  ///< pages · 64
  /// weights + activations + workspace + pool: the bytes the engine allocates.
  size_t allocated() const { return weights + activations + workspace + pool; }
  /// One line: each part in GiB and the capacity in tokens.
  std::string summary() const;
};

/// Plans memory for `cfg` with `fmt` and `opt` on a device with
/// `device_free` free bytes; weight bytes include an untied LM head when
/// `untied_lm_head`. Throws Error (naming the sizes) when weights, activations,
/// workspace and reserve leave no room for one page per layer, or opt is
/// invalid.
MemoryPlan plan_memory(const ModelConfig& cfg, bool untied_lm_head, const CacheFormat& fmt,
                       const EngineOptions& opt, size_t device_free);

/// Bytes a decode step reads, the roofline's numerator: every layer matrix,
/// the LM head, norms and biases (the embedding table is only gathered: B
/// rows), plus each sequence's cache at its length (the pages attention reads
/// in every layer: all of them, or for a sliding layer those from the page
/// holding the first visible key).
struct StepBytes {
  double weights = 0;
  double cache = 0;
  double total() const { return weights + cache; }
};

/// Per-part times of one decode step (ms), from CUDA graphs of the step's
/// pieces (Engine::profile_decode).
struct DecodeProfile {
  double step = 0;       ///< the whole step
  double gemm = 0;       ///< every weight GEMM (QKV, O, gate/up, down, LM head)
  double attention = 0;  ///< decode attention (query prologue, kernel, merge) of every layer
  double append = 0;     ///< quantize-append (or fp16 write) of every layer
  double other = 0;      ///< step − the above: norms, RoPE, SwiGLU, casts, argmax, bookkeeping
};

/// Name of the current CUDA device ("" when none is visible).
std::string cuda_device_name();

class Engine {
 public:
  /// A model with weights on the host (fp32, e.g. dequantized from GGUF),
  /// uploaded as bf16 (norms — Gemma's QK-norm and post-norm weights too —
  /// and the Q/K/V biases LayerWeights::bqkv of a cfg.qkv_bias model as
  /// fp32). Throws Error for an unsupported architecture or feature (naming
  /// it: e.g. sliding_window with a packed cache at GQA > 8), a weight of the
  /// wrong size (naming it), no CUDA device, or a memory plan that does not
  /// fit.
  static std::unique_ptr<Engine> create(const ModelConfig& cfg, const ModelWeights& w, CacheFormat fmt,
                                        const EngineOptions& opt);
  /// A synthetic model (model/synthetic.h): weights generated on the GPU from
  /// `seed`, identical to synthetic_weights on the CPU.
  static std::unique_ptr<Engine> create_synthetic(const ModelConfig& cfg, bool untied_output, uint64_t seed,
                                                  CacheFormat fmt, const EngineOptions& opt);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const ModelConfig& config() const;
  const CacheFormat& format() const;
  const MemoryPlan& memory() const;
  const EngineOptions& options() const;
  int64_t context_limit() const;
  /// Tokens the unreserved pages hold.
  int64_t free_tokens() const;

  /// Reserves the pages of a sequence of up to max_tokens tokens and returns
  /// its id. Throws Error, before any work, when max_tokens < 1, exceeds
  /// context_limit(), or needs more pages than are free (the message gives
  /// both numbers in tokens).
  int add_sequence(int64_t max_tokens);
  /// Frees a sequence's pages. Error for an unknown id.
  void remove_sequence(int seq);
  /// Tokens cached for `seq`.
  int64_t seq_length(int seq) const;

  /// Prefill of a fresh sequence (length 0) with `tokens` in one piece.
  /// logits: empty, (n_vocab) for the last token, or (n, n_vocab) for every
  /// token (host fp32). Throws Error for a non-empty sequence, tokens past its
  /// reservation or max_prefill_tokens, or a token id outside the vocabulary.
  void prefill(int seq, std::span<const int32_t> tokens, PrefillMode mode, std::span<float> logits);

  /// Chunked prefill (engine issue 2 of 3): appends the chunk `tokens` to
  /// `seq`, whose length p0 is a multiple of 64 (0 for the first chunk), at
  /// positions p0 .. p0+n−1. The chunk attends to keys 0 .. p0+n−1 in tiles
  /// of a bounded size (memory plan: workspace), online softmax: the earlier
  /// chunks' keys are read from the pages (packed: dequantized with
  /// cuda::packed_dequantize; fp16: read back), the chunk's own keys from its
  /// pages too in evaluation mode and from its fp16 K/V in serving mode; then
  /// the rest of the layer. Memory grows with the chunk (≤
  /// max_prefill_tokens rows), not with p0. logits: empty, (n_vocab) for the
  /// last token or (n, n_vocab). Throws Error (before any work) for a length
  /// that is not a multiple of 64, a chunk past the reservation or
  /// max_prefill_tokens, or a bad token id.
  void prefill_chunk(int seq, std::span<const int32_t> tokens, PrefillMode mode, std::span<float> logits);
  /// A fresh sequence's whole prompt in chunks of `chunk` tokens (a multiple
  /// of 64, ≤ max_prefill_tokens; the last chunk may be shorter) through
  /// prefill_chunk. logits as prefill(). Error for a bad chunk size, a
  /// non-empty sequence, or a prompt past the reservation.
  void prefill_chunked(int seq, std::span<const int32_t> tokens, int64_t chunk, PrefillMode mode,
                       std::span<float> logits);

  /// Appends n_tokens synthetic K/V (seeded, uniform in [−1, 1) per channel)
  /// to every layer of `seq` through the cache's write path (packed_prefill's
  /// quantizer, or the fp16 writer): a long context at benchmark scale without
  /// a prefill of that length. Results at such depths are labelled
  /// synthetic_fill.
  void fill_synthetic(int seq, int64_t n_tokens, uint64_t seed);

  /// Greedy decode of n_steps tokens for the sequences `seqs` (distinct, at
  /// most max_batch, each with length ≥ 1), starting from `tokens` (one per
  /// sequence, the last sampled token). out_tokens: (n_steps, B) the argmax of
  /// each step; last_logits: empty or (B, n_vocab), the last step's logits.
  /// Throws Error (before any work) for a sequence past its reservation.
  void decode(std::span<const int> seqs, std::span<const int32_t> tokens, int n_steps,
              std::span<int32_t> out_tokens, std::span<float> last_logits = {});

  /// One decode step of `seqs` (as decode with n_steps 1) whose next tokens
  /// are sampled on the GPU (cuda::sample_rows, the definition of
  /// engine/sampling.h) with sp[b] and uniform u[b] per sequence (greedy rows
  /// take the argmax). next: (B) the picked tokens; last_logits: empty or
  /// (B, n_vocab), the step's logits. Throws Error (before any work) for
  /// spans of the wrong size, invalid settings, u outside [0, 1), or a
  /// sequence past its reservation.
  void decode_sample(std::span<const int> seqs, std::span<const int32_t> tokens, std::span<const SamplingParams> sp,
                     std::span<const double> u, std::span<int32_t> next, std::span<float> last_logits = {});

  /// Times `n_steps` decode steps (graph replays) of `seqs` after `warmup`
  /// untimed steps; returns ms per step (events). The sequences grow by
  /// warmup + n_steps tokens.
  double time_decode(std::span<const int> seqs, std::span<const int32_t> tokens, int warmup, int n_steps);
  /// The per-part times of one step at the sequences' current lengths
  /// (median of `reps` replays each). Lengths do not change.
  DecodeProfile profile_decode(std::span<const int> seqs, int reps);
  /// Median ms of one layer's decode attention (query prologue + kernel +
  /// merge) over `seqs` at their current lengths, L2 flushed before each
  /// call: the number set against torch SDPA flash on the same shapes.
  /// The layer is layer 0: on Gemma 3 a sliding-window layer, so the time is
  /// that of a window of the last sliding_window cached tokens (a global
  /// layer reads them all); the lengths are the cached tokens (no append).
  /// fp16_kernel: −1 the engine's choice, else as EngineOptions::fp16_kernel.
  double time_attention(std::span<const int> seqs, int reps, int fp16_kernel = -1);
  /// Bytes the next decode step of `seqs` reads (the roofline numerator).
  StepBytes step_bytes(std::span<const int> seqs) const;
  /// Read-bandwidth ceiling (GB/s): a read-only probe over `bytes` of device
  /// memory (the page pool when it is that large), median of `reps`.
  double read_ceiling_gbps(size_t bytes, int reps);
  /// Device memory in use now (total − free), bytes.
  size_t device_bytes_in_use() const;

  // ---- raw state, for bindings (device pointers; no CUDA types) ----
  void* stream() const;
  /// Layer `layer`'s page memory: pages · page_bytes bytes: the layer's pages
  /// (pages · layout(l).page_bytes()), then its extension pages if it has
  /// 5..8-bit groups (CacheFormat::ext_layout), then its vq pages if it has
  /// vq sides (CacheFormat::vq).
  uint8_t* layer_pool(int layer) const;
  /// CacheFormat::page_bytes: a vq layer's scalar plus vq page.
  size_t page_bytes(int layer) const;
  /// Physical page ids of `seq` (logical page i → element i).
  std::vector<int32_t> seq_pages(int seq) const;
  /// The page pool: free list, sequences, page-table rows, layer memory
  /// (layer_base(l) = layer_pool(l)).
  const PagePool& page_pool() const;

  struct Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ratekv::engine
