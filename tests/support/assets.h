// tests/support/assets.h — where tests find the model and text assets
// (outside git; tools/fetch_assets.sh). Tests that need one GTEST_SKIP() when
// it is absent. Header-only.
#pragma once

#include <cstdlib>
#include <string>

namespace ratekv_test {

/// $RATEKV_ASSETS, else $HOME/.cache/ratekv/assets.
inline std::string assets_dir() {
  if (const char* e = std::getenv("RATEKV_ASSETS")) return e;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/ratekv/assets";
}

/// The default model, SmolLM2-135M-Instruct Q4_1 (may not exist).
inline std::string smollm2_path() { return assets_dir() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf"; }

/// Gemma 3 270M Q4_K_M (may not exist).
inline std::string gemma3_path() { return assets_dir() + "/models/gemma-3-270m-q4_k_m.gguf"; }

/// Qwen2.5-Coder-0.5B-Instruct Q4_K_M (in the default fetch; may not exist).
inline std::string qwen05_path() { return assets_dir() + "/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"; }

/// Qwen2.5-Coder-1.5B-Instruct Q4_K_M (opt-in: tools/fetch_assets.sh --with-qwen-1.5b; may not exist).
inline std::string qwen15_path() { return assets_dir() + "/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"; }

}  // namespace ratekv_test
