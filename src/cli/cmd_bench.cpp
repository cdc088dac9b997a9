// `ratekv bench`: prefill and decode speed in llama-bench's manner (issue 17):
//   ratekv bench (-m MODEL | --synthetic NAME) [-p 512] [-n 128] [-d 0,32768] [-b 1,4]
//                [-ctk f16,tq3 -ctv f16,tq3 | --plan P ...] [--device cpu|cuda] [-r 3]
//                [-o md|csv|json] [--out FILE] [--fill auto|prefill|synthetic] [-c CTX]
// One row per (cache, test): pp<p> rows time the prefill of a p-token prompt
// (one sequence), tg<n> rows n decode steps of B sequences at depth d. Each
// row: tokens/s mean ± sd over -r repetitions, the decode step time against
// its roofline (bytes the step reads — weights and cache — over a read
// ceiling measured in the same run by a read-only probe), cache bytes and the
// memory the configuration takes. Decode rows at a depth are reached either
// by a real prefill of d tokens or (cuda, --fill synthetic or auto above the
// largest prompt) by synthetic K/V written through the cache's quantize path,
// labelled synthetic_fill. A configuration that does not fit (e.g. fp16 at a
// batch its cache cannot hold) is a row with its error, the others run.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include <unistd.h>

#include "cli/command.h"
#include "cli/flag_names.h"
#include "cli/gpu_cache.h"
#include "cli/loaded_model.h"
#include "ratekv/common/error.h"
#include "ratekv/common/log.h"
#include "ratekv/eval/baseline_plans.h"
#include "ratekv/model/synthetic.h"

#ifdef RATEKV_HAVE_ENGINE
#include "ratekv/engine/engine.h"
#include "ratekv/engine/engine_executor.h"
#include "ratekv/engine/scheduler.h"
#endif

namespace ratekv::cli {
namespace {

using json = nlohmann::ordered_json;
using clk = std::chrono::steady_clock;

struct BenchArgs {
  std::string model, synthetic, device = "cpu", output = "md", out_file, fill = "auto", mode = "serving";
  int layers = 0, reps = 3;
  std::vector<int64_t> p{512}, n{128}, d{0};
  std::vector<int> b{1};
  std::vector<std::string> ctk, ctv, plans;
  int64_t ctx = 0;
  uint64_t seed = 1;
  bool profile = false, force = false, no_plan_check = false;
  int fp16_kernel = 0;
  bool layers_given = false, fp16_kernel_given = false, mode_given = false;  // the flag was given (any value)
  int64_t chunk = 0;  // cuda: chunked prefill in chunks of this many tokens (0: one piece)
  // cuda request stream (continuous batching): requests, prompt / output tokens each, pool GiB, batch cap
  int64_t requests = 0, req_prompt = 512, req_gen = 128;
  double pool_gib = 0;
  int stream_batch = 128;
  int pp_warmup = 1;  // cuda pp rows: an untimed prefill first (0: none, for prompts that take long)
};

struct Stat {
  double mean = 0, sd = 0;
};
Stat stat(const std::vector<double>& v) {
  Stat s;
  if (v.empty()) return s;
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  double q = 0;
  for (double x : v) q += (x - s.mean) * (x - s.mean);
  s.sd = v.size() > 1 ? std::sqrt(q / (v.size() - 1)) : 0.0;
  return s;
}

std::vector<int32_t> random_tokens(int64_t n, int V, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(g() % static_cast<uint64_t>(V));
  return t;
}

/// One cache configuration of the bench: its label and plan (none = fp16).
struct CacheSpec {
  std::string label;
  std::optional<Plan> plan;
  bool fp16 = false;
};

std::vector<CacheSpec> cache_specs(const BenchArgs& a, const ModelConfig& cfg) {
  std::vector<CacheSpec> out;
  for (const std::string& f : a.plans) {
    CacheSpec s;
    s.plan = Plan::load(f);
    s.label.append("plan:").append(std::filesystem::path(f).stem().string());
    out.push_back(std::move(s));
  }
  check(a.ctk.size() == a.ctv.size() || a.ctv.size() == 1 || a.ctk.size() == 1,
        "-ctk/-ctv: {} key types and {} value types (give equal counts, or one of either)", a.ctk.size(), a.ctv.size());
  const size_t n = std::max(a.ctk.size(), a.ctv.size());
  for (size_t i = 0; i < n; ++i) {
    const std::string& k = a.ctk[a.ctk.size() == 1 ? 0 : i];
    const std::string& v = a.ctv[a.ctv.size() == 1 ? 0 : i];
    CacheSpec s;
    if (k == "f16" && v == "f16") {
      s.fp16 = true;
      s.label = "fp16";
    } else {
      s.plan = eval::cache_type_plan(k, v, cfg, a.seed);
      if (k.rfind("tq", 0) == 0 && v.rfind("tq", 0) == 0)
        s.label.append("K").append(k.substr(2)).append("V").append(v.substr(2));
      else
        s.label.append(k).append("/").append(v);
    }
    out.push_back(std::move(s));
  }
  return out;
}

json base_row(const BenchArgs& a, const std::string& model, const std::string& cache, const std::string& test) {
  json r;
  r["model"] = model;
  r["cache"] = cache;
  r["device"] = a.device;
  r["test"] = test;
  return r;
}

// ---- CPU -----------------------------------------------------------------------

/// Read bandwidth of this machine (GB/s): OpenMP sum over a 256 MiB buffer, best of 3. Each thread keeps 8
/// independent partial sums: one running sum is bound by the add's latency (≈ 6 GB/s per core), not by memory,
/// and the decode rows' "x roofline" came out below 1 against it.
double cpu_read_ceiling() {
  const size_t n = (size_t{256} << 20) / sizeof(double);  // a multiple of 8
  std::vector<double> buf(n, 1.0);
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = clk::now();
    double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static)
    for (int64_t i = 0; i < static_cast<int64_t>(n); i += 8) {
      const double* p = buf.data() + i;
      double a0 = p[0], a1 = p[1], a2 = p[2], a3 = p[3], a4 = p[4], a5 = p[5], a6 = p[6], a7 = p[7];
      s += ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
    }
    const double sec = std::chrono::duration<double>(clk::now() - t0).count();
    if (s != static_cast<double>(n)) spdlog::warn("bench: read probe sum {}", s);
    best = std::max(best, n * sizeof(double) / sec / 1e9);
  }
  return best;
}

