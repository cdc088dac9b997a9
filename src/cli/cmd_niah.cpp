// `ratekv niah -m MODEL [--plan PLAN ...] [-ctk T -ctv T] [--ctx 1024,2048]
// [--depths 11 | --depth-list 0.5,0.75] [--trials 10] [--json OUT] [--device cpu|cuda [--chunk N]
// [--prefill-mode evaluation|serving]]`: needle-in-a-haystack accuracy grids
// (ratekv/eval/niah.h) for an fp16 KV cache and each plan (packed cache by
// default), printed as tables; --json writes every grid and trial. With
// --device cuda every grid runs on the GPU engine (ratekv/engine/niah.h): the
// same prompts, needles and scoring; plans the engine cannot serve are
// refused, naming the flag, before the weights load.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/flag_names.h"
#include "cli/gpu_cache.h"
#include "cli/loaded_model.h"
#include "cli/text_tokens.h"
#include "ratekv/format/stored_bytes.h"
#include "ratekv/cache/fake_quant_cache.h"
#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/common/error.h"
#include "ratekv/eval/niah.h"
#include "ratekv/common/log.h"
#include "ratekv/model/chat_template.h"
#ifdef RATEKV_HAVE_ENGINE
#include "ratekv/engine/niah.h"
#endif

namespace ratekv::cli {
namespace {

struct NiahArgs {
  std::string model, haystack, json, cache = "packed", ctk, ctv, device = "cpu", mode = "evaluation";
  std::vector<std::string> plans;
  int64_t chunk = 0;  // cuda: chunked prefill (0: one piece)
  std::vector<int64_t> ctx{1024};
  std::vector<double> depth_list;
  int depths = 11, trials = 10, max_new = 10;
  uint64_t seed = 0;
  bool no_fp16 = false, force = false, no_plan_check = false;
};

// The prompt form from the model's chat template: ChatML with its default system turn (as `generate --chat`),
// or plain text when the GGUF has no tokenizer.chat_template (a base model such as Gemma 3 270M). Another
// template (e.g. Gemma's <start_of_turn>) is refused: niah would prompt that model in a form it was not tuned on.
void set_prompt_form(const GgufFile& f, eval::NiahConfig& nc) {
  const std::string tpl = f.get_string("tokenizer.chat_template", "");
  if (tpl.empty()) {
    nc.chatml = false;
    nc.system_prompt.clear();
    spdlog::info("niah: {} has no chat template: plain-text prompt (\"Question: ... Answer: The secret code for X is\")",
                 f.path());
    return;
  }
  check(is_chatml_template(tpl),
        "niah: {}: tokenizer.chat_template is not a ChatML (<|im_start|>) template; only ChatML (or no template: "
        "plain-text prompt) is supported",
        f.path());
  nc.chatml = true;
  nc.system_prompt = chatml_default_system(tpl);
}

// A plan that stores every K/V as fp16: the fp16 baseline through FakeQuantKVCache.
Plan fp16_plan(const ModelConfig& cfg) {
  Plan p;
  p.method = "fp16";
  static_cast<PlanTarget&>(p.model) = cache::plan_target(cfg);
  p.budget_k = p.budget_v = 16;
  p.layers.assign(cfg.n_layers, std::vector<HeadPlan>(cfg.n_kv_heads, HeadPlan{Codec::fp16(), Codec::fp16()}));
  return p;
}

std::string table(const eval::NiahGrid& g) {
  std::string s = fmt::format("{} ({:.1f} cache bytes/token, {:.0f} s)\n{:>8}", g.name, g.cache_bytes_per_token,
                              g.seconds, "ctx\\depth");
  for (double d : g.depths) s += fmt::format(" {:>5.0f}%", 100 * d);
  s += "    mean\n";
  for (size_t c = 0; c < g.context_lengths.size(); ++c) {
    s += fmt::format("{:>9}", g.context_lengths[c]);
    double mean = 0;
    for (double a : g.accuracy[c]) {
      s += fmt::format(" {:>5.0f}%", 100 * a);
      mean += a / g.accuracy[c].size();
    }
    s += fmt::format(" {:>6.1f}%\n", 100 * mean);
  }
  return s;
}

void run(const NiahArgs& a) {
  const bool cuda = a.device == "cuda";
  check(!a.no_fp16 || !a.plans.empty() || !a.ctk.empty() || !a.ctv.empty(),
        "--no-fp16: nothing left to evaluate (give --plan or -ctk/-ctv)");
  check_chunk_option(a.device, a.chunk);
  check_prefill_mode_option(a.device, a.mode);
  check(!cuda || a.cache == "packed", "--cache {}: the fake-quant cache runs on the CPU only (--device cpu)", a.cache);
  require_engine(a.device);
  if (!a.json.empty()) check_output_path(a.json, a.force, "--json");
  std::string hay_dir = a.haystack;
  if (hay_dir.empty()) {
    const char* env = std::getenv("RATEKV_ASSETS");
    const char* home = std::getenv("HOME");
    hay_dir = (env ? std::string(env) : std::string(home ? home : ".") + "/.cache/ratekv/assets") + "/text/haystack";
  }
  int64_t max_ctx = 0;
  for (int64_t c : a.ctx) {
    check(c >= 64, "--ctx: {} is too short (need ≥ 64 tokens)", c);
    max_ctx = std::max(max_ctx, c);
  }
  const std::optional<int64_t> twice = first_repeat(a.ctx);  // ran the same row twice
  check(!twice, "--ctx: {} is listed twice (each context length is one row of the grid)", twice.value_or(0));
  struct Entry {
    std::string name, plan_file;
    std::shared_ptr<const cache::PlanCodecs> codecs;
    bool packed;
#ifdef RATEKV_HAVE_ENGINE
    std::optional<engine::CacheFormat> gpu = std::nullopt;  // --device cuda
#endif
  };
  std::vector<Entry> entries;
  std::vector<int32_t> hay_tok;
  eval::NiahConfig nc;
  // Contexts, plans (and whether --cache can serve them), the chat template and the haystack against the
  // model's header, before the weights load (and before the fp16 grid runs).
  nc.context_lengths = a.ctx;
  nc.n_depths = a.depths;
  nc.depth_fractions = a.depth_list;
  nc.trials = a.trials;
  nc.max_new_tokens = a.max_new;
  nc.seed = a.seed;
  check_plans_match_model(a.plans, a.model, a.no_plan_check);
  LoadedModel lm = load_model(a.model, [&](const ModelHeader& h) {
    set_prompt_form(h.file, nc);
    eval::check_niah_answer_length(h.tokenizer, nc);
    check(max_ctx <= h.config.n_ctx_train, "--ctx: {} exceeds the model's context {}", max_ctx,
          h.config.n_ctx_train);
    const std::string where = cuda ? "cuda " : "";
    if (!a.no_fp16) {
      entries.push_back(
          {"fp16", "", std::make_shared<const cache::PlanCodecs>(fp16_plan(h.config), h.config, "fp16"), false});
#ifdef RATEKV_HAVE_ENGINE
      if (cuda) entries.back().gpu = engine::CacheFormat::fp16(h.config);
#endif
    }
    for (const auto& p : a.plans) {
      auto codecs = std::make_shared<const cache::PlanCodecs>(Plan::load(p), h.config, p);
      if (cuda) {
#ifdef RATEKV_HAVE_ENGINE
        std::string base = p.substr(p.find_last_of('/') + 1);
        entries.push_back({base + " (cuda packed)", p, codecs, true});
        entries.back().gpu = gpu_cache_format(std::nullopt, "", "", "packed", p, h.config);  // names --plan
#endif
        continue;
      }
      if (a.cache == "packed") (void)make_packed_cache(h.config.kv_shape(1), codecs);  // throws: no packed form
      std::string base = p.substr(p.find_last_of('/') + 1);
      entries.push_back({base + " (" + a.cache + ")", p, codecs, a.cache == "packed"});
    }
    // -ctk/-ctv: one more grid, the plan those cache types stand for (both flags or neither).
    if (const std::optional<Plan> types = cache_type_plan_or_empty(a.ctk, a.ctv, "", h.config)) {
      const std::string name = fmt::format("-ctk {} -ctv {}", a.ctk, a.ctv);
      auto codecs = std::make_shared<const cache::PlanCodecs>(*types, h.config, "cache types");
      std::string kind = "packed";
      if (!cuda) (void)make_cache_for_plan(*types, h.config, 1, kind);  // packed, or fake for q8_0/q4_0/...
#ifdef RATEKV_HAVE_ENGINE
      std::optional<engine::CacheFormat> gf;
      if (cuda) {
        gf = gpu_cache_format(types, a.ctk, a.ctv, "packed", "", h.config);  // names -ctk/-ctv
        if (gf->is_fp16()) kind = "fp16";                                     // -ctk f16 -ctv f16: fp16 pages
      }
#endif
      entries.push_back({name + " (" + where + kind + ")", name, codecs, kind == "packed"});
#ifdef RATEKV_HAVE_ENGINE
      entries.back().gpu = gf;
#endif
    }
    // Tokenize only as much of the haystack as the longest context needs (≈ 4.3 bytes/token, margin 3×); text
    // with more bytes per token (long whitespace runs) is read further, 4× at a time, until it gives max_ctx
    // tokens or ends (it was called too short while the file held thousands of tokens).
    // A file that is not UTF-8 text is tokenized as raw bytes: warned about, naming it, as perplexity -f does.
    const std::string hay = eval::load_haystack(
        hay_dir, [](const std::string& f, std::string_view t) { warn_if_not_utf8(t, "--haystack", f); });
    for (size_t limit = static_cast<size_t>(max_ctx) * 13;; limit *= 4) {
      hay_tok = h.tokenizer.encode(hay.substr(0, std::min(limit, hay.size())), false);
      if (limit >= hay.size() || static_cast<int64_t>(hay_tok.size()) >= max_ctx) break;
    }
    spdlog::info("haystack: {} tokens from {}", hay_tok.size(), hay_dir);
    // Every context's prompts (tokenization only): --ctx shorter than the prompt, or a haystack too short for it,
    // fails here, before the weights load.
    for (int64_t c : nc.context_lengths) (void)eval::niah_prompts(h.tokenizer, h.add_bos, hay_tok, nc, c);
  });
  Model& model = *lm.model;
  const ModelConfig& cfg = model.config();

  nlohmann::ordered_json out;
  out["model"] = a.model;
  out["haystack"] = hay_dir;
  out["context_lengths"] = a.ctx;
  out["depths"] = eval::niah_depths(nc);
  out["n_depths"] = out["depths"].size();
  const int n_depths = static_cast<int>(out["depths"].size());
  out["trials"] = a.trials;
  out["max_new_tokens"] = a.max_new;
  out["seed"] = a.seed;
  out["prompt"] = nc.chatml ? "chatml" : "plain";
  out["device"] = a.device;
  out["prefill_mode"] = a.mode;  // cpu: always evaluation (K/V quantized before attention reads them)
  if (cuda) {
    out["chunk"] = a.chunk;
#ifdef RATEKV_HAVE_ENGINE
    out["gpu"] = engine::cuda_device_name();
#endif
  }
  out["fp16_bytes_per_token"] = cfg.kv_bytes_per_token_fp16();
  out["grids"] = nlohmann::ordered_json::array();
  for (const Entry& e : entries) {
    auto make = [&](int64_t n_ctx) -> std::unique_ptr<KVCache> {
      if (e.packed) return make_packed_cache(cfg.kv_shape(n_ctx), e.codecs);
      return std::make_unique<cache::FakeQuantKVCache>(cfg.kv_shape(n_ctx), e.codecs);
    };
    Progress progress("niah " + e.name, static_cast<int64_t>(a.ctx.size()) * n_depths * a.trials);
    // Writes the report with this grid (partial or complete) appended.
    // The fp16 baseline runs through a fake-quant cache that also keeps fp32
    // copies; it reports the bytes of a real fp16 K/V cache (what it models),
    // and the evaluation cache's own bytes under another key.
    const bool fp16_entry = e.plan_file.empty();
    const double fp16_bytes = static_cast<double>(cfg.kv_bytes_per_token_fp16());
    // A fake-quant cache keeps fp32 reconstructions and originals: like the fp16 entry, it reports the bytes of
    // the cache it models (the plan's stored bytes per token, format/stored_bytes.h), its own under another key.
    const bool fake_entry = !fp16_entry && !cuda && !e.packed;
    const double planned_bytes = fake_entry ? plan_stored_bytes(e.codecs->plan()).bytes_per_token() : 0.0;
    auto grid_json = [&](const eval::NiahGrid& g, bool complete) {
      nlohmann::ordered_json gj = g.to_json();
      gj["complete"] = complete;
      gj["plan"] = e.plan_file;
      if (fp16_entry) {
        gj["cache"] = cuda ? "fp16 (the GPU engine's fp16 pages)"
                           : "fp16 (K/V rounded to fp16; evaluated with a fake-quant cache of an all-fp16 plan)";
        gj["cache_bytes_per_token"] = fp16_bytes;
        gj["evaluation_cache_bytes_per_token"] = g.cache_bytes_per_token;
        gj["effective_bits"] = {{"k", 16.0}, {"v", 16.0}, {"total", 16.0}};
      } else {
#ifdef RATEKV_HAVE_ENGINE
        if (cuda) gj["cache"] = e.gpu->is_fp16() ? "cuda fp16" : "cuda packed";
#endif
        if (!cuda) gj["cache"] = e.packed ? "packed" : "fake (the plan's stored bytes; evaluated with a fake-quant cache)";
        if (fake_entry) {
          gj["cache_bytes_per_token"] = planned_bytes;
          gj["evaluation_cache_bytes_per_token"] = g.cache_bytes_per_token;
        }
        const auto ach = e.codecs->plan().achieved();
        gj["effective_bits"] = {{"k", ach.k}, {"v", ach.v}, {"total", ach.total}};
      }
      return gj;
    };
    // Written beside the file and renamed over it: a run stopped mid-write
    // (a time limit) leaves the last complete report, never a cut one.
    auto write = [&](const nlohmann::ordered_json& rep) {
      if (a.json.empty()) return;
      const std::string tmp = a.json + ".part";
      std::ofstream f(tmp);
      check(static_cast<bool>(f), "--json: cannot open '{}' for writing", tmp);
      f << rep.dump(2) << "\n";
      f.close();  // a full disk shows at close, not at <<
      check(static_cast<bool>(f), "--json: failed writing '{}'", tmp);
      std::error_code ec;
      std::filesystem::rename(tmp, a.json, ec);
      check(!ec, "--json: cannot rename '{}' to '{}': {}", tmp, a.json, ec.message());
    };
    // After every round of trials (all depths once more) the partial grid is
    // written: an interrupted run leaves a uniform grid with fewer trials.
    const auto on_trial = [&](int done, int, const eval::NiahGrid& partial) {
      progress.update(done);
      if (done % n_depths == 0 && done < static_cast<int>(a.ctx.size()) * n_depths * a.trials) {
        nlohmann::ordered_json rep = out;
        rep["grids"].push_back(grid_json(partial, false));
        write(rep);
      }
    };
    eval::NiahGrid g;
    if (cuda) {
#ifdef RATEKV_HAVE_ENGINE
      // One engine per grid: its cache format, a pool for the longest prompt and its answer.
      engine::EngineOptions o;
      o.max_prefill_tokens = a.chunk > 0 ? a.chunk : max_ctx;
      o.pool_bytes = e.gpu->page_bytes_all_layers() * static_cast<size_t>((max_ctx + a.max_new + 63) / 64 + 1);
      auto eng = engine::Engine::create(cfg, model.weights(), *e.gpu, o);
      const engine::PrefillMode mode =
          a.mode == "serving" ? engine::PrefillMode::serving : engine::PrefillMode::evaluation;
      spdlog::info("GPU engine ({}): {} cache, {} mode, chunk {}; {}", engine::cuda_device_name(), e.gpu->label(),
                   engine::prefill_mode_name(mode), a.chunk, eng->memory().summary());
      engine::EngineNiahAnswerer gpu(*eng, mode, a.chunk);
      g = eval::run_niah(gpu, *lm.tokenizer, lm.add_bos, hay_tok, nc, e.name, on_trial);
#endif
    } else {
      g = eval::run_niah(model, *lm.tokenizer, lm.add_bos, hay_tok, make, nc, e.name, on_trial);
    }
    progress.finish();
    eval::NiahGrid shown = g;
    if (fp16_entry) shown.cache_bytes_per_token = fp16_bytes;  // fp16 K/V, not the evaluation copies
    if (fake_entry) shown.cache_bytes_per_token = planned_bytes;
    std::cout << table(shown) << std::endl;
    out["grids"].push_back(grid_json(g, true));
    write(out);
  }
}

Registrar reg("niah", [](CLI::App& app) {
  auto args = std::make_shared<NiahArgs>();
  auto* cmd = app.add_subcommand("niah", "Needle-in-a-haystack retrieval grid (depth x context) for fp16 and plans");
  cmd->add_option("-m,--model", args->model, "GGUF model file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--plan", args->plans, "plan file (repeatable); each gets a grid")->check(CLI::ExistingFile);
  add_no_plan_check_option(cmd, args->no_plan_check);
  cmd->add_option("--cache", args->cache, "cache for the plans: packed (codes) or fake (fake-quant)")
      ->capture_default_str()
      ->check(CLI::IsMember({"packed", "fake"}));
  add_list_option(cmd, "--ctx", args->ctx, "context lengths in tokens (comma-separated)");
  cmd->add_option("--depths", args->depths, "needle depths 0..100% in this many steps (2..101)")
      ->capture_default_str()
      ->check(CLI::Range(2, 101));
  add_list_option(cmd, "--depth-list", args->depth_list,
                  "needle depths as fractions 0..1, strictly increasing (comma-separated; instead of --depths)")
      ->excludes("--depths");
  cmd->add_option("--trials", args->trials, "trials per cell (different needles; 1..1000)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--max-new", args->max_new, "answer tokens (greedy; 1..256)")->capture_default_str()->check(CLI::Range(1, 256));
  cmd->add_option("--seed", args->seed, "needle seed")->capture_default_str()->check(seed_validator());
  cmd->add_option("--haystack", args->haystack, "haystack directory (default $RATEKV_ASSETS/text/haystack)")
      ->check(non_empty_path_validator("a directory of .txt files (without --haystack: "
                                       "$RATEKV_ASSETS/text/haystack)"));
  cmd->add_flag("--no-fp16", args->no_fp16, "skip the fp16 baseline grid");
  cmd->add_option("--json", args->json, "write all grids and trials as JSON")
      ->check(non_empty_path_validator("a file to write the JSON to"));
  cmd->add_flag("--force", args->force, "overwrite --json if it exists");
  add_cache_type_options(cmd, args->ctk, args->ctv);
  add_device_option(cmd, args->device);
  cmd->add_option("--chunk", args->chunk,
                  "--device cuda: prefill each prompt in chunks of N tokens (a multiple of 64; 0 = one piece)")
      ->check(non_negative_validator());
  cmd->add_option("--prefill-mode", args->mode,
                  "--device cuda: evaluation (every K/V quantized before attention reads it, as the CPU caches do) "
                  "or serving (the prompt attends to its own fp16 K/V); docs/design.md §9.2")
      ->capture_default_str()
      ->check(CLI::IsMember({"evaluation", "serving"}));
  cmd->callback([args] { with_flag_names({{"NiahConfig.max_new_tokens", "--max-new"},
                                            {"NiahConfig.depth_fractions", "--depth-list"},
                                            {"NiahConfig.n_depths", "--depths"},
                                            {"NiahConfig.context_lengths", "--ctx"}}, [&] { run(*args); }); });
});

}  // namespace
}  // namespace ratekv::cli
