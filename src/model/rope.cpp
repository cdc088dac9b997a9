// RoPE: the arch -> channel-pair layout table (docs/design.md §1.1) and the rotation.
#include <cmath>

#include "ratekv/common/error.h"
#include "ratekv/model/model.h"

namespace ratekv {

namespace {

struct ArchLayout {
  const char* arch;
  RopeLayout layout;
};

// The one table. GGUF has no rope-type key; llama.cpp decides by architecture.
// "llama": convert_hf_to_gguf permutes the Q/K rows so pairs are adjacent.
constexpr ArchLayout kArchLayouts[] = {
    {"llama", RopeLayout::Interleaved},
    {"gemma3", RopeLayout::NeoX},
    {"qwen2", RopeLayout::NeoX},
};

void check_head_dim(int head_dim) {
  check(head_dim > 0 && head_dim % 2 == 0, "RoPE: head_dim = {} must be positive and even", head_dim);
}

}  // namespace

RopeLayout rope_layout_for_arch(const std::string& arch) {
  for (const auto& e : kArchLayouts) {
    if (arch == e.arch) return e.layout;
  }
  fail("general.architecture '{}': no RoPE layout known for this architecture (known: llama, gemma3, qwen2)", arch);
}

const char* rope_layout_name(RopeLayout layout) {
  return layout == RopeLayout::Interleaved ? "interleaved" : "neox";
}

std::vector<std::array<int, 2>> rope_pairs(RopeLayout layout, int head_dim) {
  check_head_dim(head_dim);
  const int half = head_dim / 2;
  std::vector<std::array<int, 2>> p(half);
  for (int i = 0; i < half; ++i) {
    p[i] = layout == RopeLayout::Interleaved ? std::array<int, 2>{2 * i, 2 * i + 1}
                                             : std::array<int, 2>{i, i + half};
  }
  return p;
}

double rope_frequency(int block, int head_dim, double theta) {
  return std::pow(theta, -2.0 * block / head_dim);
}

void rope_angles(int64_t pos, int head_dim, double theta, float* cos_out, float* sin_out) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    const double a = static_cast<double>(pos) * rope_frequency(i, head_dim, theta);
    cos_out[i] = static_cast<float>(std::cos(a));
    sin_out[i] = static_cast<float>(std::sin(a));
  }
}

void apply_rope(float* x, int64_t n_vecs, int head_dim, RopeLayout layout, const float* cos, const float* sin,
                bool inverse) {
  const int half = head_dim / 2;
  const float sgn = inverse ? -1.0f : 1.0f;
  // Block i: (a, b) -> (a cos − b sin, a sin + b cos); the stride between a and
  // b is 1 (interleaved, a = 2i) or half (NeoX, a = i).
  const int step = layout == RopeLayout::Interleaved ? 2 : 1;
  const int off = layout == RopeLayout::Interleaved ? 1 : half;
  for (int64_t v = 0; v < n_vecs; ++v) {
    float* xv = x + v * head_dim;
    for (int i = 0; i < half; ++i) {
      float* pa = xv + i * step;
      float* pb = pa + off;
      const float c = cos[i], s = sgn * sin[i];
      const float a = *pa, b = *pb;
      *pa = a * c - b * s;
      *pb = a * s + b * c;
    }
  }
}

void apply_rope(float* x, int64_t n_vecs, int head_dim, int64_t pos, RopeLayout layout, double theta,
                bool inverse) {
  check_head_dim(head_dim);
  check(std::isfinite(theta) && theta > 0, "RoPE: theta = {} must be finite and positive", theta);
  std::vector<float> c(head_dim / 2), s(head_dim / 2);
  rope_angles(pos, head_dim, theta, c.data(), s.data());
  apply_rope(x, n_vecs, head_dim, layout, c.data(), s.data(), inverse);
}

}  // namespace ratekv
