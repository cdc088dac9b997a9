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
  check(o.wide_norm_bits >= 0 && o.wide_norm_bits % 2 == 0 && o.wide_norm_bits <= 64,
        "block-gtq: wide_norm_bits = {}: expected an even number in 0..64", o.wide_norm_bits);
  check(o.tile_channels >= 2 && o.tile_channels % 2 == 0 && o.tile_channels <= 64,
        "block-gtq: tile_channels = {}: expected an even number in 2..64", o.tile_channels);
}

void check_energies(std::span<const double> s) {
  check(!s.empty(), "block-gtq: no RoPE block energies (head_dim must be >= 2)");
  for (size_t i = 0; i < s.size(); ++i)
    check(std::isfinite(s[i]) && s[i] >= 0.0, "block-gtq: energy of RoPE block {} is {}: expected finite and >= 0",
          i, s[i]);
}

// Group metadata beyond the tiles' code bits: the norm (+ the extension norm of a wide group).
int64_t group_fixed_bits(int w, const BlockGtqOptions& o) {
  return w > 0 ? o.norm_bits + (w > 4 ? o.wide_norm_bits : 0) : 0;
}

BlockAllocation finish(std::span<const double> s, std::vector<int> bits, const BlockGtqOptions& o) {
  BlockAllocation a;
  a.distortion = block_distortion(s, bits);
  a.groups = groups_from_bits(bits);
  for (const auto& g : a.groups) {
    if (g.bits == 0) continue;
    const int64_t m = 2 * (int64_t)g.blocks.size();
    a.code_bits += m * g.bits;
    a.norm_bits += o.norm_bits;
    a.pad_bits += block_group_cost((int)m, g.bits, o) - m * g.bits - o.norm_bits;
  }
  a.bits = std::move(bits);
  return a;
}

}  // namespace

int64_t block_group_cost(int channels, int bits, const BlockGtqOptions& o) {
  check_options(o);
  check(channels >= 1 && bits >= 0 && bits <= 8, "block-gtq: group of {} channels at {} bits: expected >= 1 "
        "channels and 0..8 bits", channels, bits);
  if (bits == 0) return 0;
  const int64_t t = o.tile_channels;
  return (int64_t)bits * t * ((channels + t - 1) / t) + group_fixed_bits(bits, o);
}

