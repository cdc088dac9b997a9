// Block-GTQ allocation with group-norm charging (alloc/block_gtq.h).
#include "ratekv/alloc/block_gtq.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "ratekv/common/error.h"

namespace ratekv::alloc {

namespace {

void check_options(const BlockGtqOptions& o) {
  check(o.b_min >= 0 && o.b_min <= o.b_max && o.b_max <= 8,
        "block-gtq: bounds b_min = {}, b_max = {}: expected 0 <= b_min <= b_max <= 8", o.b_min, o.b_max);
  check(o.norm_bits >= 0 && o.norm_bits % 2 == 0 && o.norm_bits <= 64,
        "block-gtq: norm_bits = {}: expected an even number in 0..64", o.norm_bits);
}

void check_energies(std::span<const double> s) {
  check(!s.empty(), "block-gtq: no RoPE block energies (head_dim must be >= 2)");
  for (size_t i = 0; i < s.size(); ++i)
    check(std::isfinite(s[i]) && s[i] >= 0.0, "block-gtq: energy of RoPE block {} is {}: expected finite and >= 0",
          i, s[i]);
}

BlockAllocation finish(std::span<const double> s, std::vector<int> bits, int norm_bits) {
  BlockAllocation a;
  a.distortion = block_distortion(s, bits);
  a.groups = groups_from_bits(bits);
  for (int b : bits) a.code_bits += 2 * (int64_t)b;
  for (const auto& g : a.groups)
    if (g.bits > 0) a.norm_bits += norm_bits;
  a.bits = std::move(bits);
  return a;
}

}  // namespace

double BlockAllocation::effective_bits_per_element() const {
  return bits.empty() ? 0.0 : (double)(code_bits + norm_bits) / (double)(2 * bits.size());
}

int64_t budget_bits_for(double bits_per_element, int head_dim) {
  check(std::isfinite(bits_per_element) && bits_per_element >= 0.0 && bits_per_element <= 64.0,
        "bit budget {}: expected a finite number of bits per element in 0..64", bits_per_element);
  check(head_dim > 0, "bit budget: head_dim = {}: expected > 0", head_dim);
  return (int64_t)std::floor(bits_per_element * head_dim + 1e-9);
}

double block_distortion(std::span<const double> s, std::span<const int> bits) {
  check(s.size() == bits.size(), "block-gtq: {} energies but {} bit widths", s.size(), bits.size());
  double j = 0.0;
  for (size_t i = 0; i < s.size(); ++i) j += s[i] * std::ldexp(1.0, -2 * bits[i]);
  return j;
}

std::vector<BlockGroup> groups_from_bits(std::span<const int> bits) {
  std::vector<BlockGroup> groups;
  std::vector<int> widths(bits.begin(), bits.end());
  std::sort(widths.begin(), widths.end(), std::greater<>());
  widths.erase(std::unique(widths.begin(), widths.end()), widths.end());
  for (int w : widths) {
    BlockGroup g{w, {}};
    for (size_t i = 0; i < bits.size(); ++i)
      if (bits[i] == w) g.blocks.push_back((int)i);
    groups.push_back(std::move(g));
  }
  return groups;
}

BlockAllocation allocate_block_gtq(std::span<const double> s, int64_t budget_bits, const BlockGtqOptions& opt) {
  check_options(opt);
  check_energies(s);
  const int L = (int)s.size(), d = 2 * L;
  const int64_t min_bits = opt.b_min > 0 ? (int64_t)opt.b_min * d + opt.norm_bits : 0;
  const int64_t max_bits = opt.b_max > 0 ? (int64_t)opt.b_max * d + opt.norm_bits : 0;
  check(budget_bits >= min_bits,
        "block-gtq: budget of {} bits per head ({:.4g} bits/element at head_dim {}) is below the minimum {} bits "
        "({:.4g}/element: b_min = {} everywhere plus one {}-bit norm)",
        budget_bits, (double)budget_bits / d, d, min_bits, (double)min_bits / d, opt.b_min, opt.norm_bits);
  check(budget_bits <= max_bits,
        "block-gtq: budget of {} bits per head ({:.4g} bits/element at head_dim {}) exceeds the most b_max = {} can "
        "use: {} bits ({:.4g}/element incl. one {}-bit norm)",
        budget_bits, (double)budget_bits / d, d, opt.b_max, max_bits, (double)max_bits / d, opt.norm_bits);

  // Units of 2 bits: a block at width w costs w units, a norm norm_bits/2.
  const int64_t R = budget_bits / 2;
  const int nu = opt.norm_bits / 2;
  const int W = opt.b_max + 1;
  std::vector<int> widths;  // allowed widths, ascending
  if (opt.b_min == 0) widths.push_back(0);
  for (int w = std::max(1, opt.b_min); w <= opt.b_max; ++w) widths.push_back(w);

  std::vector<int> order(L);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return s[a] > s[b]; });

  constexpr double kInf = std::numeric_limits<double>::infinity();
  const size_t plane = (size_t)(R + 1) * W;
  std::vector<double> cur(plane, kInf), next(plane);
  std::vector<int8_t> parent((size_t)L * plane, -1);  // previous block's width
  auto at = [W](int64_t r, int w) { return (size_t)r * W + w; };

  for (int w : widths) {
    const int64_t r = w + (w > 0 ? nu : 0);
    if (r <= R) cur[at(r, w)] = s[order[0]] * std::ldexp(1.0, -2 * w);
  }
  for (int j = 1; j < L; ++j) {
    std::fill(next.begin(), next.end(), kInf);
    const double sj = s[order[j]];
    int8_t* par = parent.data() + (size_t)j * plane;
    for (int64_t r = 0; r <= R; ++r) {
      for (int pw : widths) {
        const double v = cur[at(r, pw)];
        if (v == kInf) continue;
        for (int w : widths) {
          if (w > pw) break;
          const int64_t nr = r + w + (w != pw && w > 0 ? nu : 0);
          if (nr > R) continue;
          const double cand = v + sj * std::ldexp(1.0, -2 * w);
          if (cand < next[at(nr, w)]) {
            next[at(nr, w)] = cand;
            par[at(nr, w)] = (int8_t)pw;
          }
        }
      }
    }
    std::swap(cur, next);
  }

  double best = kInf;
  int64_t br = -1;
  int bw = -1;
  for (int64_t r = 0; r <= R; ++r)
    for (int w : widths)
      if (cur[at(r, w)] < best) {
        best = cur[at(r, w)];
        br = r;
        bw = w;
      }
  check(br >= 0, "block-gtq: internal error: no feasible allocation for budget {} bits", budget_bits);

  std::vector<int> bits(L);
  int64_t r = br;
  int w = bw;
  for (int j = L - 1; j >= 0; --j) {
    bits[order[j]] = w;
    if (j == 0) break;
    const int pw = parent[(size_t)j * plane + at(r, w)];
    r -= w + (w != pw && w > 0 ? nu : 0);
    w = pw;
  }
  return finish(s, std::move(bits), opt.norm_bits);
}

