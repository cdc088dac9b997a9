// PagePool: pages per layer, the free list, sequences and their page-table
// rows (ratekv/engine/page_pool.h). Host code only.
#include "ratekv/engine/page_pool.h"

#include <algorithm>
#include <limits>

#include "ratekv/common/error.h"
#include "ratekv/engine/cache_format.h"

namespace ratekv::engine {

namespace {

double gib(double bytes) { return bytes / 1073741824.0; }

}  // namespace

PagePool::PagePool(std::vector<size_t> page_bytes, std::string label, const PagePoolOptions& opt)
    : page_bytes_(std::move(page_bytes)), label_(std::move(label)), opt_(opt) {
  const std::string& who = opt_.owner;
  check(!page_bytes_.empty(), "{}: a page pool needs at least one layer", who);
  check(opt_.pages >= 1 && opt_.pages <= std::numeric_limits<int32_t>::max(),
        "{}: PagePoolOptions.pages = {}: expected 1..{} (page ids are int32)", who, opt_.pages,
        std::numeric_limits<int32_t>::max());
  check(opt_.max_seq_pages >= 1 && opt_.max_seq_pages <= std::numeric_limits<int32_t>::max(),
        "{}: PagePoolOptions.max_seq_pages = {}: expected 1..{}", who, opt_.max_seq_pages,
        std::numeric_limits<int32_t>::max());
  for (size_t l = 0; l < page_bytes_.size(); ++l) {
    check(page_bytes_[l] > 0, "{}: layer {} has 0-byte pages", who, l);
    check(page_bytes_[l] <= std::numeric_limits<size_t>::max() / static_cast<size_t>(opt_.pages),
          "{}: layer {}: {} pages of {} bytes overflow size_t", who, l, opt_.pages, page_bytes_[l]);
  }
  base_.assign(page_bytes_.size(), nullptr);
  bound_bytes_.assign(page_bytes_.size(), 0);
  free_.resize(static_cast<size_t>(opt_.pages));
  // pop_back hands out ascending (or, pages_descending, descending) ids.
  for (int64_t i = 0; i < opt_.pages; ++i)
    free_[static_cast<size_t>(i)] = static_cast<int32_t>(opt_.pages_descending ? i : opt_.pages - 1 - i);
}

PagePool PagePool::for_format(const CacheFormat& fmt, const PagePoolOptions& opt) {
  std::vector<size_t> pb(static_cast<size_t>(fmt.n_layers()));
  for (int l = 0; l < fmt.n_layers(); ++l) pb[static_cast<size_t>(l)] = fmt.page_bytes(l);
  return PagePool(std::move(pb), fmt.label(), opt);
}

int PagePool::check_layer(int layer) const {
  check(layer >= 0 && layer < n_layers(), "{}: layer {} outside 0..{}", opt_.owner, layer, n_layers() - 1);
  return layer;
}

size_t PagePool::page_bytes(int layer) const { return page_bytes_[static_cast<size_t>(check_layer(layer))]; }

size_t PagePool::layer_bytes(int layer) const { return page_bytes(layer) * static_cast<size_t>(opt_.pages); }

size_t PagePool::total_bytes() const {
  size_t t = 0;
  for (int l = 0; l < n_layers(); ++l) {
    const size_t b = layer_bytes(l);
    check(t <= std::numeric_limits<size_t>::max() - b, "{}: the pool's bytes overflow size_t", opt_.owner);
    t += b;
  }
  return t;
}

uint64_t PagePool::page_offset(int layer, int64_t page) const {
  check(page >= 0 && page < opt_.pages, "{}: page {} outside 0..{}", opt_.owner, page, opt_.pages - 1);
  return static_cast<uint64_t>(page) * static_cast<uint64_t>(page_bytes(layer));
}

void PagePool::bind_layer(int layer, void* base, size_t bytes) {
  check_layer(layer);
  check(base != nullptr, "{}: layer {}: null memory", opt_.owner, layer);
  check(bytes >= layer_bytes(layer), "{}: layer {}: {} bytes bound, its {} pages of {} bytes need {}", opt_.owner,
        layer, bytes, opt_.pages, page_bytes(layer), layer_bytes(layer));
  base_[static_cast<size_t>(layer)] = static_cast<uint8_t*>(base);
  bound_bytes_[static_cast<size_t>(layer)] = bytes;
}

bool PagePool::bound() const {
  return std::all_of(base_.begin(), base_.end(), [](const uint8_t* p) { return p != nullptr; });
}

uint8_t* PagePool::layer_base(int layer) const {
  uint8_t* p = base_[static_cast<size_t>(check_layer(layer))];
  check(p != nullptr, "{}: layer {}: no memory bound (bind_layer)", opt_.owner, layer);
  return p;
}

uint8_t* PagePool::page_address(int layer, int64_t page) const {
  return layer_base(layer) + page_offset(layer, page);
}

int PagePool::add_sequence(int64_t max_tokens) {
  const std::string& who = opt_.owner;
  check(max_tokens >= 1, "{}: a sequence needs room for at least 1 token (got {})", who, max_tokens);
  const int64_t need = pages_for(max_tokens);
  check(need <= opt_.max_seq_pages,
        "{}: a request of {} tokens needs {} pages; a sequence holds at most {} pages ({} tokens)", who, max_tokens,
        need, opt_.max_seq_pages, opt_.max_seq_pages * kPageTokens);
  check(need <= free_pages(),
        "{}: a request of {} tokens needs {} pages ({} cache); {} pages ({} tokens) are free of {} ({} tokens, "
        "{:.2f} GiB of pages)",
        who, max_tokens, need, label_, free_pages(), free_tokens(), opt_.pages, opt_.pages * kPageTokens,
        gib(static_cast<double>(total_bytes())));
  Seq s;
  s.cap = max_tokens;
  s.pages.resize(static_cast<size_t>(need));
  for (int64_t i = 0; i < need; ++i) {
    s.pages[static_cast<size_t>(i)] = free_.back();
    free_.pop_back();
  }
  const int id = next_id_++;
  seqs_.emplace(id, std::move(s));
  return id;
}

void PagePool::remove_sequence(int id) {
  const Seq& s = seq(id);
  // In reverse, so that the next request gets these ids in the same order.
  for (auto it = s.pages.rbegin(); it != s.pages.rend(); ++it) free_.push_back(*it);
  seqs_.erase(id);
}

std::vector<int> PagePool::sequence_ids() const {
  std::vector<int> ids;
  ids.reserve(seqs_.size());
  for (const auto& [id, s] : seqs_) ids.push_back(id);
  return ids;
}

const PagePool::Seq& PagePool::seq(int id) const {
  auto it = seqs_.find(id);
  check(it != seqs_.end(), "{}: unknown sequence id {}", opt_.owner, id);
  return it->second;
}

PagePool::Seq& PagePool::seq(int id) {
  auto it = seqs_.find(id);
  check(it != seqs_.end(), "{}: unknown sequence id {}", opt_.owner, id);
  return it->second;
}

const std::vector<int32_t>& PagePool::seq_pages(int id) const { return seq(id).pages; }
int64_t PagePool::capacity(int id) const { return seq(id).cap; }
int64_t PagePool::length(int id) const { return seq(id).len; }

void PagePool::check_room(int id, int64_t extra) const {
  const Seq& s = seq(id);
  check(extra >= 0 && s.len + extra <= s.cap,
        "{}: sequence {} has {} tokens and room for {}; {} more do not fit its reservation", opt_.owner, id, s.len,
        s.cap, extra);
}

void PagePool::set_length(int id, int64_t tokens) {
  Seq& s = seq(id);
  check(tokens >= 0 && tokens <= s.cap, "{}: sequence {}: length {} outside its reservation 0..{}", opt_.owner, id,
        tokens, s.cap);
  s.len = tokens;
}

void PagePool::page_table(std::span<const int> ids, std::span<int32_t> rows) const {
  const size_t stride = static_cast<size_t>(opt_.max_seq_pages);
  check(rows.size() == ids.size() * stride, "{}: page table of {} int32 for {} sequences; expected {} (rows of {})",
        opt_.owner, rows.size(), ids.size(), ids.size() * stride, stride);
  for (size_t b = 0; b < ids.size(); ++b) {
    const auto& pg = seq(ids[b]).pages;
    int32_t* row = rows.data() + b * stride;
    std::copy(pg.begin(), pg.end(), row);
    std::fill(row + pg.size(), row + stride, 0);
  }
}

}  // namespace ratekv::engine