void run_cpu(const BenchArgs& a, Model& model, const std::string& model_name, const std::vector<CacheSpec>& specs,
             std::vector<json>& rows) {
  const ModelConfig& c = model.config();
  const double ceiling = cpu_read_ceiling();
  spdlog::info("bench: CPU read ceiling {:.1f} GB/s", ceiling);
  const int V = c.n_vocab;
  auto make = [&](const CacheSpec& s, int64_t n_ctx) {
    std::string kind;
    const Plan plan = s.fp16 ? eval::cache_type_plan("f16", "f16", c) : *s.plan;
    return make_cache_for_plan(plan, c, n_ctx, kind, s.label);
  };
  std::vector<float> logits(V);
  for (const CacheSpec& s : specs) {
    for (int64_t p : a.p) {
      if (p <= 0) continue;
      json r = base_row(a, model_name, s.label, "pp" + std::to_string(p));
      r["B"] = 1;
      r["depth"] = 0;
      std::vector<double> tps;
      for (int rep = 0; rep < a.reps; ++rep) {
        auto kv = make(s, p);
        const auto toks = random_tokens(p, V, a.seed + rep);
        const auto t0 = clk::now();
        model.forward(toks, 0, *kv, logits.data(), false);
        tps.push_back(p / std::chrono::duration<double>(clk::now() - t0).count());
      }
      const Stat st = stat(tps);
      r["prefill_tok_s"] = st.mean;
      r["prefill_tok_s_sd"] = st.sd;
      r["prefill_mode"] = "evaluation";
      rows.push_back(r);
    }
    for (int B : a.b)
      for (int64_t depth : a.d)
        for (int64_t n : a.n) {
          if (n <= 0) continue;
          json r = base_row(a, model_name, s.label, "tg" + std::to_string(n));
          r["B"] = B;
          r["depth"] = depth;
          r["synthetic_fill"] = false;
          r["prefill_mode"] = "evaluation";
          const int64_t d0 = std::max<int64_t>(depth, 1);
          check(d0 + n <= model.position_limit(), "-d/-n: depth {} + {} tokens exceed the model's context {}", d0, n,
                model.position_limit());
          std::vector<double> tps, step_ms;
          double bytes = 0, cache_bytes = 0;
          for (int rep = 0; rep < a.reps; ++rep) {
            std::vector<std::unique_ptr<KVCache>> kv;
            for (int b = 0; b < B; ++b) {
              kv.push_back(make(s, d0 + n));
              model.forward(random_tokens(d0, V, a.seed + 31 * b), 0, *kv.back(), logits.data(), false);
              if (b == 0 && rep == 0) {
                // B caches, each at least what the first holds after its d0 tokens (a lower bound:
                // no projection, which paged caches would overestimate): refuse a batch this machine
                // cannot hold instead of allocating until the kernel kills the process.
                const double need = static_cast<double>(B) * static_cast<double>(kv[0]->bytes()) +
                                    static_cast<double>(model.weights().bytes());
                const double phys = static_cast<double>(sysconf(_SC_PHYS_PAGES)) *
                                    static_cast<double>(sysconf(_SC_PAGE_SIZE));
                check(phys <= 0 || need <= phys,
                      "-b {}: {} sequences ({} cache, depth {}) need at least {:.1f} GB with the weights, "
                      "more than this machine's {:.1f} GB of memory",
                      B, B, s.label, d0, need / 1e9, phys / 1e9);
              }
            }
            cache_bytes = 0;
            for (auto& k : kv) cache_bytes += static_cast<double>(k->bytes());
            const auto t0 = clk::now();
            for (int64_t k = 0; k < n; ++k)
              for (int b = 0; b < B; ++b) {
                const int32_t t = static_cast<int32_t>((k * 7 + b) % V);
                model.forward(std::span<const int32_t>(&t, 1), d0 + k, *kv[b], logits.data(), false);
              }
            const double sec = std::chrono::duration<double>(clk::now() - t0).count();
            tps.push_back(B * n / sec);
            step_ms.push_back(sec * 1e3 / n);
            // The CPU runtime decodes the B sequences one forward each: every forward reads the weights.
            bytes = static_cast<double>(B) * static_cast<double>(model.weights().bytes()) + cache_bytes;
          }
          const Stat st = stat(tps), sm = stat(step_ms);
          r["decode_tok_s"] = st.mean;
          r["decode_tok_s_sd"] = st.sd;
          r["step_ms"] = sm.mean;
          r["step_ms_sd"] = sm.sd;
          r["read_ceiling_gbps"] = ceiling;
          r["bytes_read_gb"] = bytes / 1e9;
          r["roofline_ms"] = bytes / (ceiling * 1e9) * 1e3;
          r["x_roofline"] = sm.mean / (bytes / (ceiling * 1e9) * 1e3);
          r["cache_bytes"] = cache_bytes;
          r["peak_mem_gb"] = (static_cast<double>(model.weights().bytes()) + cache_bytes) / 1e9;
          rows.push_back(r);
        }
  }
}

