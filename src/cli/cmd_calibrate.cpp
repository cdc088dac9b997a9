// `ratekv calibrate`: K/V statistics of a model on unlabeled text (calib/).
#include <filesystem>

#include "cli/command.h"
#include "cli/loaded_model.h"
#include "cli/text_tokens.h"
#include "ratekv/calib/calibrate.h"
#include "ratekv/error.h"
#include "ratekv/log.h"
#include "ratekv/sha256.h"

namespace ratekv::cli {
namespace {

struct CalibrateArgs {
  std::string model, text, out;
  int64_t tokens = 0, ctx = 512;
  bool force = false;
};

void run(const CalibrateArgs& a) {
  check(a.tokens >= 1, "--tokens {}: expected ≥ 1", a.tokens);
  check(a.ctx >= 1, "--ctx {}: expected ≥ 1", a.ctx);
  check_output_path(a.out, a.force, "-o");
  LoadedModel lm = load_model(a.model);
  const std::vector<int32_t> ids = read_text_tokens(*lm.tokenizer, a.text, a.tokens, lm.add_bos, "-f");
  spdlog::info("calibrating on the first {} tokens of {} in chunks of {}", ids.size(), a.text, a.ctx);
  calib::KVStats s = calib::calibrate(*lm.model, ids, a.ctx);
  s.model.file = std::filesystem::path(a.model).filename().string();
  s.model.sha256 = sha256_file(a.model);
  s.text_file = std::filesystem::path(a.text).filename().string();
  s.text_sha256 = sha256_file(a.text);
  s.save(a.out);
  spdlog::info("wrote {} ({} tokens, {} layers × {} KV heads)", a.out, s.n_tokens, s.model.n_layers,
               s.model.n_kv_heads);
}

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
  c->add_flag("--force", a->force, "overwrite the output file");
  c->callback([a] { run(*a); });
});

}  // namespace
}  // namespace ratekv::cli
