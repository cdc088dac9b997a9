// The scalar reference encoder / decoder of the vq pages
// (ratekv/cache/vq_page_codec.h): one token slot at a time, bit by bit through
// the format's writer and reader.
#include "ratekv/cache/vq_page_codec.h"

#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"

namespace ratekv::cache {

using packed::kPageTokens;
using packed::VqSideKind;
using packed::VqSideSpec;

namespace {

const char* side_name(Side s) { return s == Side::key ? "key" : "value"; }

void check_kind(const VqLayerLayout& L, Side s, VqSideKind want, const char* what) {
  check(L.side(s).kind == want, "packed vq format: {} side is not {}", side_name(s), what);
}

void check_heads(const VqLayerLayout& L, Side s, std::span<const VqCodec* const> heads) {
  const VqSideSpec& sp = L.side(s);
  check(static_cast<int>(heads.size()) == L.n_kv_heads(), "packed vq format: {} codecs for {} KV heads",
        heads.size(), L.n_kv_heads());
  for (size_t h = 0; h < heads.size(); ++h) {
    const VqCodec* c = heads[h];
    check(c != nullptr && c->head_dim() == L.head_dim() && c->n_groups() == sp.n_groups &&
              c->n_centroids() == (1 << sp.bits) && c->shared_scale() == sp.shared_scale,
          "packed vq format: KV head {} {} codec does not match the layout (head_dim {}, {} groups, {} bits, "
          "shared scale {})",
          h, side_name(s), L.head_dim(), sp.n_groups, sp.bits, sp.shared_scale);
  }
}

}  // namespace

float vq_token_scale(std::span<const VqCodec* const> heads, const float* x) {
  check(!heads.empty() && heads[0] != nullptr, "vq_token_scale: no codecs");
  if (!heads[0]->shared_scale()) return 1.0f;
  const int d = heads[0]->head_dim(), H = static_cast<int>(heads.size());
  double acc = 0.0;  // same order as vq_fake_quant_layer: heads 0..H−1
  for (int h = 0; h < H; ++h) acc += heads[h]->weighted_sq_sum(x + static_cast<size_t>(h) * d);
  return vq_shared_scale(acc, H, d);
}

void encode_vq_token(const VqLayerLayout& L, std::span<uint8_t> page, Side side, int slot,
                     std::span<const VqCodec* const> heads, const float* x, float s) {
  check_kind(L, side, VqSideKind::vq, "vq");
  check_heads(L, side, heads);
  const VqSideSpec& sp = L.side(side);
  const int d = L.head_dim();
  int32_t z[1024];  // G ≤ head_dim; heads wider than 1024 groups are not a model we know
  check(sp.n_groups <= 1024, "encode_vq_token: {} groups (at most 1024)", sp.n_groups);
  for (int h = 0; h < L.n_kv_heads(); ++h) {
    heads[h]->encode(x + static_cast<size_t>(h) * d, s, z);
    write_vq_indices(L, page, h, side, slot, std::span<const int32_t>(z, sp.n_groups));
  }
  if (sp.shared_scale) write_vq_scale(L, page, side, slot, fp32_to_fp16(s));
}

void decode_vq_token(const VqLayerLayout& L, std::span<const uint8_t> page, Side side, int slot,
                     std::span<const VqCodec* const> heads, float* xhat) {
  check_kind(L, side, VqSideKind::vq, "vq");
  check_heads(L, side, heads);
  const VqSideSpec& sp = L.side(side);
  const int d = L.head_dim();
  int32_t z[1024];
  check(sp.n_groups <= 1024, "decode_vq_token: {} groups (at most 1024)", sp.n_groups);
  const float s = sp.shared_scale ? fp16_to_fp32(read_vq_scale(L, page, side, slot)) : 1.0f;
  for (int h = 0; h < L.n_kv_heads(); ++h) {
    read_vq_indices(L, page, h, side, slot, std::span<int32_t>(z, sp.n_groups));
    heads[h]->decode(z, s, xhat + static_cast<size_t>(h) * d);
  }
}

}  // namespace ratekv::cache