// ---- CUDA ----------------------------------------------------------------------

#ifdef RATEKV_HAVE_ENGINE
// A stream of `requests` requests (random prompts of req_prompt tokens,
// req_gen greedy tokens each, all queued at t = 0) through the
// continuous-batching scheduler on a pool of pool_gib GiB (0: all free
// memory) with at most stream_batch sequences: one "stream" row with
// requests/s, output tokens/s, the most sequences at once, time to first
// token (mean, p50, p90) and latency.
void run_stream(const BenchArgs& a, const ModelConfig& cfg, const Model* model, bool untied,
                const std::string& model_name, const CacheSpec& s, const engine::CacheFormat& fmt,
                engine::PrefillMode mode, std::vector<json>& rows) {
  engine::EngineOptions o;
  o.max_batch = a.stream_batch;
  o.max_prefill_tokens = a.chunk > 0 ? a.chunk : a.req_prompt;
  o.context_limit = a.ctx;
  o.pool_bytes = static_cast<size_t>(a.pool_gib * 1073741824.0);
  o.prefill_score_bytes = size_t{1} << 30;
  json r = base_row(a, model_name, s.label, "stream");
  r["requests"] = a.requests;
  r["prompt_tokens_each"] = a.req_prompt;
  r["output_tokens_each"] = a.req_gen;
  r["pool_gib"] = a.pool_gib;
  r["max_batch"] = a.stream_batch;
  r["B"] = a.stream_batch;  // the cap; max_concurrent is what ran
  r["depth"] = 0;
  r["chunk"] = a.chunk;
  r["prefill_mode"] = engine::prefill_mode_name(mode);
  try {
    std::unique_ptr<engine::Engine> eng = model ? engine::Engine::create(cfg, model->weights(), fmt, o)
                                                : engine::Engine::create_synthetic(cfg, untied, a.seed, fmt, o);
    spdlog::info("bench stream: {} {}", s.label, eng->memory().summary());
    r["pool_tokens"] = eng->memory().capacity_tokens;
    engine::EngineExecutor ex(*eng, mode, a.chunk > 0);
    engine::SchedulerOptions so;
    so.prefill_chunk = a.chunk;
    so.prefill_token_budget = std::max<int64_t>(a.chunk > 0 ? a.chunk : a.req_prompt, 2048);
    engine::Scheduler sch(ex, so);
    for (int64_t i = 0; i < a.requests; ++i) {
      engine::Request q;
      q.prompt = random_tokens(a.req_prompt, cfg.n_vocab, a.seed + 1000 + i);
      q.n_predict = static_cast<int>(a.req_gen);
      sch.submit(std::move(q));
    }
    const auto res = sch.run();
    const engine::SchedulerStats& st = sch.stats();
    std::vector<double> ttft, lat;
    int errors = 0;
    for (const auto& x : res) {
      if (x.finish == "error") {
        ++errors;
        r["error"] = x.error;
        continue;
      }
      ttft.push_back(x.t_first_token);
      lat.push_back(x.t_done);
    }
    std::sort(ttft.begin(), ttft.end());
    std::sort(lat.begin(), lat.end());
    auto pct = [](const std::vector<double>& v, double q) { return v.empty() ? 0.0 : v[size_t(q * (v.size() - 1))]; };
    r["seconds"] = st.seconds;
    r["requests_per_s"] = st.seconds > 0 ? (a.requests - errors) / st.seconds : 0.0;
    r["output_tok_s"] = st.seconds > 0 ? st.output_tokens / st.seconds : 0.0;
    r["max_concurrent"] = st.max_concurrent;
    r["decode_steps"] = st.decode_steps;
    r["ttft_s_mean"] = ttft.empty() ? 0.0 : std::accumulate(ttft.begin(), ttft.end(), 0.0) / ttft.size();
    r["ttft_s_p50"] = pct(ttft, 0.5);
    r["ttft_s_p90"] = pct(ttft, 0.9);
    r["latency_s_p50"] = pct(lat, 0.5);
    r["latency_s_max"] = lat.empty() ? 0.0 : lat.back();
    r["failed_requests"] = errors;
    spdlog::info("bench stream: {}: {} requests in {:.2f} s, {:.2f} req/s, {:.0f} output tok/s, at most {} at once",
                 s.label, a.requests, st.seconds, r["requests_per_s"].get<double>(), r["output_tok_s"].get<double>(),
                 st.max_concurrent);
  } catch (const Error& e) {
    r["error"] = e.what();
    spdlog::warn("bench stream: {}: {}", s.label, e.what());
  }
  rows.push_back(r);
}

