// tests/support/vq_plans.h — vq (TaSQ / CQ) plans for the vq decode kernel's
// tests (tests/cuda) and its named CPU reference's (tests/ref): a one-layer
// model config, hand-made vq codecs with random codebooks, and the tables the
// GPU plan and ref::VqPlan take (codewords C̃, channel lists) from the CPU codecs.
#pragma once

#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "ratekv/cache/plan_codecs.h"
#include "ratekv/model/model.h"
#include "tiny_model.h"
#include "vq_codec.h"

namespace ratekv_test {

/// How the values of a vq test plan are stored.
enum class VqValues { vq, fp16, tq_mse };

/// One layer, n_kv_heads · gqa query heads (llama / interleaved or qwen2 / NeoX).
inline ratekv::ModelConfig vq_config(int head_dim, int n_kv_heads, int gqa, ratekv::RopeLayout rope) {
  return tiny_config({.n_layers = 1,
                      .n_heads = n_kv_heads * gqa,
                      .n_kv_heads = n_kv_heads,
                      .head_dim = head_dim,
                      .n_ctx = 1 << 20,
                      .rope_theta = rope == ratekv::RopeLayout::NeoX ? 1e6 : 5e5},
                     rope);
}

/// TaSQ-style keys (group g, 2^kbits centroids, shared fp16 scale, channel
/// weights, RoPE pairs kept together in a shuffled order); values CQ (g 8,
/// 2^vbits, no scale), fp16, or scalar TQ-MSE at vbits. Codebooks random (seeded);
/// with dup_every = n > 1, key codeword j equals codeword j − 1 whenever j mod n = 1
/// (exact distance ties: the encoders must pick the lower index).
inline std::shared_ptr<const ratekv::cache::PlanCodecs> vq_codecs(const ratekv::ModelConfig& cfg, int g, int kbits,
                                                                  int vbits, VqValues vals, uint32_t seed,
                                                                  int dup_every = 0) {
  using namespace ratekv;
  const int d = cfg.head_dim, H = cfg.n_kv_heads;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.3f, 2.0f);
  Plan p;
  p.method = "tasq";
  static_cast<PlanTarget&>(p.model) = cache::plan_target(cfg);
  p.tensors_file = "in-memory.safetensors";
  p.layers.assign(1, std::vector<HeadPlan>(H));
  const auto pairs = rope_pairs(cfg.rope_layout, d);
  std::vector<int> order(d / 2);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int> perm;
  for (int b : order) perm.insert(perm.end(), {pairs[b][0], pairs[b][1]});
  std::vector<int> id(d);
  std::iota(id.begin(), id.end(), 0);
  for (int h = 0; h < H; ++h) {
    p.layers[0][h].key = vq_codec(d, g, kbits, true, H, perm);
    p.layers[0][h].value = vals == VqValues::vq     ? vq_codec(d, 8, vbits, false, H, id)
                           : vals == VqValues::fp16 ? Codec::fp16()
                                                    : Codec::tq_mse(vbits, d, seed + 17 * h);
  }
  VqTensors t = VqTensors::for_plan(p);
  for (int h = 0; h < H; ++h) {
    auto& k = t.at(0, h, 0);
    k.present = true;
    k.codebooks.resize(static_cast<size_t>(d / g) * (size_t{1} << kbits) * g);
    for (float& x : k.codebooks) x = nd(rng);
    if (dup_every > 1)
      for (size_t j = 1; j < k.codebooks.size() / g; ++j)
        if (j % (size_t)dup_every == 1 && j % (size_t{1} << kbits) != 0)
          std::copy_n(k.codebooks.begin() + (j - 1) * g, g, k.codebooks.begin() + j * g);
    k.channel_scale.resize(d);
    for (float& x : k.channel_scale) x = ud(rng);
    if (vals == VqValues::vq) {
      auto& v = t.at(0, h, 1);
      v.present = true;
      v.codebooks.resize(static_cast<size_t>(d / 8) * (size_t{1} << vbits) * 8);
      for (float& x : v.codebooks) x = 1.5f * nd(rng);
    }
  }
  return std::make_shared<const cache::PlanCodecs>(p, cfg, "vq-plan", std::make_shared<const VqTensors>(std::move(t)));
}

/// The vq tables of layer 0 in the GPU plan's order (cuda::VqPlan,
/// ref::VqPlan): reconstruction codewords C̃ (one decode per one-hot index:
/// x̂ = 1 · C̃[z] on the group's channels) and the channel lists.
struct VqTables {
  std::vector<float> codewords;
  std::vector<int32_t> channels;
};
inline VqTables vq_tables(const ratekv::cache::PlanCodecs& codecs) {
  using namespace ratekv;
  VqTables T;
  const int d = codecs.config().head_dim;
  for (int h = 0; h < codecs.config().n_kv_heads; ++h)
    for (int s = 0; s < 2; ++s) {
      const cache::VqCodec* c = codecs.vq(0, h, s == 0 ? cache::KVSide::key : cache::KVSide::value);
      if (!c) continue;
      const int G = c->n_groups(), K = c->n_centroids(), g = c->group_size();
      std::vector<int32_t> z(G, 0);
      std::vector<float> xhat(d);
      for (int gi = 0; gi < G; ++gi) {
        for (int j = 0; j < K; ++j) {
          z[gi] = j;
          c->decode(z.data(), 1.0f, xhat.data());
          for (int i = 0; i < g; ++i) T.codewords.push_back(xhat[c->group_channels(gi)[i]]);
        }
        z[gi] = 0;
        for (int i = 0; i < g; ++i) T.channels.push_back(c->group_channels(gi)[i]);
      }
    }
  return T;
}

/// The encoder tables of layer `layer` in cuda::VqEncodePlan's order: per
/// (KV head, side) whose codec is vq, the codebooks C (weighted space), the
/// channel weights a and the channel lists.
struct VqEncodeTables {
  std::vector<float> codebooks, channel_scale;
  std::vector<int32_t> channels;
};
inline VqEncodeTables vq_encode_tables(const ratekv::cache::PlanCodecs& codecs, int layer = 0) {
  using namespace ratekv;
  VqEncodeTables T;
  for (int h = 0; h < codecs.config().n_kv_heads; ++h)
    for (int s = 0; s < 2; ++s) {
      const cache::VqCodec* c = codecs.vq(layer, h, s == 0 ? cache::KVSide::key : cache::KVSide::value);
      if (!c) continue;
      T.codebooks.insert(T.codebooks.end(), c->codebooks().begin(), c->codebooks().end());
      T.channel_scale.insert(T.channel_scale.end(), c->channel_scale().begin(), c->channel_scale().end());
      for (int gi = 0; gi < c->n_groups(); ++gi)
        T.channels.insert(T.channels.end(), c->group_channels(gi).begin(), c->group_channels(gi).end());
    }
  return T;
}

}  // namespace ratekv_test
