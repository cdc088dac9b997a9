// gradient_sensitivity(): mean squared K/V gradients over calibration sequences.
#include "ratekv/calib/sensitivity.h"

#include "ratekv/common/error.h"
#include "ratekv/common/param_error.h"
#include "ratekv/common/log.h"
#include "ratekv/model/backward.h"

namespace ratekv::calib {

GradSensitivity gradient_sensitivity(const Model& model, std::span<const int32_t> tokens, int64_t n_sequences,
                                     int64_t seq_len) {
  check_param(n_sequences >= 1, "gradient_sensitivity.n_sequences", "{}: expected ≥ 1", n_sequences);
  check_param(seq_len >= 2, "gradient_sensitivity.seq_len", "{}: expected ≥ 2 (the loss needs a next token)",
              seq_len);
  check_param(seq_len <= model.position_limit(), "gradient_sensitivity.seq_len",
              "{}: exceeds the model's position limit {}", seq_len, model.position_limit());
  check(n_sequences <= static_cast<int64_t>(tokens.size()) / seq_len,
        "sensitivity: {} sequences of {} tokens need {} tokens, the text gave {}", n_sequences, seq_len,
        n_sequences * seq_len, tokens.size());
  const ModelConfig& c = model.config();
  const ModelBackward<float> bw(model);
  const int Hkv = c.n_kv_heads, d = c.head_dim;
  const int64_t per_layer = int64_t{Hkv} * d, T = seq_len;
  GradSensitivity s;
  s.n_sequences = n_sequences;
  s.seq_len = seq_len;
  s.k_pre_sq.assign(c.n_layers * per_layer, 0.0);
  s.k_post_sq.assign(c.n_layers * per_layer, 0.0);
  s.v_sq.assign(c.n_layers * per_layer, 0.0);
  // Sum over tokens of squares, in double, per (layer, head, channel).
  auto add_sq = [&](const std::vector<float>& g, double* acc) {
    for (int64_t t = 0; t < T; ++t) {
      const float* r = g.data() + t * per_layer;
      for (int64_t i = 0; i < per_layer; ++i) acc[i] += double{r[i]} * r[i];
    }
  };
  double loss_sum = 0;
  Progress prog("calibrate: sensitivity (sequences)", n_sequences);
  for (int64_t q = 0; q < n_sequences; ++q) {
    loss_sum += bw.backward(tokens.subspan(q * T, T), [&](const LayerKVGrad<float>& g) {
      const int64_t off = g.layer * per_layer;
      add_sq(g.dk_pre, s.k_pre_sq.data() + off);
      add_sq(g.dk_post, s.k_post_sq.data() + off);
      add_sq(g.dv, s.v_sq.data() + off);
    });
    prog.update(q + 1);
  }
  prog.finish();
  const double inv = 1.0 / static_cast<double>(n_sequences * T);
  for (auto* v : {&s.k_pre_sq, &s.k_post_sq, &s.v_sq}) {
    for (double& x : *v) x *= inv;
  }
  s.mean_loss = loss_sum / static_cast<double>(n_sequences);
  return s;
}

}  // namespace ratekv::calib
