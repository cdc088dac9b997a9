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
#include "cli/loaded_model.h"
#include "cli/text_tokens.h"
#include "ratekv/common/error.h"
#include "ratekv/common/log.h"
#include "ratekv/model/perplexity.h"

namespace ratekv::cli {
namespace {

struct PerplexityArgs {
  std::string model, text, output, cache = "fp32", plan;
  int64_t n_ctx = 512;
  int64_t chunks = -1;
  bool json = false, force = false;
};

void run(const PerplexityArgs& a) {
  check(a.n_ctx >= 4, "-c: context {} is too small (need >= 4)", a.n_ctx);
  if (!a.output.empty()) check_output_path(a.output, a.force, "--output");  // before the run, not after
  const std::string text = read_text_file(a.text, "-f");
  warn_if_not_utf8(text, "-f", a.text);
  // Context, token count and cache are checked against the model's header,
  // before the weights load.
  std::vector<int32_t> tokens;
  std::unique_ptr<KVCache> cache;
  const int64_t n_ctx = a.n_ctx;
  LoadedModel lm = load_model(a.model, [&](const ModelHeader& h) {
    check(n_ctx <= h.config.n_ctx_train, "-c: context {} exceeds the model's context {}", n_ctx,
          h.config.n_ctx_train);
    cache = make_cache(a.cache, h.config, n_ctx, a.plan);
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
  const auto t0 = std::chrono::steady_clock::now();
  const PerplexityResult r = perplexity(model, *cache, tokens, n_ctx, a.chunks, lm.add_bos, lm.tokenizer->bos_id(),
                                        [&](int64_t done, const PerplexityResult& run) {
                                          progress.update(done);
                                          spdlog::info("chunk {}/{}: ppl {:.4f}, running ppl {:.4f}", done,
                                                       run.n_chunks, run.chunk_ppl.back(), run.ppl);
                                        });
  progress.finish();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t n_chunks = r.n_chunks, count = r.n_scored;
  const double ppl = r.ppl, ppl_err = r.ppl_err, mean = r.mean_nll;
  const std::vector<double>& chunk_ppl = r.chunk_ppl;

  nlohmann::ordered_json j;
  j["model"] = a.model;
  j["text"] = a.text;
  j["cache"] = a.cache;
  j["plan"] = a.plan;
  j["cache_bytes"] = cache->bytes();
  j["cache_tokens"] = cache->n_tokens();
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
             : fmt::format("PPL = {:.4f} +/- {:.5f}  (ctx {}, {} chunks, {} tokens scored of {} in file, cache {})\n",
                           ppl, ppl_err, n_ctx, n_chunks, count, tokens.size(), a.cache);
  if (!a.output.empty()) {
    std::ofstream out(a.output);
    check(static_cast<bool>(out), "--output: cannot open '{}' for writing", a.output);
    out << report;
    check(static_cast<bool>(out), "--output: failed writing '{}'", a.output);
  } else {
    std::cout << report;
  }
  std::fprintf(stderr, "%s\n", cache_size_report(a.cache, *cache, model).c_str());
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
  cmd->add_option("-o,--output", args->output, "write the report to this file instead of stdout");
  cmd->add_flag("--force", args->force, "overwrite --output if it exists");
  add_cache_option(cmd, args->cache);
  add_plan_option(cmd, args->plan);
  cmd->callback([args] { run(*args); });
});

}  // namespace
}  // namespace ratekv::cli
