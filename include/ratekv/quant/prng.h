// ratekv/quant/prng.h — the portable seeded random streams behind every
// rotation, sketch and random test vector.
//
// std::mt19937 is portable but std::normal_distribution is not (libstdc++ and
// libc++ draw differently), so codes would differ between machines. ratekv
// defines its own streams:
//   * SplitMix64 (Steele, Lea, Flood 2014): state += 0x9e3779b97f4a7c15, then
//     the 64-bit finalizer; uniform doubles take the top 53 bits.
//   * Gaussians by Box–Muller: u1 ∈ (0,1], u2 ∈ [0,1); r = sqrt(-2 ln u1);
//     the pair (r cos 2πu2, r sin 2πu2) is returned in that order.
// The only platform dependence left is libm's log/cos/sin in the last ulp.
#pragma once

#include <cmath>
#include <cstdint>

namespace ratekv::quant {

/// SplitMix64 generator; the sequence is a pure function of the seed.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  /// Next 64 random bits.
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// Uniform double in [0, 1), 53-bit resolution.
  double uniform() { return (double)(next() >> 11) * 0x1.0p-53; }
  /// Uniform double in (0, 1].
  double uniform_open0() { return (double)((next() >> 11) + 1) * 0x1.0p-53; }
  /// Standard normal N(0,1) by Box–Muller (caches the second value of a pair).
  double gaussian() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = uniform_open0(), u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double a = 6.283185307179586476925 * u2;
    spare_ = r * std::sin(a);
    has_spare_ = true;
    return r * std::cos(a);
  }
  /// Random sign: +1 or -1 with probability 1/2 each (top bit of next()).
  float sign() { return (next() >> 63) ? -1.0f : 1.0f; }

 private:
  uint64_t state_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

/// Derives an independent seed for a sub-stream (e.g. (layer, head, group) or
/// "the QJL sketch of this codec") from a parent seed and a tag.
inline uint64_t mix_seed(uint64_t seed, uint64_t tag) {
  SplitMix64 g(seed ^ (tag * 0xd1b54a32d192ed03ull));
  g.next();
  return g.next();
}

}  // namespace ratekv::quant
