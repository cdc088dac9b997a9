// Token sampling, host reference (ratekv/engine/sampling.h).
#include "ratekv/engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "ratekv/common/error.h"

namespace ratekv::engine {

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

void SamplingParams::validate() const {
  check(std::isfinite(temperature) && temperature >= 0.f, "SamplingParams.temperature {}: expected a finite value >= 0",
        temperature);
  check(top_k >= 0, "SamplingParams.top_k {}: expected >= 0 (0 = all tokens)", top_k);
  check(top_p > 0.f && top_p <= 1.f, "SamplingParams.top_p {}: expected a value in (0, 1]", top_p);
}

double sampling_uniform(uint64_t seed, int64_t step) {
  return static_cast<double>(splitmix64(splitmix64(seed) + static_cast<uint64_t>(step)) >> 11) * 0x1.0p-53;
}

int32_t sample_reference(const float* logits, int V, const SamplingParams& sp, double u) {
  check(V >= 1, "sample_reference: n_vocab {} must be >= 1", V);
  if (sp.greedy()) {
    int32_t best = -1;
    for (int i = 0; i < V; ++i)
      if (!std::isnan(logits[i]) && (best < 0 || logits[i] > logits[best])) best = i;
    return std::max(best, 0);
  }
  std::vector<float> z(V);
  float zmax = -INFINITY;
  for (int i = 0; i < V; ++i) {
    z[i] = std::isnan(logits[i]) ? -INFINITY : logits[i] / sp.temperature;  // fp32 division, as the GPU
    zmax = std::max(zmax, z[i]);
  }
  float thr = -INFINITY;
  if (sp.top_k > 0 && sp.top_k < V) {
    std::vector<float> s = z;
    std::nth_element(s.begin(), s.begin() + (sp.top_k - 1), s.end(), std::greater<float>());
    thr = s[sp.top_k - 1];
  }
  auto w = [&](int i) { return static_cast<double>(std::exp(z[i] - zmax)); };  // fp32 exp, as the GPU
  if (sp.top_p < 1.f) {
    std::vector<int> kept;
    double W = 0;
    for (int i = 0; i < V; ++i)
      if (z[i] >= thr && z[i] > -INFINITY) kept.push_back(i), W += w(i);
    std::sort(kept.begin(), kept.end(), [&](int a, int b) { return z[a] > z[b]; });
    double cum = 0;
    for (int i : kept) {
      cum += w(i);
      if (cum >= static_cast<double>(sp.top_p) * W) {
        thr = std::max(thr, z[i]);
        break;
      }
    }
  }
  double W = 0;
  int last = -1;
  for (int i = 0; i < V; ++i)
    if (z[i] >= thr && z[i] > -INFINITY) W += w(i), last = i;
  const double target = u * W;
  double cum = 0;
  for (int i = 0; i < V; ++i)
    if (z[i] >= thr && z[i] > -INFINITY) {
      cum += w(i);
      if (cum > target) return i;
    }
  return std::max(last, 0);
}

}  // namespace ratekv::engine
