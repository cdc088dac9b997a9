// DistortionAccumulator: per-component MSE of each plan codec on captured
// K/V, then the shared-β fit; measure_distortion_curves() feeds it from the
// model runtime (eval/distortion_measure.h).
#include "ratekv/eval/distortion_measure.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <set>

#include "ratekv/alloc/make_plan.h"
#include "ratekv/cache/fake_quant_cache.h"
#include "ratekv/cache/plan_codecs.h"
#include "ratekv/common/error.h"
#include "ratekv/common/param_error.h"
#include "ratekv/common/log.h"

namespace ratekv::eval {

namespace {

Plan plan_at(const CalibStats& st, const std::string& q, int b, const CurveMeasureOptions& opt) {
  alloc::PlanRequest rq;
  rq.budget_unit = "code";
  rq.k_bits = rq.v_bits = b;
  rq.seed = opt.seed;
  rq.group_size = opt.group_size;
  if (q == "block-gtq") {
    rq.method = "block-gtq";
    rq.b_min = 0;
    rq.b_max = 8;
  } else {
    rq.method = "uniform";
    rq.quantizer = q;
  }
  return alloc::make_plan(st, rq);
}

}  // namespace

struct DistortionAccumulator::Impl {
  ModelConfig cfg;
  CurveMeasureOptions opt;
  std::vector<int> bits;  // ascending
  // Codecs per (quantizer, width), index q·B + j.
  std::vector<std::unique_ptr<cache::PlanCodecs>> codecs;
  // sq[c][side][l·H + h]: Σ‖x − x̂‖² in double.
  std::vector<std::array<std::vector<double>, 2>> sq;
  std::vector<int64_t> tokens;  // per layer
};

void validate_curve_options(const CurveMeasureOptions& opt) {
  check_param(!opt.quantizers.empty(), "CurveMeasureOptions.quantizers", ": none given");
  {
    std::set<std::string> seen;
    for (const auto& q : opt.quantizers) {
      check_param(q == "kivi" || q == "quarot" || q == "tq-mse" || q == "block-gtq", "CurveMeasureOptions.quantizers",
                  "\"{}\": expected kivi, quarot, tq-mse or block-gtq", q);
      check_param(seen.insert(q).second, "CurveMeasureOptions.quantizers", ": \"{}\" given twice", q);
    }
  }
  std::vector<int> bits = opt.bits;
  std::sort(bits.begin(), bits.end());
  check_param(std::unique(bits.begin(), bits.end()) == bits.end(), "CurveMeasureOptions.bits",
              ": widths must be distinct");
  check_param(bits.size() >= 2, "CurveMeasureOptions.bits", ": need at least two widths, got {}", bits.size());
  check_param(bits.front() >= 1 && bits.back() <= 8, "CurveMeasureOptions.bits",
              ": widths must be in 1..8 (got {}..{})", bits.front(), bits.back());
}

DistortionAccumulator::DistortionAccumulator(const ModelConfig& cfg, const CalibStats& st,
                                             const CurveMeasureOptions& opt)
    : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.cfg = cfg;
  I.opt = opt;
  validate_curve_options(opt);
  I.bits = opt.bits;
  std::sort(I.bits.begin(), I.bits.end());
  check(st.model.n_layers == cfg.n_layers && st.model.n_kv_heads == cfg.n_kv_heads &&
            st.model.head_dim == cfg.head_dim,
        "distortion curves: statistics are for {} layers × {} KV heads × head_dim {}, the model has {} × {} × {}",
        st.model.n_layers, st.model.n_kv_heads, st.model.head_dim, cfg.n_layers, cfg.n_kv_heads, cfg.head_dim);
  for (const auto& q : opt.quantizers)
    for (int b : I.bits) I.codecs.push_back(std::make_unique<cache::PlanCodecs>(plan_at(st, q, b, opt), cfg, q));
  const size_t n = static_cast<size_t>(cfg.n_layers) * cfg.n_kv_heads;
  I.sq.resize(I.codecs.size());
  for (auto& s : I.sq) s = {std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
  I.tokens.assign(static_cast<size_t>(cfg.n_layers), 0);
}

DistortionAccumulator::~DistortionAccumulator() = default;
DistortionAccumulator::DistortionAccumulator(DistortionAccumulator&&) noexcept = default;
DistortionAccumulator& DistortionAccumulator::operator=(DistortionAccumulator&&) noexcept = default;

void DistortionAccumulator::add(int layer, const float* k_post, const float* v, int64_t T) {
  Impl& I = *impl_;
  const int H = I.cfg.n_kv_heads, d = I.cfg.head_dim;
  check(layer >= 0 && layer < I.cfg.n_layers, "distortion curves: layer {} outside 0..{}", layer,
        I.cfg.n_layers - 1);
  check(T >= 1, "distortion curves: layer {}: a chunk of {} tokens", layer, T);
  const int64_t row = int64_t{H} * d;
  for (int side = 0; side < 2; ++side) {
    const float* x = side == 0 ? k_post : v;
    for (int64_t i = 0; i < T * row; ++i)
      check(std::isfinite(x[i]), "distortion curves: layer {}: {} element {} is {} (activations must be finite)",
            layer, side == 0 ? "key" : "value", i, x[i]);
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < static_cast<int64_t>(I.codecs.size()) * 2; ++task) {
    const size_t c = static_cast<size_t>(task / 2);
    const int side = static_cast<int>(task % 2);
    const float* x = side == 0 ? k_post : v;
    std::vector<float> xhat(static_cast<size_t>(T * row));
    cache::fake_quant_sequence(*I.codecs[c], layer, side == 0 ? cache::KVSide::key : cache::KVSide::value, x,
                               nullptr, nullptr, T, 0, 0, xhat.data());
    for (int h = 0; h < H; ++h) {
      double s = 0.0;
      for (int64_t t = 0; t < T; ++t)
        for (int i = 0; i < d; ++i) {
          const double e = static_cast<double>(x[t * row + h * d + i]) - xhat[t * row + h * d + i];
          s += e * e;
        }
      I.sq[c][side][static_cast<size_t>(layer) * H + h] += s;
    }
  }
  I.tokens[static_cast<size_t>(layer)] += T;
}

int64_t DistortionAccumulator::tokens(int layer) const {
  check(layer >= 0 && layer < impl_->cfg.n_layers, "distortion curves: layer {} outside 0..{}", layer,
        impl_->cfg.n_layers - 1);
  return impl_->tokens[static_cast<size_t>(layer)];
}

std::map<std::string, calib::QuantizerCurves> DistortionAccumulator::finish() const {
  const Impl& I = *impl_;
  const int64_t N = I.tokens[0];
  check(N > 0, "distortion curves: no activations were added");
  for (int l = 1; l < I.cfg.n_layers; ++l)
    check(I.tokens[static_cast<size_t>(l)] == N,
          "distortion curves: layer {} received {} tokens, layer 0 {} (every layer needs the same tokens)", l,
          I.tokens[static_cast<size_t>(l)], N);
  const int H = I.cfg.n_kv_heads, d = I.cfg.head_dim;
  const size_t Q = I.opt.quantizers.size(), B = I.bits.size(), n = static_cast<size_t>(I.cfg.n_layers) * H;
  std::map<std::string, calib::QuantizerCurves> out;
  const double denom = static_cast<double>(N) * d;
  for (size_t q = 0; q < Q; ++q) {
    calib::QuantizerCurves qc;
    qc.bits.assign(I.bits.begin(), I.bits.end());
    qc.mse_k.resize(n * B);
    qc.mse_v.resize(n * B);
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < B; ++j) {
        qc.mse_k[i * B + j] = I.sq[q * B + j][0][i] / denom;
        qc.mse_v[i * B + j] = I.sq[q * B + j][1][i] / denom;
        for (int side = 0; side < 2; ++side)
          check(I.sq[q * B + j][side][i] > 0,
                "distortion curves: {} at {} bits has zero error on layer {} KV head {} {} (cannot fit ln D)",
                I.opt.quantizers[q], I.bits[j], i / H, i % H, side == 0 ? "K" : "V");
      }
    calib::fit_curves(qc, n);
    out.emplace(I.opt.quantizers[q], std::move(qc));
  }
  return out;
}

std::map<std::string, calib::QuantizerCurves> measure_distortion_curves(Model& model, std::span<const int32_t> tokens,
                                                                        const CalibStats& st,
                                                                        const CurveMeasureOptions& opt) {
  const ModelConfig& cfg = model.config();
  check(!tokens.empty(), "distortion curves: no calibration tokens");
  check_param(opt.ctx >= 1 && opt.ctx <= model.position_limit(), "CurveMeasureOptions.ctx", "{}: outside 1..{}",
              opt.ctx, model.position_limit());
  DistortionAccumulator acc(cfg, st, opt);
  ForwardHooks hooks;
  hooks.on_layer = [&](const LayerActivations& a) { acc.add(a.layer, a.k_post, a.v, a.n); };
  const int64_t N = static_cast<int64_t>(tokens.size());
  Progress prog("calibrate: distortion curves", N);
  for (int64_t start = 0; start < N; start += opt.ctx) {
    const int64_t m = std::min(opt.ctx, N - start);
    DenseKVCache kv = model.make_dense_cache(m);
    model.forward(tokens.subspan(start, m), 0, kv, nullptr, false, &hooks);
    prog.update(start + m);
  }
  prog.finish();
  return acc.finish();
}

}  // namespace ratekv::eval
