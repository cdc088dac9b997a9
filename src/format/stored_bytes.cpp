// Stored bytes of a plan (ratekv/format/stored_bytes.h): the arithmetic of the
// packed scalar pages and the vq pages (docs/packed_format.md §4, §5, §7.3) and
// the non-paged codecs, written out from the specification (not from the
// LayerLayout / VqLayerLayout classes, which tests compare it with).
#include "ratekv/format/stored_bytes.h"

#include <algorithm>

#include "ratekv/common/error.h"
#include "ratekv/format/packed_format.h"
#include "ratekv/format/packed_vq_format.h"

namespace ratekv {

namespace {

constexpr int64_t P = packed::kPageTokens;  // tokens per page
constexpr int64_t kNormBytesPerPage = 2 * P;  // one fp16 per slot (PageNorms)

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

int64_t group_channels(const Codec& c, const CodecGroup& g) {
  return c.kind == CodecKind::TqMseGrouped ? 2 * (int64_t)g.blocks.size() : (int64_t)g.channels.size();
}

}  // namespace

double StoredBytes::per_token() const { return (double)total() / (double)P; }

StoredBytes& StoredBytes::operator+=(const StoredBytes& o) {
  codes += o.codes;
  padding += o.padding;
  norms += o.norms;
  scales += o.scales;
  fp16 += o.fp16;
  return *this;
}

int64_t scalar_group_stored_bits(int channels, int bits) {
  check(channels >= 1, "stored bytes: a TQ-MSE group of {} channels (expected ≥ 1)", channels);
  check(bits >= 0 && bits <= 8, "stored bytes: a TQ-MSE group at {} bits (expected 0..8)", bits);
  if (bits == 0) return 0;
  const int64_t m_pad = round_up(channels, packed::kTileChannels);
  return m_pad * bits + 16 + (bits > packed::kMaxBits ? 16 : 0);
}

StoredBytes codec_stored_bytes(const Codec& c, int d) {
  check(d >= 2, "stored bytes: head_dim {} (expected ≥ 2)", d);
  StoredBytes b;
  switch (c.kind) {
    case CodecKind::FP16:
      b.fp16 = P * 2 * d;
      break;
    case CodecKind::TqMse:
    case CodecKind::TqMseGrouped:
      // Norms as the codec says (the caches serve only "fp16"; a plan may name "none").
      for (const CodecGroup& g : c.groups) {
        const int64_t m = group_channels(c, g);
        if (g.bits == 0 || m == 0) continue;
        check(g.bits >= 1 && g.bits <= 8, "stored bytes: kind {} group at {} bits (expected 0..8)",
              codec_kind_name(c.kind), g.bits);
        const int64_t m_pad = round_up(m, packed::kTileChannels);
        b.codes += P * m * g.bits / 8;
        b.padding += P * (m_pad - m) * g.bits / 8;
        if (c.norm == NormStorage::FP16) b.norms += kNormBytesPerPage;
        if (g.bits > packed::kMaxBits) b.padding += kNormBytesPerPage;  // extension pages' norm array, unused
      }
      break;
    case CodecKind::Kivi:
    case CodecKind::QuaRot: {
      check(c.groups.size() == 1 && c.group_size >= 1 && d % c.group_size == 0,
            "stored bytes: kind {} needs one group and a group_size dividing head_dim {} (got {})",
            codec_kind_name(c.kind), d, c.group_size);
      b.codes = P * d * c.groups[0].bits / 8;
      b.scales = P * (d / c.group_size) * 4;  // fp16 scale + fp16 zero per group of group_size elements
      break;
    }
    case CodecKind::Q8_0:
    case CodecKind::Q4_0:
      check(d % 32 == 0, "stored bytes: kind {} needs head_dim divisible by 32 (head_dim {})",
            codec_kind_name(c.kind), d);
      b.codes = P * d * (c.kind == CodecKind::Q8_0 ? 8 : 4) / 8;
      b.scales = P * (d / 32) * 2;  // one fp16 scale per block of 32
      break;
    case CodecKind::Vq: {
      check(!c.groups.empty(), "stored bytes: kind vq without groups");
      int64_t index_bits = 0;
      for (const CodecGroup& g : c.groups) index_bits += g.bits;
      const int64_t seg = P * index_bits;  // bits per page
      check(seg % 8 == 0, "stored bytes: internal: vq segment of {} bits", seg);
      b.codes = seg / 8;
      b.padding = round_up(seg / 8, (int64_t)packed::kVqAlign) - seg / 8;
      break;  // the shared scale: per layer side (layer_side_stored_bytes)
    }
  }
  return b;
}

double codec_stored_bits(const Codec& c, int d) {
  double bits = (double)codec_stored_bytes(c, d).total() * 8.0 / (double)P;
  if (c.kind == CodecKind::Vq && c.norm == NormStorage::SharedFP16) {
    check(c.scale_heads >= 1, "stored bytes: vq codec with a shared scale over {} heads", c.scale_heads);
    bits += 16.0 / c.scale_heads;
  }
  return bits;
}

StoredBytes layer_side_stored_bytes(const Plan& p, int layer, bool key) {
  check(layer >= 0 && layer < (int)p.layers.size(), "stored bytes: layer {} outside [0, {})", layer,
        p.layers.size());
  StoredBytes b;
  bool shared = false;
  for (const HeadPlan& hp : p.layers[(size_t)layer]) {
    const Codec& c = key ? hp.key : hp.value;
    b += codec_stored_bytes(c, p.model.head_dim);
    shared = shared || (c.kind == CodecKind::Vq && c.norm == NormStorage::SharedFP16);
  }
  if (shared) b.scales += kNormBytesPerPage;  // one fp16 per token per layer side, all KV heads
  return b;
}

double PlanStoredBytes::k_bits_per_element() const {
  return elements > 0 ? (double)k.total() * 8.0 / ((double)P * (double)elements) : 0.0;
}
double PlanStoredBytes::v_bits_per_element() const {
  return elements > 0 ? (double)v.total() * 8.0 / ((double)P * (double)elements) : 0.0;
}

nlohmann::json PlanStoredBytes::to_json() const {
  auto parts = [](const StoredBytes& b) {
    return nlohmann::json{{"codes", b.codes / 64.0}, {"padding", b.padding / 64.0}, {"norms", b.norms / 64.0},
                          {"scales", b.scales / 64.0}, {"fp16", b.fp16 / 64.0}};
  };
  return {{"bytes_per_token", bytes_per_token()},
          {"k_bytes_per_token", k.per_token()},
          {"v_bytes_per_token", v.per_token()},
          {"k_bits_per_element", k_bits_per_element()},
          {"v_bits_per_element", v_bits_per_element()},
          {"k", parts(k)},
          {"v", parts(v)},
          {"per_sequence_max_bytes", per_sequence_max},
          {"fixed_bytes", fixed_bytes}};
}

int64_t plan_codebook_bytes(const Plan& p) {
  int64_t b = 0;
  for (const auto& layer : p.layers)
    for (const HeadPlan& hp : layer)
      for (const Codec* c : {&hp.key, &hp.value})
        if (c->kind == CodecKind::Vq && !c->groups.empty())
          b += (int64_t)c->groups.size() * (int64_t{1} << c->groups[0].bits) * c->group_size * 2;
  return b;
}

int64_t plan_offset_bytes(const Plan& p) {
  int64_t b = 0;
  for (const auto& layer : p.layers)
    for (const HeadPlan& hp : layer)
      for (const Codec* c : {&hp.key, &hp.value}) b += 2 * (int64_t)c->offset.size();
  return b;
}

int64_t plan_fixed_bytes(const Plan& p) { return plan_codebook_bytes(p) + plan_offset_bytes(p); }

PlanStoredBytes plan_stored_bytes(const Plan& p) {
  PlanStoredBytes s;
  const int d = p.model.head_dim;
  s.elements = (int64_t)p.model.n_layers * p.model.n_kv_heads * d;
  for (int l = 0; l < (int)p.layers.size(); ++l) {
    s.k += layer_side_stored_bytes(p, l, true);
    s.v += layer_side_stored_bytes(p, l, false);
    for (const HeadPlan& hp : p.layers[(size_t)l])
      if (hp.key.kind == CodecKind::Kivi) s.per_sequence_max += (int64_t)(hp.key.group_size - 1) * 2 * d;
  }
  s.fixed_bytes = plan_fixed_bytes(p);
  return s;
}

double plan_stored_bytes_at(const Plan& p, int64_t n, int sink, int window) {
  check(n >= 0, "stored bytes: {} tokens (expected ≥ 0)", n);
  const int64_t S = sink >= 0 ? sink : p.sink_tokens, W = window >= 0 ? window : p.fp16_window;
  check(S >= 0 && W >= 0, "stored bytes: sink {} / window {} (expected ≥ 0)", S, W);
  const int d = p.model.head_dim, H = p.model.n_kv_heads;
  const int64_t nq = std::max<int64_t>(0, n - S - W);  // quantized region [S, n − W)
  const int64_t rows16 = n - nq;                       // sink + window rows, fp16
  const int64_t pages = (nq + P - 1) / P;
  double bytes = 0.0;
  for (int l = 0; l < (int)p.layers.size(); ++l)
    for (int side = 0; side < 2; ++side) {
      bytes += (double)rows16 * H * 2 * d;
      const bool key = side == 0;
      // Paged kinds of this layer side: the side's page bytes (shared scale included) × pages.
      StoredBytes paged;
      bool any_paged = false, shared = false;
      for (const HeadPlan& hp : p.layers[(size_t)l]) {
        const Codec& c = key ? hp.key : hp.value;
        switch (c.kind) {
          case CodecKind::FP16:
          case CodecKind::TqMse:
          case CodecKind::TqMseGrouped:
          case CodecKind::Vq:
            paged += codec_stored_bytes(c, d);
            any_paged = true;
            shared = shared || (c.kind == CodecKind::Vq && c.norm == NormStorage::SharedFP16);
            break;
          case CodecKind::Kivi:
            if (key) {  // token groups of group_size rows; the unfilled group's rows are fp16
              const int64_t g = c.group_size, full = nq / g * g;
              bytes += (double)(full * d * c.groups[0].bits + full / g * d * 32 + (nq - full) * d * 16) / 8.0;
              break;
            }
            [[fallthrough]];
          case CodecKind::QuaRot:
          case CodecKind::Q8_0:
          case CodecKind::Q4_0:
            bytes += (double)(nq * codec_stored_bytes(c, d).total()) / (double)P;
            break;
        }
      }
      if (shared) paged.scales += kNormBytesPerPage;
      if (any_paged) bytes += (double)(pages * paged.total());
    }
  return bytes;
}

}  // namespace ratekv
