// ratekv/engine/page_pool.h — the page bookkeeping of a paged KV cache on the
// GPU (docs/design.md §10): the one page pool that the GPU engine
// (engine/engine.h) and the Python package's CUDA cache (python/src/bind_cuda.cpp,
// ratekv.ops) both use. Host code only: no CUDA types, no device memory of its
// own, so it is built and tested without a GPU.
//
// Layout. Every layer has the same number of pages (`pages`); a page holds 64
// tokens of all KV heads of one layer, page_bytes(l) bytes (CacheFormat::
// page_bytes: fp16 K/V or a plan's packed codes, docs/packed_format.md). Page
// p of layer l starts at byte p · page_bytes(l) of that layer's memory — a
// 64-bit offset (a layer's pages may exceed 4 GiB). The memory is the owner's:
// the engine cudaMallocs it, Python allocates torch tensors (so torch's
// allocator, CUDA graphs and torch.compile see it); the owner binds each
// layer's base pointer with bind_layer.
//
// Sequences. add_sequence(max_tokens) reserves ⌈max_tokens / 64⌉ pages for
// the whole request up front and returns an id (0, 1, 2, … in order); a
// request that does not fit is an Error before any page changes hands.
// Pages are handed out from a free list: with pages_descending = false the
// lowest free id first (a fresh pool gives sequence 0 pages 0, 1, 2, …), with
// true the highest first (tests of 64-bit offsets); remove_sequence returns a
// sequence's pages so that the next request gets the same ids in the same
// order. A sequence's page table row (what the kernels read,
// cuda::DecodeBatch::page_table) is its page ids, logical page i at element i,
// zero-padded to the row stride max_seq_pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace ratekv::engine {

class CacheFormat;

/// Sizes and switches of a PagePool.
struct PagePoolOptions {
  int64_t pages = 0;              ///< pages per layer, 1..2^31 − 1 (page ids are int32)
  int64_t max_seq_pages = 0;      ///< page-table row stride: most pages one sequence holds, ≥ 1
  bool pages_descending = false;  ///< hand out the highest free page first
  std::string owner = "page pool";  ///< prefix of error messages ("GPU engine", "CUDA packed cache")
};

class PagePool {
 public:
  /// Tokens per page (packed::kPageTokens).
  static constexpr int64_t kPageTokens = 64;
  /// Pages that hold `tokens` tokens: ⌈tokens / 64⌉ (tokens ≥ 0).
  static int64_t pages_for(int64_t tokens) { return (tokens + kPageTokens - 1) / kPageTokens; }

  /// A pool of opt.pages pages per layer, layer l's pages page_bytes[l] bytes
  /// each; `label` names the cache in messages ("fp16", "K3V3", …). Throws
  /// Error when page_bytes is empty or holds a 0, pages or max_seq_pages is
  /// outside its range, or a layer's bytes (pages · page_bytes) overflow
  /// size_t.
  PagePool(std::vector<size_t> page_bytes, std::string label, const PagePoolOptions& opt);
  /// The pool for `fmt`'s pages (CacheFormat::page_bytes, label).
  static PagePool for_format(const CacheFormat& fmt, const PagePoolOptions& opt);

  const std::string& label() const { return label_; }
  const PagePoolOptions& options() const { return opt_; }
  int n_layers() const { return static_cast<int>(page_bytes_.size()); }
  /// Pages per layer.
  int64_t pages() const { return opt_.pages; }
  /// Page-table row stride (int32 elements).
  int64_t max_seq_pages() const { return opt_.max_seq_pages; }
  /// Bytes of one page of `layer`. Error for a layer outside 0..n_layers−1.
  size_t page_bytes(int layer) const;
  /// Bytes of all pages of `layer` (pages · page_bytes): what its owner allocates.
  size_t layer_bytes(int layer) const;
  /// Σ over layers of layer_bytes.
  size_t total_bytes() const;
  /// Byte offset of page `page` within `layer`'s memory: page · page_bytes(layer),
  /// in 64 bits. Error for a page outside 0..pages−1.
  uint64_t page_offset(int layer, int64_t page) const;

  /// Binds `layer`'s memory (device pointer, `bytes` long). Error when bytes <
  /// layer_bytes(layer) or base is null.
  void bind_layer(int layer, void* base, size_t bytes);
  /// Whether every layer is bound.
  bool bound() const;
  /// The base pointer of `layer` (Error when not bound).
  uint8_t* layer_base(int layer) const;
  /// layer_base(layer) + page_offset(layer, page).
  uint8_t* page_address(int layer, int64_t page) const;

  /// Free pages / the tokens they hold.
  int64_t free_pages() const { return static_cast<int64_t>(free_.size()); }
  int64_t free_tokens() const { return free_pages() * kPageTokens; }

  /// Reserves the pages of a sequence of up to max_tokens tokens; returns its
  /// id. Throws Error, with nothing reserved, when max_tokens < 1, needs more
  /// pages than a page-table row holds (max_seq_pages), or more pages than are
  /// free — the message names the request (tokens, pages) and what is free
  /// and in the pool (pages, tokens, GiB).
  int add_sequence(int64_t max_tokens);
  /// Returns a sequence's pages to the free list. Error for an unknown id.
  void remove_sequence(int id);
  bool has_sequence(int id) const { return seqs_.count(id) != 0; }
  int n_sequences() const { return static_cast<int>(seqs_.size()); }
  /// Ids of the live sequences, ascending.
  std::vector<int> sequence_ids() const;

  /// Physical page ids of `id` (logical page i → element i). Error for an unknown id.
  const std::vector<int32_t>& seq_pages(int id) const;
  /// Tokens reserved for `id` (add_sequence's max_tokens).
  int64_t capacity(int id) const;
  /// Tokens stored in `id` (set by the owner; 0 after add_sequence).
  int64_t length(int id) const;
  /// Throws Error, naming the sequence, its length and capacity, when `extra`
  /// more tokens do not fit its reservation.
  void check_room(int id, int64_t extra) const;
  /// Sets the stored length (0..capacity, else Error).
  void set_length(int id, int64_t tokens);

  /// Page-table rows of `ids` in order: rows (ids.size() · max_seq_pages) int32,
  /// row b holds seq_pages(ids[b]) then zeros. Error for an unknown id or
  /// rows of another size.
  void page_table(std::span<const int> ids, std::span<int32_t> rows) const;

 private:
  struct Seq {
    std::vector<int32_t> pages;
    int64_t len = 0, cap = 0;
  };
  int check_layer(int layer) const;
  const Seq& seq(int id) const;
  Seq& seq(int id);

  std::vector<size_t> page_bytes_;
  std::string label_;
  PagePoolOptions opt_;
  std::vector<uint8_t*> base_;
  std::vector<size_t> bound_bytes_;
  std::vector<int32_t> free_;  // back() is handed out next
  std::map<int, Seq> seqs_;
  int next_id_ = 0;
};

}  // namespace ratekv::engine