void run_cuda(const BenchArgs& a, const ModelConfig& cfg, const Model* model, bool untied,
              const std::string& model_name, const std::vector<CacheSpec>& specs, std::vector<json>& rows,
              json& meta) {
  const int V = cfg.n_vocab;
  const int max_b = *std::max_element(a.b.begin(), a.b.end());
  int64_t max_p = 1;
  for (int64_t p : a.p) max_p = std::max(max_p, p);
  const int64_t prefill_cap = std::max<int64_t>(max_p, 8192);
  auto real_prefill = [&](int64_t depth) {
    return a.fill == "prefill" || (a.fill == "auto" && depth <= prefill_cap);
  };
  int64_t max_prefill = max_p;
  for (int64_t d : a.d)
    if (real_prefill(d)) max_prefill = std::max(max_prefill, d);
  if (a.chunk > 0) max_prefill = a.chunk;  // activations for one chunk, whatever the prompt
  const engine::PrefillMode mode =
      a.mode == "evaluation" ? engine::PrefillMode::evaluation : engine::PrefillMode::serving;
  auto do_prefill = [&](engine::Engine& e, int seq, std::span<const int32_t> toks) {
    if (a.chunk > 0)
      e.prefill_chunked(seq, toks, a.chunk, mode, {});
    else
      e.prefill(seq, toks, mode, {});
  };
  const bool need_main = std::any_of(a.p.begin(), a.p.end(), [](int64_t v) { return v > 0; }) ||
                         std::any_of(a.n.begin(), a.n.end(), [](int64_t v) { return v > 0; });
  for (const CacheSpec& s : specs) {
    const engine::CacheFormat fmt =
        s.fp16 ? engine::CacheFormat::fp16(cfg)
               : engine::CacheFormat::packed(std::make_shared<const cache::PlanCodecs>(*s.plan, cfg, s.label),
                                             s.label);
    if (need_main) {
      engine::EngineOptions o;
      o.max_batch = max_b;
      o.max_prefill_tokens = max_prefill;
      o.context_limit = a.ctx;
      o.fp16_kernel = a.fp16_kernel;
      std::unique_ptr<engine::Engine> eng =
          model ? engine::Engine::create(cfg, model->weights(), fmt, o)
                : engine::Engine::create_synthetic(cfg, untied, a.seed, fmt, o);
      spdlog::info("bench: {} {}", s.label, eng->memory().summary());
      const double ceiling = eng->read_ceiling_gbps(size_t{4} << 30, 10);
      spdlog::info("bench: read ceiling {:.0f} GB/s (read-only probe)", ceiling);
      meta["read_ceiling_gbps"][s.label] = ceiling;
      meta["memory"][s.label] = {{"weights", eng->memory().weights}, {"activations", eng->memory().activations},
                                 {"workspace", eng->memory().workspace}, {"pool", eng->memory().pool},
                                 {"capacity_tokens", eng->memory().capacity_tokens}};
      const engine::MemoryPlan& mp = eng->memory();
      const double fixed = static_cast<double>(mp.weights + mp.activations + mp.workspace);
      const double page_all = static_cast<double>(fmt.page_bytes_all_layers());
      for (int64_t p : a.p) {
        if (p <= 0) continue;
        json r = base_row(a, model_name, s.label, "pp" + std::to_string(p));
        r["B"] = 1;
        r["depth"] = 0;
        r["prefill_mode"] = engine::prefill_mode_name(mode);
        r["chunk"] = a.chunk;
        std::vector<double> tps, ttft;
        for (int rep = a.pp_warmup > 0 ? 0 : 1; rep <= a.reps; ++rep) {  // rep 0: warm-up
          const int seq = eng->add_sequence(p);
          const auto toks = random_tokens(p, V, a.seed + rep);
          const auto t0 = clk::now();
          std::vector<float> last(V);  // the first token's logits: time to first token
          if (a.chunk > 0)
            eng->prefill_chunked(seq, toks, a.chunk, mode, last);
          else
            eng->prefill(seq, toks, mode, last);
          const double sec = std::chrono::duration<double>(clk::now() - t0).count();
          if (rep > 0) tps.push_back(p / sec), ttft.push_back(sec * 1e3);
          eng->remove_sequence(seq);
        }
        const Stat st = stat(tps);
        r["prefill_tok_s"] = st.mean;
        r["prefill_tok_s_sd"] = st.sd;
        r["ttft_ms"] = stat(ttft).mean;
        r["ttft_ms_sd"] = stat(ttft).sd;
        rows.push_back(r);
      }
      for (int B : a.b)
        for (int64_t depth : a.d)
          for (int64_t n : a.n) {
            if (n <= 0) continue;
            json r = base_row(a, model_name, s.label, "tg" + std::to_string(n));
            r["B"] = B;
            r["depth"] = depth;
            const int64_t d0 = std::max<int64_t>(depth, 1);
            const bool real = real_prefill(d0);
            r["synthetic_fill"] = !real;
            r["prefill_mode"] = real ? engine::prefill_mode_name(mode) : "none";
            const int warmup = 2;
            const int64_t need = d0 + (a.reps + 1) * (n + warmup) + 2;
            std::vector<int> seqs;
            try {
              for (int b = 0; b < B; ++b) seqs.push_back(eng->add_sequence(need));
            } catch (const Error& e) {
              for (int q : seqs) eng->remove_sequence(q);
              r["error"] = e.what();
              spdlog::warn("bench: {} B={} depth={}: {}", s.label, B, depth, e.what());
              rows.push_back(r);
              continue;
            }
            for (int b = 0; b < B; ++b) {
              if (real)
                do_prefill(*eng, seqs[b], random_tokens(d0, V, a.seed + 31 * b));
              else
                eng->fill_synthetic(seqs[b], d0, a.seed + 31 * b);
            }
            const std::vector<int32_t> start(B, 1);
            eng->time_decode(seqs, start, warmup, n);  // graph capture, warm-up
            std::vector<double> tps, step_ms;
            const engine::StepBytes sb = eng->step_bytes(seqs);
            for (int rep = 0; rep < a.reps; ++rep) {
              const double ms = eng->time_decode(seqs, start, 0, static_cast<int>(n));
              step_ms.push_back(ms);
              tps.push_back(B * 1e3 / ms);
            }
            const Stat st = stat(tps), sm = stat(step_ms);
            const double roof = sb.total() / (ceiling * 1e9) * 1e3;
            r["decode_tok_s"] = st.mean;
            r["decode_tok_s_sd"] = st.sd;
            r["step_ms"] = sm.mean;
            r["step_ms_sd"] = sm.sd;
            r["read_ceiling_gbps"] = ceiling;
            r["bytes_read_gb"] = sb.total() / 1e9;
            r["weight_bytes_gb"] = sb.weights / 1e9;
            r["cache_read_gb"] = sb.cache / 1e9;
            r["roofline_ms"] = roof;
            r["x_roofline"] = sm.mean / roof;
            r["cache_bytes"] = static_cast<double>(B) * std::ceil(d0 / 64.0) * page_all;
            r["peak_mem_gb"] = (fixed + static_cast<double>(B) * std::ceil(need / 64.0) * page_all) / 1e9;
            r["attn_ms"] = eng->time_attention(seqs, 20);
            if (s.fp16) r["attn_ms_rows16"] = eng->time_attention(seqs, 20, 1);
            if (a.profile) {
              const engine::DecodeProfile pr = eng->profile_decode(seqs, 10);
              r["profile_ms"] = {{"step", pr.step}, {"gemm", pr.gemm}, {"attention", pr.attention},
                                 {"append", pr.append}, {"other", pr.other}};
            }
            rows.push_back(r);
            spdlog::info("bench: {} B={} depth={} {}: {:.1f} tok/s, step {:.3f} ms, roofline {:.3f} ms ({:.2f}x)",
                         s.label, B, depth, r["test"].get<std::string>(), st.mean, sm.mean, roof, sm.mean / roof);
            for (int q : seqs) eng->remove_sequence(q);
          }
    }
    if (a.requests > 0) run_stream(a, cfg, model, untied, model_name, s, fmt, mode, rows);
  }
}
#endif