BlockAllocation allocate_block_uniform(std::span<const double> s, int64_t budget_bits, const BlockGtqOptions& opt) {
  check_options(opt);
  check_energies(s);
  const int L = (int)s.size(), d = 2 * L;
  const int64_t max_bits = opt.b_max > 0 ? (int64_t)opt.b_max * d + opt.norm_bits : 0;
  check(budget_bits <= max_bits,
        "uniform: budget of {} bits per head ({:.4g} bits/element at head_dim {}) exceeds the most b_max = {} can "
        "use: {} bits ({:.4g}/element incl. one {}-bit norm)",
        budget_bits, (double)budget_bits / d, d, opt.b_max, max_bits, (double)max_bits / d, opt.norm_bits);
  int chosen = -1;
  for (int b = opt.b_min; b <= opt.b_max; ++b)
    if ((int64_t)b * d + (b > 0 ? opt.norm_bits : 0) <= budget_bits) chosen = b;
  check(chosen >= 0,
        "uniform: budget of {} bits per head ({:.4g} bits/element at head_dim {}) is below b_min = {} plus one "
        "{}-bit norm ({} bits)",
        budget_bits, (double)budget_bits / d, d, opt.b_min, opt.norm_bits,
        (int64_t)opt.b_min * d + (opt.b_min > 0 ? opt.norm_bits : 0));
  return finish(s, std::vector<int>(L, chosen), opt.norm_bits);
}

}  // namespace ratekv::alloc
