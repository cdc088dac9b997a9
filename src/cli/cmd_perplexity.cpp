// `ratekv perplexity -m MODEL -f TEXT -c CTX [--chunks N] [--json] [--cache fp32|fake|packed --plan PLAN]`: perplexity
// of a whole file (tokenized with BOS iff the model declares it) with
// llama.cpp's llama-perplexity convention (ratekv/model/perplexity.h).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/gpu_cache.h"
#include "cli/loaded_model.h"
#include "cli/text_tokens.h"
#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/common/error.h"
#include "ratekv/common/log.h"
#include "ratekv/format/stored_bytes.h"
#include "ratekv/model/perplexity.h"
#ifdef RATEKV_HAVE_ENGINE
#include "ratekv/engine/perplexity.h"
#endif

namespace ratekv::cli {
namespace {

struct PerplexityArgs {
  std::string model, text, output, cache = "fp32", plan, ctk, ctv, device = "cpu", mode = "evaluation";
  int64_t n_ctx = 512;
  int64_t chunks = -1;
  int64_t chunk = 0;  // cuda: chunked prefill of each window (0: one piece)
  bool json = false, force = false, no_plan_check = false;
};

void run(const PerplexityArgs& a) {
  check(a.n_ctx >= 4, "-c: context {} is too small (need >= 4)", a.n_ctx);
  check_chunk_option(a.device, a.chunk);
  check_prefill_mode_option(a.device, a.mode);  // serving on the CPU was accepted and reported "evaluation mode"
  if (!a.output.empty()) check_output_path(a.output, a.force, "--output");  // before the run, not after
  const std::string text = read_text_file(a.text, "-f");
  warn_if_not_utf8(text, "-f", a.text);
  // Context, token count and cache are checked against the model's header,
  // before the weights load.
  require_engine(a.device);
  std::vector<int32_t> tokens;
  std::unique_ptr<KVCache> cache;
  std::string cache_kind = a.cache;
  const int64_t n_ctx = a.n_ctx;
#ifdef RATEKV_HAVE_ENGINE
  std::optional<engine::CacheFormat> gpu_fmt;
#endif
  check_plans_match_model({a.plan}, a.model, a.no_plan_check);
  LoadedModel lm = load_model(a.model, [&](const ModelHeader& h) {
    check(n_ctx <= h.config.n_ctx_train, "-c: context {} exceeds the model's context {}", n_ctx,
          h.config.n_ctx_train);
    const std::optional<Plan> types = cache_type_plan_or_empty(a.ctk, a.ctv, a.plan, h.config);
    if (a.device == "cuda") {
#ifdef RATEKV_HAVE_ENGINE
      gpu_fmt = gpu_cache_format(types, a.ctk, a.ctv, a.cache, a.plan, h.config);
#endif
    } else if (types) {
      cache = make_cache_for_plan(*types, h.config, n_ctx, cache_kind);
    } else {
      cache = make_cache(a.cache, h.config, n_ctx, a.plan);
    }
    const auto t_tok = std::chrono::steady_clock::now();
    tokens = h.tokenizer.encode(text, /*add_bos=*/true);
    spdlog::info("tokenized {} bytes into {} tokens in {:.2f} s (add_bos {})", text.size(), tokens.size(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t_tok).count(), h.add_bos);
    check(static_cast<int64_t>(tokens.size()) >= 2 * n_ctx,
          "-f/-c: '{}' has {} tokens; need at least 2·CTX = {} (llama-perplexity's requirement)", a.text,
          tokens.size(), 2 * n_ctx);
  });
  Model& model = *lm.model;
  const int64_t all_chunks = static_cast<int64_t>(tokens.size()) / n_ctx;
  const int64_t max_chunks = a.chunks > 0 ? std::min(a.chunks, all_chunks) : all_chunks;

  Progress progress("perplexity chunks", max_chunks);
  const auto on_chunk = [&](int64_t done, const PerplexityResult& run) {
    progress.update(done);
    spdlog::info("chunk {}/{}: ppl {:.4f}, running ppl {:.4f}", done, run.n_chunks, run.chunk_ppl.back(), run.ppl);
  };
  const auto t0 = std::chrono::steady_clock::now();
  PerplexityResult r;
  std::string cache_label = cache_kind, mode_name = "evaluation";
  size_t cache_bytes = 0;
  int64_t cache_tokens = 0;
  if (a.device == "cuda") {
#ifdef RATEKV_HAVE_ENGINE
    engine::EngineOptions o;
    const int64_t chunk = a.chunk > 0 && a.chunk < n_ctx ? a.chunk : 0;  // a chunk ≥ the window: one piece
    o.max_prefill_tokens = chunk > 0 ? chunk : n_ctx;
    o.pool_bytes = gpu_fmt->page_bytes_all_layers() * static_cast<size_t>((n_ctx + 63) / 64 + 1);
    auto eng = engine::Engine::create(model.config(), model.weights(), *gpu_fmt, o);
    const engine::PrefillMode mode =
        a.mode == "serving" ? engine::PrefillMode::serving : engine::PrefillMode::evaluation;
    spdlog::info("GPU engine ({}): {} cache, {} mode; {}", engine::cuda_device_name(), gpu_fmt->label(),
                 engine::prefill_mode_name(mode), eng->memory().summary());
    r = engine::gpu_perplexity(*eng, tokens, n_ctx, a.chunks, lm.add_bos, lm.tokenizer->bos_id(), mode, on_chunk,
                               chunk);
    cache_label = gpu_fmt->label();
    mode_name = engine::prefill_mode_name(mode);
    cache_tokens = n_ctx;
    cache_bytes = static_cast<size_t>((n_ctx + 63) / 64) * gpu_fmt->page_bytes_all_layers();
#endif
  } else {
    r = perplexity(model, *cache, tokens, n_ctx, a.chunks, lm.add_bos, lm.tokenizer->bos_id(), on_chunk);
    cache_bytes = cache->bytes();
    cache_tokens = cache->n_tokens();
  }
  progress.finish();
  // A perplexity that overflowed is no measurement: refuse it rather than print "PPL = inf" as a result
  // (the forward pass refuses NaN activations, but finite ones can still give logits whose NLL overflows).
  check(std::isfinite(r.ppl) && std::isfinite(r.mean_nll),
        "perplexity of -m '{}' on -f '{}' is not finite (mean NLL {} nats per token, PPL {}): the model's "
        "logits overflow; its weights are not usable as they are",
        a.model, a.text, r.mean_nll, r.ppl);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t n_chunks = r.n_chunks, count = r.n_scored;
  const double ppl = r.ppl, ppl_err = r.ppl_err, mean = r.mean_nll;
  const std::vector<double>& chunk_ppl = r.chunk_ppl;

  nlohmann::ordered_json j;
  j["model"] = a.model;
  j["text"] = a.text;
  j["device"] = a.device;
  j["cache"] = cache_label;
  j["plan"] = a.plan;
  j["cache_type_k"] = a.ctk;
  j["cache_type_v"] = a.ctv;
  j["mode"] = mode_name;
  j["cache_bytes"] = cache_bytes;
  j["cache_tokens"] = cache_tokens;
  if (const auto* pk = cache ? dynamic_cast<const cache::PackedKVCache*>(cache.get()) : nullptr) {
    // The packed pages after the last chunk against the plan's stored bytes for its tokens
    // (format/stored_bytes.h; sink and window rows are fp16 rows outside the pages).
    const ModelConfig& c = model.config();
    const int64_t n = pk->n_tokens(), nq = pk->n_quantized(0);
    j["page_bytes"] = pk->page_bytes();
    j["planned_page_bytes"] = plan_stored_bytes_at(pk->codecs().plan(), n, pk->sink_tokens(), pk->fp16_window()) -
                              static_cast<double>(n - nq) * c.n_layers * c.n_kv_heads * 2 * c.head_dim * 2;
    j["planned_bytes_per_token"] = plan_stored_bytes(pk->codecs().plan()).bytes_per_token();
  }
  j["fp16_bytes_per_token"] = model.config().kv_bytes_per_token_fp16();
  j["n_ctx"] = n_ctx;
  j["n_chunks"] = n_chunks;
  j["n_tokens_file"] = tokens.size();
  j["n_scored"] = count;
  j["add_bos"] = lm.add_bos;
  j["ppl"] = ppl;
  j["ppl_err"] = ppl_err;
  j["mean_nll"] = mean;
  j["chunk_ppl"] = chunk_ppl;
  j["seconds"] = secs;
  j["tokens_per_second"] = static_cast<double>(n_chunks * n_ctx) / secs;
  const std::string report =
      a.json ? j.dump(2) + "\n"
             : fmt::format("PPL = {:.4f} +/- {:.5f}  (ctx {}, {} chunks, {} tokens scored of {} in file, cache {}, "
                           "{}, {} mode)\n",
                           ppl, ppl_err, n_ctx, n_chunks, count, tokens.size(), cache_label, a.device, mode_name);
  if (!a.output.empty()) {
    std::ofstream out(a.output);
    check(static_cast<bool>(out), "--output: cannot open '{}' for writing", a.output);
    out << report;
    out.close();  // a full disk shows at close, not at <<
    check(static_cast<bool>(out), "--output: failed writing '{}'", a.output);
  } else {
    std::cout << report;
  }
  if (cache) std::fprintf(stderr, "%s\n", cache_size_report(cache_kind, *cache, model).c_str());
  std::fprintf(stderr, "perplexity: %lld chunks x %lld tokens in %.2f s (%.1f tokens/s)\n",
               static_cast<long long>(n_chunks), static_cast<long long>(n_ctx), secs, n_chunks * n_ctx / secs);
}

Registrar reg("perplexity", [](CLI::App& app) {
  auto args = std::make_shared<PerplexityArgs>();
  auto* cmd = app.add_subcommand("perplexity",
                                 "Perplexity of a text file (llama-perplexity convention: non-overlapping chunks of "
                                 "CTX tokens, second half of each chunk scored)");
  cmd->add_option("-m,--model", args->model, "GGUF model file")->required()->check(CLI::ExistingFile);
  cmd->add_option("-f,--file", args->text, "UTF-8 text file")->required()->check(CLI::ExistingFile);
  cmd->add_option("-c,--ctx-size", args->n_ctx, "chunk length in tokens")->capture_default_str();
  cmd->add_option("--chunks", args->chunks, "evaluate at most this many chunks (default: all)")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()));
  cmd->add_flag("--json", args->json, "print a JSON report");
  cmd->add_option("-o,--output", args->output, "write the report to this file instead of stdout")
      ->check(non_empty_path_validator("a file to write the report to (without -o: stdout)"));
  cmd->add_flag("--force", args->force, "overwrite --output if it exists");
  add_cache_option(cmd, args->cache);
  add_plan_option(cmd, args->plan);
  add_no_plan_check_option(cmd, args->no_plan_check);
  add_cache_type_options(cmd, args->ctk, args->ctv);
  add_device_option(cmd, args->device);
  cmd->add_option("--chunk", args->chunk,
                  "--device cuda: prefill each window in chunks of N tokens (a multiple of 64; 0 = one piece)")
      ->check(non_negative_validator());
  cmd->add_option("--prefill-mode", args->mode,
                  "--device cuda: evaluation (every K/V quantized before attention reads it, as on the CPU) or "
                  "serving (each window attends to its own fp16 K/V); docs/design.md §9.2")
      ->capture_default_str()
      ->check(CLI::IsMember({"evaluation", "serving"}));
  cmd->callback([args] { run(*args); });
});

}  // namespace
}  // namespace ratekv::cli
