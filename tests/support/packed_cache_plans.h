// tests/support/packed_cache_plans.h — what the GPU kernels and their named
// CPU references take, built from a CPU PackedKVCache: a layer's scalar
// rotations and codebooks (ref::PackedPlan, the inputs of cuda::PackedPlan)
// and its pages scattered into a pool under a page table.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/common/error.h"
#include "ratekv/quant/grouped_tq_mse.h"
#include "ratekv/quant/tq_mse.h"
#include "ratekv/ref/packed_plan.h"

namespace ratekv_test {

/// The TQ-MSE quantizers of the groups of side s of KV head h of `layer`, in
/// the order of the cache's layout (groups of 0 bits dropped, as the cache does).
inline std::vector<const ratekv::quant::TQMSE*> layout_quantizers(const ratekv::cache::PackedKVCache& cache, int layer,
                                                                  int h, int s) {
  using namespace ratekv;
  std::vector<const quant::TQMSE*> out;
  const auto& specs = s == 0 ? cache.layout(layer).spec(h).key : cache.layout(layer).spec(h).value;
  if (specs.empty()) return out;
  const quant::Quantizer* q = cache.codecs().quantizer(layer, h, static_cast<cache::KVSide>(s));
  if (const auto* tq = dynamic_cast<const quant::TQMSE*>(q)) {
    out.push_back(tq);
  } else if (const auto* gq = dynamic_cast<const quant::GroupedTQMSE*>(q)) {
    for (const quant::TQMSE& c : gq->codecs())
      if (c.bits() > 0) out.push_back(&c);
  }
  check(out.size() == specs.size(), "layout_quantizers: {} TQ-MSE groups for {} layout groups", out.size(),
        specs.size());
  return out;
}

/// Rotations (Rotation::matrix(), fp32 values) and codebooks of every scalar
/// group of `layer`, in the GPU plan's order, as a ref::PackedPlan (with the
/// extension layout when the layer has 5..8-bit groups).
inline ratekv::ref::PackedPlan cache_ref_plan(const ratekv::cache::PackedKVCache& cache, int layer) {
  using namespace ratekv;
  const packed::LayerLayout& L = cache.layout(layer);
  std::vector<float> rot, lvl;
  for (int h = 0; h < L.n_kv_heads(); ++h)
    for (int s = 0; s < 2; ++s)
      for (const quant::TQMSE* tq : layout_quantizers(cache, layer, h, s)) {
        const auto M = tq->rotation().matrix();  // y = Π x, channels in the group's order
        for (int i = 0; i < M.rows(); ++i)
          for (int j = 0; j < M.cols(); ++j) rot.push_back(static_cast<float>(M(i, j)));
        lvl.insert(lvl.end(), tq->codebook().levels.begin(), tq->codebook().levels.end());
      }
  const int n_heads = cache.shape().n_heads;
  if (const packed::LayerLayout* X = cache.ext_layout(layer)) return ref::PackedPlan(L, *X, n_heads, rot, lvl);
  return ref::PackedPlan(L, n_heads, rot, lvl);
}

/// The n_used logical pages page(i) (i < n_used) copied into pages
/// table[i] of a pool of n_pages pages of page_bytes bytes; other pages hold
/// `fill` bytes.
template <typename PageFn>
std::vector<uint8_t> scatter_pages(PageFn page, int n_used, std::span<const int32_t> table, int n_pages,
                                   size_t page_bytes, std::vector<uint8_t> fill = {}) {
  std::vector<uint8_t> pool = fill.empty() ? std::vector<uint8_t>(static_cast<size_t>(n_pages) * page_bytes, 0) : fill;
  for (int i = 0; i < n_used; ++i) {
    const std::span<const uint8_t> src = page(i);
    std::copy(src.begin(), src.end(), pool.begin() + static_cast<size_t>(table[i]) * page_bytes);
  }
  return pool;
}

}  // namespace ratekv_test
