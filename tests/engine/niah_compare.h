// tests/engine/niah_compare.h — a GPU NIAH answer against the CPU's on the
// same prompt (eval::NiahAnswerer answer logits, (rows, n_vocab) each): the
// worst relative L2 of the logit rows both sides picked a token from while
// they agreed, and where (if anywhere) their argmax first differs, with the
// CPU's top-2 margin there (a divergence is legitimate only at a near tie).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gpu_util.h"

namespace engine_test {

struct AnswerComparison {
  double worst = 0;   ///< max rel L2 over the compared rows
  int rows = 0;       ///< rows compared (up to and including a divergence)
  int diverge = -1;   ///< first row whose argmax differs, −1 if none
  double margin = 0;  ///< the CPU row's top-1 − top-2 logit there
};

inline AnswerComparison compare_answers(const std::vector<float>& cpu, const std::vector<float>& gpu, int V) {
  AnswerComparison r;
  const size_t n = std::min(cpu.size(), gpu.size()) / static_cast<size_t>(V);
  for (size_t i = 0; i < n; ++i) {
    const float* c = cpu.data() + i * V;
    const float* g = gpu.data() + i * V;
    r.worst = std::max(r.worst, rel_l2(gpu, cpu, i * V, V));
    ++r.rows;
    const int ac = static_cast<int>(std::max_element(c, c + V) - c);
    const int ag = static_cast<int>(std::max_element(g, g + V) - g);
    if (ac != ag) {
      r.diverge = static_cast<int>(i);
      float a = -1e30f, b = -1e30f;
      for (int j = 0; j < V; ++j) {
        if (c[j] > a) b = a, a = c[j];
        else if (c[j] > b) b = c[j];
      }
      r.margin = a - b;
      break;
    }
  }
  return r;
}

}  // namespace engine_test
