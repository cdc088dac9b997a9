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
#include <nlohmann/json.hpp>

#include "cli/text_tokens.h"
#include "ratekv/engine/engine.h"
#include "ratekv/engine/engine_executor.h"
#include "ratekv/engine/scheduler.h"
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
  std::string prompts_file;  // cuda: many requests, continuous batching
  bool mode_given = false;   // --prefill-mode was given (the default, serving, applies to cuda only)
  bool top_k_given = false, top_p_given = false, max_batch_given = false;  // given on the command line
  double top_p = 1.0;
  int max_batch = 16;
  bool json = false;
  bool no_plan_check = false;
};

#ifdef RATEKV_HAVE_ENGINE
// One request of --prompts-file: a line of text, or a JSON object
// {"prompt": "...", "n_predict": N, "temperature": T, "top_k": K, "top_p": P, "seed": S}
// (every key but "prompt" optional; defaults from the flags).
struct FileRequest {
  std::string prompt;
  int n_predict;
  engine::SamplingParams sampling;
};

std::vector<FileRequest> read_prompts_file(const GenerateArgs& a) {
  const std::string text = read_text_file(a.prompts_file, "--prompts-file");
  std::vector<FileRequest> out;
  size_t line_no = 0, start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) {
      if (end == text.size()) break;
      continue;
    }
    FileRequest r;
    r.prompt = line;
    r.n_predict = a.n_predict;
    r.sampling.temperature = static_cast<float>(a.temp);
    r.sampling.top_k = a.top_k;
    r.sampling.top_p = static_cast<float>(a.top_p);
    r.sampling.seed = a.seed + out.size();
    if (line[line.find_first_not_of(" \t")] == '{') {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const std::exception& e) {
        fail("--prompts-file {} line {}: not a JSON object: {}", a.prompts_file, line_no, e.what());
      }
      check(j.is_object() && j.contains("prompt") && j["prompt"].is_string(),
            "--prompts-file {} line {}: a JSON line needs a string \"prompt\"", a.prompts_file, line_no);
      for (auto it = j.begin(); it != j.end(); ++it)
        check(it.key() == "prompt" || it.key() == "n_predict" || it.key() == "temperature" || it.key() == "top_k" ||
                  it.key() == "top_p" || it.key() == "seed",
              "--prompts-file {} line {}: unknown key \"{}\" (expected prompt, n_predict, temperature, top_k, top_p, "
              "seed)",
              a.prompts_file, line_no, it.key());
      try {
        r.prompt = j["prompt"].get<std::string>();
        if (j.contains("n_predict")) r.n_predict = j["n_predict"].get<int>();
        if (j.contains("temperature")) r.sampling.temperature = j["temperature"].get<float>();
        if (j.contains("top_k")) r.sampling.top_k = j["top_k"].get<int>();
        if (j.contains("top_p")) r.sampling.top_p = j["top_p"].get<float>();
        if (j.contains("seed")) {
          // get<uint64_t> would turn -1 into 2^64-1 (and 1.5 into 1).
          check(j["seed"].is_number_unsigned(),
                "--prompts-file {} line {}: \"seed\" {}: expected an integer in 0..18446744073709551615",
                a.prompts_file, line_no, j["seed"].dump());
          r.sampling.seed = j["seed"].get<uint64_t>();
        }
      } catch (const nlohmann::json::exception& e) {
        fail("--prompts-file {} line {}: a value of the wrong type: {}", a.prompts_file, line_no, e.what());
      }
      check(r.n_predict >= 0, "--prompts-file {} line {}: n_predict {} must be >= 0", a.prompts_file, line_no,
            r.n_predict);
    }
    try {
      r.sampling.validate();
    } catch (const Error& e) {
      fail("--prompts-file {} line {}: {}", a.prompts_file, line_no, e.what());
    }
    out.push_back(std::move(r));
    if (end == text.size()) break;
  }
  check(!out.empty(), "--prompts-file {}: no prompt (one per line, or JSON lines with \"prompt\")", a.prompts_file);
  return out;
}
#endif

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

