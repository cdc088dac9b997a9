// Shared model loading and --cache handling for the CLI subcommands.
#include "cli/loaded_model.h"

#include <chrono>

#include "ratekv/error.h"
#include "ratekv/log.h"

namespace ratekv::cli {

LoadedModel load_model(const std::string& path) {
  const auto t0 = std::chrono::steady_clock::now();
  LoadedModel m;
  m.file = std::make_unique<GgufFile>(GgufFile::open(path));
  m.model = std::make_unique<Model>(Model::load(*m.file));
  m.tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_gguf(*m.file));
  m.add_bos = m.file->has("tokenizer.ggml.add_bos_token") && m.file->get_bool("tokenizer.ggml.add_bos_token");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const ModelConfig& c = m.model->config();
  spdlog::info("loaded {} ({}, {} layers, {} heads / {} KV heads, head_dim {}) in {:.2f} s; fp32 weights {:.1f} MiB",
               path, c.arch, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, s,
               m.model->weights().bytes() / (1024.0 * 1024.0));
  return m;
}

void add_cache_option(CLI::App* cmd, std::string& kind) {
  cmd->add_option("--cache", kind,
                  "KV cache: fp32 (the only kind implemented so far; quantized caches come with plans)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32"}));
}

std::unique_ptr<KVCache> make_cache(const std::string& kind, const Model& model, int64_t n_ctx) {
  if (kind == "fp32") return std::make_unique<DenseKVCache>(model.config().kv_shape(n_ctx));
  fail("--cache '{}': unknown cache kind (implemented: fp32)", kind);
}

}  // namespace ratekv::cli
