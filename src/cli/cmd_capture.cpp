// `ratekv capture`: dump real post-RoPE K and V vectors of chosen layers as
// float32 .npy files, the input of `ratekv rd --data` (measured
// rate–distortion curves on real K/V; docs/design.md §4.2).
//
// Output, per captured layer l: DIR/k_layer<l>.npy and DIR/v_layer<l>.npy,
// each (n_kv_heads · N, head_dim) float32, C order, head-major: row h·N + t is
// token t of KV head h (post-RoPE keys; values as projected), so consecutive
// rows are consecutive tokens of one head (what per-channel-over-tokens
// codecs such as KIVI keys group). With --queries also DIR/q_layer<l>.npy,
// (n_heads · N, head_dim), post-RoPE queries in the same order (the real
// decode queries of the GPU attention test, tests/cuda).
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "cli/capture_layers.h"
#include "cli/command.h"
#include "cli/loaded_model.h"
#include "cli/text_tokens.h"
#include "ratekv/common/error.h"
#include "ratekv/common/log.h"
#include "ratekv/io/npy.h"

namespace ratekv::cli {
namespace {

struct CaptureArgs {
  std::string model, text, out_dir;
  int64_t tokens = 2048, ctx = 512;
  std::vector<int> layers;
  bool force = false, queries = false;
};

void run(CaptureArgs& a) {
  check(a.tokens >= 1, "--tokens {}: expected ≥ 1", a.tokens);
  check(a.ctx >= 1, "--ctx {}: expected ≥ 1", a.ctx);
  // Options against the model's header, the text, and the output files, before the weights load; the
  // output directory is created only once all of them pass (a failed check leaves nothing behind).
  std::vector<int32_t> ids;
  LoadedModel lm = load_model(a.model, [&](const ModelHeader& h) {
    const ModelConfig& c = h.config;
    check(a.ctx <= c.n_ctx_train, "--ctx {}: the model's context is {} tokens", a.ctx, c.n_ctx_train);
    if (a.layers.empty()) a.layers = default_capture_layers(c.n_layers);
    for (size_t i = 0; i < a.layers.size(); ++i) {
      const int l = a.layers[i];
      check(l >= 0 && l < c.n_layers, "--layers: layer {} out of range 0..{}", l, c.n_layers - 1);
      for (size_t j = 0; j < i; ++j) check(a.layers[j] != l, "--layers: layer {} given twice (each layer once)", l);
    }
    const bool dir_exists = output_dir_exists(a.out_dir, "-o");
    ids = read_text_tokens(h.tokenizer, a.text, a.tokens, h.add_bos, "-f");
    if (dir_exists)
      for (int l : a.layers) {
        for (const char* side : {"k", "v", "q"}) {
          if (*side == 'q' && !a.queries) continue;
          check_output_path(fmt::format("{}/{}_layer{}.npy", a.out_dir, side, l), a.force, "-o");
        }
      }
    make_output_dir(a.out_dir, "-o");
  });
  const ModelConfig& cfg = lm.model->config();
  const int64_t row = (int64_t)cfg.n_kv_heads * cfg.head_dim;
  const int64_t qrow = (int64_t)cfg.n_heads * cfg.head_dim;
  std::vector<std::vector<float>> ks(cfg.n_layers), vs(cfg.n_layers), qs(cfg.n_layers);
  std::vector<char> want(cfg.n_layers, 0);
  for (int l : a.layers) want[l] = 1;
  ForwardHooks hooks;
  hooks.on_layer = [&](const LayerActivations& act) {
    if (!want[act.layer]) return;
    ks[act.layer].insert(ks[act.layer].end(), act.k_post, act.k_post + act.n * row);
    vs[act.layer].insert(vs[act.layer].end(), act.v, act.v + act.n * row);
    if (a.queries) qs[act.layer].insert(qs[act.layer].end(), act.q_post, act.q_post + act.n * qrow);
  };
  DenseKVCache cache = lm.model->make_dense_cache(a.ctx);
  Progress prog("capture", (int64_t)ids.size());
  for (size_t p = 0; p < ids.size(); p += (size_t)a.ctx) {
    const size_t n = std::min(ids.size() - p, (size_t)a.ctx);
    cache.clear();
    lm.model->forward(std::span<const int32_t>(ids.data() + p, n), 0, cache, nullptr, false, &hooks);
    prog.update((int64_t)(p + n));
  }
  prog.finish();
  // (N, n_kv_heads, head_dim) -> (n_kv_heads, N, head_dim)
  const int64_t N = (int64_t)ids.size(), H = cfg.n_kv_heads, d = cfg.head_dim;
  auto head_major = [&](const std::vector<float>& x, int64_t heads) {
    std::vector<float> y(x.size());
    for (int64_t t = 0; t < N; ++t)
      for (int64_t h = 0; h < heads; ++h)
        std::copy_n(x.data() + (t * heads + h) * d, d, y.data() + (h * N + t) * d);
    return y;
  };
  // Every file is written as <name>.part first and renamed only once all are written, so a failed write
  // (disk full, an unwritable entry) leaves no partial set of layers and no truncated .npy behind.
  std::vector<std::string> finals;
  auto write_part = [&](const std::string& final_path, const std::vector<float>& x, int64_t rows) {
    const std::string part = final_path + ".part";
    try {
      write_npy_f32(part, x, rows, d, "-o");
    } catch (...) {
      // A short write leaves a truncated file; anything else there (a directory, a link) is not ours to remove.
      std::error_code ec;
      if (std::filesystem::is_regular_file(std::filesystem::symlink_status(part, ec))) std::filesystem::remove(part, ec);
      throw;
    }
    finals.push_back(final_path);
  };
  try {
    for (int l : a.layers) {
      write_part(fmt::format("{}/k_layer{}.npy", a.out_dir, l), head_major(ks[l], H), H * N);
      write_part(fmt::format("{}/v_layer{}.npy", a.out_dir, l), head_major(vs[l], H), H * N);
      if (a.queries)
        write_part(fmt::format("{}/q_layer{}.npy", a.out_dir, l), head_major(qs[l], cfg.n_heads),
                   (int64_t)cfg.n_heads * N);
    }
  } catch (...) {
    std::error_code ec;
    for (const auto& f : finals) std::filesystem::remove(f + ".part", ec);
    throw;
  }
  for (const auto& f : finals) {
    std::error_code ec;
    std::filesystem::rename(f + ".part", f, ec);
    check(!ec, "-o: cannot rename '{}.part' to '{}': {}", f, f, ec.message());
  }
  spdlog::info("wrote K/V of {} layer(s), {} tokens × {} KV heads each, to {}", a.layers.size(), ids.size(),
               cfg.n_kv_heads, a.out_dir);
}

const Registrar reg("capture", [](CLI::App& app) {
  auto a = std::make_shared<CaptureArgs>();
  auto* c = app.add_subcommand("capture",
                               "Dump post-RoPE K and V vectors of chosen layers as float32 .npy files "
                               "(n_kv_heads·N, head_dim), head-major, the input of `ratekv rd --data`");
  c->add_option("-m,--model", a->model, "GGUF model")->required()->check(CLI::ExistingFile);
  c->add_option("-f,--file", a->text, "text (UTF-8); its first --tokens tokens are used")
      ->required()
      ->check(CLI::ExistingFile);
  c->add_option("--tokens", a->tokens, "tokens to run")->capture_default_str();
  c->add_option("--ctx", a->ctx, "tokens per forward chunk (fresh cache per chunk)")->capture_default_str();
  add_list_option(c, "--layers", a->layers, "layers to capture (default: first, middle, last)");
  c->add_option("-o,--output", a->out_dir, "output directory")->required();
  c->add_flag("--queries", a->queries,
              "also write q_layer<l>.npy: post-RoPE queries (n_heads·N, head_dim), same order");
  c->add_flag("--force", a->force, "overwrite existing .npy files");
  c->callback([a] { run(*a); });
});

}  // namespace
}  // namespace ratekv::cli
