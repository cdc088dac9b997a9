// The engine's memory plan (ratekv/engine/engine.h plan_memory): weights,
// activations, workspace and reserve first; the rest is the page pool.
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "buffer_sizes.h"
#include "ratekv/common/error.h"
#include "ratekv/cuda/decode_attention.h"
#include "ratekv/engine/engine.h"

namespace ratekv::engine {

namespace {

double gib(size_t b) { return static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0); }

/// Largest decode workspace over batch sizes 1..max_batch: split states for
/// at most one wave of 16 resident warps per SM of `sm_count` (the packed
/// kernels' bound; the fp16 kernels stay under it), plus 8.
size_t decode_workspace(const ModelConfig& c, int max_batch, int sm_count) {
  size_t best = 0;
  for (int b = 1; b <= max_batch; ++b) {
    const int splits = (sm_count * 16 + b * c.n_kv_heads - 1) / (b * c.n_kv_heads) + 8;
    best = std::max(best, cuda::decode_workspace_bytes(b, c.n_heads, c.head_dim, splits));
  }
  return best;
}

}  // namespace

const char* prefill_mode_name(PrefillMode m) { return m == PrefillMode::evaluation ? "evaluation" : "serving"; }

std::string MemoryPlan::summary() const {
  return fmt::format(
      "memory plan: {:.2f} GiB free = weights {:.2f} + activations {:.2f} + workspace {:.2f} + reserve {:.2f} + "
      "page pool {:.2f} GiB ({} pages per layer = {} tokens)",
      gib(device_free), gib(weights), gib(activations), gib(workspace), gib(reserve), gib(pool), pages,
      capacity_tokens);
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
  p.activations = detail::activation_rows(opt) * detail::activation_row_bytes(m) +
                  static_cast<size_t>(detail::logit_rows(opt) * m.V * 4) + detail::decode_bytes(m, opt.max_batch);
  size_t tables = 0;  // packed plans: rotations, levels, head tables on the device
  if (!fmt.is_fp16())
    for (int l = 0; l < cfg.n_layers; ++l)
      tables += 4 * (fmt.rotations(l).size() + fmt.levels(l).size()) + size_t{8192} * cfg.n_kv_heads;
  for (int l = 0; l < cfg.n_layers && fmt.has_vq(); ++l)
    if (const CacheFormat::VqLayer* vq = fmt.vq(l))  // cuda::VqPlan + VqEncodePlan tables
      tables += 4 * (vq->codewords.size() + vq->codebooks.size() + 2 * vq->channels.size()) +
                size_t{16} * cfg.n_kv_heads * cfg.head_dim + size_t{8192};
  if (fmt.has_vq()) p.activations += detail::activation_rows(opt) * 4 * static_cast<size_t>(m.kvd);  // k_pre32
  p.workspace = detail::kCublasWorkspace + decode_workspace(cfg, opt.max_batch, 132) + opt.prefill_score_bytes + tables +
                detail::chunk_scratch_bytes(cfg, opt);
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
