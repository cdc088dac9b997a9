// cli/loaded_model.h — what the model-running subcommands share: open a GGUF,
// load the model and its tokenizer, and the --cache option.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "ratekv/gguf.h"
#include "ratekv/kv_cache.h"
#include "ratekv/model.h"
#include "ratekv/tokenizer.h"

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

/// Opens `path` and loads model + tokenizer, logging load time and weight
/// bytes. Throws Error (from the reader, config, weights or tokenizer).
LoadedModel load_model(const std::string& path);

/// Adds `--cache KIND` to `cmd`, storing into `kind`. Only "fp32" exists
/// today; the fake-quant and packed caches (DESIGN.md §6) will add kinds here
/// and in make_cache().
void add_cache_option(CLI::App* cmd, std::string& kind);

/// Builds the cache named by `kind` for `model` with capacity n_ctx tokens.
/// Throws Error for an unknown kind.
std::unique_ptr<KVCache> make_cache(const std::string& kind, const Model& model, int64_t n_ctx);

}  // namespace ratekv::cli
