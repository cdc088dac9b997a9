// evaluate_plans(): the fp32 reference pass with MAE/KL hooks, then the
// quantized perplexity passes (eval/plan_eval.h).
#include "ratekv/eval/plan_eval.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <set>

#include "ratekv/cache/fake_quant_cache.h"
#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/cache/plan_codecs.h"
#include "ratekv/common/error.h"
#include "ratekv/common/param_error.h"
#include "ratekv/eval/baseline_plans.h"
#include "ratekv/eval/logit_error.h"
#include "ratekv/eval/next_token_kld.h"
#include "ratekv/eval/reference_cache.h"
#include "ratekv/format/stored_bytes.h"
#include "ratekv/model/perplexity.h"
#include "ratekv/common/log.h"

namespace ratekv::eval {

using nlohmann::json;

namespace {

bool uses_rotation(const Plan& p) {
  for (const auto& layer : p.layers)
    for (const auto& h : layer)
      for (const Codec* c : {&h.key, &h.value})
        if (c->kind == CodecKind::TqMse || c->kind == CodecKind::TqMseGrouped || c->kind == CodecKind::QuaRot)
          return true;
  return false;
}

// Mean and sample standard deviation (0 for one value).
std::pair<double, double> mean_sd(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m += x;
  m /= static_cast<double>(v.size());
  double s = 0.0;
  for (double x : v) s += (x - m) * (x - m);
  return {m, v.size() > 1 ? std::sqrt(s / static_cast<double>(v.size() - 1)) : 0.0};
}

json stat_json(const std::vector<double>& per_seed) {
  const auto [m, sd] = mean_sd(per_seed);
  return {{"mean", m}, {"sd", sd}, {"per_seed", per_seed}};
}

// per_seed[s][l] -> {"layers_mean", "layers_sd", "mean" (over layers), "mean_sd" (over seeds), "per_seed"}
// Per-seed next-token summaries -> {field: {"mean", "sd", "per_seed"}} for every summary field.
json next_token_json(const std::vector<NextTokenSummary>& per_seed) {
  json out = json::object();
  const json first = per_seed.at(0).to_json();
  for (const auto& [key, v] : first.items()) {
    std::vector<double> vals;
    for (const auto& s : per_seed) vals.push_back(s.to_json().at(key).get<double>());
    out[key] = stat_json(vals);
  }
  return out;
}

json layer_stat_json(const std::vector<std::vector<double>>& per_seed) {
  const size_t S = per_seed.size(), L = per_seed[0].size();
  std::vector<double> lm(L), lsd(L), seed_means(S);
  for (size_t l = 0; l < L; ++l) {
    std::vector<double> v(S);
    for (size_t s = 0; s < S; ++s) v[s] = per_seed[s][l];
    std::tie(lm[l], lsd[l]) = mean_sd(v);
  }
  for (size_t s = 0; s < S; ++s) seed_means[s] = mean_sd(per_seed[s]).first;
  const auto [m, sd] = mean_sd(seed_means);
  return {{"layers_mean", lm}, {"layers_sd", lsd}, {"mean", m}, {"mean_sd", sd}, {"per_seed", per_seed}};
}

}  // namespace

json evaluate_plans(Model& model, std::span<const int32_t> tokens, const std::vector<PlanEntry>& plans,
                    const EvalOptions& opt) {
  const ModelConfig& cfg = model.config();
  check_param(opt.ctx >= 4, "EvalOptions.ctx", "{}: expected at least 4", opt.ctx);
  check_param(opt.n_seeds >= 1 && opt.n_seeds <= 1000, "EvalOptions.n_seeds", "{}: expected 1..1000", opt.n_seeds);
  check_param(opt.query_stride >= 1, "EvalOptions.query_stride", "{}: expected ≥ 1", opt.query_stride);
  // A stride ≥ ctx keeps only query 0 of each window, which attends to one key: its KL is 0 by construction.
  check_param(opt.query_stride < opt.ctx, "EvalOptions.query_stride",
              "{}: must be below the window length {} (it would keep only query 0 of each window, whose "
              "attention KL is 0 by construction)", opt.query_stride, opt.ctx);
  const int64_t n_chunks = static_cast<int64_t>(tokens.size()) / opt.ctx;
  check_param(n_chunks >= 1, "EvalOptions.ctx", "{}: {} tokens do not fill one window", opt.ctx, tokens.size());
  check_param(!opt.perplexity || n_chunks >= 2, "EvalOptions.ctx",
              "{}: perplexity needs at least 2 windows ({} tokens, llama-perplexity's rule); got {} tokens", opt.ctx,
              2 * opt.ctx, tokens.size());
  check_param(!opt.perplexity || opt.perplexity_k || opt.perplexity_kv, "EvalOptions.perplexity_k",
              "false with perplexity_kv false: perplexity needs at least one mode (K only or K+V)");
  {
    std::set<std::string> names;
    for (const auto& p : plans) check(names.insert(p.name).second, "eval: two plans are named '{}'", p.name);
  }
  // A fitted plan's calibration window marks the NMSE buckets past it; checked before the passes.
  for (const auto& p : plans)
    if (p.plan.fit.is_object() && p.plan.fit.contains("ctx"))
      check(p.plan.fit["ctx"].is_number_integer() && p.plan.fit["ctx"].get<int64_t>() >= 1,
            "eval: plan '{}': fit.ctx = {}: expected a positive integer (the calibration window in tokens)", p.name,
            p.plan.fit["ctx"].dump());
  const int L = cfg.n_layers, S = opt.n_seeds;
  const size_t P = plans.size();

  // Codecs per plan and run seed (deterministic plans: seed 0 only).
  std::vector<std::vector<std::shared_ptr<const cache::PlanCodecs>>> codecs(P);
  std::vector<bool> det(P);
  for (size_t p = 0; p < P; ++p) {
    det[p] = !uses_rotation(plans[p].plan);
    const int ns = det[p] ? 1 : S;
    for (int s = 0; s < ns; ++s)
      codecs[p].push_back(std::make_shared<const cache::PlanCodecs>(cache::reseeded_plan(plans[p].plan, s), cfg,
                                                                     plans[p].file.empty() ? plans[p].name : plans[p].file));
  }

  // --- passes, window by window -------------------------------------------------
  // Per window: (1) the fp16-cache reference (K and V rounded to fp16, as llama.cpp's f16
  // cache; only with perplexity), whose next-token logits every other pass is compared with;
  // (2) the fp32 pass: reference perplexity + MAE/KL hooks; (3) each plan, run seed and mode
  // (K only, K+V) with a FakeQuantKVCache: perplexity and next-token KLD / top-1 / Δp.
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::vector<std::vector<LogitErrorSums>>> sums(P);  // [p][s][l]
  for (size_t p = 0; p < P; ++p) sums[p].assign(codecs[p].size(), std::vector<LogitErrorSums>(L));
  const float scale = 1.0f / std::sqrt(static_cast<float>(cfg.head_dim));
  // Planned vs measured stored bytes: the first window's K/V of every layer also go into a
  // PackedKVCache per plan (run seed 0) when the packed cache serves the plan; its page bytes
  // are compared with plan_stored_bytes_at (format/stored_bytes.h).
  std::vector<std::unique_ptr<cache::PackedKVCache>> packed(P);
  std::vector<std::string> not_packed(P);
  for (size_t p = 0; p < P; ++p) {
    try {
      packed[p] = std::make_unique<cache::PackedKVCache>(cfg.kv_shape(opt.ctx), codecs[p][0]);
    } catch (const Error& e) {
      not_packed[p] = e.what();
    }
  }
  bool first_window = true;
  // The fp32 pass's activations of the current window when a reference cache records them.
  WindowReference* record = nullptr;
  ForwardHooks hooks;
  hooks.on_layer = [&](const LayerActivations& a) {
    if (record) {
      WindowReference::Layer& r = record->layers[a.layer];
      const size_t nq = static_cast<size_t>(a.n) * a.n_heads * a.head_dim, nk = static_cast<size_t>(a.n) * a.n_kv_heads * a.head_dim;
      r.q_post.insert(r.q_post.end(), a.q_post, a.q_post + nq);
      r.k_pre.insert(r.k_pre.end(), a.k_pre, a.k_pre + nk);
      r.k_post.insert(r.k_post.end(), a.k_post, a.k_post + nk);
      r.v.insert(r.v.end(), a.v, a.v + nk);
      if (a.layer == 0) record->pos.insert(record->pos.end(), a.pos, a.pos + a.n);
    }
    if (first_window)
      for (size_t p = 0; p < P; ++p)
        if (packed[p]) packed[p]->append(a.layer, a.n, a.pos, a.k_pre, a.k_post, a.v);
    const LogitErrorReference ref(a.q_post, a.k_post, a.n, a.n_heads, a.n_kv_heads, a.head_dim, scale,
                                  opt.query_stride);
    std::vector<float> khat(static_cast<size_t>(a.n) * a.n_kv_heads * a.head_dim);
    for (size_t p = 0; p < P; ++p)
      for (size_t s = 0; s < codecs[p].size(); ++s) {
        const cache::PlanCodecs& c = *codecs[p][s];
        cache::fake_quant_sequence(c, a.layer, cache::KVSide::key, a.k_post, a.k_pre, a.pos, a.n,
                                   c.plan().fp16_window, c.plan().sink_tokens, khat.data());
        sums[p][s][a.layer].merge(ref.compare(khat.data()));
      }
  };
  const int64_t V = cfg.n_vocab, ctx = opt.ctx, first = ctx / 2, per_window = ctx - 1 - first;
  // Perplexity modes run: 0 = K only, 1 = K and V.
  std::vector<int> modes;
  if (opt.perplexity_k) modes.push_back(0);
  if (opt.perplexity_kv) modes.push_back(1);
  std::optional<ReferenceCache> rcache;
  if (!opt.reference_cache.empty()) {
    check_param(!opt.reference_key.empty(), "EvalOptions.reference_key",
                "empty: a reference cache needs the key of the model, tokens and windows (reference_key)");
    rcache.emplace(opt.reference_cache, opt.reference_key,
                   ReferenceShape{opt.ctx, cfg.n_vocab, L, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim});
  }
  std::vector<float> logits(static_cast<size_t>(ctx) * V);
  std::vector<float> ref_rows(opt.perplexity ? static_cast<size_t>(per_window) * V : 0);
  std::vector<int32_t> win(ctx);
  double fp_nll = 0.0;
  double ref_nll = 0.0;  // the fp16-cache reference's summed next-token NLL (perplexity only)
  int64_t scored = 0;
  NextTokenStats fp_vs_ref;
  std::vector<std::vector<std::array<double, 2>>> nll(P);          // [p][s][mode]
  std::vector<std::vector<std::array<NextTokenStats, 2>>> nts(P);  // [p][s][mode]
  for (size_t p = 0; p < P; ++p) {
    nll[p].assign(codecs[p].size(), {0.0, 0.0});
    nts[p].resize(codecs[p].size());
  }
  std::shared_ptr<const cache::PlanCodecs> ref_codecs;
  if (opt.perplexity) ref_codecs = std::make_shared<const cache::PlanCodecs>(baseline_plan("fp16", cfg), cfg, "fp16 cache");
  {
    int64_t passes = 1 + (opt.perplexity ? 1 : 0);
    if (opt.perplexity)
      for (size_t p = 0; p < P; ++p) passes += static_cast<int64_t>(codecs[p].size()) * static_cast<int64_t>(modes.size());
    Progress prog(fmt::format("eval: {} windows × {} passes (fp16 reference, fp32 + MAE/KL, plans)", n_chunks, passes),
                  n_chunks * passes);
    int64_t done = 0;
    for (int64_t c = 0; c < n_chunks; ++c) {
      std::copy(tokens.begin() + c * ctx, tokens.begin() + (c + 1) * ctx, win.begin());
      if (opt.bos_id >= 0) win[0] = opt.bos_id;
      const int32_t* target = tokens.data() + c * ctx + 1;  // target of position j: tokens[c·ctx + j + 1]
      std::optional<WindowReference> cached;
      if (rcache) cached = rcache->load(c, opt.perplexity);
      if (cached) {
        // The reference passes of this window from the cache: the fp16-cache logits, the fp32 pass's
        // perplexity terms and its activations replayed into the MAE/KL hooks.
        if (opt.perplexity) {
          ref_rows = cached->ref_logits;
          for (int64_t i = first; i < ctx - 1; ++i)
            ref_nll += token_nll(&ref_rows[(i - first) * V], static_cast<int>(V), target[i]);
        }
        for (int l = 0; l < L; ++l) {
          const WindowReference::Layer& r = cached->layers[l];
          LayerActivations a;
          a.layer = l;
          a.n = ctx;
          a.pos = cached->pos.data();
          a.n_heads = cfg.n_heads;
          a.n_kv_heads = cfg.n_kv_heads;
          a.head_dim = cfg.head_dim;
          a.q_post = r.q_post.data();
          a.k_pre = r.k_pre.data();
          a.k_post = r.k_post.data();
          a.v = r.v.data();
          hooks.on_layer(a);
        }
        fp_nll += cached->fp_nll;
        if (opt.perplexity)
          for (const TokenComparison& t : cached->fp_vs_ref) fp_vs_ref.add(t);
        scored += per_window;
        first_window = false;
        done += opt.perplexity ? 2 : 1;
        prog.update(done);
      } else {
        WindowReference rec;
        if (rcache) {
          rec.perplexity = opt.perplexity;
          rec.layers.resize(L);
          record = &rec;
        }
        if (opt.perplexity) {
          cache::FakeQuantOptions fo;
          fo.quantize_v = true;
          cache::FakeQuantKVCache kv(cfg.kv_shape(ctx), ref_codecs, fo);
          model.forward(win, 0, kv, logits.data(), true);
          std::copy(logits.begin() + first * V, logits.begin() + (ctx - 1) * V, ref_rows.begin());
          for (int64_t i = first; i < ctx - 1; ++i) ref_nll += token_nll(&logits[i * V], static_cast<int>(V), target[i]);
          prog.update(++done);
        }
        DenseKVCache kv = model.make_dense_cache(ctx);
        model.forward(win, 0, kv, logits.data(), true, &hooks);
        record = nullptr;
        double window_nll = 0.0;
        for (int64_t i = first; i < ctx - 1; ++i) {
          window_nll += token_nll(&logits[i * V], static_cast<int>(V), target[i]);
          if (opt.perplexity) {
            const TokenComparison t =
                compare_next_token(&ref_rows[(i - first) * V], &logits[i * V], static_cast<int>(V), target[i]);
            fp_vs_ref.add(t);
            rec.fp_vs_ref.push_back(t);
          }
        }
        fp_nll += window_nll;
        scored += per_window;
        first_window = false;
        prog.update(++done);
        if (rcache) {
          rec.fp_nll = window_nll;
          if (opt.perplexity) rec.ref_logits = ref_rows;
          rcache->save(c, rec);
        }
      }
      if (!opt.perplexity) continue;
      for (size_t p = 0; p < P; ++p)
        for (size_t s = 0; s < codecs[p].size(); ++s)
          for (int mode : modes) {
            cache::FakeQuantOptions fo;
            fo.quantize_v = mode == 1;
            cache::FakeQuantKVCache kv(cfg.kv_shape(ctx), codecs[p][s], fo);
            model.forward(win, 0, kv, logits.data(), true);
            for (int64_t i = first; i < ctx - 1; ++i) {
              nll[p][s][mode] += token_nll(&logits[i * V], static_cast<int>(V), target[i]);
              nts[p][s][mode].add(
                  compare_next_token(&ref_rows[(i - first) * V], &logits[i * V], static_cast<int>(V), target[i]));
            }
            prog.update(++done);
          }
    }
    prog.finish();
  }
  const double fp_ppl = std::exp(fp_nll / static_cast<double>(scored));
  spdlog::info("fp32 cache: perplexity {:.4f} over {} scored tokens ({} windows of {})", fp_ppl, scored, n_chunks, ctx);
  std::vector<std::vector<double>> ppl_k(P), ppl_kv(P);
  std::vector<std::array<std::vector<NextTokenSummary>, 2>> next_tok(P);  // [p][mode][s]
  if (opt.perplexity)
    for (size_t p = 0; p < P; ++p)
      for (size_t s = 0; s < codecs[p].size(); ++s)
        for (int mode : modes) {
          const double ppl = std::exp(nll[p][s][mode] / static_cast<double>(scored));
          (mode == 0 ? ppl_k : ppl_kv)[p].push_back(ppl);
          next_tok[p][mode].push_back(nts[p][s][mode].summary());
          spdlog::info("eval: {} seed {} {}: perplexity {:.4f}, KLD vs fp16 cache {:.5f}, top-1 {:.2f} %", plans[p].name, s,
                       mode == 0 ? "K-only" : "K+V", ppl, next_tok[p][mode].back().kld_mean,
                       100 * next_tok[p][mode].back().top1);
        }

  // --- report ---------------------------------------------------------------
  json rep;
  rep["format"] = "ratekv-eval";
  rep["version"] = 1;
  rep["model"] = {{"arch", cfg.arch},         {"n_layers", L},           {"n_heads", cfg.n_heads},
                  {"n_kv_heads", cfg.n_kv_heads}, {"head_dim", cfg.head_dim}, {"rope_layout", rope_layout_name(cfg.rope_layout)}};
  rep["n_tokens"] = tokens.size();
  rep["ctx"] = ctx;
  rep["n_chunks"] = n_chunks;
  rep["ppl_scored_tokens"] = scored;
  rep["query_stride"] = opt.query_stride;
  rep["seeds"] = S;
  rep["mae_definition"] =
      "mean over (query head, query i, key j <= i) within each window of |q.k - q.khat|, post-RoPE, unscaled; "
      "K-only (V exact); KL = mean over (query head, query) of KL(p || phat) in nats, p = softmax(q.k/sqrt(d))";
  rep["fp"] = {{"name", "fp32 cache"}, {"ppl", fp_ppl}, {"bits", {{"k", 32.0}, {"v", 32.0}}}};
  if (opt.perplexity) {
    rep["fp"]["next_token"] = fp_vs_ref.summary().to_json();
    // The reference itself: the fp16 cache (K and V rounded to fp16), the panel's "fp16" row.
    rep["fp16_cache"] = {{"name", "fp16 cache"},
                         {"ppl", std::exp(ref_nll / static_cast<double>(scored))},
                         {"bits", {{"k", 16.0}, {"v", 16.0}}}};
    rep["next_token_definition"] =
        "per scored token (the perplexity positions), against the fp16-cache model (K and V rounded to fp16, as "
        "llama.cpp's f16 cache): KLD = KL(p_fp16 || p_plan) in nats over the vocabulary, top1 = argmax agrees, "
        "delta_p = p_plan(next token) - p_fp16(next token); median, p90, p99 as llama-perplexity --kl-divergence "
        "(interpolated percentiles); 'k' = K-only cache, 'kv' = K+V";
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  rep["seconds"] = seconds;

  // Query-position buckets of the NMSE: every bucket holding a position < ctx.
  const int n_buckets = position_bucket(ctx - 1) + 1;
  json buckets = json::array();
  for (int b = 0; b < n_buckets; ++b) {
    int64_t pairs = 0;
    if (P > 0)
      for (int l = 0; l < L; ++l)
        if (static_cast<size_t>(b) < sums[0][0][l].by_position.size()) pairs += sums[0][0][l].by_position[b].pairs;
    buckets.push_back({{"begin", position_bucket_begin(b)},
                       {"end", std::min<int64_t>(position_bucket_begin(b + 1), ctx)},
                       {"pairs_per_layer", L > 0 ? pairs / L : 0}});
  }
  rep["position_buckets"] = buckets;
  rep["nmse_definition"] =
      "per bucket of query positions i (position in the window, which starts from an empty cache): "
      "sum over (layer, query head, i in bucket, key j <= i) of (q.khat - q.k)^2 / sum of (q.k)^2, "
      "pre-softmax logits, post-RoPE, q and k from the fp32 pass; K-only";

  json jp = json::array();
  std::vector<std::vector<std::vector<double>>> mae(P), kl(P);  // [p][s][l], expanded to S seeds
  for (size_t p = 0; p < P; ++p) {
    for (int s = 0; s < S; ++s) {
      const size_t si = det[p] ? 0 : static_cast<size_t>(s);
      std::vector<double> m(L), k(L);
      for (int l = 0; l < L; ++l) {
        m[l] = sums[p][si][l].mae();
        k[l] = sums[p][si][l].kl();
      }
      mae[p].push_back(m);
      kl[p].push_back(k);
    }
    auto expand = [&](const std::vector<double>& v) {
      std::vector<double> out;
      for (int s = 0; s < S; ++s) out.push_back(v[det[p] ? 0 : s]);
      return out;
    };
    // Logit NMSE by query-position bucket, all layers and heads: per seed Σ_l err / Σ_l ref.
    std::vector<double> nmse_all;
    std::vector<std::vector<double>> nmse_pos;  // [s][b]
    for (int s = 0; s < S; ++s) {
      LogitErrorSums all;
      all.by_position.resize(static_cast<size_t>(n_buckets));
      for (int l = 0; l < L; ++l) all.merge(sums[p][det[p] ? 0 : s][l]);
      nmse_all.push_back(all.nmse());
      std::vector<double> v(static_cast<size_t>(n_buckets));
      for (int b = 0; b < n_buckets; ++b) v[b] = all.by_position[b].nmse();
      nmse_pos.push_back(v);
    }
    json pos_mean = json::array(), pos_sd = json::array();
    for (int b = 0; b < n_buckets; ++b) {
      std::vector<double> v(S);
      for (int s = 0; s < S; ++s) v[s] = nmse_pos[s][b];
      const auto [m, sd] = mean_sd(v);
      pos_mean.push_back(m);
      pos_sd.push_back(sd);
    }
    const Plan::Achieved a = plans[p].plan.achieved();
    json e = {{"name", plans[p].name},
              {"file", plans[p].file},
              {"method", plans[p].plan.method},
              {"deterministic", static_cast<bool>(det[p])},
              {"fp16_window", plans[p].plan.fp16_window},
              {"sink_tokens", plans[p].plan.sink_tokens},
              {"bits", {{"k", a.k}, {"v", a.v}, {"k_code", a.k_code}, {"v_code", a.v_code}}},
              {"mae", layer_stat_json(mae[p])},
              {"kl", layer_stat_json(kl[p])},
              {"nmse", stat_json(nmse_all)},
              {"nmse_by_position", {{"mean", pos_mean}, {"sd", pos_sd}, {"per_seed", nmse_pos}}}};
    // The calibration window length of a fitted plan (TaSQ / CQ record it in "fit"):
    // NMSE buckets at or past it are positions the fit never saw.
    const json& fit = plans[p].plan.fit;
    if (fit.is_object() && fit.contains("ctx")) {
      e["fit_ctx"] = fit["ctx"];
      if (fit.contains("calibration_tokens")) e["fit_calibration_tokens"] = fit["calibration_tokens"];
    }
    e["stored"] = plan_stored_bytes(plans[p].plan).to_json();
    {
      // The first window (ctx tokens): planned bytes (sink/window rows are fp16 rows outside the pages)
      // against the packed cache's allocated pages, or, for kinds the packed cache does not store, the
      // plan's quantizers' own count (Quantizer::bits_per_element(ctx), KIVI's fp16 token group included).
      const Plan& pl = plans[p].plan;
      const int64_t nq = std::max<int64_t>(0, ctx - pl.sink_tokens - pl.fp16_window);
      const double rows16 = static_cast<double>(ctx - nq) * L * cfg.n_kv_heads * 2 * cfg.head_dim * 2;
      const double planned = plan_stored_bytes_at(pl, ctx) - rows16;
      json m = {{"tokens", ctx}, {"planned_bytes", planned}};
      if (packed[p]) {
        m["measured_bytes"] = static_cast<double>(packed[p]->page_bytes());
        m["measured_by"] = "packed cache pages";
      } else {
        double bits = 0;
        for (int l = 0; l < L && nq > 0; ++l)
          for (int h = 0; h < cfg.n_kv_heads; ++h)
            for (int sd = 0; sd < 2; ++sd) {
              const quant::Quantizer* q = codecs[p][0]->quantizer(l, h, static_cast<cache::KVSide>(sd));
              bits += (q ? q->bits_per_element(nq) : 16.0) * static_cast<double>(nq) * cfg.head_dim;
            }
        m["measured_bytes"] = bits / 8;
        m["measured_by"] = "the plan's quantizers (packed cache: " + not_packed[p] + ")";
      }
      e["stored"]["first_window"] = m;
    }
    if (opt.perplexity) {
      if (opt.perplexity_k) e["ppl_k"] = stat_json(expand(ppl_k[p]));
      if (opt.perplexity_kv) e["ppl_kv"] = stat_json(expand(ppl_kv[p]));
      auto expand_nt = [&](const std::vector<NextTokenSummary>& v) {
        std::vector<NextTokenSummary> out;
        for (int s = 0; s < S; ++s) out.push_back(v[det[p] ? 0 : s]);
        return out;
      };
      e["next_token"] = json::object();
      if (opt.perplexity_k) e["next_token"]["k"] = next_token_json(expand_nt(next_tok[p][0]));
      if (opt.perplexity_kv) e["next_token"]["kv"] = next_token_json(expand_nt(next_tok[p][1]));
    }
    jp.push_back(e);
  }
  rep["plans"] = jp;

  // Pairwise comparisons of plans at equal stored K bits, or made for the same K budget (same unit and
  // value: each stores at most it; Block-GTQ may leave bits of its budget unused).
  json cmp = json::array();
  for (size_t a = 0; a < P; ++a)
    for (size_t b = a + 1; b < P; ++b) {
      const Plan &pa = plans[a].plan, &pb = plans[b].plan;
      const double ka = pa.achieved().k, kb = pb.achieved().k;
      const bool same_budget = pa.budget_unit == pb.budget_unit && std::abs(pa.budget_k - pb.budget_k) < 1e-9 &&
                               pa.budget_k > 0 && pa.method != pb.method;
      if (std::abs(ka - kb) >= opt.pair_tolerance && !same_budget) continue;
      std::vector<double> red_layer(L), seed_red(S);
      int lower = 0;
      for (int l = 0; l < L; ++l) {
        std::vector<double> r(S);
        for (int s = 0; s < S; ++s) r[s] = mae[b][s][l] > 0 ? 1.0 - mae[a][s][l] / mae[b][s][l] : 0.0;
        red_layer[l] = mean_sd(r).first;
        const double ma = mean_sd([&] { std::vector<double> v; for (int s = 0; s < S; ++s) v.push_back(mae[a][s][l]); return v; }()).first;
        const double mb = mean_sd([&] { std::vector<double> v; for (int s = 0; s < S; ++s) v.push_back(mae[b][s][l]); return v; }()).first;
        lower += ma < mb;
      }
      for (int s = 0; s < S; ++s) {
        double acc = 0.0;
        for (int l = 0; l < L; ++l) acc += mae[b][s][l] > 0 ? 1.0 - mae[a][s][l] / mae[b][s][l] : 0.0;
        seed_red[s] = acc / L;
      }
      json c = {{"a", plans[a].name},
                {"b", plans[b].name},
                {"k_bits_a", ka},
                {"k_bits_b", kb},
                {"paired_by", std::abs(ka - kb) < opt.pair_tolerance ? "stored K bits" : "K budget"},
                {"n_layers", L},
                {"layers_a_lower_mae", lower},
                {"fraction_layers_a_lower_mae", static_cast<double>(lower) / L},
                {"mae_reduction_per_layer", red_layer},
                {"mae_reduction", stat_json(seed_red)}};
      if (opt.perplexity) {
        std::vector<double> dk(S), dkv(S);
        for (int s = 0; s < S; ++s) {
          if (opt.perplexity_k) dk[s] = ppl_k[a][det[a] ? 0 : s] - ppl_k[b][det[b] ? 0 : s];
          if (opt.perplexity_kv) dkv[s] = ppl_kv[a][det[a] ? 0 : s] - ppl_kv[b][det[b] ? 0 : s];
        }
        if (opt.perplexity_k) c["ppl_k_diff"] = stat_json(dk);
        if (opt.perplexity_kv) c["ppl_kv_diff"] = stat_json(dkv);
        std::vector<double> kk(S), kkv(S);
        for (int s = 0; s < S; ++s) {
          if (opt.perplexity_k)
            kk[s] = next_tok[a][0][det[a] ? 0 : s].kld_mean - next_tok[b][0][det[b] ? 0 : s].kld_mean;
          if (opt.perplexity_kv)
            kkv[s] = next_tok[a][1][det[a] ? 0 : s].kld_mean - next_tok[b][1][det[b] ? 0 : s].kld_mean;
        }
        if (opt.perplexity_k) c["kld_k_diff"] = stat_json(kk);
        if (opt.perplexity_kv) c["kld_kv_diff"] = stat_json(kkv);
      }
      cmp.push_back(c);
    }
  rep["comparisons"] = cmp;
  rep["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

std::string format_eval_report(const json& r) {
  std::string out;
  // "mean ± sd" over seeds; one seed measures no spread, so only the value is printed.
  const bool spread = r["seeds"].get<int>() > 1;
  auto pmf = [spread](double mean, double sd, int prec, bool sign = false) {
    const std::string m = sign ? fmt::format("{:+.{}f}", mean, prec) : fmt::format("{:.{}f}", mean, prec);
    return spread ? fmt::format("{} ± {:.{}f}", m, sd, prec) : m;
  };
  out += fmt::format("ratekv eval: {} tokens, {} windows of {} (perplexity: {} scored tokens, llama.cpp convention), "
                     "{} run seed(s), MAE/KL query stride {}\n",
                     r["n_tokens"].get<int64_t>(), r["n_chunks"].get<int64_t>(), r["ctx"].get<int64_t>(),
                     r["ppl_scored_tokens"].get<int64_t>(), r["seeds"].get<int>(), r["query_stride"].get<int64_t>());
  out += std::string("bits = stored bits per element (everything the cache holds per token: codes, norms, scales, "
                     "tile padding), B/token = stored bytes per token, all layers; MAE/KL: K-only, V exact, mean over "
                     "layers") +
         (spread ? " (± sd over seeds); PPL ± sd over seeds" : "") +
         "; KLD (nats), top-1 agreement and Δp of the next-token distribution against the fp16-cache model, K+V "
         "quantized" +
         (spread ? " (mean over seeds)\n\n" : "; one seed: no spread is measured, no ± is printed\n\n");
  out += fmt::format("| {:<22} | {:>6} | {:>6} | {:>8} | {:>16} | {:>18} | {:>16} | {:>16} | {:>9} | {:>9} | {:>9} | "
                     "{:>7} | {:>8} |\n",
                     "plan", "K bits", "V bits", "B/token", "logit MAE", "attn KL (nats)", "PPL K-only", "PPL K+V",
                     "KLD", "KLD med", "KLD p99", "top-1", "Δp");
  out += fmt::format("|{:-<24}|{:->8}|{:->8}|{:->10}|{:->18}|{:->20}|{:->18}|{:->18}|{:->11}|{:->11}|{:->11}|{:->9}|{:->10}|\n",
                     "", "", "", "", "", "", "", "", "", "", "", "", "");
  const double fpp = r["fp"]["ppl"].get<double>();
  auto nt_cells = [](const json& nt) {
    if (!nt.is_object()) return fmt::format("{:>9} | {:>9} | {:>9} | {:>7} | {:>8}", "-", "-", "-", "-", "-");
    auto g = [&](const char* k) { return nt.at(k).is_object() ? nt.at(k).at("mean").get<double>() : nt.at(k).get<double>(); };
    return fmt::format("{:>9.5f} | {:>9.5f} | {:>9.4f} | {:>6.2f}% | {:>+7.3f}%", g("kld_mean"), g("kld_median"),
                       g("kld_p99"), 100 * g("top1"), 100 * g("delta_p_mean"));
  };
  const int64_t fp_bytes = 2 * r["model"]["n_layers"].get<int64_t>() * r["model"]["n_kv_heads"].get<int64_t>() *
                           r["model"]["head_dim"].get<int64_t>() * 4;
  out += fmt::format("| {:<22} | {:>6} | {:>6} | {:>8} | {:>16} | {:>18} | {:>16.4f} | {:>16.4f} | {} |\n", "fp32 cache",
                     "32", "32", fp_bytes, "0", "0", fpp, fpp, nt_cells(r["fp"].value("next_token", json())));
  auto pm = [&](const json& j) { return pmf(j["mean"].get<double>(), j["sd"].get<double>(), 4); };
  for (const auto& p : r["plans"]) {
    const json kv = p.contains("next_token") ? p["next_token"].value("kv", json()) : json();
    out += fmt::format("| {:<22} | {:>6.3f} | {:>6.3f} | {:>8} | {:>16} | {:>18} | {:>16} | {:>16} | {} |\n",
                       p["name"].get<std::string>(), p["bits"]["k"].get<double>(), p["bits"]["v"].get<double>(),
                       p.contains("stored") ? fmt::format("{:.10g}", p["stored"]["bytes_per_token"].get<double>()) : "-",
                       pmf(p["mae"]["mean"].get<double>(), p["mae"]["mean_sd"].get<double>(), 4),
                       pmf(p["kl"]["mean"].get<double>(), p["kl"]["mean_sd"].get<double>(), 5),
                       p.contains("ppl_k") ? pm(p["ppl_k"]) : "-", p.contains("ppl_kv") ? pm(p["ppl_kv"]) : "-", nt_cells(kv));
  }
  out += "\nStored bytes of the first window (planned by plan_stored_bytes_at vs measured):";
  for (const auto& p : r["plans"]) {
    if (!p.contains("stored") || !p["stored"].contains("first_window")) continue;
    const auto& fw = p["stored"]["first_window"];
    const double a = fw["planned_bytes"].get<double>(), b = fw["measured_bytes"].get<double>();
    out += fmt::format(" {} {:.10g}{}{:.10g}{};", p["name"].get<std::string>(), a, a == b ? " = " : " != ", b,
                       fw["measured_by"].get<std::string>().rfind("packed", 0) == 0 ? " (pages)" : " (quantizers)");
  }
  out += "\n";
  if (!r["comparisons"].empty()) {
    out += std::string("\nPairs at equal stored K bits or the same K budget (a vs b): layers where a has lower MAE, "
                       "mean per-layer MAE reduction 1 - MAE_a/MAE_b") +
           (spread ? " (± sd over seeds)" : "") + ", paired PPL and KLD (K+V) differences a - b\n";
    for (const auto& c : r["comparisons"]) {
      out += fmt::format("  {} vs {} (K {:.3f} / {:.3f}): {}/{} layers lower ({:.0f} %), MAE reduction {} %",
                         c["a"].get<std::string>(), c["b"].get<std::string>(), c["k_bits_a"].get<double>(),
                         c["k_bits_b"].get<double>(), c["layers_a_lower_mae"].get<int>(), c["n_layers"].get<int>(),
                         100.0 * c["fraction_layers_a_lower_mae"].get<double>(),
                         pmf(100.0 * c["mae_reduction"]["mean"].get<double>(),
                             100.0 * c["mae_reduction"]["sd"].get<double>(), 1));
      if (c.contains("ppl_k_diff"))
        out += ", ΔPPL K-only " + pmf(c["ppl_k_diff"]["mean"].get<double>(), c["ppl_k_diff"]["sd"].get<double>(), 4, true);
      if (c.contains("ppl_kv_diff"))
        out += ", ΔPPL K+V " + pmf(c["ppl_kv_diff"]["mean"].get<double>(), c["ppl_kv_diff"]["sd"].get<double>(), 4, true);
      if (c.contains("kld_kv_diff"))
        out += ", ΔKLD K+V " + pmf(c["kld_kv_diff"]["mean"].get<double>(), c["kld_kv_diff"]["sd"].get<double>(), 5, true);
      out += "\n";
    }
  }
  if (r.contains("position_buckets") && !r["plans"].empty() && r["plans"][0].contains("nmse_by_position")) {
    // Smallest calibration window among fitted plans: buckets from it on are past it.
    int64_t fit_ctx = 0;
    std::string fitted;
    for (const auto& p : r["plans"])
      if (p.contains("fit_ctx")) {
        const int64_t c = p["fit_ctx"].get<int64_t>();
        fit_ctx = fit_ctx == 0 ? c : std::min(fit_ctx, c);
        fitted += (fitted.empty() ? "" : ", ") + fmt::format("{} {}", p["name"].get<std::string>(), c);
      }
    out += "\nAttention-logit NMSE by query position: sum (q.khat - q.k)^2 / sum (q.k)^2 over all layers, query heads "
           "and causal keys of the queries in each position bucket (pre-softmax, K-only; mean over seeds)\n";
    if (fit_ctx > 0)
      out += fmt::format("Calibration window length (fit ctx) of fitted plans: {}; buckets marked * start at or past "
                         "{} tokens (positions the fit never saw)\n",
                         fitted, fit_ctx);
    out += fmt::format("| {:<22} | {:>10} |", "plan", "all");
    for (const auto& b : r["position_buckets"]) {
      const int64_t lo = b["begin"].get<int64_t>(), hi = b["end"].get<int64_t>() - 1;
      out += fmt::format(" {:>10} |", fmt::format("{}{}-{}", fit_ctx > 0 && lo >= fit_ctx ? "*" : "", lo, hi));
    }
    out += "\n";
    for (const auto& p : r["plans"]) {
      out += fmt::format("| {:<22} | {:>10.3e} |", p["name"].get<std::string>(), p["nmse"]["mean"].get<double>());
      for (const auto& v : p["nmse_by_position"]["mean"]) out += fmt::format(" {:>10.3e} |", v.get<double>());
      out += "\n";
    }
  }
  out += "\nPer-layer RoPE-logit MAE (mean over seeds)\n";
  out += fmt::format("{:>5}", "layer");
  for (const auto& p : r["plans"]) out += fmt::format(" {:>14.14}", p["name"].get<std::string>());
  out += "\n";
  const int L = r["model"]["n_layers"].get<int>();
  for (int l = 0; l < L; ++l) {
    out += fmt::format("{:>5}", l);
    for (const auto& p : r["plans"]) out += fmt::format(" {:>14.4f}", p["mae"]["layers_mean"][l].get<double>());
    out += "\n";
  }
  return out;
}

}  // namespace ratekv::eval
