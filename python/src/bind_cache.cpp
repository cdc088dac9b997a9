// Bindings: the packed KV cache on the CPU (cache/packed_kv_cache.h) for a
// batch of sequences — what ratekv.hf.PackedCache and the ratekv::* custom
// ops run on CPU tensors.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bind_common.h"
#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/cache/plan_codecs.h"

namespace ratekv::py {

namespace {

/// Throws Error naming `what`, the layer and the first offending index when x
/// holds a NaN or an infinity (the cache would store nothing sensible).
void check_finite(const float* x, size_t n, const char* what, int layer) {
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) fail("PackedCache: layer {}: {} element {} is {} (K/V must be finite)", layer, what, i, x[i]);
}

/// Bytes the heap has handed out (glibc's mallinfo2); 0 where it cannot be read (then nothing is refused).
double heap_bytes() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  const struct mallinfo2 m = mallinfo2();
  return static_cast<double>(m.uordblks) + static_cast<double>(m.hblkhd);
#else
  return 0.0;
#endif
}

/// B independent PackedKVCache sequences sharing one plan. Per layer, the
/// tokens of sequence b sit at positions 0, 1, … in append order.
class PackedBatch {
 public:
  /// Throws Error for batch or n_ctx < 1, and when the `batch` sequences' layout tables alone (allocated up
  /// front, measured on the first sequence; pages are allocated as tokens arrive) would not fit in this
  /// machine's physical memory: a clean refusal instead of allocating until the kernel kills the process.
  PackedBatch(std::shared_ptr<const cache::PlanCodecs> codecs, int batch, int64_t n_ctx)
      : codecs_(std::move(codecs)) {
    const ModelConfig& cfg = codecs_->config();
    check(batch >= 1, "PackedKVCache: batch_size {} must be ≥ 1", batch);
    check(n_ctx >= 1, "PackedKVCache: max_tokens {} must be ≥ 1", n_ctx);
    const double before = heap_bytes();
    seqs_.emplace_back(cfg.kv_shape(n_ctx), codecs_);
    const double tables = std::max(0.0, heap_bytes() - before);  // 0 where the heap cannot be read
    const double need = static_cast<double>(batch) * tables;
    const double phys = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
    check(phys <= 0 || need <= phys,
          "PackedKVCache: batch_size {}: the sequences' layout tables alone need ~{:.1f} GB ({:.2f} MB per sequence, "
          "before any token is stored), more than this machine's {:.1f} GB of memory",
          batch, need / 1e9, tables / 1e6, phys / 1e9);
    seqs_.reserve(static_cast<size_t>(batch));
    for (int b = 1; b < batch; ++b) seqs_.emplace_back(cfg.kv_shape(n_ctx), codecs_);
    capacity_ = n_ctx;
    len_.assign(static_cast<size_t>(batch), std::vector<int64_t>(static_cast<size_t>(cfg.n_layers), 0));
  }

  int batch() const { return static_cast<int>(seqs_.size()); }
  int64_t length(int b, int layer) const { return len_.at(b).at(layer); }
  /// The tokens of every sequence at `layer` (one call per op instead of B).
  std::vector<int64_t> lengths(int layer) const {
    std::vector<int64_t> out;
    for (const auto& l : len_) out.push_back(l.at(layer));
    return out;
  }
  /// Why the batch refuses use until clear() (an append failed after writing some sequences); "" when usable.
  const std::string& unusable() const { return broken_; }

  /// k, v (B, n, n_kv_heads, head_dim) float32, post-RoPE keys; k_pre as k
  /// (pre-RoPE; needed by vq key layers only).
  void append(int layer, F32In k, F32In v, std::optional<F32In> k_pre) {
    const ModelConfig& cfg = codecs_->config();
    check(layer >= 0 && layer < cfg.n_layers, "PackedCache: layer {} outside 0..{}", layer, cfg.n_layers - 1);
    check_shape(k, "PackedKVCache.append: k", {batch(), -1, cfg.n_kv_heads, cfg.head_dim});
    const int64_t n = static_cast<int64_t>(k.shape(1));
    check(n >= 1, "PackedKVCache.append: no tokens");
    check_shape(v, "PackedKVCache.append: v", {batch(), n, cfg.n_kv_heads, cfg.head_dim});
    if (k_pre) check_shape(*k_pre, "PackedKVCache.append: k_pre", {batch(), n, cfg.n_kv_heads, cfg.head_dim});
    check_usable("append");
    // Every sequence holds the same count per layer (appends take all of them at once).
    check(len_[0][layer] + n <= capacity_, "PackedKVCache.append: layer {}: {} cached + {} new tokens exceed capacity "
          "max_tokens = {}", layer, len_[0][layer], n, capacity_);
    // Finite K/V and norms within fp16 are checked per sequence by check_append below (naming the sequence,
    // token, head and channel), not by a scan of the whole batch beside it.
    const size_t per = static_cast<size_t>(n) * cfg.n_kv_heads * cfg.head_dim;
    nb::gil_scoped_release rel;
    std::vector<std::vector<int32_t>> pos(static_cast<size_t>(batch()), std::vector<int32_t>(static_cast<size_t>(n)));
    for (int b = 0; b < batch(); ++b)
      for (int64_t i = 0; i < n; ++i) pos[b][i] = static_cast<int32_t>(len_[b][layer] + i);
    // Every sequence is checked before any is written: one bad sequence leaves the whole batch as it was
    // (before, sequences 0..b-1 were stored while the lengths stayed, and later attention read extra tokens).
    for (int b = 0; b < batch(); ++b)
      with_sequence(b, [&] { seqs_[b].check_append(layer, n, pos[b].data(), k.data() + b * per, v.data() + b * per); });
    for (int b = 0; b < batch(); ++b) {
      const float* kp = k_pre ? k_pre->data() + b * per : k.data() + b * per;
      try {
        with_sequence(b, [&] { seqs_[b].append(layer, n, pos[b].data(), kp, k.data() + b * per, v.data() + b * per); });
      } catch (...) {
        // Only what check_append cannot see (a vq scale beyond fp16, memory) fails here; sequence b is as it was, but
        // 0..b-1 hold the new tokens and cannot give them back: the batch refuses further use until clear().
        if (b > 0)
          broken_ = fmt::format("an append to layer {} failed at sequence {} after sequences 0..{} were written",
                                layer, b, b - 1);
        throw;
      }
      len_[b][layer] += n;
    }
  }

