// `ratekv plan`: allocate bits from calibration statistics and write a plan (alloc/).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>

#include "cli/command.h"
#include "cli/flag_names.h"
#include "ratekv/alloc/make_plan.h"
#include "ratekv/common/error.h"
#include "ratekv/common/log.h"
#include "ratekv/format/stored_bytes.h"

// The statistics file: the safetensors file of `ratekv calibrate` when the
// calib module provides its reader, else (and always accepted) the JSON form
// of format/calib_stats.h.
#include "ratekv/calib/kv_stats.h"
#ifdef RATEKV_HAVE_TASQ
#include "cli/loaded_model.h"
#include "cli/text_tokens.h"
#include "ratekv/io/sha256.h"
#include "ratekv/model/backward.h"
#include "ratekv/tasq/fit.h"
#endif

namespace ratekv::cli {
namespace {

struct PlanArgs {
  alloc::PlanRequest rq;
  std::string stats, out;
  double avg_bits = 0.0;
  bool avg_given = false;  // --bits was given (any value, NaN and negatives included: make_plan checks it)
  // RateQuant's allocation flags that were given (any value, the defaults included)
  bool key_weight_given = false, sensitivity_given = false, curves_from_given = false;
  bool force = false, json = false, quiet = false;
  const CLI::App* app = nullptr;  // the subcommand, to ask which flags were given (count())
  // --method tasq | cq (docs/design.md §5)
  std::string model, text;
  int64_t tokens = 40960, ctx = 512;
  int group = 8, centroids = 1024, vgroup = 8, vcentroids = 1024, kmeans_iters = 20, n_seeds = 1, also_seeds = 0;
  bool no_weighting = false, no_normalization = false, no_grouping = false, fisher = false;
  std::vector<std::string> also;
};

#ifdef RATEKV_HAVE_TASQ
// Fits the TaSQ / CQ plan(s) from one capture of the calibration text. Each
// plan P.json gets its side file P.tensors.safetensors beside it.
void run_vq(PlanArgs& a) {
  namespace fs = std::filesystem;
  check(!a.model.empty(), "--method {}: -m/--model is required", a.rq.method);
  check(!a.text.empty(), "--method {}: -f/--file (calibration text) is required", a.rq.method);
  check(a.tokens >= 1, "--tokens {}: expected ≥ 1", a.tokens);
  check(!fs::is_directory(a.out), "-o: '{}' is a directory; expected a plan file path (.json)", a.out);
  check(a.stats.empty(), "--stats: --method {} fits on -f text; it takes no statistics", a.rq.method);
  check(a.rq.fp16_window == 0 && a.rq.sink_tokens == 0,
        "--fp16-window/--sink-tokens: not supported with --method {} (the fitted plan keeps no fp16 tokens)",
        a.rq.method);
  check(a.rq.key_offset == "none" && !a.rq.norm_correction,
        "--key-offset/--norm-correction: not supported with --method {} (vq codecs have neither)", a.rq.method);
  {
    std::set<std::string> seen;
    for (const std::string& v : a.also)
      check(seen.insert(v).second && v != a.rq.method, "--also {}: given twice or equal to --method", v);
  }
  check(a.n_seeds >= 1 && a.n_seeds <= 100, "--kmeans-seeds {}: expected 1..100", a.n_seeds);
  check(a.also_seeds >= 0 && a.also_seeds <= a.n_seeds, "--also-kmeans-seeds {}: expected 1..--kmeans-seeds ({})",
        a.also_seeds, a.n_seeds);
  // It sets the k-means seeds of the --also variants only; without them it was ignored silently.
  check(a.also_seeds == 0 || !a.also.empty(), "--also-kmeans-seeds {}: needs --also (it sets the k-means seeds of "
        "the --also variants)", a.also_seeds);
  const std::string values = a.rq.v_quantizer.empty() ? "cq" : a.rq.v_quantizer;
  check(values == "cq" || values == "fp16", "--vquantizer {}: --method {} takes cq or fp16", values, a.rq.method);
  struct Variant {
    std::string name;  // "" = the main plan
    tasq::FitOptions opt;
    int n_seeds = 1;
  };
  tasq::FitOptions base;
  base.method = a.rq.method;
  base.group = a.group;
  base.centroids = a.centroids;
  base.weighting = !a.no_weighting;
  base.normalization = !a.no_normalization;
  base.grouping = !a.no_grouping;
  base.fisher = a.fisher;
  base.values = values;
  base.value_group = a.vgroup;
  base.value_centroids = a.vcentroids;
  base.kmeans_iters = a.kmeans_iters;
  std::vector<Variant> variants{{"", base, a.n_seeds}};
  for (const std::string& v : a.also) {
    const bool ablation = v.rfind("no-", 0) == 0;
    Variant x{v, base, ablation && a.also_seeds > 0 ? a.also_seeds : a.n_seeds};
    // CQ is the baseline of docs/design.md §5.6: plain k-means even when the main plan is Fisher-weighted.
    if (v == "cq") x.opt.method = "cq", x.opt.fisher = false;
    else if (v == "tasq") x.opt.method = "tasq", x.opt.weighting = x.opt.normalization = x.opt.grouping = true;
    else if (v == "no-weighting") x.opt.method = "tasq", x.opt.weighting = false;
    else if (v == "no-normalization") x.opt.method = "tasq", x.opt.normalization = false;
    else if (v == "no-grouping") x.opt.method = "tasq", x.opt.grouping = false;
    else if (v == "no-fisher") x.opt.method = "tasq", x.opt.fisher = false;
    else fail("--also {}: expected cq, tasq, no-weighting, no-normalization, no-grouping or no-fisher", v);
    variants.push_back(x);
  }
  // Output paths: P.json, P.<variant>.json, with .s<k> before .json when --kmeans-seeds > 1.
  const fs::path out(a.out);
  const std::string stem = out.extension() == ".json" ? (out.parent_path() / out.stem()).string() : a.out;
  auto plan_path = [&](const std::string& variant, int k) {
    std::string p = stem;
    if (!variant.empty()) p += "." + variant;
    if (a.n_seeds > 1) p += fmt::format(".s{}", k);
    return p + ".json";
  };
  for (const auto& v : variants)
    for (int k = 0; k < v.n_seeds; ++k) {
      check_output_path(plan_path(v.name, k), a.force, "-o");
      check_output_path(fs::path(plan_path(v.name, k)).replace_extension(".tensors.safetensors").string(), a.force,
                        "-o (side file)");
    }

  // Option errors from the model's header and the tokenized text, before the
  // weights load and long before the capture (minutes at 40K tokens).
  std::vector<int32_t> ids;
  LoadedModel lm = load_model(a.model, [&](const ModelHeader& h) {
    check(a.ctx >= 1 && a.ctx <= h.config.n_ctx_train, "--ctx {}: expected 1..{} (the model's context)", a.ctx,
          h.config.n_ctx_train);
    ids = read_text_tokens(h.tokenizer, a.text, a.tokens, h.add_bos, "-f");
    for (const auto& v : variants) tasq::validate_fit_options(h.config, static_cast<int64_t>(ids.size()), v.opt);
    if (std::any_of(variants.begin(), variants.end(), [](const auto& v) { return v.opt.fisher; }))
      check_backward_arch(h.config, "--fisher");
  });
  spdlog::info("{} fit: {} calibration tokens of {} in windows of {}", a.rq.method, ids.size(), a.text, a.ctx);
  bool fisher = false;
  for (const auto& v : variants) fisher = fisher || v.opt.fisher;
  const tasq::FitCaptures cap = tasq::capture_for_fit(*lm.model, ids, a.ctx, values == "cq", fisher);
  const std::string model_sha = sha256_file(a.model);
  nlohmann::json report = nlohmann::json::array();
  for (const auto& v : variants)
    for (int k = 0; k < v.n_seeds; ++k) {
      tasq::FitOptions o = v.opt;
      o.seed = a.rq.seed + static_cast<uint64_t>(k);
      tasq::FitResult r = tasq::fit_vq_plan(cap, o);
      const std::string pp = plan_path(v.name, k);
      const fs::path side = fs::path(pp).replace_extension(".tensors.safetensors");
      r.plan.model.file = fs::path(a.model).filename().string();
      r.plan.model.sha256 = model_sha;
      r.plan.fit["text"] = fs::path(a.text).filename().string();
      if (!v.name.empty()) r.plan.fit["variant"] = v.name;
      r.plan.tensors_file = side.filename().string();
      r.tensors.save(side.string(), r.plan);
      r.plan.save(pp);
      const auto ach = r.plan.achieved();
      spdlog::info("wrote {} + {}: K {:.4f} stored ({:.4f} code) bits/element, V {:.4f}; matching fell back to "
                   "contiguous on {} heads; fit {:.1f} s",
                   pp, side.filename().string(), ach.k, ach.k_code, ach.v, r.diagnostics["contiguous_fallbacks"].get<int>(),
                   r.diagnostics["fit_seconds"].get<double>());
      report.push_back({{"plan", pp}, {"tensors", side.string()}, {"fit", r.plan.fit},
                        {"achieved", {{"k", ach.k}, {"v", ach.v}, {"k_code", ach.k_code}, {"v_code", ach.v_code}}},
                        {"stored", plan_stored_bytes(r.plan).to_json()},
                        {"diagnostics", r.diagnostics}});
    }
  if (a.json) std::printf("%s\n", report.dump(1).c_str());
}
#endif

// Flags the method or its codecs do not use, refused when given at all (they used to be ignored silently,
// issue 22): the TaSQ / CQ fit's flags on the methods that allocate from statistics and the allocation's
// flags on the fit; --bits with --kbits/--vbits; codec options on codecs without them.
void refuse_ignored_flags(const PlanArgs& a) {
  const auto given = [&](const char* f) { return a.app->get_option(f)->count() > 0; };
  const std::string& m = a.rq.method;
  const bool vq = m == "tasq" || m == "cq";
  if (vq) {
    for (const char* f : {"--kbits", "--vbits", "--bits", "--bmin", "--bmax", "--budget-unit", "--group-size",
                          "--quantizer"})
      check(!given(f),
            "{}: not used by --method {}: it fits vector-quantized keys on -f text (widths from --group and "
            "--centroids, values from --vquantizer)",
            f, m);
    return;
  }
  for (const char* f : {"--model", "--file", "--tokens", "--ctx", "--group", "--centroids", "--vgroup", "--vcentroids",
                        "--kmeans-iters", "--kmeans-seeds", "--also-kmeans-seeds", "--no-weighting",
                        "--no-normalization", "--no-grouping", "--fisher", "--also"})
    check(!given(f), "{}: not used by --method {}: it applies to --method tasq and cq (vector-quantized keys fitted on "
          "-f text)", std::string(f) == "--model" ? "-m/--model" : std::string(f) == "--file" ? "-f/--file" : f, m);
  for (const char* f : {"--kbits", "--vbits"})
    check(!a.avg_given || !given(f),
          "{}: conflicts with --bits (the average budget of keys and values); give --bits alone, or --kbits and --vbits",
          f);
  check(!a.curves_from_given || !a.rq.curves_from.empty(),
        "--curves-from: empty; expected the quantizer whose distortion curves to allocate with");
  check(!a.sensitivity_given || !a.rq.sensitivity.empty(),
        "--sensitivity: empty; expected an estimator in the statistics (grad, activation) or none");
  // The codecs the request names (block-gtq and ratequant+block-gtq refuse any but tq-mse in make_plan).
  const std::string& kq = a.rq.quantizer;
  const std::string& vq_ = a.rq.v_quantizer.empty() ? kq : a.rq.v_quantizer;
  const auto any_of = [&](std::initializer_list<const char*> set) {
    for (const char* q : set)
      if (kq == q || vq_ == q) return true;
    return false;
  };
  const bool gtq = m == "block-gtq" || m == "ratequant+block-gtq";
  const std::string codecs =
      gtq ? "" : " with --quantizer " + kq + (a.rq.v_quantizer.empty() ? "" : " --vquantizer " + a.rq.v_quantizer);
  check(!given("--norm-correction") || any_of({"tq-mse"}),
        "--norm-correction: not used by --method {}{}: it applies to TQ-MSE codecs (tq-mse, block-gtq)", m, codecs);
  check(!given("--seed") || any_of({"tq-mse", "quarot"}),
        "--seed: not used by --method {}{}: it seeds the rotations of tq-mse, block-gtq and quarot codecs", m, codecs);
  check(!given("--group-size") || any_of({"kivi", "quarot"}),
        "--group-size: not used by --method {}{}: it is the scale group of kivi and quarot codecs", m, codecs);
  const auto fixed = [](const std::string& q) { return q == "q8_0" || q == "q4_0" || q == "fp16"; };
  for (const char* f : {"--bmin", "--bmax"})
    check(!given(f) || !fixed(kq) || !fixed(vq_),
          "{}: not used by --method {}{}: fixed-width codecs (q8_0, q4_0, fp16) take no width bounds", f, m, codecs);
}

void run(PlanArgs& a) {
  refuse_ignored_flags(a);
  if (a.avg_given) a.rq.avg_bits = a.avg_bits;
  // --key-weight / --sensitivity / --curves-from set RateQuant's allocation: a method that allocates without it
  // would ignore them silently (tasq / cq fit codebooks; block-gtq allocates from block energies; uniform with
  // --kbits/--vbits has fixed widths).
  {
    const std::string& m = a.rq.method;
    const bool rq_alloc = alloc::allocates_with_ratequant(a.rq);
    for (const auto& [given, flag] : {std::pair{a.key_weight_given, "--key-weight"},
                                      std::pair{a.sensitivity_given, "--sensitivity"},
                                      std::pair{a.curves_from_given, "--curves-from"}})
      check(rq_alloc || !given,
            "{}: not used by --method {}{}: it sets RateQuant's allocation (--method ratequant, ratequant+block-gtq, "
            "or uniform with --bits)",
            flag, m, m == "uniform" ? " with --kbits/--vbits" : "");
  }
  if (a.rq.method == "tasq" || a.rq.method == "cq") {
#ifdef RATEKV_HAVE_TASQ
    run_vq(a);
    return;
#else
    fail("--method {}: this build has no TaSQ fitting (LEMON and Faiss were not found at configure time)",
         a.rq.method);
#endif
  }
  check(!a.stats.empty(), "--stats is required for --method {}", a.rq.method);
  check_output_path(a.out, a.force, "-o");
  CalibStats st = calib::load_alloc_stats(a.stats);  // safetensors or JSON
  a.rq.stats_file = std::filesystem::path(a.stats).filename().string();
  alloc::PlanDiagnostics dg;
  const Plan plan = alloc::make_plan(st, a.rq, &dg);
  plan.save(a.out);
  if (a.json) {
    nlohmann::json j;
    j["plan"] = a.out;
    j["method"] = plan.method;
    const auto ach = plan.achieved();
    j["achieved"] = {{"k", ach.k}, {"v", ach.v}, {"total", ach.total}, {"k_code", ach.k_code}, {"v_code", ach.v_code}};
    j["stored"] = plan_stored_bytes(plan).to_json();
    j["diagnostics"] = dg.to_json();
    std::printf("%s\n", j.dump(1).c_str());
    return;
  }
  if (a.quiet) return;
  std::printf("%s", alloc::plan_summary(plan).c_str());
  if (!dg.key_j.empty()) {
    double s = 0, u = 0;
    for (size_t i = 0; i < dg.key_j.size(); ++i) {
      s += dg.key_j[i];
      u += dg.key_j_uniform[i];
    }
    std::printf("Block-GTQ objective Σ J = %.6g vs uniform TQ-MSE at the same budget %.6g (ratio %.4f)\n", s, u,
                u > 0 ? s / u : 0.0);
  }
  if (dg.ratequant) {
    const auto& r = *dg.ratequant;
    std::printf("RateQuant: predicted distortion %.6g (integer optimum), %.6g (continuous relaxation, %d of %zu "
                "components clipped)\n",
                r.distortion, r.relaxed.distortion, r.relaxed.n_clipped, r.bits.size());
    std::printf("           AM/GM of w·α = %.4f (predicted gain of the unclipped relaxation over uniform)\n",
                r.am_gm);
  }
  if (dg.uniform_split)
    std::printf("uniform split K%dV%d: predicted distortion %.6g\n", dg.uniform_split->k_bits,
                dg.uniform_split->v_bits, dg.uniform_split->cost);
  std::printf("wrote %s\n", a.out.c_str());
}

// The library parameters these flags set (errors name the flag).
const FlagNames kPlanFlags = {
    {"PlanRequest.method", "--method"},           {"PlanRequest.k_bits", "--kbits"},
    {"PlanRequest.v_bits", "--vbits"},            {"PlanRequest.avg_bits", "--bits"},
    {"PlanRequest.budget_unit", "--budget-unit"}, {"PlanRequest.b_min", "--bmin"},
    {"PlanRequest.b_max", "--bmax"},              {"PlanRequest.quantizer", "--quantizer"},
    {"PlanRequest.v_quantizer", "--vquantizer"},  {"PlanRequest.curves_from", "--curves-from"},
    {"PlanRequest.sensitivity", "--sensitivity"}, {"PlanRequest.group_size", "--group-size"},
    {"PlanRequest.fp16_window", "--fp16-window"}, {"PlanRequest.sink_tokens", "--sink-tokens"},
    {"PlanRequest.key_offset", "--key-offset"},   {"PlanRequest.key_weight", "--key-weight"},
    {"load_alloc_stats.path", "--stats"},         {"capture_for_fit.ctx", "--ctx"},
    {"make_plan.stats", "--stats"},
    {"FitOptions.method", "--method"},            {"FitOptions.values", "--vquantizer"},
    {"FitOptions.group", "--group"},              {"FitOptions.centroids", "--centroids"},
    {"FitOptions.kmeans_iters", "--kmeans-iters"}, {"FitOptions.value_group", "--vgroup"},
    {"FitOptions.value_centroids", "--vcentroids"},
};

const Registrar reg("plan", [](CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  auto* c = app.add_subcommand(
      "plan",
      "Allocate KV-cache bits from calibration statistics and write a plan (JSON). Budgets are bits per element; "
      "with --budget-unit effective (default) they are stored bits (everything the cache holds per token: codes, "
      "norms, scales, the padding of groups to 16-channel tiles), with code they name the code bits of a uniform "
      "codec (block-gtq then gets exactly the bytes that codec stores).");
  c->add_option("--method", a->rq.method,
                "uniform | block-gtq | ratequant | ratequant+block-gtq | tasq | cq (tasq/cq: vector-quantized "
                "pre-RoPE keys fitted on -f text; need -m, no --stats)")
      ->required()
      ->check(CLI::IsMember({"uniform", "block-gtq", "ratequant", "ratequant+block-gtq", "tasq", "cq"}));
  c->add_option("--kbits", a->rq.k_bits, "key budget, bits per element")->capture_default_str();
  c->add_option("--vbits", a->rq.v_bits, "value budget, bits per element")->capture_default_str();
  CLI::Option* bits = c->add_option("--bits", a->avg_bits,
                "ratequant: average budget per component (default (kbits+vbits)/2); uniform: the RateQuant "
                "baseline, better of K⌈b⌉V⌊b⌋ and K⌊b⌋V⌈b⌉ under the fitted curves");
  c->add_option("--budget-unit", a->rq.budget_unit, "effective | code")
      ->capture_default_str()
      ->check(CLI::IsMember({"effective", "code"}));
  c->add_option("--bmin", a->rq.b_min,
                "lowest width (default: block-gtq 0, uniform 1, ratequant the bottom of its curves' fitted widths)")
      ->check(CLI::Range(0, 8));
  c->add_option("--bmax", a->rq.b_max,
                "highest width (default: block-gtq 4, uniform 8, ratequant the top of its curves' fitted widths)")
      ->check(CLI::Range(0, 8));
  c->add_option("--stats", a->stats,
                "statistics from `ratekv calibrate` (.safetensors) or the JSON form (format/calib_stats.h); required "
                "except for tasq/cq")
      ->check(CLI::ExistingFile);
  c->add_option("-o,--output", a->out, "output plan (.json)")->required();
  c->add_option("--seed", a->rq.seed, "seed of the per-group rotation seeds")
      ->capture_default_str()
      ->check(seed_validator());
  c->add_option("--quantizer", a->rq.quantizer,
                "codec: tq-mse | kivi | quarot; uniform also q8_0 | q4_0 | fp16 (llama.cpp cache types, fp16 cache)")
      ->capture_default_str();
  c->add_option("--vquantizer", a->rq.v_quantizer,
                "uniform: value codec when it differs from --quantizer; tasq/cq: cq (contiguous-group VQ, default) "
                "| fp16")
      ->check(non_empty_validator("a codec name (leave --vquantizer out for the --quantizer codec)"));
  c->add_option("-m,--model", a->model, "tasq/cq: GGUF model")->check(CLI::ExistingFile);
  c->add_option("-f,--file", a->text, "tasq/cq: calibration text (disjoint from evaluation text)")
      ->check(CLI::ExistingFile);
  c->add_option("--tokens", a->tokens, "tasq/cq: calibration tokens (≥ 39 per centroid)")->capture_default_str();
  c->add_option("--ctx", a->ctx, "tasq/cq: tokens per calibration window (fresh cache each)")->capture_default_str();
  c->add_option("--group", a->group, "tasq/cq: key channels per VQ group g (tasq: 2, 4, 8, …)")->capture_default_str();
  c->add_option("--centroids", a->centroids, "tasq/cq: centroids K per key group (power of two; bits = log2 K / g)")
      ->capture_default_str();
  c->add_option("--vgroup", a->vgroup, "tasq/cq: value channels per VQ group")->capture_default_str();
  c->add_option("--vcentroids", a->vcentroids, "tasq/cq: centroids per value group")->capture_default_str();
  c->add_option("--kmeans-iters", a->kmeans_iters, "tasq/cq: Lloyd iterations (Faiss)")->capture_default_str();
  c->add_option("--kmeans-seeds", a->n_seeds,
                "tasq/cq: fit with k-means seeds seed..seed+N−1 from one capture (outputs OUT.s<k>.json)")
      ->capture_default_str();
  c->add_flag("--no-weighting", a->no_weighting, "tasq ablation: no query-guided channel weights");
  c->add_flag("--no-normalization", a->no_normalization, "tasq ablation: no shared per-token scale");
  c->add_flag("--no-grouping", a->no_grouping, "tasq ablation: contiguous RoPE pairs instead of matching");
  c->add_flag("--fisher", a->fisher,
              "tasq/cq: Fisher-weighted key k-means (F = s² Σ_G g²/w, g = ∂L/∂k_pre; runs a backward pass per "
              "window)");
  add_list_option(c, "--also", a->also,
                  "tasq/cq: also fit these variants from the same capture: cq, tasq, no-weighting, no-normalization, "
                  "no-grouping, no-fisher (each = the main options with one change; outputs OUT.<variant>.json)");
  c->add_option("--also-kmeans-seeds", a->also_seeds,
                "tasq/cq: k-means seeds for the --also ablations no-* (default: --kmeans-seeds; file names keep .s<k>)");
  CLI::Option* curves_from = c->add_option(
      "--curves-from", a->rq.curves_from,
      "ratequant (and uniform --bits): allocate with another quantizer's fitted (α, β) curves (the mismatch "
      "experiment)");
  CLI::Option* sensitivity = c->add_option(
      "--sensitivity", a->rq.sensitivity,
      "ratequant (and uniform --bits): sensitivity estimator in the stats (grad | activation), or none (every "
      "component weighs 1: the curves alone); refused when every key or every value sensitivity is 0");
  sensitivity->capture_default_str();
  CLI::Option* key_weight = c->add_option(
      "--key-weight", a->rq.key_weight,
      "ratequant (and uniform --bits): multiply the key sensitivities by this factor, 1e-6..1e6 "
      "(alloc::kMinKeyWeight..kMaxKeyWeight; side calibration, docs/quality_results.md §8)");
  key_weight->capture_default_str();
  c->add_option("--group-size", a->rq.group_size, "kivi / quarot scale group")->capture_default_str();
  c->add_option("--fp16-window", a->rq.fp16_window, "recent tokens kept in fp16")->capture_default_str();
  c->add_option("--sink-tokens", a->rq.sink_tokens, "first tokens kept in fp16")->capture_default_str();
  c->add_option("--key-offset", a->rq.key_offset,
                "none | mean: subtract the calibrated pre-RoPE key mean before quantizing keys (uniform, block-gtq; "
                "docs/design.md §2.5)")
      ->capture_default_str();
  c->add_flag("--norm-correction", a->rq.norm_correction,
              "TQ-MSE codecs store n/‖c[idx]‖ so that reconstructions keep their norm (docs/design.md §2.4)");
  c->add_flag("--force", a->force, "overwrite the output file");
  c->add_flag("--json", a->json, "print the achieved bits and the allocator diagnostics as JSON on stdout");
  c->add_flag("-q,--quiet", a->quiet, "print nothing on success");
  c->callback([a, c, bits, key_weight, sensitivity, curves_from] {
    a->app = c;
    a->avg_given = bits->count() > 0;
    a->key_weight_given = key_weight->count() > 0;
    a->sensitivity_given = sensitivity->count() > 0;
    a->curves_from_given = curves_from->count() > 0;
    with_flag_names(kPlanFlags, [&] { run(*a); });
  });
});

}  // namespace
}  // namespace ratekv::cli