// ---- output -------------------------------------------------------------------

std::string fmt_num(const json& r, const char* key, const char* sd_key, int prec) {
  if (!r.contains(key)) return "";
  std::string s = fmt::format("{:.{}f}", r[key].get<double>(), prec);
  if (sd_key && r.contains(sd_key)) s += fmt::format(" ± {:.{}f}", r[sd_key].get<double>(), prec);
  return s;
}

std::string markdown(const std::vector<json>& rows) {
  std::string s =
      "| model | cache | device | B | depth | test | t/s | step ms | roofline ms | x roofline | cache GiB | mem GB | "
      "fill |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const json& r : rows) {
    const bool pp = r.contains("prefill_tok_s");
    std::string ts = r.contains("error")          ? "does not fit"
                     : pp                         ? fmt_num(r, "prefill_tok_s", "prefill_tok_s_sd", 1)
                     : r.contains("output_tok_s") ? fmt_num(r, "output_tok_s", nullptr, 1)
                                                  : fmt_num(r, "decode_tok_s", "decode_tok_s_sd", 1);
    s += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                     r["model"].get<std::string>(), r["cache"].get<std::string>(), r["device"].get<std::string>(),
                     r["B"].get<int>(), r["depth"].get<int64_t>(), r["test"].get<std::string>(), ts,
                     fmt_num(r, "step_ms", nullptr, 3), fmt_num(r, "roofline_ms", nullptr, 3),
                     fmt_num(r, "x_roofline", nullptr, 2),
                     r.contains("cache_bytes") ? fmt::format("{:.2f}", r["cache_bytes"].get<double>() / 1073741824.0)
                                               : "",
                     fmt_num(r, "peak_mem_gb", nullptr, 1),
                     r.contains("synthetic_fill") ? (r["synthetic_fill"].get<bool>() ? "synthetic" : "prefill") : "");
  }
  return s;
}

