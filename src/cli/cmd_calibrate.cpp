// `ratekv calibrate`: K/V statistics of a model on unlabeled text (calib/).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>

#include "cli/command.h"
#include "cli/flag_names.h"
#include "cli/loaded_model.h"
#include "cli/text_tokens.h"
#include "ratekv/calib/calibrate.h"
#include "ratekv/calib/sensitivity.h"
#include "ratekv/eval/distortion_measure.h"
#include "ratekv/common/error.h"
#include "ratekv/common/log.h"
#include "ratekv/model/backward.h"
#include "ratekv/io/sha256.h"

namespace ratekv::cli {
namespace {

struct CalibrateArgs {
  std::string model, text, out;
  int64_t tokens = 0, ctx = 512;
  bool force = false;
  bool sensitivity = false;
  int64_t sens_seqs = 16, sens_len = 512;
  std::vector<std::string> curves;  // quantizers whose distortion curves are measured
  std::vector<int> curve_bits = {1, 2, 3, 4, 5};
  std::string curves_json;
  bool curve_bits_given = false;  // --curve-bits was given
  bool sens_given = false;        // --sens-seqs or --sens-len was given
};

void run(const CalibrateArgs& a) {
  // ≥ 2: k_pre_cov is the population covariance (1/N) of the pre-RoPE keys, 0 for one token (and with a BOS
  // that one token is the BOS): statistics of nothing (--tokens 1 used to be accepted).
  check(a.tokens >= 2, "--tokens {}: expected ≥ 2 (the key covariance of one token is 0)", a.tokens);
  check(a.ctx >= 1, "--ctx {}: expected ≥ 1", a.ctx);
  if (a.sensitivity) {
    check(a.sens_seqs >= 1 && a.sens_seqs <= 4096, "--sens-seqs {}: expected 1..4096", a.sens_seqs);
    check(a.sens_len >= 2, "--sens-len {}: expected ≥ 2", a.sens_len);
  }
  // Accepted and ignored before, as --curve-bits without --curves was.
  check(a.sensitivity || !a.sens_given,
        "--sens-seqs/--sens-len: need --sensitivity (no gradient sensitivity is measured without it)");
  // The curve options before the model loads (a duplicate quantizer or a bad width was refused only after the
  // whole calibration forward pass).
  check(!a.curve_bits_given || !a.curves.empty(),
        "--curve-bits: needs --curves (no distortion curves are measured without it)");
  if (!a.curves.empty()) {
    eval::CurveMeasureOptions co;
    co.quantizers = a.curves;
    co.bits = a.curve_bits;
    eval::validate_curve_options(co);
  }
  check_output_path(a.out, a.force, "-o");
  if (!a.curves_json.empty()) {
    check(!a.curves.empty(), "--curves-json '{}': needs --curves (no distortion curves are measured without it)",
          a.curves_json);
    check_output_path(a.curves_json, a.force, "--curves-json");
    check(std::filesystem::weakly_canonical(a.curves_json) != std::filesystem::weakly_canonical(a.out),
          "--curves-json '{}': the same file as -o '{}' (the statistics would overwrite the JSON)", a.curves_json,
          a.out);
  }
  // The architecture, --sens-len and the text length are checked against the
  // model's header, before its weights load and long before the backward pass.
  std::vector<int32_t> ids;
  LoadedModel lm = load_model(a.model, [&](const ModelHeader& h) {
    if (a.sensitivity) {
      check_backward_arch(h.config, "--sensitivity");
      check(a.sens_len <= h.config.n_ctx_train, "--sens-len {}: exceeds the model's position limit {}", a.sens_len,
            h.config.n_ctx_train);
    }
    const int64_t need = a.sensitivity ? std::max(a.tokens, a.sens_seqs * a.sens_len) : a.tokens;
    const std::string what =
        a.sensitivity && need > a.tokens
            ? fmt::format("-f (--sensitivity reads --sens-seqs {} × --sens-len {} tokens)", a.sens_seqs, a.sens_len)
            : std::string("-f");
    ids = read_text_tokens(h.tokenizer, a.text, need, h.add_bos, what);
  });
  spdlog::info("calibrating on the first {} tokens of {} in chunks of {}", a.tokens, a.text, a.ctx);
  calib::KVStats s = calib::calibrate(*lm.model, std::span<const int32_t>(ids).first(a.tokens), a.ctx);
  if (a.sensitivity) {
    spdlog::info("gradient sensitivity: {} sequences of {} tokens (the first {} tokens of {})", a.sens_seqs,
                 a.sens_len, a.sens_seqs * a.sens_len, a.text);
    s.grad = calib::gradient_sensitivity(*lm.model, ids, a.sens_seqs, a.sens_len);
    spdlog::info("mean loss over the sensitivity sequences: {:.4f} nats", s.grad.mean_loss);
  }
  if (!a.curves.empty()) {
    eval::CurveMeasureOptions co;
    co.quantizers = a.curves;
    co.bits = a.curve_bits;
    co.ctx = a.ctx;
    std::string names;
    for (const auto& q : a.curves) names += (names.empty() ? "" : ", ") + q;
    spdlog::info("distortion curves of {} at {} widths on the calibration chunks", names, a.curve_bits.size());
    s.curves = eval::measure_distortion_curves(*lm.model, std::span<const int32_t>(ids).first(a.tokens),
                                               s.to_alloc_stats(), co);
    const size_t n = static_cast<size_t>(s.model.n_layers) * s.model.n_kv_heads;
    std::fputs(calib::format_curve_table(s.curves, n).c_str(), stdout);
    if (!a.curves_json.empty()) {
      std::ofstream out(a.curves_json);
      out << calib::curves_to_json(s.curves, n).dump(1) << "\n";
      out.close();  // a full disk shows at close, not at <<
      check(out.good(), "--curves-json '{}': write failed", a.curves_json);
    }
  }
  s.model.file = std::filesystem::path(a.model).filename().string();
  s.model.sha256 = sha256_file(a.model);
  s.text_file = std::filesystem::path(a.text).filename().string();
  s.text_sha256 = sha256_file(a.text);
  s.save(a.out);
  spdlog::info("wrote {} ({} tokens, {} layers × {} KV heads)", a.out, s.n_tokens, s.model.n_layers,
               s.model.n_kv_heads);
}

// The library parameters these flags set (errors name the flag).
const FlagNames kCalibrateFlags = {
    {"calibrate.ctx", "--ctx"},
    {"gradient_sensitivity.n_sequences", "--sens-seqs"},
    {"gradient_sensitivity.seq_len", "--sens-len"},
    {"CurveMeasureOptions.quantizers", "--curves"},
    {"CurveMeasureOptions.bits", "--curve-bits"},
    {"CurveMeasureOptions.ctx", "--ctx"},
};

const Registrar reg("calibrate", [](CLI::App& app) {
  auto a = std::make_shared<CalibrateArgs>();
  auto* c = app.add_subcommand("calibrate",
                               "Run the model over calibration text and store K/V statistics (per-RoPE-block q/k "
                               "energies, pre-RoPE key mean/covariance, query and value second moments) as "
                               "safetensors (docs/calibration_stats.md)");
  c->add_option("-m,--model", a->model, "GGUF model")->required()->check(CLI::ExistingFile);
  c->add_option("-f,--file", a->text, "calibration text (UTF-8); its first --tokens tokens are used")
      ->required()
      ->check(CLI::ExistingFile);
  c->add_option("--tokens", a->tokens, "calibration tokens N")->required();
  c->add_option("--ctx", a->ctx, "tokens per forward chunk (fresh cache per chunk)")->capture_default_str();
  c->add_option("-o,--output", a->out, "output statistics file (.safetensors)")->required();
  c->add_flag("--sensitivity", a->sensitivity,
              "also measure the gradient sensitivity E_t ‖∂L/∂K‖², E_t ‖∂L/∂V‖² per layer and KV head by a "
              "backward pass (RateQuant's \"grad\" weights)");
  c->add_option("--sens-seqs", a->sens_seqs, "sensitivity: number of sequences (consecutive, from the text start)")
      ->capture_default_str();
  c->add_option("--sens-len", a->sens_len, "sensitivity: tokens per sequence (each its own causal LM loss)")
      ->capture_default_str();
  add_list_option(c, "--curves", a->curves,
                  "measure and fit RateQuant distortion curves D(b) = α β^(−b) of these quantizers (kivi, quarot, "
                  "tq-mse, block-gtq; comma-separated) on the calibration chunks");
  add_list_option(c, "--curve-bits", a->curve_bits, "code widths the curves are measured at");
  c->add_option("--curves-json", a->curves_json, "also write the measured MSE and the fits as JSON")
      ->check(non_empty_path_validator("a file to write the JSON to"));
  c->add_flag("--force", a->force, "overwrite the output file");
  c->callback([a, c] {
    a->curve_bits_given = c->get_option("--curve-bits")->count() > 0;
    a->sens_given = c->get_option("--sens-seqs")->count() > 0 || c->get_option("--sens-len")->count() > 0;
    with_flag_names(kCalibrateFlags, [&] { run(*a); });
  });
});

}  // namespace
}  // namespace ratekv::cli
