// The engine's memory plan (ratekv/engine/engine.h plan_memory): weights,
// activations, workspace and reserve first; the rest is the page pool.
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "buffer_sizes.h"
#include "ratekv/common/error.h"
#include "ratekv/cuda/decode_attention.h"
#include "ratekv/cuda/model_kernels.h"
#include "ratekv/cuda/vq_encode.h"
#include "ratekv/engine/engine.h"
#include "ratekv/model/sliding_window.h"

namespace ratekv::engine {

namespace {

double gib(size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0); }

}  // namespace

namespace detail {

// default_splits(plan, …) of a plan with 5..8-bit groups (the generic decode
// kernel: one page per split, at most 2048; src/cuda/packed_plan.cpp).
int wide_default_splits(int len) { return std::max(1, std::min((len + packed::kPageTokens - 1) / packed::kPageTokens, 2048)); }

// PackedPlan(layout, ext, …)'s device bytes: packed_plan_device_bytes without
// prefill matrices (a plan with 5..8-bit groups has none), with 2^b levels
// for a wide group instead of the layout's 2^4.
size_t wide_plan_device_bytes(const CacheFormat& f, int l) {
  const packed::LayerLayout& L = f.layout(l);
  size_t main_levels = 0;
  for (int h = 0; h < L.n_kv_heads(); ++h)
    for (packed::Side side : {packed::Side::key, packed::Side::value})
      for (const packed::GroupLayout& G : L.head(h).side(side)) main_levels += size_t{1} << G.bits;
  return cuda::packed_plan_device_bytes(L, cuda::PrefillMatrices::none) + 4 * (f.levels(l).size() - main_levels);
}

size_t decode_workspace_bytes(const ModelConfig& c, const CacheFormat& f, const EngineOptions& o) {
  const int ctx = static_cast<int>(std::min<int64_t>(context_limit(c, o), std::numeric_limits<int>::max()));
  size_t ws = 0;
  for (int b = 1; b <= o.max_batch; ++b) {
    int splits = 0;
    // Splits grow as lengths shrink (more pages per wave): the context limit,
    // short lengths, and the spans sliding layers read (cuda::DecodeBatch::window).
    std::vector<int> lens = {ctx, 64, 256, 1024, 4096};
    if (any_sliding(c))
      for (int unit : {16, packed::kPageTokens})
        lens.push_back(static_cast<int>(window_span_tokens(ctx, c.sliding_window, unit)));
    for (int len : lens) {
      // Both fp16 kernels (Engine::time_attention compares them).
      splits = std::max(splits, cuda::fp16_default_splits(b, c.n_kv_heads, c.n_heads, c.head_dim, len));
      splits = std::max(splits, cuda::fp16_default_splits(b, c.n_kv_heads, c.n_heads, c.head_dim, len,
                                                          cuda::Fp16DecodeVariant::rows16));
      for (int l = 0; l < c.n_layers && !f.is_fp16(); ++l)
        splits = std::max(splits, f.vq(l)           ? cuda::vq_default_splits(c.n_kv_heads, b, len)
                                  : f.ext_layout(l) ? wide_default_splits(len)
                                                    : cuda::default_splits(f.layout(l), c.n_heads, b, len));
    }
    ws = std::max(ws, cuda::decode_workspace_bytes(b, c.n_heads, c.head_dim, splits + 8));
  }
  return ws;
}

size_t table_bytes(const ModelConfig& c, const CacheFormat& f) {
  size_t b = 8 * static_cast<size_t>(c.head_dim / 2) * (any_sliding(c) ? 2 : 1) +  // RoPE (and local RoPE)
             4 * static_cast<size_t>(cuda::kReadProbeBlocks);
  for (int l = 0; l < c.n_layers && !f.is_fp16(); ++l) {
    if (f.ext_layout(l))
      b += wide_plan_device_bytes(f, l);
    else if (has_packed_plan(f, l))
      b += cuda::packed_plan_device_bytes(f.layout(l), cuda::PrefillMatrices::f32);
    if (const CacheFormat::VqLayer* vq = f.vq(l))
      b += cuda::vq_plan_device_bytes(c.n_kv_heads, c.head_dim, vq->codewords.size(), vq->channels.size()) +
           cuda::vq_encode_plan_device_bytes(c.n_kv_heads, c.head_dim, vq->codebooks.size());
  }
  return b;
}

size_t prefill_rotation_bytes(const ModelConfig& c, const CacheFormat& f, const EngineOptions& o) {
  bool any = false;  // a layer whose tq-mse sides packed_prefill writes
  for (int l = 0; l < c.n_layers && !f.is_fp16(); ++l) any = any || has_packed_plan(f, l);
  return any ? cuda::prefill_scratch_bytes(c.n_kv_heads, c.head_dim, o.max_prefill_tokens) : 0;
}

}  // namespace detail

