// ratekv/cache/vq_page_codec.h — the scalar reference encoder / decoder of
// the vq pages (ratekv/format/packed_vq_format.h, docs/packed_format.md §7):
// VqCodec's math applied to one token slot of a page through the format's
// bit-level writer and reader. The packed cache encodes with these; the CUDA
// vq kernels are tested against them.
#pragma once

#include <cstdint>
#include <span>

#include "ratekv/cache/vq_codec.h"
#include "ratekv/format/packed_vq_format.h"

namespace ratekv::cache {

using packed::Side;
using packed::VqLayerLayout;

/// The shared fp16 scale s_t of one token of a vq layer side: x (H, head_dim)
/// (keys pre-RoPE), heads[h] the codec of KV head h (vq_shared_scale of
/// Σ_h weighted_sq_sum); 1 when the codecs have no shared scale. Throws Error
/// when the scale overflows fp16 (as the fake-quant cache does).
float vq_token_scale(std::span<const VqCodec* const> heads, const float* x);

/// Encodes one token of a vq layer side into slot `slot` of `page`: indices
/// z_{h,gi} = heads[h]->encode(x_h, s) (argmin, ties → lowest index: the same
/// indices as vq_fake_quant_layer) and, with a shared scale, fp16(s).
/// x (H, head_dim); s from vq_token_scale. Throws Error on a layout/codec
/// mismatch (head count, head_dim, G, bits, scale kind).
void encode_vq_token(const VqLayerLayout& L, std::span<uint8_t> page, Side side, int slot,
                     std::span<const VqCodec* const> heads, const float* x, float s);

/// Decodes slot `slot` of a vq side: xhat (H, head_dim) = s · C̃[z] per head
/// (pre-RoPE for keys). Equals vq_fake_quant_layer's output bit for bit.
void decode_vq_token(const VqLayerLayout& L, std::span<const uint8_t> page, Side side, int slot,
                     std::span<const VqCodec* const> heads, float* xhat);

}  // namespace ratekv::cache