std::string csv(const std::vector<json>& rows) {
  const std::vector<std::string> cols = {"model", "cache", "device", "B", "depth", "test", "prefill_tok_s",
                                         "prefill_tok_s_sd", "decode_tok_s", "decode_tok_s_sd", "step_ms",
                                         "step_ms_sd", "roofline_ms", "x_roofline", "read_ceiling_gbps",
                                         "cache_bytes", "peak_mem_gb", "synthetic_fill", "prefill_mode", "attn_ms",
                                         "chunk", "ttft_ms", "requests_per_s", "output_tok_s", "max_concurrent",
                                         "error"};
  std::string s;
  for (size_t i = 0; i < cols.size(); ++i) s.append(i ? "," : "").append(cols[i]);
  s += "\n";
  for (const json& r : rows) {
    for (size_t i = 0; i < cols.size(); ++i) {
      if (i) s += ",";
      if (!r.contains(cols[i])) continue;
      const json& v = r[cols[i]];
      if (v.is_string())
        s.append("\"").append(v.get<std::string>()).append("\"");
      else
        s.append(v.dump());
    }
    s += "\n";
  }
  return s;
}

void run(const BenchArgs& a, const std::string& command_line) {
  check(a.model.empty() != a.synthetic.empty(), "bench: give one of -m MODEL or --synthetic NAME");
  check(a.reps >= 1, "-r: {} repetitions (at least 1)", a.reps);
  for (int b : a.b) check(b >= 1, "-b: batch size {} (at least 1)", b);
  for (int64_t d : a.d) check(d >= 0, "-d: depth {} (at least 0)", d);
  for (int64_t n : a.n) check(n >= 0, "-n: {} tokens (at least 0)", n);
  for (int64_t p : a.p) check(p >= 0, "-p: {} tokens (at least 0)", p);
  // Every -p and -n at 0 and no request stream: nothing to time (it used to print an empty table).
  check(a.requests > 0 || std::any_of(a.p.begin(), a.p.end(), [](int64_t p) { return p > 0; }) ||
            std::any_of(a.n.begin(), a.n.end(), [](int64_t n) { return n > 0; }),
        "-p/-n: every -p and -n is 0: no pp row and no tg row to run; expected a prompt length or a number of tokens "
        "to generate above 0 (or --requests)");
  check(a.plans.empty() || (a.ctk.empty() && a.ctv.empty()), "bench: give -ctk/-ctv or --plan, not both");
  check(a.ctk.empty() == a.ctv.empty(), "-ctk/-ctv: give both");
  // Flags that only apply elsewhere (they used to be ignored silently, issue 22).
  check(!a.layers_given || !a.synthetic.empty(),
        "--layers: applies to --synthetic only (-m {} runs every layer of the model)", a.model);
  check(!a.profile || a.device == "cuda", "--profile: the decode-step profile runs on --device cuda only");
  check(!a.fp16_kernel_given || a.device == "cuda",
        "--fp16-kernel: selects the CUDA fp16 decode kernel; runs on --device cuda only");
  // --prefill-mode serving on the CPU was accepted and ignored (its rows say evaluation); evaluation, what the CPU
  // runs, is accepted. The default (serving) applies to cuda only.
  if (a.mode_given) check_prefill_mode_option(a.device, a.mode);
  if (!a.out_file.empty()) check_output_path(a.out_file, a.force, "--out");
  require_engine(a.device);  // --device cuda: a build with the engine and a visible GPU, before anything loads
  BenchArgs args = a;
  if (args.ctk.empty() && args.plans.empty()) args.ctk = args.ctv = {"f16"};
  std::unique_ptr<Model> model;
  std::unique_ptr<GgufFile> file;
  ModelConfig cfg;
  std::string model_name;
  bool untied = true;
  if (!a.synthetic.empty()) {
    with_flag_names({{"synthetic_config.n_layers", "--layers"}}, [&] { cfg = synthetic_config(a.synthetic, a.layers); });
    untied = synthetic_untied_output(a.synthetic);
    model_name = a.synthetic + (a.layers > 0 ? fmt::format(" ({} layers)", a.layers) : "") + " synthetic";
  } else {
    check_plans_match_model(a.plans, a.model, a.no_plan_check);
    file = std::make_unique<GgufFile>(GgufFile::open(a.model));
    cfg = ModelConfig::from_gguf(*file);
    model_name = std::filesystem::path(a.model).filename().string();
  }
  const std::vector<CacheSpec> specs = cache_specs(args, cfg);  // plans checked before the weights load
  // Token counts against the context, in the flags' words, before the weights load (a prompt past it used to fail
  // in Model::forward after the load, naming Model::set_position_limit).
  const int64_t limit = args.ctx > 0 ? args.ctx : cfg.n_ctx_train;
  const std::string limit_src = args.ctx > 0 ? "-c/--ctx-size" : "the model's context_length; -c/--ctx-size raises it";
  for (int64_t p : args.p)
    check(p <= limit, "-p/--n-prompt {}: exceeds the context of {} tokens ({}); expected 0..{}", p, limit,
          limit_src, limit);
  for (int64_t d : args.d)
    for (int64_t n : args.n) {
      if (n <= 0) continue;
      // The CPU rows prefill max(d, 1) tokens, then decode n.
      const int64_t d0 = args.device == "cpu" ? std::max<int64_t>(d, 1) : d;
      check(d0 + n <= limit, "-d/--n-depth {} + -n/--n-gen {}: {} tokens exceed the context of {} tokens ({})", d, n,
            d0 + n, limit, limit_src);
    }
  if (args.requests > 0)
    check(args.req_prompt + args.req_gen <= limit,
          "--req-prompt {} + --req-gen {}: {} tokens exceed the context of {} tokens ({})", args.req_prompt,
          args.req_gen, args.req_prompt + args.req_gen, limit, limit_src);
  std::vector<json> rows;
  json meta;
  meta["command"] = command_line;
  check_chunk_option(args.device, args.chunk);
  check(args.requests == 0 || args.device == "cuda", "--requests: the request stream runs on --device cuda only");
  check(args.req_prompt >= 1 && args.req_gen >= 1 && args.stream_batch >= 1,
        "--req-prompt {} / --req-gen {} / --stream-batch {} must be >= 1", args.req_prompt, args.req_gen,
        args.stream_batch);
  // inf or 1e300 passed a >= 0 test and overflowed size_t in the pool's byte count.
  check(std::isfinite(args.pool_gib) && args.pool_gib >= 0 && args.pool_gib <= 1 << 20,
        "--pool-gib {}: expected a number of GiB in 0..1048576 (0 = all free memory)", args.pool_gib);
  if (args.device == "cpu") {
    check(args.fill != "synthetic", "--fill synthetic: the CPU runtime has no synthetic fill (use prefill)");
    if (!a.synthetic.empty()) {
      // fp32 weights on the host: refuse a published size by accident (the
      // default device is cpu; a full Llama-3.1-8B is 32 GB and hours of bench).
      const double gb = 4.0 * (static_cast<double>(cfg.n_vocab) * cfg.d_model * (untied ? 2 : 1) +
                               static_cast<double>(cfg.n_layers) * cfg.d_model *
                                   (2.0 * (cfg.n_heads + cfg.n_kv_heads) * cfg.head_dim + 3.0 * cfg.d_ff)) / 1e9;
      check(gb <= 8.0,
            "--synthetic {} on --device cpu needs {:.1f} GB of fp32 weights; pass --layers N (a few layers at full "
            "width) or --device cuda",
            a.synthetic, gb);
    }
    if (file) {
      model = std::make_unique<Model>(Model::load(*file));
    } else {
      model = std::make_unique<Model>(Model::from_weights(cfg, synthetic_weights(cfg, args.seed, untied)));
    }
    if (args.ctx > 0) model->set_position_limit(args.ctx);
    run_cpu(args, *model, model_name, specs, rows);
  } else {
#ifdef RATEKV_HAVE_ENGINE
    if (file) model = std::make_unique<Model>(Model::load(*file));
    meta["device_name"] = engine::cuda_device_name();
    run_cuda(args, cfg, model.get(), untied, model_name, specs, rows, meta);
#endif
  }
  json doc = meta;
  doc["rows"] = rows;
  std::string text = args.output == "json" ? doc.dump(2) + "\n" : args.output == "csv" ? csv(rows) : markdown(rows);
  if (!args.out_file.empty()) {
    std::ofstream out(args.out_file);
    check(static_cast<bool>(out), "--out: cannot open '{}'", args.out_file);
    out << text;
  } else {
    std::fputs(text.c_str(), stdout);
  }
}

