// The continuous-batching scheduler (ratekv/engine/scheduler.h) against a
// fake executor that keeps the engine's page accounting (64-token pages
// reserved up front, refused past the pool) and produces deterministic
// tokens from each sequence's whole history — so a token fed to the wrong
// sequence, a chunk skipped or repeated, or a page not returned changes the
// results. Host only (runs in CI).
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "ratekv/common/error.h"
#include "ratekv/engine/scheduler.h"

namespace {

using namespace ratekv;
using namespace ratekv::engine;

// The token that follows `history` (all tokens of a sequence so far).
int32_t next_of(const std::vector<int32_t>& history) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : history) h = (h ^ static_cast<uint32_t>(t)) * 1099511628211ull;
  return static_cast<int32_t>(h % 1000);
}

struct FakeExecutor : Executor {
  int batch;
  int64_t pages, ctx;
  int64_t free_pages;
  int next_id = 0;
  struct Seq {
    std::vector<int32_t> hist;
    int64_t cap = 0;
    int64_t pages = 0;
  };
  std::map<int, Seq> seqs;
  std::vector<std::string> log;  // "P<seq>:<n>" prefill chunks, "D<B>" decode steps
  int max_held = 0;

  FakeExecutor(int b, int64_t n_pages, int64_t context) : batch(b), pages(n_pages), ctx(context), free_pages(n_pages) {}
  int max_batch() const override { return batch; }
  int64_t free_tokens() const override { return free_pages * 64; }
  int64_t capacity_tokens() const override { return pages * 64; }
  int64_t context_limit() const override { return ctx; }
  int add_sequence(int64_t max_tokens) override {
    const int64_t need = (max_tokens + 63) / 64;
    check(need <= free_pages, "fake: {} pages needed, {} free", need, free_pages);
    free_pages -= need;
    seqs[next_id] = Seq{{}, max_tokens, need};
    max_held = std::max(max_held, static_cast<int>(seqs.size()));
    return next_id++;
  }
  void remove_sequence(int seq) override {
    free_pages += seqs.at(seq).pages;
    seqs.erase(seq);
  }
  int32_t prefill(int seq, std::span<const int32_t> tokens, bool last, const SamplingParams& sp, double) override {
    Seq& s = seqs.at(seq);
    EXPECT_EQ(s.hist.size() % 64, 0u) << "a chunk starts at a page boundary";
    s.hist.insert(s.hist.end(), tokens.begin(), tokens.end());
    EXPECT_LE(static_cast<int64_t>(s.hist.size()), s.cap);
    log.push_back("P" + std::to_string(seq) + ":" + std::to_string(tokens.size()));
    return last ? next_of(s.hist) + (sp.greedy() ? 0 : 1000) : -1;
  }
  void decode(std::span<const int> ids, std::span<const int32_t> toks, std::span<const SamplingParams>,
              std::span<const double>, std::span<int32_t> next) override {
    EXPECT_LE(static_cast<int>(ids.size()), batch);
    for (size_t b = 0; b < ids.size(); ++b) {
      Seq& s = seqs.at(ids[b]);
      s.hist.push_back(toks[b]);
      EXPECT_LE(static_cast<int64_t>(s.hist.size()), s.cap) << "decode past the reservation";
      next[b] = next_of(s.hist);
    }
    log.push_back("D" + std::to_string(ids.size()));
  }
};

// What a request yields alone: prompt, then n tokens each following the history.
std::vector<int32_t> alone(const Request& r, const std::function<bool(int32_t)>& eog = {}) {
  std::vector<int32_t> h = r.prompt, out;
  for (int i = 0; i < r.n_predict; ++i) {
    const int32_t t = next_of(h);
    out.push_back(t);
    h.push_back(t);
    if (eog && eog(t)) break;
  }
  return out;
}

Request req(int n_prompt, int n_predict, uint32_t seed) {
  std::mt19937 g(seed);
  Request r;
  r.prompt.resize(n_prompt);
  for (auto& t : r.prompt) t = static_cast<int32_t>(g() % 5000);
  r.n_predict = n_predict;
  return r;
}

// Many requests of unequal lengths through a small batch and pool: each gets
// exactly its alone tokens; no more than max_batch run; pages all return.
TEST(Scheduler, EveryRequestGetsItsAloneTokens) {
  for (int64_t chunk : {int64_t{0}, int64_t{64}, int64_t{128}}) {
    FakeExecutor ex(3, 40, 4096);  // 40 pages = 2560 tokens
    SchedulerOptions o;
    o.prefill_chunk = chunk;
    o.prefill_token_budget = 128;
    Scheduler s(ex, o);
    std::vector<Request> rs;
    const int lens[][2] = {{1, 5}, {97, 30}, {300, 12}, {64, 1}, {130, 40}, {7, 64}, {500, 3}, {65, 20}};
    for (int i = 0; i < 8; ++i) rs.push_back(req(lens[i][0], lens[i][1], 10 + i));
    for (const auto& r : rs) s.submit(r);
    std::vector<size_t> order;
    const auto res = s.run([&](size_t i, const RequestResult&) { order.push_back(i); });
    ASSERT_EQ(res.size(), rs.size());
    for (size_t i = 0; i < rs.size(); ++i) {
      EXPECT_EQ(res[i].finish, "length") << i;
      EXPECT_EQ(res[i].tokens, alone(rs[i])) << "request " << i << " chunk " << chunk;
      EXPECT_LE(res[i].t_admitted, res[i].t_first_token);
      EXPECT_LE(res[i].t_first_token, res[i].t_done);
    }
    EXPECT_EQ(order.size(), rs.size());
    EXPECT_LE(ex.max_held, 3);
    EXPECT_EQ(s.stats().max_concurrent, ex.max_held);
    EXPECT_EQ(ex.free_pages, 40);
    EXPECT_TRUE(ex.seqs.empty());
    int64_t prompt = 0, out = 0;
    for (size_t i = 0; i < rs.size(); ++i) prompt += rs[i].prompt.size(), out += rs[i].n_predict;
    EXPECT_EQ(s.stats().prompt_tokens, prompt);
    EXPECT_EQ(s.stats().output_tokens, out);
    if (chunk > 0) {  // every prefill call is at most a chunk
      for (const auto& e : ex.log) {
        if (e[0] == 'P') {
          EXPECT_LE(std::stoi(e.substr(e.find(':') + 1)), chunk) << e;
        }
      }
    }
  }
}

