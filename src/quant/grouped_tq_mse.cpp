// Grouped TQ-MSE: one TQ-MSE encoder per channel group (Block-GTQ keys).
#include "ratekv/quant/grouped_tq_mse.h"

#include <vector>

#include "ratekv/common/error.h"

namespace ratekv::quant {

GroupedTQMSE::GroupedTQMSE(const GroupedTQMSEConfig& cfg) : cfg_(cfg) {
  check(cfg.dim >= 1, "grouped_tq_mse: dim {} is too small (expected ≥ 1)", cfg.dim);
  std::vector<int> owner(cfg.dim, -1);
  offsets_.push_back(0);
  for (size_t g = 0; g < cfg.groups.size(); ++g) {
    const auto& grp = cfg.groups[g];
    check(grp.channels.size() >= 2, "grouped_tq_mse: group {} has {} channel(s) (expected ≥ 2)", g,
          grp.channels.size());
    for (int c : grp.channels) {
      check(c >= 0 && c < cfg.dim, "grouped_tq_mse: group {} lists channel {} outside [0, {})", g, c, cfg.dim);
      check(owner[c] < 0, "grouped_tq_mse: channel {} is in group {} and group {}", c, owner[c], g);
      owner[c] = (int)g;
    }
    TQMSEConfig tc;
    tc.dim = (int)grp.channels.size();
    tc.bits = grp.bits;
    tc.seed = grp.seed;
    tc.rotation = cfg.rotation;
    tc.norm = cfg.norm;
    tc.norm_correction = cfg.norm_correction;
    codecs_.emplace_back(tc);
    offsets_.push_back(offsets_.back() + (grp.bits > 0 ? grp.channels.size() : 0));
  }
}

GroupedTQMSEConfig GroupedTQMSE::config_from_json(const nlohmann::json& j) {
  GroupedTQMSEConfig c;
  c.dim = detail::json_int(j, "dim", "grouped_tq_mse");
  check(j.contains("groups") && j.at("groups").is_array(), "grouped_tq_mse: description lacks array field 'groups'");
  for (const auto& g : j.at("groups")) {
    ChannelGroup cg;
    check(g.contains("channels") && g.at("channels").is_array(),
          "grouped_tq_mse: a group lacks array field 'channels': {}", g.dump());
    cg.channels = g.at("channels").get<std::vector<int>>();
    cg.bits = detail::json_int(g, "bits", "grouped_tq_mse group");
    cg.seed = detail::json_u64(g, "seed", "grouped_tq_mse group", 0);
    c.groups.push_back(std::move(cg));
  }
  if (j.contains("rotation")) c.rotation = rotation_kind_from_string(j.at("rotation").get<std::string>());
  if (j.contains("norm")) c.norm = norm_coding_from_string(j.at("norm").get<std::string>());
  if (j.contains("norm_correction")) c.norm_correction = j.at("norm_correction").get<bool>();
  return c;
}

nlohmann::json GroupedTQMSE::to_json() const {
  nlohmann::json groups = nlohmann::json::array();
  for (const auto& g : cfg_.groups) groups.push_back({{"channels", g.channels}, {"bits", g.bits}, {"seed", g.seed}});
  return {{"kind", "grouped_tq_mse"},        {"dim", cfg_.dim},
          {"rotation", to_string(cfg_.rotation)}, {"norm", to_string(cfg_.norm)},
          {"norm_correction", cfg_.norm_correction}, {"groups", groups}};
}

double GroupedTQMSE::code_bits_per_element() const {
  double bits = 0.0;
  for (const auto& g : cfg_.groups) bits += (double)g.channels.size() * g.bits;
  return bits / cfg_.dim;
}

double GroupedTQMSE::bits_per_element(int64_t T) const {
  check(T >= 1, "grouped_tq_mse: bits_per_element needs T ≥ 1, got {}", T);
  double bits = 0.0;
  for (const auto& g : cfg_.groups)
    if (g.bits > 0) bits += (double)g.channels.size() * g.bits + norm_bits(cfg_.norm);
  return bits / cfg_.dim;
}

void GroupedTQMSE::encode(const float* x, uint8_t* idx, float* norms) const {
  std::vector<float> sub;
  for (size_t g = 0; g < codecs_.size(); ++g) {
    norms[g] = 0.0f;
    if (cfg_.groups[g].bits == 0) continue;
    const auto& ch = cfg_.groups[g].channels;
    sub.resize(ch.size());
    for (size_t i = 0; i < ch.size(); ++i) sub[i] = x[ch[i]];
    norms[g] = codecs_[g].encode(sub.data(), idx + offsets_[g]);
  }
}

void GroupedTQMSE::decode(const uint8_t* idx, const float* norms, float* x) const {
  std::vector<float> sub;
  for (int i = 0; i < cfg_.dim; ++i) x[i] = 0.0f;
  for (size_t g = 0; g < codecs_.size(); ++g) {
    if (cfg_.groups[g].bits == 0) continue;
    const auto& ch = cfg_.groups[g].channels;
    sub.resize(ch.size());
    codecs_[g].decode(idx + offsets_[g], norms[g], sub.data());
    for (size_t i = 0; i < ch.size(); ++i) x[ch[i]] = sub[i];
  }
}

void GroupedTQMSE::fake_quant(const float* x, int64_t T, float* xhat) const {
  check(T >= 0, "grouped_tq_mse: fake_quant got T = {} rows", T);
  std::vector<uint8_t> idx(total_codes());
  std::vector<float> norms(codecs_.size());
  for (int64_t t = 0; t < T; ++t) {
    detail::check_finite(x + t * cfg_.dim, cfg_.dim, "grouped_tq_mse: input row");
    encode(x + t * cfg_.dim, idx.data(), norms.data());
    decode(idx.data(), norms.data(), xhat + t * cfg_.dim);
  }
}

}  // namespace ratekv::quant