Registrar reg("bench", [](CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  auto* cmd = app.add_subcommand(
      "bench",
      "Prefill and decode speed in llama-bench's manner (pp<p> and tg<n> rows; mean ± sd over -r runs; decode step "
      "time against the roofline: bytes read over a read ceiling measured in the same run)");
  cmd->add_option("-m,--model", a->model, "GGUF model file")->check(CLI::ExistingFile);
  std::string synthetic_names;  // every name --synthetic accepts, from the same table
  for (const std::string& n : synthetic_model_names())
    if (n != "tiny-llama") synthetic_names += (synthetic_names.empty() ? "" : ", ") + n;
  cmd->add_option("--synthetic", a->synthetic,
                  "a published configuration with seeded random weights: " + synthetic_names +
                      " (and tiny-llama, a 2-layer test model)")
      ->check(CLI::IsMember(synthetic_model_names()));
  cmd->add_option("--layers", a->layers, "synthetic: keep only the first N layers (0 = all)")
      ->check(non_negative_validator("layers", "0 = all"));
  add_list_option(cmd, "-p,--n-prompt", a->p, "prompt lengths of the pp rows (comma list; 0 = none)");
  add_list_option(cmd, "-n,--n-gen", a->n, "decode steps of the tg rows (comma list; 0 = none)");
  add_list_option(cmd, "-d,--n-depth", a->d, "cached tokens before the tg rows decode (comma list)");
  add_list_option(cmd, "-b,--batch", a->b, "sequences decoded together (comma list)");
  const std::vector<std::string> types = eval::cache_type_names();
  add_list_option(cmd, "--cache-type-k", a->ctk, "K cache types (short: -ctk; comma list; f16, q8_0, q4_0, tq2, tq3, tq4)",
                  CLI::IsMember(types));
  add_list_option(cmd, "--cache-type-v", a->ctv, "V cache types (short: -ctv; comma list, paired with -ctk)", CLI::IsMember(types));
  cmd->add_option("--plan", a->plans, "plan files (uniform, Block-GTQ, RateQuant), one cache each")
      ->check(CLI::ExistingFile);
  add_no_plan_check_option(cmd, a->no_plan_check);
  add_device_option(cmd, a->device);
  cmd->add_option("-r,--repetitions", a->reps, "repetitions per row (mean ± sd)")->capture_default_str();
  cmd->add_option("-o,--output", a->output, "md, csv or json")->capture_default_str()->check(
      CLI::IsMember({"md", "csv", "json"}));
  cmd->add_option("--out", a->out_file, "write the table to this file instead of stdout")
      ->check(non_empty_path_validator("a file to write the table to (without --out: stdout)"));
  cmd->add_flag("--force", a->force, "overwrite --out");
  cmd->add_option("--fill", a->fill,
                  "how tg rows reach their depth: prefill (a real prefill of d tokens), synthetic (cuda: seeded K/V "
                  "through the quantize path, labelled synthetic_fill), auto (prefill up to max(-p, 8192))")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "prefill", "synthetic"}));
  cmd->add_option("--prefill-mode", a->mode,
                  "cuda: evaluation or serving (docs/design.md §9.2); named in every row. The CPU rows always run "
                  "evaluation (serving is refused there)")
      ->default_str("serving; the CPU runs evaluation")
      ->check(CLI::IsMember({"evaluation", "serving"}));
  cmd->add_option("-c,--ctx-size", a->ctx,
                  "context limit in tokens (default: the model's trained context; larger values extrapolate RoPE, "
                  "as llama.cpp's -c)")
      ->check(non_negative_validator());
  cmd->add_option("--seed", a->seed, "seed of synthetic weights, prompts, fills and plan rotations")
      ->capture_default_str()->check(seed_validator());
  cmd->add_option("--chunk", a->chunk,
                  "cuda: chunked prefill in chunks of N tokens (a multiple of 64; 0 = one piece): activations for N "
                  "tokens whatever the prompt; pp rows report ttft_ms")
      ->check(non_negative_validator());
  cmd->add_option("--pp-warmup", a->pp_warmup, "cuda pp rows: untimed prefills first (0 or 1)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1));
  cmd->add_option("--requests", a->requests,
                  "cuda: a stream of N requests through the continuous-batching scheduler (a 'stream' row per cache)")
      ->check(non_negative_validator());
  cmd->add_option("--req-prompt", a->req_prompt, "--requests: prompt tokens of each request")->capture_default_str();
  cmd->add_option("--req-gen", a->req_gen, "--requests: tokens generated by each request")->capture_default_str();
  cmd->add_option("--pool-gib", a->pool_gib, "--requests: page pool in GiB (0 = all free memory)")
      ->capture_default_str();
  cmd->add_option("--stream-batch", a->stream_batch, "--requests: most sequences decoded together")
      ->capture_default_str();
  cmd->add_flag("--profile", a->profile, "cuda: time each part of a decode step (GEMMs, attention, append, rest)");
  cmd->add_option("--fp16-kernel", a->fp16_kernel, "cuda fp16 decode kernel: 0 automatic, 1 rows16, 2 n8, 3 n8_fused")
      ->capture_default_str()
      ->check(CLI::Range(0, 3));
  cmd->callback([a, cmd] {
    a->layers_given = cmd->get_option("--layers")->count() > 0;
    a->fp16_kernel_given = cmd->get_option("--fp16-kernel")->count() > 0;
    a->mode_given = cmd->get_option("--prefill-mode")->count() > 0;
    std::string line = "ratekv bench";
    for (const auto* o : cmd->get_options())
      for (const std::string& r : o->results()) line.append(" ").append(o->get_name()).append(" ").append(r);
    run(*a, line);
  });
});

}  // namespace
}  // namespace ratekv::cli
