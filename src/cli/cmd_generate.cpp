// `ratekv generate -m MODEL -p PROMPT -n N [--temp T --seed S --top-k K] [--chat] [--cache fp32|fake|packed --plan PLAN
//  | -ctk T -ctv T] [--device cpu|cuda [--prefill-mode serving|evaluation]]`:
// greedy (default) or sampled continuation; text on stdout, prefill/decode
// tokens/s on stderr.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "cli/command.h"
#include "cli/gpu_cache.h"
#include "cli/loaded_model.h"
#include "ratekv/common/error.h"
#include "ratekv/common/log.h"
#include "ratekv/model/chat_template.h"
#ifdef RATEKV_HAVE_ENGINE
#include "ratekv/engine/engine.h"
#endif

namespace ratekv::cli {
namespace {

struct GenerateArgs {
  std::string model, prompt, cache = "fp32", plan, ctk, ctv, device = "cpu", mode = "serving";
  int n_predict = 64;
  double temp = 0.0;
  uint64_t seed = 0;
  int top_k = 40;
  bool chat = false;
  int64_t chunk = 0;  // cuda: chunked prefill (0: one piece)
};

// Wraps the prompt in the model's ChatML template (the only one supported):
// its default system turn, the user turn, then the assistant header
// (model/chat_template.h).
std::string chat_prompt(const GgufFile& f, const std::string& user) {
  const std::string tpl = f.get_string("tokenizer.chat_template", "");
  check(is_chatml_template(tpl),
        "--chat: {}: tokenizer.chat_template is not a ChatML (<|im_start|>) template; only ChatML is supported",
        f.path());
  return chatml_prompt(tpl, user);
}

// Picks the next token: argmax when temp <= 0, else a sample from
// softmax(logits / temp) restricted to the top_k logits (top_k <= 0: all).
int32_t pick_token(const float* logits, int n_vocab, double temp, int top_k, std::mt19937_64& rng) {
  if (temp <= 0) return static_cast<int32_t>(std::max_element(logits, logits + n_vocab) - logits);
  std::vector<int32_t> idx(n_vocab);
  std::iota(idx.begin(), idx.end(), 0);
  const int k = (top_k <= 0 || top_k > n_vocab) ? n_vocab : top_k;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  std::vector<double> p(k);
  const double mx = logits[idx[0]];
  double sum = 0;
  for (int i = 0; i < k; ++i) sum += (p[i] = std::exp((logits[idx[i]] - mx) / temp));
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * sum;
  double acc = 0;
  for (int i = 0; i < k; ++i) {
    acc += p[i];
    if (u < acc) return idx[i];
  }
  return idx[k - 1];
}

#ifdef RATEKV_HAVE_ENGINE
// The GPU loop: prefill in `mode`, then one decode step per token (its
// logits come back for sampling; greedy is the step's own argmax).
void run_cuda(const GenerateArgs& a, LoadedModel& lm, const std::vector<int32_t>& prompt,
              const engine::CacheFormat& fmt) {
  const ModelConfig& cfg = lm.model->config();
  const int V = cfg.n_vocab;
  const int64_t n_ctx = static_cast<int64_t>(prompt.size()) + a.n_predict;
  engine::EngineOptions o;
  o.max_prefill_tokens = a.chunk > 0 ? a.chunk : static_cast<int64_t>(prompt.size());
  o.pool_bytes = fmt.page_bytes_all_layers() * static_cast<size_t>((n_ctx + 63) / 64 + 1);
  o.prefill_score_bytes = size_t{256} << 20;
  auto eng = engine::Engine::create(cfg, lm.model->weights(), fmt, o);
  const engine::PrefillMode mode =
      a.mode == "evaluation" ? engine::PrefillMode::evaluation : engine::PrefillMode::serving;
  spdlog::info("GPU engine ({}): {} cache, prefill in {} mode; {}", engine::cuda_device_name(), fmt.label(),
               engine::prefill_mode_name(mode), eng->memory().summary());
  const Tokenizer& tok = *lm.tokenizer;
  std::mt19937_64 rng(a.seed);
  std::vector<float> logits(V);
  const int seq = eng->add_sequence(std::max<int64_t>(n_ctx, 1));
  using clk = std::chrono::steady_clock;
  const auto t0 = clk::now();
  if (a.chunk > 0)
    eng->prefill_chunked(seq, prompt, a.chunk, mode, logits);
  else
    eng->prefill(seq, prompt, mode, logits);
  const double t_prefill = std::chrono::duration<double>(clk::now() - t0).count();
  if (!a.chat) {
    std::fputs(a.prompt.c_str(), stdout);
    std::fflush(stdout);
  }
  std::vector<int32_t> out;
  size_t printed = 0;
  int64_t n_decoded = 0;
  const auto t1 = clk::now();
  for (int i = 0; i < a.n_predict; ++i) {
    const int32_t next = pick_token(logits.data(), V, a.temp, a.top_k, rng);
    if (tok.is_eog(next)) break;
    out.push_back(next);
    const std::string s = tok.decode(out, /*skip_special=*/false);
    std::fwrite(s.data() + printed, 1, s.size() - printed, stdout);
    std::fflush(stdout);
    printed = s.size();
    if (i + 1 == a.n_predict) break;
    int32_t argmax_tok = 0;
    eng->decode(std::span<const int>(&seq, 1), std::span<const int32_t>(&next, 1), 1,
                std::span<int32_t>(&argmax_tok, 1), logits);
    ++n_decoded;
  }
  const double t_decode = std::chrono::duration<double>(clk::now() - t1).count();
  std::fputs("\n", stdout);
  std::fflush(stdout);
  std::fprintf(stderr, "prefill (%s mode): %zu tokens in %.3f s (%.1f tokens/s)\n", engine::prefill_mode_name(mode),
               prompt.size(), t_prefill, prompt.size() / t_prefill);
  std::fprintf(stderr, "decode:  %lld tokens in %.3f s (%.1f tokens/s, one step per token with its logits copied)\n",
               static_cast<long long>(n_decoded), t_decode, n_decoded > 0 ? n_decoded / t_decode : 0.0);
  std::fprintf(stderr, "KV cache (%s, GPU): %.1f bytes/token; fp16 K/V %lld bytes/token\n", fmt.label().c_str(),
               fmt.bytes_per_token(), static_cast<long long>(cfg.kv_bytes_per_token_fp16()));
}
#endif

void run(const GenerateArgs& a) {
  check(a.n_predict >= 0, "-n: {} must be >= 0", a.n_predict);
  check(std::isfinite(a.temp) && a.temp >= 0, "--temp: {} must be a finite value >= 0", a.temp);
  check(a.chunk == 0 || (a.chunk >= 64 && a.chunk % 64 == 0),
        "--chunk {}: expected a multiple of 64 tokens (the page), or 0 for a one-piece prefill", a.chunk);
  check(a.chunk == 0 || a.device == "cuda", "--chunk: chunked prefill runs on --device cuda only");
  require_engine(a.device);
  // Prompt, context and cache are settled from the model's header: an option
  // error (--chat template, -p/-n past the context, --cache/--plan/-ctk/-ctv,
  // a cache the GPU cannot serve) comes before the weights load.
  std::vector<int32_t> prompt;
  std::unique_ptr<KVCache> cache;
  std::string cache_kind = a.cache;
#ifdef RATEKV_HAVE_ENGINE
  std::optional<engine::CacheFormat> gpu_fmt;
#endif
  LoadedModel lm = load_model(a.model, [&](const ModelHeader& h) {
    const std::string text = a.chat ? chat_prompt(h.file, a.prompt) : a.prompt;
    prompt = h.tokenizer.encode(text, /*add_bos=*/true, /*parse_special=*/a.chat);
    check(!prompt.empty(), "-p: the prompt is empty after tokenization (and the model adds no BOS)");
    const int64_t n_ctx = static_cast<int64_t>(prompt.size()) + a.n_predict;
    check(n_ctx <= h.config.n_ctx_train, "-p/-n: prompt ({} tokens) + {} new tokens exceed the model context {}",
          prompt.size(), a.n_predict, h.config.n_ctx_train);
    const std::optional<Plan> types = cache_type_plan_or_empty(a.ctk, a.ctv, a.plan, h.config);
    if (a.device == "cuda") {
#ifdef RATEKV_HAVE_ENGINE
      gpu_fmt = gpu_cache_format(types, a.ctk, a.ctv, a.cache, a.plan, h.config);
#endif
      return;
    }
    if (types) {
      cache = make_cache_for_plan(*types, h.config, n_ctx, cache_kind);
    } else {
      cache = make_cache(a.cache, h.config, n_ctx, a.plan);
    }
  });
#ifdef RATEKV_HAVE_ENGINE
  if (a.device == "cuda") return run_cuda(a, lm, prompt, *gpu_fmt);
#endif
  Model& model = *lm.model;
  const Tokenizer& tok = *lm.tokenizer;
  const int V = model.config().n_vocab;
  std::vector<float> logits(V);
  std::mt19937_64 rng(a.seed);

  using clk = std::chrono::steady_clock;
  const auto t0 = clk::now();
  model.forward(prompt, 0, *cache, logits.data(), false);
  const double t_prefill = std::chrono::duration<double>(clk::now() - t0).count();

  std::vector<int32_t> out;
  size_t printed = 0;
  if (!a.chat) {
    std::fputs(a.prompt.c_str(), stdout);
    std::fflush(stdout);
  }
  const auto t1 = clk::now();
  int64_t n_decoded = 0;
  for (int i = 0; i < a.n_predict; ++i) {
    const int32_t next = pick_token(logits.data(), V, a.temp, a.top_k, rng);
    if (tok.is_eog(next)) break;
    out.push_back(next);
    const std::string s = tok.decode(out, /*skip_special=*/false);
    std::fwrite(s.data() + printed, 1, s.size() - printed, stdout);
    std::fflush(stdout);
    printed = s.size();
    if (i + 1 == a.n_predict) break;
    model.forward(std::span<const int32_t>(&next, 1), static_cast<int64_t>(prompt.size()) + i, *cache, logits.data(),
                  false);
    ++n_decoded;
  }
  const double t_decode = std::chrono::duration<double>(clk::now() - t1).count();
  std::fputs("\n", stdout);
  std::fflush(stdout);  // the text ends before the timing lines on stderr
  std::fprintf(stderr, "prefill: %zu tokens in %.3f s (%.1f tokens/s)\n", prompt.size(), t_prefill,
               prompt.size() / t_prefill);
  std::fprintf(stderr, "decode:  %lld tokens in %.3f s (%.1f tokens/s)\n", static_cast<long long>(n_decoded),
               t_decode, n_decoded > 0 ? n_decoded / t_decode : 0.0);
  std::fprintf(stderr, "%s\n", cache_size_report(cache_kind, *cache, model).c_str());
}

Registrar reg("generate", [](CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  auto* cmd = app.add_subcommand("generate", "Generate a continuation of a prompt (greedy unless --temp > 0)");
  cmd->add_option("-m,--model", args->model, "GGUF model file")->required()->check(CLI::ExistingFile);
  cmd->add_option("-p,--prompt", args->prompt, "prompt text")->required();
  cmd->add_option("-n,--n-predict", args->n_predict, "tokens to generate (stops early at end-of-generation)")
      ->capture_default_str();
  cmd->add_option("--temp", args->temp, "sampling temperature; 0 = greedy")->capture_default_str();
  cmd->add_option("--seed", args->seed, "sampling seed")->capture_default_str();
  cmd->add_option("--top-k", args->top_k, "sample among the top-k logits (0 = all)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--chat", args->chat, "wrap the prompt in the model's ChatML chat template (user turn)");
  add_cache_option(cmd, args->cache);
  add_plan_option(cmd, args->plan);
  add_cache_type_options(cmd, args->ctk, args->ctv);
  add_device_option(cmd, args->device);
  cmd->add_option("--prefill-mode", args->mode,
                  "--device cuda: serving (the prompt attends to its own fp16 K/V, then it is packed) or evaluation "
                  "(it attends to its quantized K/V; docs/design.md §9.2). The CPU always runs evaluation mode")
      ->capture_default_str()
      ->check(CLI::IsMember({"evaluation", "serving"}));
  cmd->add_option("--chunk", args->chunk,
                  "--device cuda: prefill the prompt in chunks of N tokens (a multiple of 64; 0 = one piece)")
      ->check(CLI::NonNegativeNumber);
  cmd->callback([args] { run(*args); });
});

}  // namespace
}  // namespace ratekv::cli