// Many requests (--prompts-file) through the continuous-batching scheduler
// (engine/scheduler.h): each completion printed as it finishes (text) or one
// JSON report at the end (--json).
void run_cuda_many(const GenerateArgs& a, LoadedModel& lm, const std::vector<FileRequest>& reqs,
                   const std::vector<std::vector<int32_t>>& prompts, const engine::CacheFormat& fmt) {
  const ModelConfig& cfg = lm.model->config();
  int64_t longest = 1;
  for (const auto& p : prompts) longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()));
  engine::EngineOptions o;
  o.max_batch = a.max_batch;
  o.max_prefill_tokens = a.chunk > 0 ? a.chunk : std::min<int64_t>(longest, cfg.n_ctx_train);
  o.prefill_score_bytes = size_t{256} << 20;
  auto eng = engine::Engine::create(cfg, lm.model->weights(), fmt, o);
  const engine::PrefillMode mode =
      a.mode == "evaluation" ? engine::PrefillMode::evaluation : engine::PrefillMode::serving;
  spdlog::info("GPU engine ({}): {} cache, prefill in {} mode, {} requests, batch <= {}; {}",
               engine::cuda_device_name(), fmt.label(), engine::prefill_mode_name(mode), reqs.size(), a.max_batch,
               eng->memory().summary());
  const Tokenizer& tok = *lm.tokenizer;
  engine::EngineExecutor ex(*eng, mode, a.chunk > 0);
  engine::SchedulerOptions so;
  so.prefill_chunk = a.chunk;
  so.prefill_token_budget = a.chunk > 0 ? a.chunk : longest;
  so.is_eog = [&](int32_t t) { return tok.is_eog(t); };
  engine::Scheduler sch(ex, so);
  for (size_t i = 0; i < reqs.size(); ++i) {
    engine::Request r;
    r.prompt = prompts[i];
    r.n_predict = reqs[i].n_predict;
    r.sampling = reqs[i].sampling;
    sch.submit(std::move(r));
  }
  auto completion = [&](const engine::RequestResult& r) {
    std::vector<int32_t> t = r.tokens;
    if (!t.empty() && tok.is_eog(t.back())) t.pop_back();
    return tok.decode(t, /*skip_special=*/false);
  };
  const auto res = sch.run([&](size_t i, const engine::RequestResult& r) {
    if (a.json) return;
    std::printf("=== request %zu (%s, %zu tokens, first token after %.3f s) ===\n", i, r.finish.c_str(),
                r.tokens.size(), r.t_first_token);
    if (r.finish == "error")
      std::printf("error: %s\n", r.error.c_str());
    else
      std::printf("%s%s\n", a.chat ? "" : reqs[i].prompt.c_str(), completion(r).c_str());
    std::fflush(stdout);
  });
  const engine::SchedulerStats& st = sch.stats();
  if (a.json) {
    nlohmann::ordered_json j;
    j["model"] = a.model;
    j["cache"] = fmt.label();
    j["prefill_mode"] = engine::prefill_mode_name(mode);
    j["chunk"] = a.chunk;
    j["max_batch"] = a.max_batch;
    for (size_t i = 0; i < res.size(); ++i) {
      nlohmann::ordered_json r;
      r["index"] = i;
      r["prompt"] = reqs[i].prompt;
      r["completion"] = res[i].finish == "error" ? "" : completion(res[i]);
      r["tokens"] = res[i].tokens;
      r["finish"] = res[i].finish;
      if (!res[i].error.empty()) r["error"] = res[i].error;
      r["ttft_s"] = res[i].t_first_token;
      r["latency_s"] = res[i].t_done;
      j["requests"].push_back(r);
    }
    j["stats"] = {{"seconds", st.seconds}, {"steps", st.steps}, {"decode_steps", st.decode_steps},
                  {"max_concurrent", st.max_concurrent}, {"prompt_tokens", st.prompt_tokens},
                  {"output_tokens", st.output_tokens},
                  {"requests_per_s", st.seconds > 0 ? res.size() / st.seconds : 0.0},
                  {"output_tokens_per_s", st.seconds > 0 ? st.output_tokens / st.seconds : 0.0}};
    std::printf("%s\n", j.dump(2).c_str());
  }
  std::fprintf(stderr, "%zu requests in %.3f s: %.2f requests/s, %.1f output tokens/s, at most %d at once (%s cache)\n",
               res.size(), st.seconds, st.seconds > 0 ? res.size() / st.seconds : 0.0,
               st.seconds > 0 ? st.output_tokens / st.seconds : 0.0, st.max_concurrent, fmt.label().c_str());
}
#endif

