// Checks of a loaded model against the llama.cpp reference fixtures written by
// tools/make_reference_fixtures.sh (tests/fixtures/<model>/logits.json and
// greedy.json; formats in tests/fixtures/smollm2/README.md). Shared by the
// SmolLM2 and Gemma 3 forward tests so both models are judged the same way.
// Header-only, for tests.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "assets.h"
#include "ratekv/model/model.h"
#include "ratekv/model/tokenizer.h"

namespace ratekv::testing_support {

using ratekv_test::assets_dir;  // tests/support/assets.h

/// Parses a JSON file; null when the file cannot be opened.
inline nlohmann::json load_json_or_null(const std::string& path) {
  std::ifstream in(path);
  if (!in) return nullptr;
  return nlohmann::json::parse(in);
}

/// What check_llamacpp_logits compared.
struct LogitsCheck {
  double max_abs_diff = 0;  ///< max |Δlogit| over every stored entry (logits, nats)
  int compared = 0;         ///< stored entries compared (top + fixed ids, all positions)
  int top1_checked = 0;     ///< positions whose argmax was required equal
};

/// logits.json: runs every prompt's ids through `m` (fp32 dense cache, all
/// logits) and compares the stored top-k and fixed-id logits of every
/// position; where llama.cpp's top-1 leads its top-2 by more than
/// `top1_margin`, our argmax must equal llama.cpp's (EXPECT). With `tok`, the
/// prompt text must also tokenize (BOS, special tokens parsed) to the stored
/// ids. Prints a line per prompt; the caller bounds the returned max.
inline LogitsCheck check_llamacpp_logits(Model& m, const nlohmann::json& j, double top1_margin,
                                         const Tokenizer* tok = nullptr) {
  LogitsCheck out;
  const int V = m.config().n_vocab;
  EXPECT_EQ(j.at("n_vocab").get<int>(), V);
  const auto fixed = j.at("fixed_ids").get<std::vector<int>>();
  for (const auto& p : j.at("prompts")) {
    const auto ids = p.at("ids").get<std::vector<int32_t>>();
    if (tok) {
      EXPECT_EQ(tok->encode(p.at("text").get<std::string>(), true, true), ids) << p.at("name");
    }
    const int64_t n = static_cast<int64_t>(ids.size());
    auto cache = m.make_dense_cache(n);
    std::vector<float> logits(n * V);
    m.forward(ids, 0, cache, logits.data(), true);
    double prompt_max = 0;
    int64_t t = 0;
    for (const auto& pos : p.at("positions")) {
      const float* row = logits.data() + t * V;
      for (const auto& e : pos.at("top")) {
        prompt_max = std::max(prompt_max, std::fabs(row[e[0].get<int>()] - e[1].get<double>()));
        ++out.compared;
      }
      const auto& fx = pos.at("fixed");
      for (size_t i = 0; i < fixed.size(); ++i) {
        prompt_max = std::max(prompt_max, std::fabs(row[fixed[i]] - fx[i].get<double>()));
        ++out.compared;
      }
      const auto& top = pos.at("top");
      if (top[0][1].get<double>() - top[1][1].get<double>() > top1_margin) {
        const int arg = static_cast<int>(std::max_element(row, row + V) - row);
        EXPECT_EQ(arg, top[0][0].get<int>()) << p.at("name") << " position " << t;
        ++out.top1_checked;
      }
      ++t;
    }
    EXPECT_EQ(t, n) << p.at("name") << ": positions stored vs prompt length";
    std::printf("llama.cpp logits, %s: max |dlogit| = %.3g\n", p.at("name").get<std::string>().c_str(), prompt_max);
    out.max_abs_diff = std::max(out.max_abs_diff, prompt_max);
  }
  std::printf("llama.cpp logits: %d compared, max |dlogit| = %.3g, top-1 checked at %d positions\n", out.compared,
              out.max_abs_diff, out.top1_checked);
  return out;
}

/// greedy.json: greedy decoding of every case's prompt ids with `m` (fp32
/// dense cache). Ids must equal llama.cpp's up to and including the first
/// step whose llama.cpp margin (top-1 − top-2 logit) is below 2·logit_bound;
/// past it two fp32 sums may legitimately pick different tokens. With `tok`,
/// the prompt text must tokenize to the stored prompt ids.
inline void check_llamacpp_greedy(Model& m, const nlohmann::json& j, double logit_bound,
                                  const Tokenizer* tok = nullptr) {
  const int V = m.config().n_vocab;
  for (const auto& c : j.at("cases")) {
    const auto prompt = c.at("prompt_ids").get<std::vector<int32_t>>();
    if (tok) {
      EXPECT_EQ(tok->encode(c.at("prompt").get<std::string>(), true, true), prompt) << c.at("name");
    }
    const auto want = c.at("ids").get<std::vector<int32_t>>();
    const auto margins = c.at("margins").get<std::vector<double>>();
    auto cache = m.make_dense_cache(static_cast<int64_t>(prompt.size() + want.size()));
    std::vector<float> logits(V);
    m.forward(prompt, 0, cache, logits.data(), false);
    std::vector<int32_t> got;
    for (size_t i = 0; i < want.size(); ++i) {
      const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      got.push_back(next);
      if (i + 1 < want.size())
        m.forward(std::span<const int32_t>(&next, 1), static_cast<int64_t>(prompt.size() + i), cache, logits.data(),
                  false);
    }
    size_t must = want.size();
    for (size_t i = 0; i < margins.size(); ++i) {
      if (margins[i] < 2 * logit_bound) {
        must = i + 1;
        break;
      }
    }
    for (size_t i = 0; i < must; ++i)
      ASSERT_EQ(got[i], want[i]) << c.at("name") << " step " << i << " (margin " << margins[i] << ")";
    std::printf("greedy %s: %zu/%zu ids required equal, all %s\n", c.at("name").get<std::string>().c_str(), must,
                want.size(), got == want ? "equal" : "NOT equal past the low-margin step");
  }
}

}  // namespace ratekv::testing_support
