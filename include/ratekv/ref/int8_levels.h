// ratekv/ref/int8_levels.h — the int8 key and value codebooks of the integer
// CUDA decode kernels (cuda::PackedDecodeVariant::specialized, include/ratekv/
// cuda/decode_attention.h): what their integer Q·Kᵀ and P·V products use
// instead of fp16 levels, one codebook per group.
// cuda::PackedPlan builds its register codebooks with it; the CPU reference
// (ref::packed_decode_attention, PackedRounding::int8_levels) decodes with it.
#pragma once

#include <span>
#include <vector>

namespace ratekv::ref {

/// A key or value codebook as the integer kernels use it: level L_i -> s·round(L_i/s),
/// |round(L_i/s)| ≤ 127, one fp32 scale s per codebook (written to *scale when
/// non-null), chosen among s₀·(1 + j/512), j = 0..64, s₀ = max|L|/127 (so in
/// [s₀, 1.125·s₀]) to minimise Σ_i (L_i − s·round(L_i/s))² (ties: the
/// smallest). Error per level ≤ s/2 (≈ 0.4 % of max|L|). All-zero levels take
/// s = 1. Throws Error unless 2..16 finite levels.
std::vector<float> int8_levels(std::span<const float> levels, float* scale = nullptr);

}  // namespace ratekv::ref
