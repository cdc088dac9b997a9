// Continuous batching (ratekv/engine/scheduler.h).
#include "ratekv/engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <deque>

#include <fmt/format.h>

#include "ratekv/common/error.h"

namespace ratekv::engine {

namespace {
constexpr int64_t kPage = 64;
int64_t reserve_tokens(const Request& r) {
  return static_cast<int64_t>(r.prompt.size()) + r.n_predict;  // the last generated token is never cached: 1 spare
}
int64_t whole_pages(int64_t tokens) { return (tokens + kPage - 1) / kPage * kPage; }
}  // namespace

Scheduler::Scheduler(Executor& ex, SchedulerOptions opt) : ex_(ex), opt_(std::move(opt)) {
  check(opt_.prefill_chunk >= 0 && opt_.prefill_chunk % kPage == 0,
        "SchedulerOptions.prefill_chunk {}: expected 0 (whole prompts) or a multiple of {}", opt_.prefill_chunk, kPage);
  check(opt_.prefill_token_budget >= 1, "SchedulerOptions.prefill_token_budget {}: expected >= 1",
        opt_.prefill_token_budget);
}

size_t Scheduler::submit(Request r) {
  check(!r.prompt.empty(), "Scheduler::submit: request {} has an empty prompt", reqs_.size());
  check(r.n_predict >= 0, "Scheduler::submit: request {} has n_predict {} (expected >= 0)", reqs_.size(), r.n_predict);
  r.sampling.validate();
  reqs_.push_back(std::move(r));
  return reqs_.size() - 1;
}

std::vector<RequestResult> Scheduler::run(const std::function<void(size_t, const RequestResult&)>& on_done) {
  using clk = std::chrono::steady_clock;
  const auto t0 = clk::now();
  auto now = [&] { return std::chrono::duration<double>(clk::now() - t0).count(); };
  std::vector<RequestResult> res(reqs_.size());
  struct Live {
    size_t idx;
    int seq;
    int64_t prefilled = 0;  // prompt tokens run
    int32_t last = -1;      // last generated token (not yet in the cache)
  };
  std::deque<size_t> queue;
  for (size_t i = 0; i < reqs_.size(); ++i) queue.push_back(i);
  std::vector<Live> live;
  stats_ = SchedulerStats{};

  auto finish = [&](size_t i, const std::string& why) {
    res[i].finish = why;
    res[i].t_done = now();
    if (on_done) on_done(i, res[i]);
  };
  // After token `t` of live request L: finished?
  auto done_after = [&](const Live& L, int32_t t) {
    const Request& r = reqs_[L.idx];
    if (opt_.is_eog && opt_.is_eog(t)) return std::string("eog");
    if (static_cast<int>(res[L.idx].tokens.size()) >= r.n_predict) return std::string("length");
    return std::string();
  };
  auto release = [&](size_t pos, const std::string& why) {
    ex_.remove_sequence(live[pos].seq);
    finish(live[pos].idx, why);
    live.erase(live.begin() + static_cast<std::ptrdiff_t>(pos));
  };

  while (!queue.empty() || !live.empty()) {
    ++stats_.steps;
    // 1. admission (first come, first served).
    while (!queue.empty() && static_cast<int>(live.size()) < ex_.max_batch()) {
      const size_t i = queue.front();
      const Request& r = reqs_[i];
      if (r.n_predict == 0) {  // nothing to generate: no sequence needed
        queue.pop_front();
        finish(i, "length");
        continue;
      }
      const int64_t need = reserve_tokens(r);
      std::string never;
      if (need > ex_.context_limit())
        never = fmt::format("request {}: prompt {} + n_predict {} tokens exceed the context limit {}", i,
                            r.prompt.size(), r.n_predict, ex_.context_limit());
      else if (whole_pages(need) > ex_.capacity_tokens())
        never = fmt::format("request {}: prompt {} + n_predict {} tokens need {} tokens of pages; the pool holds {}", i,
                            r.prompt.size(), r.n_predict, whole_pages(need), ex_.capacity_tokens());
      if (!never.empty()) {
        queue.pop_front();
        res[i].error = never;
        finish(i, "error");
        continue;
      }
      if (whole_pages(need) > ex_.free_tokens()) break;  // waits for pages
      Live L{i, ex_.add_sequence(need)};
      queue.pop_front();
      res[i].t_admitted = now();
      live.push_back(L);
    }
    stats_.max_concurrent = std::max(stats_.max_concurrent, static_cast<int>(live.size()));
    check(!live.empty() || queue.empty(), "Scheduler: internal: nothing runs and the queue's head was not admitted");
    // 2. prefill chunks within the step's budget.
    int64_t budget = opt_.prefill_token_budget;
    bool ran_any = false;
    for (size_t p = 0; p < live.size();) {
      Live& L = live[p];
      const Request& r = reqs_[L.idx];
      const int64_t n = static_cast<int64_t>(r.prompt.size());
      bool released = false;
      while (L.prefilled < n && (budget > 0 || !ran_any)) {
        const int64_t c = opt_.prefill_chunk > 0 ? std::min(opt_.prefill_chunk, n - L.prefilled) : n - L.prefilled;
        const bool last = L.prefilled + c == n;
        const std::span<const int32_t> chunk(r.prompt.data() + L.prefilled, static_cast<size_t>(c));
        const int32_t t = ex_.prefill(L.seq, chunk, last, r.sampling, sampling_uniform(r.sampling.seed, 0));
        L.prefilled += c;
        budget -= c;
        ran_any = true;
        stats_.prompt_tokens += c;
        if (last) {
          res[L.idx].tokens.push_back(t);
          res[L.idx].t_first_token = now();
          ++stats_.output_tokens;
          L.last = t;
          if (const std::string why = done_after(L, t); !why.empty()) {
            release(p, why);
            released = true;
          }
          break;
        }
      }
      if (!released) ++p;
      if (budget <= 0 && ran_any) break;
    }
    // 3. one decode step of every request past its prefill.
    std::vector<size_t> pos;
    std::vector<int> seqs;
    std::vector<int32_t> toks, next;
    std::vector<SamplingParams> sps;
    std::vector<double> us;
    for (size_t p = 0; p < live.size(); ++p) {
      const Live& L = live[p];
      if (L.prefilled < static_cast<int64_t>(reqs_[L.idx].prompt.size())) continue;
      pos.push_back(p);
      seqs.push_back(L.seq);
      toks.push_back(L.last);
      sps.push_back(reqs_[L.idx].sampling);
      us.push_back(sampling_uniform(reqs_[L.idx].sampling.seed, static_cast<int64_t>(res[L.idx].tokens.size())));
    }
    if (!seqs.empty()) {
      next.resize(seqs.size());
      ex_.decode(seqs, toks, sps, us, next);
      ++stats_.decode_steps;
      std::vector<std::pair<size_t, std::string>> done;
      for (size_t b = 0; b < seqs.size(); ++b) {
        Live& L = live[pos[b]];
        res[L.idx].tokens.push_back(next[b]);
        ++stats_.output_tokens;
        L.last = next[b];
        if (std::string why = done_after(L, next[b]); !why.empty()) done.emplace_back(pos[b], why);
      }
      for (auto it = done.rbegin(); it != done.rend(); ++it) release(it->first, it->second);  // back to front
    }
  }
  stats_.seconds = now();
  return res;
}

}  // namespace ratekv::engine