const char* prefill_mode_name(PrefillMode m) { return m == PrefillMode::evaluation ? "evaluation" : "serving"; }

std::string MemoryPlan::summary() const {
  return fmt::format(
      "memory plan: {:.2f} GiB free = weights {:.2f} + activations {:.2f} + workspace {:.2f} (of it tables {:.3f}, "
      "prefill rotation {:.3f}) + reserve {:.2f} + page pool {:.2f} GiB ({} pages per layer = {} tokens)",
      gib(device_free), gib(weights), gib(activations), gib(workspace), gib(tables), gib(prefill_rotation),
      gib(reserve), gib(pool), pages, capacity_tokens);
}

MemoryPlan plan_memory(const ModelConfig& cfg, bool untied_lm_head, const CacheFormat& fmt, const EngineOptions& opt,
                       size_t device_free) {
  check(opt.max_batch >= 1, "plan_memory: max_batch {} must be >= 1", opt.max_batch);
  check(opt.max_prefill_tokens >= 1, "plan_memory: max_prefill_tokens {} must be >= 1", opt.max_prefill_tokens);
  check(opt.context_limit >= 0, "plan_memory: context_limit {} must be >= 0", opt.context_limit);
  check(fmt.n_layers() == cfg.n_layers && fmt.head_dim() == cfg.head_dim && fmt.n_kv_heads() == cfg.n_kv_heads,
        "plan_memory: cache format ({} layers, {} KV heads, head_dim {}) does not match the model ({}, {}, {})",
        fmt.n_layers(), fmt.n_kv_heads(), fmt.head_dim(), cfg.n_layers, cfg.n_kv_heads, cfg.head_dim);
  const detail::Dims m(cfg);
  MemoryPlan p;
  p.device_free = device_free;
  p.weights = detail::weight_bytes(cfg, untied_lm_head);
  p.activations = static_cast<size_t>(detail::activation_rows(opt)) * detail::activation_row_bytes(m) +
                  static_cast<size_t>(detail::logit_rows(opt) * m.V * 4) +
                  detail::decode_state_bytes(opt.max_batch, detail::max_seq_pages(cfg, opt));
  if (fmt.has_vq()) p.activations += detail::activation_rows(opt) * 4 * static_cast<size_t>(m.kvd);  // k_pre32
  p.tables = detail::table_bytes(cfg, fmt);
  p.prefill_rotation = detail::prefill_rotation_bytes(cfg, fmt, opt);
  p.workspace = detail::kCublasWorkspace + detail::decode_workspace_bytes(cfg, fmt, opt) + detail::score_bytes(opt) +
                detail::prob_bytes(opt) + detail::chunk_scratch_bytes(cfg, opt) + p.tables + p.prefill_rotation;
  p.reserve = opt.reserve_bytes;
  const size_t fixed = p.weights + p.activations + p.workspace + p.reserve;
  const size_t per_page = fmt.page_bytes_all_layers();
  check(fixed + per_page <= device_free,
        "GPU engine: the model needs {:.2f} GiB before its KV cache (weights {:.2f}, activations {:.2f} for {} prefill "
        "tokens / batch {}, workspace {:.2f}, reserve {:.2f}) but the device has {:.2f} GiB free",
        gib(fixed), gib(p.weights), gib(p.activations), opt.max_prefill_tokens, opt.max_batch, gib(p.workspace),
        gib(p.reserve), gib(device_free));
  size_t room = device_free - fixed;
  if (opt.pool_bytes > 0) room = std::min(room, opt.pool_bytes);
  p.pages = std::min<int64_t>(static_cast<int64_t>(room / per_page), std::numeric_limits<int32_t>::max());
  check(p.pages >= 1, "GPU engine: pool_bytes {} is smaller than one page of every layer ({} bytes)", opt.pool_bytes,
        per_page);
  p.pool = static_cast<size_t>(p.pages) * per_page;
  p.capacity_tokens = p.pages * packed::kPageTokens;
  return p;
}

}  // namespace ratekv::engine
