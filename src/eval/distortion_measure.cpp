// measure_distortion_curves(): per-component MSE of each plan codec on
// calibration K/V, then the shared-β fit (eval/distortion_measure.h).
#include "ratekv/eval/distortion_measure.h"

#include <algorithm>
#include <array>
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

std::map<std::string, calib::QuantizerCurves> measure_distortion_curves(Model& model, std::span<const int32_t> tokens,
                                                                        const CalibStats& st,
                                                                        const CurveMeasureOptions& opt) {
  const ModelConfig& cfg = model.config();
  check(!tokens.empty(), "distortion curves: no calibration tokens");
  check_param(opt.ctx >= 1 && opt.ctx <= model.position_limit(), "CurveMeasureOptions.ctx", "{}: outside 1..{}",
              opt.ctx, model.position_limit());
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
  check(st.model.n_layers == cfg.n_layers && st.model.n_kv_heads == cfg.n_kv_heads &&
            st.model.head_dim == cfg.head_dim,
        "distortion curves: statistics are for {} layers × {} KV heads × head_dim {}, the model has {} × {} × {}",
        st.model.n_layers, st.model.n_kv_heads, st.model.head_dim, cfg.n_layers, cfg.n_kv_heads, cfg.head_dim);

  const int L = cfg.n_layers, H = cfg.n_kv_heads, d = cfg.head_dim;
  const size_t Q = opt.quantizers.size(), B = bits.size(), n = static_cast<size_t>(L) * H;
  // Codecs per (quantizer, width), index q·B + j.
  std::vector<std::unique_ptr<cache::PlanCodecs>> codecs;
  for (const auto& q : opt.quantizers)
    for (int b : bits) codecs.push_back(std::make_unique<cache::PlanCodecs>(plan_at(st, q, b, opt), cfg, q));
  // sq[c][side][l·H + h]: Σ‖x − x̂‖² in double.
  std::vector<std::array<std::vector<double>, 2>> sq(codecs.size());
  for (auto& s : sq) s = {std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};

  ForwardHooks hooks;
  hooks.on_layer = [&](const LayerActivations& a) {
    const int64_t T = a.n, row = int64_t{H} * d;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t task = 0; task < static_cast<int64_t>(codecs.size()) * 2; ++task) {
      const size_t c = static_cast<size_t>(task / 2);
      const int side = static_cast<int>(task % 2);
      const float* x = side == 0 ? a.k_post : a.v;
      std::vector<float> xhat(static_cast<size_t>(T * row));
      cache::fake_quant_sequence(*codecs[c], a.layer, side == 0 ? cache::KVSide::key : cache::KVSide::value, x,
                                 a.k_pre, a.pos, T, 0, 0, xhat.data());
      for (int h = 0; h < H; ++h) {
        double s = 0.0;
        for (int64_t t = 0; t < T; ++t)
          for (int i = 0; i < d; ++i) {
            const double e = static_cast<double>(x[t * row + h * d + i]) - xhat[t * row + h * d + i];
            s += e * e;
          }
        sq[c][side][static_cast<size_t>(a.layer) * H + h] += s;
      }
    }
  };
  const int64_t N = static_cast<int64_t>(tokens.size());
  Progress prog("calibrate: distortion curves", N);
  for (int64_t start = 0; start < N; start += opt.ctx) {
    const int64_t m = std::min(opt.ctx, N - start);
    DenseKVCache kv = model.make_dense_cache(m);
    model.forward(tokens.subspan(start, m), 0, kv, nullptr, false, &hooks);
    prog.update(start + m);
  }
  prog.finish();

  std::map<std::string, calib::QuantizerCurves> out;
  const double denom = static_cast<double>(N) * d;
  for (size_t q = 0; q < Q; ++q) {
    calib::QuantizerCurves qc;
    qc.bits.assign(bits.begin(), bits.end());
    qc.mse_k.resize(n * B);
    qc.mse_v.resize(n * B);
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < B; ++j) {
        qc.mse_k[i * B + j] = sq[q * B + j][0][i] / denom;
        qc.mse_v[i * B + j] = sq[q * B + j][1][i] / denom;
        for (int side = 0; side < 2; ++side)
          check(sq[q * B + j][side][i] > 0,
                "distortion curves: {} at {} bits has zero error on layer {} KV head {} {} (cannot fit ln D)",
                opt.quantizers[q], bits[j], i / H, i % H, side == 0 ? "K" : "V");
      }
    calib::fit_curves(qc, n);
    out.emplace(opt.quantizers[q], std::move(qc));
  }
  return out;
}

}  // namespace ratekv::eval