void run(const GenerateArgs& a) {
  check(a.n_predict >= 0, "-n: {} must be >= 0", a.n_predict);
  check(std::isfinite(a.temp) && a.temp >= 0, "--temp: {} must be a finite value >= 0", a.temp);
  check_chunk_option(a.device, a.chunk);
  if (a.mode_given) check_prefill_mode_option(a.device, a.mode);  // serving on the CPU was accepted and ignored
  check(a.top_p > 0 && a.top_p <= 1, "--top-p: {} must be in (0, 1]", a.top_p);
  check(a.prompt.empty() != a.prompts_file.empty(), "generate: give one of -p (a prompt) or --prompts-file (many)");
  check(a.prompts_file.empty() || a.device == "cuda",
        "--prompts-file: many requests run with continuous batching on --device cuda only");
  // top-p is applied by the GPU sampler of the continuous-batching path only;
  // a single -p prompt samples on the host with --temp / --top-k (both devices).
  check(a.top_p == 1.0 || a.temp == 0 || !a.prompts_file.empty(),
        "--top-p: applied only with --prompts-file on --device cuda (the GPU sampler); a single -p prompt samples "
        "on the host with --temp and --top-k only");
  check(a.max_batch >= 1, "--max-batch: {} must be >= 1", a.max_batch);
  // --json and --max-batch shape the many-request run only (they were accepted and ignored with -p).
  check(!a.json || !a.prompts_file.empty(),
        "--json: needs --prompts-file (the JSON report of many requests); a single -p prompt prints its "
        "continuation as text");
  check(!a.max_batch_given || !a.prompts_file.empty(),
        "--max-batch: needs --prompts-file (the sequences of many requests decoded together); a single -p prompt "
        "is one sequence");
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
#ifdef RATEKV_HAVE_ENGINE
  std::vector<FileRequest> many;
  std::vector<std::vector<int32_t>> many_tokens;
  if (!a.prompts_file.empty()) many = read_prompts_file(a);
#endif
  // --top-k / --top-p given with greedy decoding: harmless, but what was asked for does not happen (a warning,
  // not an error, and not for the defaults). With --prompts-file, only when no request samples.
  bool greedy = a.temp == 0;
#ifdef RATEKV_HAVE_ENGINE
  if (!many.empty())
    greedy = std::all_of(many.begin(), many.end(), [](const FileRequest& r) { return r.sampling.greedy(); });
#endif
  const char* why = a.prompts_file.empty() ? " with --temp 0 (greedy decoding takes the most likely token)"
                                           : ": every request of --prompts-file decodes greedily (temperature 0)";
  if (greedy && a.top_k_given) spdlog::warn("--top-k {}: no effect{}", a.top_k, why);
  if (greedy && a.top_p_given) spdlog::warn("--top-p {}: no effect{}", a.top_p, why);
  check_plans_match_model({a.plan}, a.model, a.no_plan_check);
  LoadedModel lm = load_model(a.model, [&](const ModelHeader& h) {
#ifdef RATEKV_HAVE_ENGINE
    if (!many.empty()) {
      for (const FileRequest& r : many) {
        const std::string text = a.chat ? chat_prompt(h.file, r.prompt) : r.prompt;
        many_tokens.push_back(h.tokenizer.encode(text, /*add_bos=*/true, /*parse_special=*/a.chat));
        check(!many_tokens.back().empty(), "--prompts-file: prompt {} is empty after tokenization",
              many_tokens.size() - 1);
      }
      const std::optional<Plan> types = cache_type_plan_or_empty(a.ctk, a.ctv, a.plan, h.config);
      gpu_fmt = gpu_cache_format(types, a.ctk, a.ctv, a.cache, a.plan, h.config);
      return;
    }
#endif
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
  if (!many.empty()) return run_cuda_many(a, lm, many, many_tokens, *gpu_fmt);
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
  cmd->add_option("-p,--prompt", args->prompt, "prompt text (or --prompts-file)")
      ->check(non_empty_validator("the prompt text (or --prompts-file for many)"));
  cmd->add_option("--prompts-file", args->prompts_file,
                  "--device cuda: many requests with continuous batching, one prompt per line or JSON lines "
                  "{\"prompt\": ..., \"n_predict\": N, \"temperature\": T, \"top_k\": K, \"top_p\": P, \"seed\": S}")
      ->check(CLI::ExistingFile);
  cmd->add_option("--top-p", args->top_p, "sample within the smallest set of tokens holding this probability (1 = all)")
      ->capture_default_str();
  cmd->add_option("--max-batch", args->max_batch, "--prompts-file: sequences decoded together at most")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "--prompts-file: one JSON report (completions, times, throughput) on stdout");
  cmd->add_option("-n,--n-predict", args->n_predict, "tokens to generate (stops early at end-of-generation)")
      ->capture_default_str();
  cmd->add_option("--temp", args->temp, "sampling temperature; 0 = greedy")->capture_default_str();
  cmd->add_option("--seed", args->seed, "sampling seed")->capture_default_str()->check(seed_validator());
  cmd->add_option("--top-k", args->top_k, "sample among the top-k logits (0 = all)")
      ->capture_default_str()
      ->check(non_negative_validator());
  cmd->add_flag("--chat", args->chat, "wrap the prompt in the model's ChatML chat template (user turn)");
  add_cache_option(cmd, args->cache);
  add_plan_option(cmd, args->plan);
  add_no_plan_check_option(cmd, args->no_plan_check);
  add_cache_type_options(cmd, args->ctk, args->ctv);
  add_device_option(cmd, args->device);
  cmd->add_option("--prefill-mode", args->mode,
                  "--device cuda: serving (the prompt attends to its own fp16 K/V, then it is packed) or evaluation "
                  "(it attends to its quantized K/V; docs/design.md §9.2). The CPU always runs evaluation mode "
                  "(serving is refused there)")
      ->default_str("serving; the CPU runs evaluation")
      ->check(CLI::IsMember({"evaluation", "serving"}));
  cmd->add_option("--chunk", args->chunk,
                  "--device cuda: prefill the prompt in chunks of N tokens (a multiple of 64; 0 = one piece)")
      ->check(non_negative_validator());
  cmd->callback([args, cmd] {
    args->mode_given = cmd->get_option("--prefill-mode")->count() > 0;
    args->top_k_given = cmd->get_option("--top-k")->count() > 0;
    args->top_p_given = cmd->get_option("--top-p")->count() > 0;
    args->max_batch_given = cmd->get_option("--max-batch")->count() > 0;
    run(*args);
  });
});

}  // namespace
}  // namespace ratekv::cli
