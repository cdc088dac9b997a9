// cli/loaded_model.h — what the model-running subcommands share: open a GGUF,
// load the model and its tokenizer, and the --cache option.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ratekv/io/gguf.h"
#include "ratekv/model/kv_cache.h"
#include "ratekv/model/model.h"
#include "ratekv/format/plan.h"
#include "ratekv/model/tokenizer.h"

namespace ratekv::cache {
class PackedKVCache;  // ratekv/cache/packed_kv_cache.h
class PlanCodecs;     // ratekv/cache/plan_codecs.h
}  // namespace ratekv::cache

namespace ratekv::cli {

/// A model ready to run: the mapped file (kept for the tokenizer's lifetime),
/// fp32 weights, tokenizer, and whether the model wants a BOS token
/// (tokenizer.ggml.add_bos_token, default false).
struct LoadedModel {
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  bool add_bos = false;
};

/// The cheap part of a model (the file is mapped, not read): its config,
/// tokenizer and add_bos, as load_model() has them before the weights are
/// dequantized (the slow part: about 2 s for SmolLM2-135M).
struct ModelHeader {
  const GgufFile& file;
  const ModelConfig& config;
  const Tokenizer& tokenizer;
  bool add_bos;
};

/// Checks a subcommand makes on its options against the model's header, so
/// that a bad option combination fails before the weights load. Throws Error.
using BeforeWeights = std::function<void(const ModelHeader&)>;

/// Opens `path`, reads the config and tokenizer, runs `before_weights` (if
/// set), then loads the weights, logging load time and weight bytes. Throws
/// Error (from the reader, config, tokenizer, `before_weights` or weights).
LoadedModel load_model(const std::string& path, const BeforeWeights& before_weights = {});

/// SHA-256 (hex) of the file at `path`, computed once per process and path
/// (io/sha256.h; about 0.7 s for SmolLM2-135M's 94 MB, 9 s for a 1 GB GGUF on
/// the shared build machine).
const std::string& model_sha256(const std::string& path);

/// Adds `--no-plan-check` (skip check_plans_match_model) to `cmd`.
void add_no_plan_check_option(CLI::App* cmd, bool& skip);

/// Plan ↔ model identity: each plan file in `plan_files` that records a
/// model.sha256 (plans made from `ratekv calibrate` statistics or from the
/// model itself do) must name the model file `model_path` is. Throws Error
/// naming the flag, the plan file and both hashes otherwise. Plans without a
/// sha256 (uniform plans from shapes, Python plans of HF models) are not
/// compared; nothing is hashed unless some plan records one.
/// Cost decision: the model is hashed only for that comparison (or reused
/// when the command hashes it anyway: eval --reference-cache), memoized per
/// process — under a second for SmolLM2, ~9 s for a 1 GB GGUF here, small
/// beside a run that applies a plan; `--no-plan-check` (skip = true) skips it
/// for a deliberate cross-model use or a model file re-quantized in place.
/// Call it before the weights load.
void check_plans_match_model(const std::vector<std::string>& plan_files, const std::string& model_path, bool skip,
                             const std::string& flag = "--plan");

/// Adds `--cache KIND` to `cmd`, storing into `kind`: fp32 (DenseKVCache),
/// fake (FakeQuantKVCache of a plan) or packed (PackedKVCache of a plan).
void add_cache_option(CLI::App* cmd, std::string& kind);
/// Adds `--plan PLAN` (the plan JSON the fake/packed caches use).
void add_plan_option(CLI::App* cmd, std::string& plan);

/// Builds the cache named by `kind` for a model of config `cfg` with capacity
/// n_ctx tokens; fake and packed need `plan` (a plan file, checked against the
/// config). Needs no weights: call it from a BeforeWeights check. Throws Error
/// for an unknown kind, a missing/unused --plan, or a plan the cache cannot
/// serve (the packed cache: tq-mse / tq-mse-grouped only).
std::unique_ptr<KVCache> make_cache(const std::string& kind, const ModelConfig& cfg, int64_t n_ctx,
                                    const std::string& plan = "");

/// Adds llama.cpp's `-ctk,--cache-type-k` and `-ctv,--cache-type-v` (f16,
/// q8_0, q4_0, tq2, tq3, tq4; eval::cache_type_names) to `cmd`. Both or
/// neither must be given (checked by cache_type_plan_or_empty).
void add_cache_type_options(CLI::App* cmd, std::string& ctk, std::string& ctv);

/// The plan -ctk/-ctv stand for (eval::cache_type_plan, seed 0), or nullopt
/// when neither is given. Throws Error naming the flag when only one is given,
/// or when --plan is given too (one source of the cache, not two).
std::optional<Plan> cache_type_plan_or_empty(const std::string& ctk, const std::string& ctv,
                                             const std::string& plan_flag_value, const ModelConfig& cfg);

/// A CPU cache for an in-memory plan: the packed cache when every codec has
/// packed storage (tq-mse, tq-mse-grouped, fp16, vq), else the fake-quant cache
/// (q8_0, q4_0, kivi, quarot); `kind` receives "packed" or "fake".
std::unique_ptr<KVCache> make_cache_for_plan(const Plan& plan, const ModelConfig& cfg, int64_t n_ctx,
                                             std::string& kind, const std::string& name = "cache types");

/// Adds `--device cpu|cuda` to `cmd`.
void add_device_option(CLI::App* cmd, std::string& device);

/// A PackedKVCache of `codecs` (capacity shape.n_ctx). Throws its Error; when
/// the plan has codec kinds the packed cache does not store (kivi, quarot,
/// q8_0, q4_0) the message also says that --cache fake serves them.
std::unique_ptr<cache::PackedKVCache> make_packed_cache(const KVCacheShape& shape,
                                                         std::shared_ptr<const cache::PlanCodecs> codecs);

/// One line on the cache size measured from its allocations: bytes per token
/// (cache.bytes() / n_tokens), total, and the ratio against an fp16 K/V cache
/// of the same model (ModelConfig::kv_bytes_per_token_fp16).
std::string cache_size_report(const std::string& kind, const KVCache& cache, const Model& model);

}  // namespace ratekv::cli
