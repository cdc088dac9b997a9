// Bindings: the CUDA packed cache (include/ratekv/cuda/decode_attention.h) for
// ratekv.ops on CUDA tensors. The per-layer kernel tables come from the GPU
// engine's cache format (include/ratekv/engine/cache_format.h: the plan's
// layouts, rotations and Lloyd–Max levels in the kernels' order), so what the
// engine serves is exactly what Python serves; so is the page bookkeeping
// (engine::PagePool, engine/page_pool.h: free list, sequences, page-table rows,
// 64-bit page offsets), made by make_pool from the same format. Device memory
// (each layer's pages, page tables, lengths, workspace) is torch's: the Python
// side allocates it, binds the pages to the pool and passes device pointers
// (integers) and the current CUDA stream, so every launch is asynchronous on
// torch's stream and capturable in a CUDA graph.
// Compiled only with CUDA and the engine (RATEKV_PY_CUDA, RATEKV_HAVE_ENGINE);
// otherwise ratekv._core.has_cuda is False.
#include <nanobind/nanobind.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>

#include "bind_common.h"

#if defined(RATEKV_PY_CUDA) && defined(RATEKV_HAVE_ENGINE)
#include <cstdint>
#include <memory>
#include <vector>

#include "ratekv/cuda/decode_attention.h"
#include "ratekv/engine/cache_format.h"
#include "ratekv/engine/page_pool.h"
#endif

