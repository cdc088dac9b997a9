// Shared model loading and --cache handling for the CLI subcommands.
#include "cli/loaded_model.h"

#include <chrono>
#include <map>

#include "ratekv/cache/fake_quant_cache.h"
#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/common/error.h"
#include "ratekv/common/log.h"
#include "ratekv/eval/baseline_plans.h"
#include "ratekv/format/stored_bytes.h"
#include "ratekv/io/sha256.h"

namespace ratekv::cli {

LoadedModel load_model(const std::string& path, const BeforeWeights& before_weights) {
  const auto t0 = std::chrono::steady_clock::now();
  LoadedModel m;
  m.file = std::make_unique<GgufFile>(GgufFile::open(path));
  m.tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_gguf(*m.file));
  m.add_bos = m.file->has("tokenizer.ggml.add_bos_token") && m.file->get_bool("tokenizer.ggml.add_bos_token");
  if (before_weights) {
    const ModelConfig cfg = ModelConfig::from_gguf(*m.file);
    before_weights(ModelHeader{*m.file, cfg, *m.tokenizer, m.add_bos});
  }
  m.model = std::make_unique<Model>(Model::load(*m.file));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const ModelConfig& c = m.model->config();
  spdlog::info("loaded {} ({}, {} layers, {} heads / {} KV heads, head_dim {}) in {:.2f} s; fp32 weights {:.1f} MiB",
               path, c.arch, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, s,
               m.model->weights().bytes() / (1024.0 * 1024.0));
  return m;
}