double BlockAllocation::effective_bits_per_element() const {
  return bits.empty() ? 0.0 : (double)stored_bits() / (double)(2 * bits.size());
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
  const int64_t min_bits = block_group_cost(d, opt.b_min, opt);
  const int64_t max_bits = block_group_cost(d, opt.b_max, opt);
  check(budget_bits >= min_bits,
        "block-gtq: budget of {} bits per head ({:.4g} bits/element at head_dim {}) is below the minimum {} bits "
        "({:.4g}/element: b_min = {} everywhere, one group with its {}-bit norm)",
        budget_bits, (double)budget_bits / d, d, min_bits, (double)min_bits / d, opt.b_min, opt.norm_bits);
  check(budget_bits <= max_bits,
        "block-gtq: budget of {} bits per head ({:.4g} bits/element at head_dim {}) exceeds the most b_max = {} can "
        "use: {} bits ({:.4g}/element, one group with its {}-bit norm)",
        budget_bits, (double)budget_bits / d, d, opt.b_max, max_bits, (double)max_bits / d, opt.norm_bits);

  // Costs in units of u bits: a tile of t channels at width w is w·t/u units,
  // a group's norm (+ wide norm) group_fixed_bits/u units.
  const int64_t u = std::gcd(std::gcd((int64_t)opt.tile_channels, (int64_t)opt.norm_bits), (int64_t)opt.wide_norm_bits);
  const int64_t R = budget_bits / u;
  const int T = opt.tile_channels / 2;  // blocks per tile
  const int W = opt.b_max + 1;
  std::vector<int> widths;  // allowed widths, ascending
  if (opt.b_min == 0) widths.push_back(0);
  for (int w = std::max(1, opt.b_min); w <= opt.b_max; ++w) widths.push_back(w);
  auto tile_units = [&](int w) { return (int64_t)w * opt.tile_channels / u; };
  auto start_units = [&](int w) { return w > 0 ? group_fixed_bits(w, opt) / u + tile_units(w) : 0; };

  std::vector<int> order(L);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return s[a] > s[b]; });

  // State (units spent r, current width w, run length mod T k) after each block.
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const size_t plane = (size_t)(R + 1) * W * T;
  std::vector<double> cur(plane, kInf), next(plane);
  std::vector<int16_t> parent((size_t)L * plane, -1);  // previous (width · T + k)
  auto at = [W, T](int64_t r, int w, int k) { return ((size_t)r * W + w) * T + k; };

  for (int w : widths) {
    const int64_t r = start_units(w);
    if (r <= R) cur[at(r, w, w > 0 ? 1 % T : 0)] = s[order[0]] * std::ldexp(1.0, -2 * w);
  }
  for (int j = 1; j < L; ++j) {
    std::fill(next.begin(), next.end(), kInf);
    const double sj = s[order[j]];
    int16_t* par = parent.data() + (size_t)j * plane;
    for (int64_t r = 0; r <= R; ++r)
      for (int pw : widths)
        for (int pk = 0; pk < T; ++pk) {
          const double v = cur[at(r, pw, pk)];
          if (v == kInf) continue;
          for (int w : widths) {
            if (w > pw) break;
            int64_t nr = r;
            int nk = 0;
            if (w == 0) {
              nk = 0;
            } else if (w == pw) {
              nr += pk == 0 ? tile_units(w) : 0;  // the run fills its tiles; a new one starts every T blocks
              nk = (pk + 1) % T;
            } else {
              nr += start_units(w);
              nk = 1 % T;
            }
            if (nr > R) continue;
            const double cand = v + sj * std::ldexp(1.0, -2 * w);
            const size_t i = at(nr, w, nk);
            if (cand < next[i]) {
              next[i] = cand;
              par[i] = (int16_t)(pw * T + pk);
            }
          }
        }
    std::swap(cur, next);
  }

  double best = kInf;
  int64_t br = -1;
  int bw = -1, bk = -1;
  for (int64_t r = 0; r <= R; ++r)
    for (int w : widths)
      for (int k = 0; k < T; ++k)
        if (cur[at(r, w, k)] < best) {
          best = cur[at(r, w, k)];
          br = r;
          bw = w;
          bk = k;
        }
  check(br >= 0, "block-gtq: internal error: no feasible allocation for budget {} bits", budget_bits);

  std::vector<int> bits(L);
  int64_t r = br;
  int w = bw, k = bk;
  for (int j = L - 1; j >= 0; --j) {
    bits[order[j]] = w;
    if (j == 0) break;
    const int16_t pp = parent[(size_t)j * plane + at(r, w, k)];
    const int pw = pp / T, pk = pp % T;
    if (w == 0) {
    } else if (w == pw) {
      r -= pk == 0 ? tile_units(w) : 0;
    } else {
      r -= start_units(w);
    }
    w = pw;
    k = pk;
  }
  BlockAllocation a = finish(s, std::move(bits), opt);
  check(a.stored_bits() <= budget_bits, "block-gtq: internal error: allocation stores {} bits, budget {}",
        a.stored_bits(), budget_bits);
  return a;
}

BlockAllocation allocate_block_uniform(std::span<const double> s, int64_t budget_bits, const BlockGtqOptions& opt) {
  check_options(opt);
  check_energies(s);
  const int L = (int)s.size(), d = 2 * L;
  const int64_t max_bits = block_group_cost(d, opt.b_max, opt);
  check(budget_bits <= max_bits,
        "uniform: budget of {} bits per head ({:.4g} bits/element at head_dim {}) exceeds the most b_max = {} can "
        "use: {} bits ({:.4g}/element, one group with its {}-bit norm)",
        budget_bits, (double)budget_bits / d, d, opt.b_max, max_bits, (double)max_bits / d, opt.norm_bits);
  int chosen = -1;
  for (int b = opt.b_min; b <= opt.b_max; ++b)
    if (block_group_cost(d, b, opt) <= budget_bits) chosen = b;
  check(chosen >= 0,
        "uniform: budget of {} bits per head ({:.4g} bits/element at head_dim {}) is below b_min = {} as one group "
        "({} bits)",
        budget_bits, (double)budget_bits / d, d, opt.b_min, block_group_cost(d, opt.b_min, opt));
  return finish(s, std::vector<int>(L, chosen), opt);
}

}  // namespace ratekv::alloc