namespace ratekv::py {

#if defined(RATEKV_PY_CUDA) && defined(RATEKV_HAVE_ENGINE)
namespace {

template <typename T>
T* ptr(uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

/// The kernels' tables of every layer of a plan (one cuda::PackedPlan per layer).
class CudaPackedLayers {
 public:
  explicit CudaPackedLayers(std::shared_ptr<const cache::PlanCodecs> codecs)
      : fmt_(engine::CacheFormat::packed(codecs)), n_heads_(codecs->config().n_heads) {
    for (int l = 0; l < fmt_.n_layers(); ++l)
      check(fmt_.vq(l) == nullptr,
            "CUDA packed cache: plan: layers[{}] has vq / fp16 sides (method '{}'); the CUDA packed cache serves "
            "tq-mse / tq-mse-grouped plans (TaSQ / CQ plans: the CPU PackedKVCache, or the GPU engine)",
            l, codecs->plan().method);
    for (int l = 0; l < fmt_.n_layers(); ++l)
      check(fmt_.ext_layout(l) == nullptr,
            "CUDA packed cache: plan: layers[{}] has 5..8-bit groups (extension pages); the CUDA packed cache serves "
            "groups of at most 4 bits (such plans: the CPU PackedKVCache, or the GPU engine)",
            l);
    for (int l = 0; l < fmt_.n_layers(); ++l)
      plans_.push_back(std::make_unique<cuda::PackedPlan>(fmt_.layout(l), n_heads_, fmt_.rotations(l), fmt_.levels(l)));
  }
  CudaPackedLayers(const CudaPackedLayers&) = delete;
  CudaPackedLayers& operator=(const CudaPackedLayers&) = delete;
  int n_layers() const { return fmt_.n_layers(); }
  size_t page_bytes(int l) const { return fmt_.page_bytes(check_layer(l)); }
  std::string label() const { return fmt_.label(); }

  /// The page pool of this format: `pages` pages per layer, page-table rows of
  /// max_seq_pages, pages handed out lowest first; its memory is bound by the caller.
  engine::PagePool make_pool(int64_t pages, int64_t max_seq_pages) const {
    engine::PagePoolOptions o;
    o.pages = pages;
    o.max_seq_pages = max_seq_pages;
    o.owner = "CUDA packed cache";
    return engine::PagePool::for_format(fmt_, o);
  }

  /// Workspace bytes of a decode step of `batch` sequences of ≤ max_seq_len tokens (the
  /// largest over layers; splits as packed_decode_attention picks them for n_splits = 0).
  size_t workspace_bytes(int batch, int max_seq_len) const {
    size_t ws = 0;
    for (const auto& p : plans_)
      ws = std::max(ws, cuda::decode_workspace_bytes(batch, n_heads_, fmt_.head_dim(),
                                                     cuda::default_splits(*p, batch, max_seq_len)));
    return ws;
  }

  /// n tokens per sequence written at positions seq_lens[b] … (packed_append for n = 1,
  /// packed_prefill otherwise) into `pool`'s pages of `layer`; page_table (batch,
  /// pool.max_seq_pages()) int32 rows; k, v (batch, n, n_kv_heads, head_dim) fp16 (f16) or fp32.
  void append(int layer, const engine::PagePool& pool, uintptr_t page_table, uintptr_t seq_lens, int batch,
              int max_seq_len, uintptr_t k, uintptr_t v, int n, bool f16, uintptr_t stream) {
    const auto& P = *plans_.at(check_pool(pool, layer, batch));
    cuda::DecodeBatch b{ptr<const int32_t>(page_table), static_cast<int>(pool.max_seq_pages()),
                        ptr<const int32_t>(seq_lens), batch, max_seq_len};
    const auto dt = f16 ? cuda::DType::f16 : cuda::DType::f32;
    uint8_t* pages = pool.layer_base(layer);
    if (n == 1)
      cuda::packed_append(P, b, pages, ptr<const void>(k), ptr<const void>(v), dt, ptr<void>(stream));
    else
      cuda::packed_prefill(P, b, pages, ptr<const void>(k), ptr<const void>(v), n, dt, ptr<void>(stream));
  }

  /// One query per sequence, q (batch, n_heads, head_dim) fp16/fp32; out fp32, same shape.
  void decode(int layer, const engine::PagePool& pool, uintptr_t page_table, uintptr_t seq_lens, int batch,
              int max_seq_len, uintptr_t q, bool f16, float scale, uintptr_t out, uintptr_t workspace,
              size_t workspace_bytes, uintptr_t stream) {
    const auto& P = *plans_.at(check_pool(pool, layer, batch));
    cuda::DecodeBatch b{ptr<const int32_t>(page_table), static_cast<int>(pool.max_seq_pages()),
                        ptr<const int32_t>(seq_lens), batch, max_seq_len};
    cuda::packed_decode_attention(P, b, pool.layer_base(layer), ptr<const void>(q),
                                  f16 ? cuda::DType::f16 : cuda::DType::f32, scale, ptr<float>(out),
                                  ptr<void>(workspace), workspace_bytes, 0, ptr<void>(stream));
  }

 private:
  int check_layer(int l) const {
    check(l >= 0 && l < fmt_.n_layers(), "CUDA packed cache: layer {} outside 0..{}", l, fmt_.n_layers() - 1);
    return l;
  }
  /// The layer, after checking that `pool` holds this format's pages (bound) and
  /// that a batch of `batch` rows has as many sequences behind it.
  int check_pool(const engine::PagePool& pool, int l, int batch) const {
    check_layer(l);
    check(pool.n_layers() == fmt_.n_layers() && pool.page_bytes(l) == fmt_.page_bytes(l),
          "CUDA packed cache: the page pool ({} layers, {} bytes a page in layer {}) is not this plan's ({} layers, "
          "{} bytes)", pool.n_layers(), pool.page_bytes(l), l, fmt_.n_layers(), fmt_.page_bytes(l));
    check(batch >= 1 && batch <= pool.n_sequences(), "CUDA packed cache: batch {} but the pool holds {} sequences",
          batch, pool.n_sequences());
    return l;
  }
  engine::CacheFormat fmt_;
  int n_heads_;
  std::vector<std::unique_ptr<cuda::PackedPlan>> plans_;
};

}  // namespace
#endif

void bind_cuda(nb::module_& m) {
#if defined(RATEKV_PY_CUDA) && defined(RATEKV_HAVE_ENGINE)
  m.attr("has_cuda") = true;
  nb::class_<CudaPackedLayers>(m, "CudaPackedLayers",
                               "The CUDA kernels' tables of every layer of a plan (engine/cache_format.h): "
                               "tq-mse / Block-GTQ / RateQuant plans with 1..4-bit groups, no window/sink. Present only in an "
                               "extension built with CUDA and the GPU engine (has_cuda).")
      .def(nb::init<std::shared_ptr<const cache::PlanCodecs>>(), nb::arg("codecs"),
           "Raises RatekvError naming the plan field the GPU path cannot serve.")
      .def_prop_ro("n_layers", &CudaPackedLayers::n_layers)
      .def_prop_ro("label", &CudaPackedLayers::label)
      .def("page_bytes", &CudaPackedLayers::page_bytes, nb::arg("layer"))
      .def("make_pool", &CudaPackedLayers::make_pool, nb::arg("pages"), nb::arg("max_seq_pages"),
           "The engine's page pool (ratekv.PagePool) for this plan's pages; bind each layer's memory to it.")
      .def("workspace_bytes", &CudaPackedLayers::workspace_bytes, nb::arg("batch"), nb::arg("max_seq_len"))
      .def("append", &CudaPackedLayers::append, nb::arg("layer"), nb::arg("pool"), nb::arg("page_table"),
           nb::arg("seq_lens"), nb::arg("batch"), nb::arg("max_seq_len"), nb::arg("k"),
           nb::arg("v"), nb::arg("n"), nb::arg("f16"), nb::arg("stream"))
      .def("decode", &CudaPackedLayers::decode, nb::arg("layer"), nb::arg("pool"), nb::arg("page_table"),
           nb::arg("seq_lens"), nb::arg("batch"), nb::arg("max_seq_len"), nb::arg("q"),
           nb::arg("f16"), nb::arg("scale"), nb::arg("out"), nb::arg("workspace"), nb::arg("workspace_bytes"),
           nb::arg("stream"));
#else
  m.attr("has_cuda") = false;
#endif
}

}  // namespace ratekv::py
