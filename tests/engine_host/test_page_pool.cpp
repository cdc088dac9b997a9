// engine::PagePool (include/ratekv/engine/page_pool.h), the page bookkeeping
// the GPU engine and the Python CUDA cache share. Host code: runs in CI
// without a GPU. Expected page ids are worked out by hand from the header's
// rule (lowest free id first, or highest with pages_descending; freed pages
// come back so that the next request gets them in the same order).
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "ratekv/common/error.h"
#include "ratekv/engine/cache_format.h"
#include "ratekv/engine/page_pool.h"
#include "ratekv/eval/baseline_plans.h"
#include "ratekv/model/synthetic.h"

namespace {

using namespace ratekv;
using engine::PagePool;
using engine::PagePoolOptions;
using Pages = std::vector<int32_t>;

PagePoolOptions opts(int64_t pages, int64_t max_seq_pages, bool desc = false) {
  PagePoolOptions o;
  o.pages = pages;
  o.max_seq_pages = max_seq_pages;
  o.pages_descending = desc;
  o.owner = "test pool";
  return o;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_has(const std::string& s, const std::string& part) {
  EXPECT_NE(s.find(part), std::string::npos) << "'" << part << "' not in: " << s;
}

TEST(PagePool, HandsOutLowestPagesFirstAndHighestWhenDescending) {
  PagePool p({1000, 3000}, "K3V3", opts(10, 8));
  EXPECT_EQ(p.add_sequence(100), 0);  // 2 pages
  EXPECT_EQ(p.add_sequence(64), 1);   // exactly 1 page
  EXPECT_EQ(p.add_sequence(1), 2);    // 1 page
  EXPECT_EQ(p.add_sequence(65), 3);   // 2 pages
  EXPECT_EQ(p.seq_pages(0), (Pages{0, 1}));
  EXPECT_EQ(p.seq_pages(1), (Pages{2}));
  EXPECT_EQ(p.seq_pages(2), (Pages{3}));
  EXPECT_EQ(p.seq_pages(3), (Pages{4, 5}));
  EXPECT_EQ(p.free_pages(), 4);
  EXPECT_EQ(p.free_tokens(), 256);
  EXPECT_EQ(p.capacity(0), 100);
  EXPECT_EQ(p.length(0), 0);

  PagePool d({1000}, "fp16", opts(10, 8, true));
  d.add_sequence(100);
  d.add_sequence(1);
  EXPECT_EQ(d.seq_pages(0), (Pages{9, 8}));
  EXPECT_EQ(d.seq_pages(1), (Pages{7}));
}

TEST(PagePool, ExhaustionIsRefusedNamingBothNumbersAndReservesNothing) {
  PagePool p({262144}, "fp16", opts(10, 10));
  p.add_sequence(256);  // pages 0..3
  // 6 pages (384 tokens) free; 400 tokens need 7.
  const std::string e = error_of([&] { p.add_sequence(400); });
  expect_has(e, "test pool: a request of 400 tokens needs 7 pages (fp16 cache)");
  expect_has(e, "6 pages (384 tokens) are free of 10 (640 tokens");
  expect_has(e, "0.00 GiB of pages");  // 10 · 256 KiB = 2.5 MiB
  EXPECT_EQ(p.free_pages(), 6);
  EXPECT_EQ(p.n_sequences(), 1);
  // The refused request took nothing: the next one gets pages 4.. as if it never happened.
  const int s = p.add_sequence(384);
  EXPECT_EQ(p.seq_pages(s), (Pages{4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(p.free_pages(), 0);
  expect_has(error_of([&] { p.add_sequence(1); }), "needs 1 pages (fp16 cache); 0 pages (0 tokens) are free of 10");
  // A request past one page-table row, and an empty one.
  PagePool q({100}, "x", opts(100, 3));
  expect_has(error_of([&] { q.add_sequence(193); }),
             "a request of 193 tokens needs 4 pages; a sequence holds at most 3 pages (192 tokens)");
  EXPECT_NO_THROW(q.add_sequence(192));
  expect_has(error_of([&] { q.add_sequence(0); }), "at least 1 token (got 0)");
}

TEST(PagePool, FreedPagesAreReusedInTheirOrder) {
  PagePool p({512, 512}, "K2V2", opts(10, 10));
  const int a = p.add_sequence(128);  // 0, 1
  const int b = p.add_sequence(192);  // 2, 3, 4
  EXPECT_EQ(p.seq_pages(b), (Pages{2, 3, 4}));
  p.remove_sequence(a);
  EXPECT_FALSE(p.has_sequence(a));
  EXPECT_EQ(p.free_pages(), 7);
  const int c = p.add_sequence(10);   // the lowest freed page
  const int d = p.add_sequence(100);  // the other freed page, then the first never used
  EXPECT_EQ(p.seq_pages(c), (Pages{0}));
  EXPECT_EQ(p.seq_pages(d), (Pages{1, 5}));
  EXPECT_EQ(c, 2);  // ids are never reused
  EXPECT_EQ(d, 3);
  EXPECT_EQ(p.sequence_ids(), (std::vector<int>{1, 2, 3}));
  // The free list is a stack: the pages freed last come first. Removing 1 ({2, 3, 4}),
  // 2 ({0}), 3 ({1, 5}) leaves, top first, 1 5 0 2 3 4 and then the never-used 6..9.
  for (int id : p.sequence_ids()) p.remove_sequence(id);
  EXPECT_EQ(p.free_tokens(), 640);
  const int all = p.add_sequence(640);
  EXPECT_EQ(p.seq_pages(all), (Pages{1, 5, 0, 2, 3, 4, 6, 7, 8, 9}));
  expect_has(error_of([&] { p.remove_sequence(a); }), "test pool: unknown sequence id 0");
  expect_has(error_of([&] { p.seq_pages(77); }), "unknown sequence id 77");
}

// Llama-3.1-8B K3V3 pages are 51200 bytes (tests/engine/test_memory_plan.cpp):
// 100000 of them are 5.12e9 bytes per layer, past 2^32; the last page's offset
// 99999 · 51200 = 5119948800 does not fit 32 bits (signed or not).
TEST(PagePool, OffsetsPast4GiBAre64Bit) {
  const ModelConfig c = synthetic_config("llama-3.1-8b", 2);
  const engine::CacheFormat k3 =
      engine::CacheFormat::packed(std::make_shared<const cache::PlanCodecs>(eval::cache_type_plan("tq3", "tq3", c), c));
  PagePool p = PagePool::for_format(k3, opts(100000, 2048, true));
  EXPECT_EQ(p.label(), "K3V3");
  EXPECT_EQ(p.n_layers(), 2);
  EXPECT_EQ(p.page_bytes(1), size_t{51200});
  EXPECT_EQ(p.layer_bytes(0), size_t{5120000000});
  EXPECT_EQ(p.total_bytes(), size_t{10240000000});
  EXPECT_EQ(p.page_offset(1, 99999), uint64_t{5119948800});
  EXPECT_GT(p.page_offset(1, 99999), uint64_t{std::numeric_limits<uint32_t>::max()});
  const int s = p.add_sequence(200);  // descending: the pool's last pages, offsets past 4 GiB
  EXPECT_EQ(p.seq_pages(s), (Pages{99999, 99998, 99997, 99996}));
  EXPECT_EQ(p.page_offset(0, p.seq_pages(s)[3]), uint64_t{99996} * 51200);
  expect_has(error_of([&] { p.page_offset(0, 100000); }), "page 100000 outside 0..99999");
  // A pool whose bytes overflow size_t is refused when built.
  expect_has(error_of([&] { PagePool({std::numeric_limits<size_t>::max() / 2}, "x", opts(3, 1)); }),
             "layer 0: 3 pages of");
}

TEST(PagePool, PageTableRowsOfUnequalLengths) {
  PagePool p({640}, "K4V4", opts(16, 4));
  // Lengths 1, 97, 64, 65, 200: 1, 2, 1, 2, 4 pages.
  std::vector<int> ids;
  for (int64_t n : {1, 97, 64, 65, 200}) ids.push_back(p.add_sequence(n));
  std::vector<int32_t> rows(ids.size() * 4, -1);
  p.page_table(ids, rows);
  EXPECT_EQ(rows, (Pages{0, 0, 0, 0,  //
                         1, 2, 0, 0,  //
                         3, 0, 0, 0,  //
                         4, 5, 0, 0,  //
                         6, 7, 8, 9}));
  // Any subset, in any order (a decode batch).
  const std::vector<int> batch = {ids[4], ids[1]};
  std::vector<int32_t> two(8);
  p.page_table(batch, two);
  EXPECT_EQ(two, (Pages{6, 7, 8, 9, 1, 2, 0, 0}));
  std::vector<int32_t> wrong(7);
  expect_has(error_of([&] { p.page_table(batch, wrong); }), "page table of 7 int32 for 2 sequences; expected 8");
}

TEST(PagePool, LengthsStayInsideTheReservation) {
  PagePool p({64}, "x", opts(4, 4));
  const int s = p.add_sequence(40);
  p.set_length(s, 30);
  EXPECT_EQ(p.length(s), 30);
  EXPECT_NO_THROW(p.check_room(s, 10));
  expect_has(error_of([&] { p.check_room(s, 11); }),
             "sequence 0 has 30 tokens and room for 40; 11 more do not fit its reservation");
  expect_has(error_of([&] { p.set_length(s, 41); }), "length 41 outside its reservation 0..40");
  EXPECT_EQ(p.length(s), 30);
}

TEST(PagePool, MemoryIsTheOwnersAndBoundPerLayer) {
  PagePool p({100, 300}, "x", opts(5, 5));
  EXPECT_FALSE(p.bound());
  expect_has(error_of([&] { p.layer_base(0); }), "layer 0: no memory bound");
  std::vector<uint8_t> m0(500), m1(1500);
  expect_has(error_of([&] { p.bind_layer(1, m1.data(), 1499); }),
             "layer 1: 1499 bytes bound, its 5 pages of 300 bytes need 1500");
  p.bind_layer(0, m0.data(), m0.size());
  p.bind_layer(1, m1.data(), m1.size());
  EXPECT_TRUE(p.bound());
  EXPECT_EQ(p.page_address(1, 4), m1.data() + 1200);
  EXPECT_EQ(p.page_address(0, 3), m0.data() + 300);
  expect_has(error_of([&] { p.page_bytes(2); }), "layer 2 outside 0..1");
}

TEST(PagePool, BadSizesAreRefused) {
  expect_has(error_of([] { PagePool({}, "x", opts(1, 1)); }), "at least one layer");
  expect_has(error_of([] { PagePool({10, 0}, "x", opts(1, 1)); }), "layer 1 has 0-byte pages");
  expect_has(error_of([] { PagePool({10}, "x", opts(0, 1)); }), "PagePoolOptions.pages = 0");
  expect_has(error_of([] { PagePool({10}, "x", opts(int64_t{1} << 31, 1)); }), "PagePoolOptions.pages = 2147483648");
  expect_has(error_of([] { PagePool({10}, "x", opts(4, 0)); }), "PagePoolOptions.max_seq_pages = 0");
}

// The pool sized from a CacheFormat takes its page bytes: fp16 pages of the tiny
// config are K then V, 64 tokens × head_dim 64 × 2 KV heads × 2 bytes each.
TEST(PagePool, FromAnFp16CacheFormat) {
  const ModelConfig c = synthetic_config("tiny-llama");
  PagePool p = PagePool::for_format(engine::CacheFormat::fp16(c), opts(3, 3));
  EXPECT_EQ(p.label(), "fp16");
  EXPECT_EQ(p.n_layers(), c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) EXPECT_EQ(p.page_bytes(l), size_t{2 * 64 * 64 * 2 * 2});
}

}  // namespace