  /// Causal attention of the last n appended tokens' queries q (B, n,
  /// n_heads, head_dim) over the cached codes of `layer`; out same shape.
  void attend(int layer, F32In q, F32Out out, float scale) {
    const ModelConfig& cfg = codecs_->config();
    check(layer >= 0 && layer < cfg.n_layers, "PackedCache: layer {} outside 0..{}", layer, cfg.n_layers - 1);
    check_shape(q, "PackedKVCache.decode_attention: q", {batch(), -1, cfg.n_heads, cfg.head_dim});
    const int64_t n = static_cast<int64_t>(q.shape(1));
    check_shape(out, "PackedKVCache.decode_attention: out", {batch(), n, cfg.n_heads, cfg.head_dim});
    check_usable("decode_attention");
    check_finite(q.data(), q.size(), "query", layer);
    const size_t per = static_cast<size_t>(n) * cfg.n_heads * cfg.head_dim;
    AttnParams p;
    p.scale = scale;
    p.sliding_window = cfg.layer_window(layer);
    nb::gil_scoped_release rel;
    for (int b = 0; b < batch(); ++b) {
      const int64_t T = len_[b][layer];
      check(n <= T, "PackedKVCache.decode_attention: layer {}: {} queries but only {} cached tokens", layer, n, T);
      std::vector<int32_t> pos(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(T - n + i);
      seqs_[b].attend(layer, n, pos.data(), q.data() + b * per, out.data() + b * per, p);
    }
  }

  void clear() {
    for (auto& s : seqs_) s.clear();
    for (auto& l : len_) std::fill(l.begin(), l.end(), 0);
    broken_.clear();
  }
  size_t bytes() const {
    size_t t = 0;
    for (const auto& s : seqs_) t += s.bytes();
    return t;
  }
  size_t page_bytes() const {
    size_t t = 0;
    for (const auto& s : seqs_) t += s.page_bytes();
    return t;
  }

 private:
  void check_usable(const char* what) const {
    check(broken_.empty(), "PackedKVCache.{}: the cache is unusable: {}; clear() it", what, broken_);
  }
  /// Runs f; an Error it throws comes back with the batch index in front ("sequence 1 of 2: …").
  template <class F>
  void with_sequence(int b, F&& f) const {
    try {
      f();
    } catch (const Error& e) {
      throw Error(fmt::format("sequence {} of {}: {}", b, batch(), e.what()));
    }
  }

  std::shared_ptr<const cache::PlanCodecs> codecs_;
  std::vector<cache::PackedKVCache> seqs_;
  std::vector<std::vector<int64_t>> len_;  // [b][layer] tokens appended
  std::string broken_;                       // why the batch refuses use until clear() (empty: usable)
  int64_t capacity_ = 0;                     // tokens per sequence and layer (max_tokens)
};

}  // namespace

void bind_cache(nb::module_& m) {
  nb::class_<PackedBatch>(m, "PackedBatch",
                          "A batch of CPU packed KV caches (include/ratekv/cache/packed_kv_cache.h): codes in the "
                          "packed format, attention from the codes, never the whole cache expanded.")
      .def(nb::init<std::shared_ptr<const cache::PlanCodecs>, int, int64_t>(), nb::arg("codecs"), nb::arg("batch"),
           nb::arg("n_ctx"),
           "Raises RatekvError when a codec kind is not served (kivi, quarot, q8_0, q4_0), naming it, and when the "
           "batch's layout tables alone would not fit in this machine's memory.")
      .def_prop_ro("batch", &PackedBatch::batch)
      .def("length", &PackedBatch::length, nb::arg("b"), nb::arg("layer"))
      .def("lengths", &PackedBatch::lengths, nb::arg("layer"), "tokens stored per sequence at `layer`")
      .def_prop_ro("unusable", &PackedBatch::unusable,
                   "why the batch refuses use until clear() (an append failed after writing some sequences); '' "
                   "when usable")
      .def("append", &PackedBatch::append, nb::arg("layer"), nb::arg("k"), nb::arg("v"), nb::arg("k_pre") = nb::none(),
           "Quantizes and stores n new tokens per sequence: k, v (B, n, n_kv_heads, head_dim) float32.")
      .def("attend", &PackedBatch::attend, nb::arg("layer"), nb::arg("q"), nb::arg("out"), nb::arg("scale"),
           "Causal attention of the last n tokens' queries (B, n, n_heads, head_dim) from the codes into out.")
      .def("clear", &PackedBatch::clear)
      .def_prop_ro("bytes", &PackedBatch::bytes, "bytes held: pages + sink/window rows + positions")
      .def_prop_ro("page_bytes", &PackedBatch::page_bytes, "bytes of the allocated code pages");
}

}  // namespace ratekv::py
