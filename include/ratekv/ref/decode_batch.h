// ratekv/ref/decode_batch.h — the sequences of one decode step on the host,
// as the named CPU references of the GPU kernels (namespace ratekv::ref) take
// them: the fields of cuda::DecodeBatch (include/ratekv/cuda/decode_attention.h)
// in host memory. Pages: docs/packed_format.md §2 (a sequence's logical page
// i = tokens [64i, 64i + 64) lives in physical page page_table[b, i]).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace ratekv::ref {

/// Page table and lengths of a batch of sequences (host memory, borrowed).
struct DecodeBatch {
  std::span<const int32_t> page_table;  ///< (batch, max_pages) physical page ids, row-major
  int max_pages = 0;                    ///< row stride of page_table
  std::span<const int32_t> seq_lens;    ///< (batch) cached tokens per sequence
  /// Sliding window of the attention references (cuda::DecodeBatch::window):
  /// 0 = every cached token; W > 0 = sequence b's query (at position
  /// seq_lens[b] − 1) attends to positions first_visible_key(seq_lens[b] − 1, W)
  /// = max(0, seq_lens[b] − W) .. seq_lens[b] − 1 only — the CPU runtime's
  /// definition (AttnParams::sliding_window, model/kv_cache.h; arithmetic in
  /// model/sliding_window.h). Append / prefill ignore it.
  int window = 0;

  int batch() const { return static_cast<int>(seq_lens.size()); }
  /// Physical page of logical page i of sequence b (not checked).
  int32_t page(int b, int64_t i) const { return page_table[static_cast<size_t>(b) * max_pages + i]; }
};

/// Checks `batch` for an operation on tokens [lo_b, hi_b) of every sequence
/// b over a pool of n_pages pages: attention (n_new = 0) reads
/// [0, seq_lens[b]) and needs seq_lens[b] ≥ 1; append / prefill (n_new ≥ 1)
/// write [seq_lens[b], seq_lens[b] + n_new). Throws Error, naming `what` and
/// the field, unless batch ≥ 1, max_pages ≥ 1, page_table has
/// batch · max_pages entries, every seq_lens[b] ≥ 0, hi_b ≤ 64 · max_pages,
/// every page holding a token of [lo_b, hi_b) is in [0, n_pages), and
/// window ≥ 0. (Attention with a window reads only [first visible key, len),
/// but every page of [0, len) must still be mapped, as for the kernels.)
void check_batch(const DecodeBatch& batch, size_t n_pages, int n_new, const char* what);

}  // namespace ratekv::ref