// Admission waits for pages: a pool of 10 pages holds two 4-page requests at
// a time; the third starts only after one finished (FCFS, no overtaking:
// a small fourth request does not jump ahead of the waiting third).
TEST(Scheduler, AdmissionWaitsForFreedPages) {
  FakeExecutor ex(8, 10, 4096);
  Scheduler s(ex, SchedulerOptions{});
  s.submit(req(200, 40, 1));   // 240 tokens: 4 pages
  s.submit(req(200, 10, 2));   // 4 pages
  s.submit(req(200, 30, 3));   // 4 pages: waits
  s.submit(req(10, 5, 4));     // 1 page: would fit, but comes after the third
  std::vector<size_t> order;
  const auto res = s.run([&](size_t i, const RequestResult&) { order.push_back(i); });
  // request 1 (10 tokens) finishes first and makes room for 2, then 3 joins;
  // sequence ids follow admission, so the fourth did not overtake the third.
  ASSERT_EQ(order.size(), 4u);
  EXPECT_EQ(order[0], 1u);
  std::vector<std::string> prefills;
  int decodes_before_third = 0;
  for (const auto& e : ex.log) {
    if (e[0] == 'P') prefills.push_back(e);
    if (e[0] == 'D' && prefills.size() == 2) ++decodes_before_third;
  }
  EXPECT_EQ(prefills, (std::vector<std::string>{"P0:200", "P1:200", "P2:200", "P3:10"}));
  EXPECT_EQ(decodes_before_third, 9) << "the third starts when the second's 10 tokens are done";
  EXPECT_LE(ex.max_held, 3);
  EXPECT_GE(res[2].t_admitted, res[1].t_done);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(res[i].finish, "length");
  EXPECT_EQ(ex.free_pages, 10);
}

// While one request decodes, another's prompt is prefilled chunk by chunk
// between its decode steps (budget one chunk per step).
TEST(Scheduler, PrefillInterleavesWithDecode) {
  FakeExecutor ex(4, 100, 4096);
  SchedulerOptions o;
  o.prefill_chunk = 64;
  o.prefill_token_budget = 64;
  Scheduler s(ex, o);
  s.submit(req(10, 20, 1));
  s.submit(req(320, 3, 2));  // 5 chunks
  s.run();
  // Expected: P0:10, D1 (request 0's first decode) ... request 1's 5 chunks each followed by a decode of request 0.
  std::vector<std::string> want = {"P0:10", "P1:64", "D1", "P1:64", "D1", "P1:64", "D1", "P1:64", "D1", "P1:64", "D2"};
  ASSERT_GE(ex.log.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(ex.log[i], want[i]) << i;
}

// End-of-generation stops a request early and frees its pages; n_predict 0
// needs no sequence; a request that can never fit ends with an error naming
// the sizes and the others still run; bad requests are refused at submit.
TEST(Scheduler, EogNeverFitsAndBadRequests) {
  FakeExecutor ex(2, 8, 1000);  // 512 tokens of pages, context 1000
  SchedulerOptions o;
  const int32_t stop = alone(req(30, 50, 7))[4];
  o.is_eog = [&](int32_t t) { return t == stop; };
  Scheduler s(ex, o);
  s.submit(req(30, 50, 7));    // stops at its 5th token
  s.submit(req(600, 100, 8));  // 700 tokens: past the pool (512)
  s.submit(req(900, 200, 9));  // past the context limit
  s.submit(req(5, 0, 10));     // nothing to generate
  s.submit(req(40, 6, 11));
  const auto res = s.run();
  EXPECT_EQ(res[0].finish, "eog");
  EXPECT_EQ(res[0].tokens.size(), 5u);
  EXPECT_EQ(res[0].tokens.back(), stop);
  EXPECT_EQ(res[1].finish, "error");
  EXPECT_NE(res[1].error.find("the pool holds 512"), std::string::npos) << res[1].error;
  EXPECT_EQ(res[2].finish, "error");
  EXPECT_NE(res[2].error.find("context limit 1000"), std::string::npos) << res[2].error;
  EXPECT_EQ(res[3].finish, "length");
  EXPECT_TRUE(res[3].tokens.empty());
  EXPECT_EQ(res[4].tokens, alone(req(40, 6, 11)));
  EXPECT_EQ(ex.free_pages, 8);
  Request empty;
  EXPECT_THROW(s.submit(empty), Error);
  Request neg = req(3, -1, 1);
  EXPECT_THROW(s.submit(neg), Error);
  Request badp = req(3, 1, 1);
  badp.sampling.temperature = 1.f;
  badp.sampling.top_p = 0.f;
  EXPECT_THROW(s.submit(badp), Error);
  SchedulerOptions bad;
  bad.prefill_chunk = 100;
  EXPECT_THROW(Scheduler(ex, bad), Error);
}

}  // namespace