const std::string& model_sha256(const std::string& path) {
  static std::map<std::string, std::string> memo;
  auto it = memo.find(path);
  if (it == memo.end()) {
    const auto t0 = std::chrono::steady_clock::now();
    it = memo.emplace(path, sha256_file(path)).first;
    spdlog::debug("sha256 of {} in {:.2f} s", path,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return it->second;
}

void add_no_plan_check_option(CLI::App* cmd, bool& skip) {
  cmd->add_flag("--no-plan-check", skip,
                "do not compare a plan's model.sha256 with the model file's (hashing a 1 GB GGUF takes seconds; use "
                "it to apply a plan to another file of the same shapes on purpose)");
}

void check_plans_match_model(const std::vector<std::string>& plan_files, const std::string& model_path, bool skip,
                             const std::string& flag) {
  if (skip) return;
  for (const std::string& f : plan_files) {
    if (f.empty()) continue;
    Plan p;
    try {
      p = Plan::load(f);
    } catch (const Error&) {
      continue;  // not a plan: the command reports it in its own terms (and e.g. --plan with --cache fp32 first)
    }
    if (p.model.sha256.empty()) continue;
    const std::string& sha = model_sha256(model_path);
    check(p.model.sha256 == sha,
          "{} {}: the plan was made for the model file '{}' with sha256 {}, but -m '{}' has sha256 {} (another model "
          "or another file of it; make a plan for this file, or pass --no-plan-check to apply it anyway)",
          flag, f, p.model.file, p.model.sha256, model_path, sha);
  }
}

void add_cache_option(CLI::App* cmd, std::string& kind) {
  cmd->add_option("--cache", kind,
                  "KV cache: fp32 (reference), fake (fake-quant of --plan: stores the reconstructions, fp32 "
                  "attention), packed (codes of --plan in the packed format, attention from the codes)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "fake", "packed"}));
}

void add_plan_option(CLI::App* cmd, std::string& plan) {
  cmd->add_option("--plan", plan, "compression plan (ratekv plan) for --cache fake|packed")
      ->check(CLI::ExistingFile);
}

namespace {

// Whether the packed cache stores every codec of `plan` (tq-mse, tq-mse-grouped,
// vq, fp16; not kivi, quarot, q8_0, q4_0).
bool packed_serves(const Plan& plan) {
  for (const auto& layer : plan.layers)
    for (const HeadPlan& h : layer)
      for (const Codec* c : {&h.key, &h.value})
        if (c->kind != CodecKind::TqMse && c->kind != CodecKind::TqMseGrouped && c->kind != CodecKind::FP16 &&
            c->kind != CodecKind::Vq)
          return false;
  return true;
}

}  // namespace

std::unique_ptr<KVCache> make_cache(const std::string& kind, const ModelConfig& cfg, int64_t n_ctx,
                                    const std::string& plan) {
  const KVCacheShape shape = cfg.kv_shape(n_ctx);
  if (kind == "fp32") {
    check(plan.empty(), "--plan '{}': only used with --cache fake|packed (got --cache fp32)", plan);
    return std::make_unique<DenseKVCache>(shape);
  }
  check(kind == "fake" || kind == "packed", "--cache '{}': unknown cache kind (fp32, fake, packed)", kind);
  check(!plan.empty(), "--cache {}: needs --plan PLAN", kind);
  auto codecs = std::make_shared<const cache::PlanCodecs>(Plan::load(plan), cfg, plan);
  if (kind == "fake") return std::make_unique<cache::FakeQuantKVCache>(shape, std::move(codecs));
  return make_packed_cache(shape, std::move(codecs));
}

std::unique_ptr<cache::PackedKVCache> make_packed_cache(const KVCacheShape& shape,
                                                         std::shared_ptr<const cache::PlanCodecs> codecs) {
  try {
    return std::make_unique<cache::PackedKVCache>(shape, codecs);
  } catch (const Error& e) {
    if (!packed_serves(codecs->plan())) throw Error(fmt::format("{} (--cache fake serves every kind)", e.what()));
    throw;
  }
}

void add_cache_type_options(CLI::App* cmd, std::string& ctk, std::string& ctv) {
  const std::vector<std::string> names = eval::cache_type_names();
  cmd->add_option("--cache-type-k", ctk,
                  "KV cache type for K (short: -ctk, as llama.cpp): f16, q8_0, q4_0, or tq2/tq3/tq4 (uniform TurboQuant-MSE "
                  "at 2/3/4 bits, built from the model's shapes; no calibration). Needs -ctv; replaces --cache/--plan")
      ->check(CLI::IsMember(names));
  cmd->add_option("--cache-type-v", ctv, "KV cache type for V (short: -ctv; values as --cache-type-k)")->check(CLI::IsMember(names));
}

std::optional<Plan> cache_type_plan_or_empty(const std::string& ctk, const std::string& ctv,
                                             const std::string& plan_flag_value, const ModelConfig& cfg) {
  if (ctk.empty() && ctv.empty()) return std::nullopt;
  check(!ctk.empty() && !ctv.empty(), "-ctk/-ctv: give both (got -ctk '{}', -ctv '{}')", ctk, ctv);
  check(plan_flag_value.empty(), "-ctk/-ctv and --plan '{}': give one of them", plan_flag_value);
  return eval::cache_type_plan(ctk, ctv, cfg);
}

std::unique_ptr<KVCache> make_cache_for_plan(const Plan& plan, const ModelConfig& cfg, int64_t n_ctx,
                                             std::string& kind, const std::string& name) {
  auto codecs = std::make_shared<const cache::PlanCodecs>(plan, cfg, name);
  const bool packable = packed_serves(plan);
  kind = packable ? "packed" : "fake";
  if (packable) return std::make_unique<cache::PackedKVCache>(cfg.kv_shape(n_ctx), std::move(codecs));
  return std::make_unique<cache::FakeQuantKVCache>(cfg.kv_shape(n_ctx), std::move(codecs));
}

void add_device_option(CLI::App* cmd, std::string& device) {
  cmd->add_option("--device", device,
                  "where the model runs: cpu (the fp32 CPU runtime) or cuda (the GPU engine: bf16 weights, fp16 or "
                  "packed cache; needs a build with CUDA and an sm_90 GPU)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
}

std::string cache_size_report(const std::string& kind, const KVCache& cache, const Model& model) {
  const int64_t n = cache.n_tokens();
  const double fp16 = static_cast<double>(model.config().kv_bytes_per_token_fp16());
  if (n <= 0) return fmt::format("KV cache ({}): empty", kind);
  const double per_token = static_cast<double>(cache.bytes()) / static_cast<double>(n);
  // The fake-quant cache keeps fp32 reconstructions (and the originals): its
  // size says nothing about compression, and the line says so.
  const std::string cmp = per_token <= fp16 ? fmt::format("{:.3f}x smaller than fp16", fp16 / per_token)
                                            : fmt::format("{:.3f}x larger than fp16", per_token / fp16);
  std::string planned;
  if (const auto* pk = dynamic_cast<const cache::PackedKVCache*>(&cache)) {
    // The pages against the plan's stored bytes (format/stored_bytes.h) for these tokens; sink and window
    // rows are fp16 rows outside the pages.
    const Plan& p = pk->codecs().plan();
    const int64_t nq = pk->n_quantized(0);
    const double rows16 = static_cast<double>(n - nq) * model.config().n_layers * model.config().n_kv_heads * 2 *
                          model.config().head_dim * 2;
    const double want = plan_stored_bytes_at(p, n, pk->sink_tokens(), pk->fp16_window()) - rows16;
    planned = fmt::format("; pages {} bytes, planned {:.10g} (plan_stored_bytes_at){}", pk->page_bytes(), want,
                          static_cast<double>(pk->page_bytes()) == want ? ": equal" : ": DIFFERENT");
  }
  return fmt::format(
      "KV cache ({}): {:.1f} bytes/token, {:.3f} MiB for {} tokens (measured from the allocations{}); "
      "fp16 K/V {:.0f} bytes/token: {}{}{}",
      kind, per_token, cache.bytes() / 1048576.0, n, kind == "packed" ? ", whole 64-token pages" : "", fp16, cmp,
      planned,
      kind == "fake" ? " — the fake-quant cache stores fp32 reconstructions; use --cache packed for real sizes" : "");
}

}  // namespace ratekv::cli
