// cli/loaded_model.h — what the model-running subcommands share: open a GGUF,
// load the model and its tokenizer, and the --cache option.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <string>

#include "ratekv/io/gguf.h"
#include "ratekv/model/kv_cache.h"
#include "ratekv/model/model.h"
#include "ratekv/model/tokenizer.h"

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

/// One line on the cache size measured from its allocations: bytes per token
/// (cache.bytes() / n_tokens), total, and the ratio against an fp16 K/V cache
/// of the same model (ModelConfig::kv_bytes_per_token_fp16).
std::string cache_size_report(const std::string& kind, const KVCache& cache, const Model& model);

}  // namespace ratekv::cli
