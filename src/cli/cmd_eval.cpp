// `ratekv eval`: RoPE-logit MAE, attention KL, logit NMSE by position and perplexity of KV-cache
// plans against the fp32 cache and each other (eval/plan_eval.h).
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "cli/command.h"
#include "cli/eval_run.h"
#include "cli/flag_names.h"
#include "cli/loaded_model.h"
#include "cli/text_tokens.h"
#include "ratekv/common/error.h"
#include "ratekv/eval/baseline_plans.h"
#include "ratekv/eval/plan_eval.h"
#include "ratekv/eval/reference_cache.h"
#include "ratekv/common/log.h"

namespace ratekv::cli {
namespace {

struct EvalArgs {
  std::string model, text, json_out, plot_out, reference_cache;
  std::vector<std::string> plans, baselines;
  int64_t tokens = 2048, ctx = 512, query_stride = 1;
  int seeds = 3;
  bool no_ppl = false, no_ppl_k = false, no_ppl_kv = false, force = false, no_plan_check = false;
};

// tools/plot_eval.py: $RATEKV_TOOLS_DIR, else <exe dir>/../../tools (build/bin/ratekv).
std::filesystem::path plot_script() {
  if (const char* d = std::getenv("RATEKV_TOOLS_DIR")) return std::filesystem::path(d) / "plot_eval.py";
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path("tools/plot_eval.py") : exe.parent_path().parent_path().parent_path() / "tools" / "plot_eval.py";
}

void run(const EvalArgs& a) {
  check(!a.plans.empty() || !a.baselines.empty(), "eval: give at least one --plan or --baseline");
  // Named by the library as "two plans are named 'fp16'", after the weights loaded.
  const std::optional<std::string> twice = first_repeat(a.baselines);
  check(!twice, "--baseline {}: given twice", twice.value_or(""));
  check(a.tokens >= a.ctx, "--tokens {} must be at least --ctx {}", a.tokens, a.ctx);
  if (!a.json_out.empty()) check_output_path(a.json_out, a.force, "--json");
  if (!a.plot_out.empty()) {
    check_output_path(a.plot_out, a.force, "--plot");
    check(!a.json_out.empty(), "--plot needs --json (the plot is drawn from the JSON report)");
    check(std::filesystem::exists(plot_script()), "--plot: {} not found (set RATEKV_TOOLS_DIR to the tools/ folder)",
          plot_script().string());
  }
  check_plans_match_model(a.plans, a.model, a.no_plan_check);
  LoadedModel lm = load_model(a.model);
  const ModelConfig& cfg = lm.model->config();
  check(a.ctx <= cfg.n_ctx_train, "--ctx {}: exceeds the model's context {} (-m '{}')", a.ctx, cfg.n_ctx_train,
        a.model);
  std::vector<eval::PlanEntry> entries;
  for (const auto& path : a.plans) {
    eval::PlanEntry e;
    e.file = path;
    e.name = std::filesystem::path(path).filename().string();
    for (const char* ext : {".json", ".plan"})
      if (e.name.size() > std::strlen(ext) && e.name.ends_with(ext)) e.name.resize(e.name.size() - std::strlen(ext));
    e.plan = Plan::load(path);
    entries.push_back(std::move(e));
  }
  add_baseline_entries(entries, a.baselines, cfg);
  const std::vector<int32_t> ids = read_text_tokens(*lm.tokenizer, a.text, a.tokens, lm.add_bos, "-f");
  eval::EvalOptions opt;
  opt.ctx = a.ctx;
  opt.n_seeds = a.seeds;
  opt.query_stride = a.query_stride;
  opt.perplexity = !a.no_ppl;
  opt.perplexity_k = !a.no_ppl_k;
  opt.perplexity_kv = !a.no_ppl_kv;
  check(!(a.no_ppl_k && a.no_ppl_kv) || a.no_ppl, "--no-ppl-k with --no-ppl-kv leaves no perplexity pass: give --no-ppl");
  if (!a.reference_cache.empty()) {
    opt.reference_cache = a.reference_cache;
    opt.reference_key = eval::reference_key(model_sha256(a.model), a.ctx, lm.add_bos ? lm.tokenizer->bos_id() : -1,
                                            std::span<const int32_t>(ids).first(static_cast<size_t>(ids.size() / a.ctx * a.ctx)));
  }
  const nlohmann::json rep = evaluate_and_print(lm, ids, entries, opt, a.model, a.text);
  if (!a.json_out.empty()) {
    std::ofstream out(a.json_out);
    check(out.good(), "--json '{}': cannot open for writing", a.json_out);
    out << rep.dump(2) << "\n";
    out.close();  // a full disk shows at close, not at <<
    check(out.good(), "--json '{}': write failed", a.json_out);
    spdlog::info("wrote {}", a.json_out);
  }
  if (!a.plot_out.empty()) {
    const std::string cmd = fmt::format("python3 '{}' '{}' '{}'", plot_script().string(), a.json_out, a.plot_out);
    check(std::system(cmd.c_str()) == 0, "--plot: '{}' failed (is matplotlib installed? bash tools/install_deps.sh)", cmd);
    spdlog::info("wrote {}", a.plot_out);
  }
}

// The library parameters these flags set (errors name the flag).
const FlagNames kEvalFlags = {
    {"EvalOptions.ctx", "--ctx"},
    {"EvalOptions.n_seeds", "--seeds"},
    {"EvalOptions.query_stride", "--query-stride"},
    {"EvalOptions.perplexity_k", "--no-ppl-k"},
    {"EvalOptions.reference_key", "--reference-cache"},
    {"baseline_plan.name", "--baseline"},
};

const Registrar reg("eval", [](CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  auto* c = app.add_subcommand(
      "eval",
      "Evaluate KV-cache plans against the fp32 cache and each other: per-layer RoPE-logit MAE and attention KL "
      "(K-only, V exact), attention-logit NMSE by query position (buckets 0-63, 64-127, 128-255, ...), perplexity with K-only and K+V quantized (llama.cpp windows), over run seeds");
  c->add_option("-m,--model", a->model, "GGUF model")->required()->check(CLI::ExistingFile);
  add_no_plan_check_option(c, a->no_plan_check);
  c->add_option("--plan", a->plans, "plan file (repeatable); rows are named by the file name without .json / .plan")
      ->check(CLI::ExistingFile);
  c->add_option("--baseline", a->baselines, "built-in baseline cache: fp16, q8_0, q4_0, kivi2, kivi4 (repeatable)")
      ->check(CLI::IsMember(eval::baseline_names()));  // before the weights load
  c->add_option("-f,--file", a->text, "evaluation text (UTF-8)")->required()->check(CLI::ExistingFile);
  c->add_option("--tokens", a->tokens, "evaluation tokens (the first N of the text)")->capture_default_str();
  c->add_option("--ctx", a->ctx, "window length (perplexity and MAE/KL windows)")->capture_default_str();
  c->add_option("--seeds", a->seeds, "rotation run seeds (mean and paired spread)")->capture_default_str();
  c->add_option("--query-stride", a->query_stride, "MAE/KL over every r-th query row (all causal keys)")
      ->capture_default_str();
  c->add_flag("--no-ppl", a->no_ppl, "skip the quantized perplexity passes");
  c->add_flag("--no-ppl-k", a->no_ppl_k, "skip the K-only perplexity pass, keep K+V");
  c->add_option("--reference-cache", a->reference_cache,
                "directory of cached reference passes (fp16-cache logits, fp32 activations) per window: windows "
                "found there are not recomputed, others are written (keyed by model file, tokens, --ctx, BOS)")
      ->check(non_empty_path_validator("a directory of cached reference passes"));
  c->add_flag("--no-ppl-kv", a->no_ppl_kv,
              "skip the K+V perplexity pass, keep K-only (e.g. plans whose values are fp16 anyway)");
  c->add_option("--json", a->json_out, "write the report as JSON")
      ->check(non_empty_path_validator("a file to write the JSON report to"));
  c->add_option("--plot", a->plot_out, "write a per-layer MAE plot (PNG; needs --json and matplotlib)")
      ->check(non_empty_path_validator("a PNG file to write the plot to"));
  c->add_flag("--force", a->force, "overwrite output files");
  c->callback([a] { with_flag_names(kEvalFlags, [&] { run(*a); }); });
});

}  // namespace
}  // namespace ratekv::cli
