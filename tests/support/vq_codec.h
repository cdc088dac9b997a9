// tests/support/vq_codec.h — a hand-made vq codec (TaSQ/CQ kind) for cache,
// packed-format and CUDA tests.
#pragma once

#include <vector>

#include "ratekv/format/plan.h"

namespace ratekv_test {

/// A vq codec over d channels: groups of g channels taken in `perm` order
/// (perm: a permutation of 0..d−1), `bits` index bits per group, and the
/// shared fp16 scale over n_heads KV heads when `shared` (else no scale).
inline ratekv::Codec vq_codec(int d, int g, int bits, bool shared, int n_heads, const std::vector<int>& perm) {
  ratekv::Codec c;
  c.kind = ratekv::CodecKind::Vq;
  c.norm = shared ? ratekv::NormStorage::SharedFP16 : ratekv::NormStorage::None;
  c.scale_heads = shared ? n_heads : 0;
  c.group_size = g;
  for (int i = 0; i < d; i += g) {
    ratekv::CodecGroup cg;
    cg.bits = bits;
    cg.channels.assign(perm.begin() + i, perm.begin() + i + g);
    c.groups.push_back(cg);
  }
  return c;
}

}  // namespace ratekv_test
