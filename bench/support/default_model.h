// The default model for CPU benchmarks: SmolLM2-135M-Instruct Q4_1 from
// $RATEKV_ASSETS (default $HOME/.cache/ratekv/assets, tools/fetch_assets.sh),
// or the GGUF named by $RATEKV_BENCH_MODEL (e.g. Qwen2.5-Coder-1.5B for the
// comparison with llama.cpp), loaded once per process, and deterministic
// random token ids. Header-only, shared by bench_forward and bench_backward.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ratekv/io/gguf.h"
#include "ratekv/model/model.h"

namespace ratekv_bench {

/// Path of the model GGUF (may not exist): $RATEKV_BENCH_MODEL, else SmolLM2.
inline std::string model_path() {
  if (const char* m = std::getenv("RATEKV_BENCH_MODEL"); m && *m) return m;
  const char* e = std::getenv("RATEKV_ASSETS");
  const char* home = std::getenv("HOME");
  const std::string dir = e ? e : std::string(home ? home : "") + "/.cache/ratekv/assets";
  return dir + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

/// The model, loaded (dequantized) on first use; nullptr when the file is absent.
inline ratekv::Model* model() {
  static std::unique_ptr<ratekv::Model> m = [] {
    std::unique_ptr<ratekv::Model> r;
    if (std::filesystem::exists(model_path())) {
      const auto f = ratekv::GgufFile::open(model_path());
      r = std::make_unique<ratekv::Model>(ratekv::Model::load(f));
    }
    return r;
  }();
  return m.get();
}

/// n token ids uniform in [0, n_vocab), seed 42.
inline std::vector<int32_t> token_ids(int64_t n, int n_vocab) {
  std::mt19937 g(42);
  std::uniform_int_distribution<int32_t> u(0, n_vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = u(g);
  return t;
}

}  // namespace ratekv_bench
