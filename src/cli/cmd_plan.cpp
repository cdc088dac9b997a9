// `ratekv plan`: allocate bits from calibration statistics and write a plan (alloc/).
#include <cstdio>
#include <filesystem>

#include "cli/command.h"
#include "ratekv/alloc/make_plan.h"
#include "ratekv/error.h"
#include "ratekv/log.h"

// The statistics file: the safetensors file of `ratekv calibrate` when the
// calib module provides its reader, else (and always accepted) the JSON form
// of alloc/stats.h.
#include "ratekv/calib/kv_stats.h"

namespace ratekv::cli {
namespace {

struct PlanArgs {
  alloc::PlanRequest rq;
  std::string stats, out;
  double avg_bits = -1.0;
  bool force = false, json = false, quiet = false;
};

void run(PlanArgs& a) {
  check_output_path(a.out, a.force, "-o");
  alloc::CalibStats st = calib::load_alloc_stats(a.stats);  // safetensors or JSON
  a.rq.stats_file = std::filesystem::path(a.stats).filename().string();
  if (a.avg_bits >= 0) a.rq.avg_bits = a.avg_bits;
  alloc::PlanDiagnostics dg;
  const Plan plan = alloc::make_plan(st, a.rq, &dg);
  plan.save(a.out);
  if (a.json) {
    nlohmann::json j;
    j["plan"] = a.out;
    j["method"] = plan.method;
    const auto ach = plan.achieved();
    j["achieved"] = {{"k", ach.k}, {"v", ach.v}, {"total", ach.total}, {"k_code", ach.k_code}, {"v_code", ach.v_code}};
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

const Registrar reg("plan", [](CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  auto* c = app.add_subcommand(
      "plan",
      "Allocate KV-cache bits from calibration statistics and write a plan (JSON). Budgets are bits per element; "
      "with --budget-unit effective (default) they include every stored norm/scale, with code they name the code "
      "bits of a uniform codec (block-gtq then gets that codec's effective budget).");
  c->add_option("--method", a->rq.method, "uniform | block-gtq | ratequant | ratequant+block-gtq")
      ->required()
      ->check(CLI::IsMember({"uniform", "block-gtq", "ratequant", "ratequant+block-gtq"}));
  c->add_option("--kbits", a->rq.k_bits, "key budget, bits per element")->capture_default_str();
  c->add_option("--vbits", a->rq.v_bits, "value budget, bits per element")->capture_default_str();
  c->add_option("--bits", a->avg_bits,
                "ratequant: average budget per component (default (kbits+vbits)/2); uniform: the RateQuant "
                "baseline, better of K⌈b⌉V⌊b⌋ and K⌊b⌋V⌈b⌉ under the fitted curves");
  c->add_option("--budget-unit", a->rq.budget_unit, "effective | code")
      ->capture_default_str()
      ->check(CLI::IsMember({"effective", "code"}));
  c->add_option("--bmin", a->rq.b_min, "lowest width (default: block-gtq 0, others 1)");
  c->add_option("--bmax", a->rq.b_max, "highest width (default: block-gtq 4, others 8)");
  c->add_option("--stats", a->stats,
                "statistics from `ratekv calibrate` (.safetensors) or the JSON form (alloc/stats.h)")
      ->required()
      ->check(CLI::ExistingFile);
  c->add_option("-o,--output", a->out, "output plan (.json)")->required();
  c->add_option("--seed", a->rq.seed, "seed of the per-group rotation seeds")->capture_default_str();
  c->add_option("--quantizer", a->rq.quantizer,
                "codec: tq-mse | kivi | quarot; uniform also q8_0 | q4_0 | fp16 (llama.cpp cache types, fp16 cache)")
      ->capture_default_str();
  c->add_option("--vquantizer", a->rq.v_quantizer, "uniform: value codec when it differs from --quantizer");
  c->add_option("--curves-from", a->rq.curves_from,
                "allocate with another quantizer's fitted (α, β) curves (the mismatch experiment)");
  c->add_option("--sensitivity", a->rq.sensitivity, "sensitivity estimator in the stats (grad | activation)")
      ->capture_default_str();
  c->add_option("--group-size", a->rq.group_size, "kivi / quarot scale group")->capture_default_str();
  c->add_option("--fp16-window", a->rq.fp16_window, "recent tokens kept in fp16")->capture_default_str();
  c->add_option("--sink-tokens", a->rq.sink_tokens, "first tokens kept in fp16")->capture_default_str();
  c->add_flag("--force", a->force, "overwrite the output file");
  c->add_flag("--json", a->json, "print the achieved bits and the allocator diagnostics as JSON on stdout");
  c->add_flag("-q,--quiet", a->quiet, "print nothing on success");
  c->callback([a] { run(*a); });
});

}  // namespace
}  // namespace ratekv::cli
