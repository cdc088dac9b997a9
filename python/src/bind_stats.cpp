// Bindings: calibration statistics (calib/kv_stats.h, format/calib_stats.h),
// their accumulator (calib/accumulator.h) and the distortion-curve accumulator
// (eval/distortion_measure.h), used by ratekv.calibrate() to write the same
// statistics file as `ratekv calibrate`.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <vector>

#include "bind_common.h"
#include "ratekv/calib/accumulator.h"
#include "ratekv/calib/kv_stats.h"
#include "ratekv/eval/distortion_measure.h"
#include "ratekv/format/calib_stats.h"

namespace ratekv::py {

namespace {

/// A numpy float64 copy of `v` with `shape`.
nb::ndarray<nb::numpy, double> to_numpy(const std::vector<double>& v, std::vector<size_t> shape) {
  auto* buf = new std::vector<double>(v);
  nb::capsule owner(buf, [](void* p) noexcept { delete static_cast<std::vector<double>*>(p); });
  return nb::ndarray<nb::numpy, double>(buf->data(), shape.size(), shape.data(), owner);
}

std::vector<double> from_array(nb::ndarray<const double, nb::c_contig, nb::device::cpu> a, size_t n,
                               const char* what) {
  check(a.size() == n, "{}: {} values, expected {}", what, a.size(), n);
  return std::vector<double>(a.data(), a.data() + n);
}

}  // namespace

void bind_stats(nb::module_& m) {
  nb::class_<CalibStats>(m, "CalibStats",
                         "The allocators' view of calibration statistics (include/ratekv/format/calib_stats.h).")
      .def_prop_ro("arch", [](const CalibStats& s) { return s.model.arch; })
      .def_prop_ro("rope_layout", [](const CalibStats& s) { return s.model.rope_layout; })
      .def_ro("n_tokens", &CalibStats::n_tokens)
      .def_prop_ro("sensitivities",
                   [](const CalibStats& s) {
                     std::vector<std::string> r;
                     for (const auto& [k, _] : s.sensitivity) r.push_back(k);
                     return r;
                   })
      .def_prop_ro("curves",
                   [](const CalibStats& s) {
                     std::vector<std::string> r;
                     for (const auto& [k, _] : s.curves) r.push_back(k);
                     return r;
                   })
      .def("to_json", [](const CalibStats& s) { return stats_to_json(s).dump(1); })
      .def("validate", &CalibStats::validate, nb::arg("name") = "stats");

  m.def("load_alloc_stats", &calib::load_alloc_stats, nb::arg("path"),
        "Loads allocator statistics from a safetensors file of `ratekv calibrate` (or the JSON form).");
  m.def(
      "identity_stats",
      [](const ModelConfig& cfg) {
        cfg.validate("config");
        CalibStats s;
        s.model = calib::model_identity(cfg);
        const size_t n = static_cast<size_t>(cfg.n_layers) * cfg.n_kv_heads * (cfg.head_dim / 2);
        s.q_block_energy.assign(n, 1.0);
        s.k_block_energy.assign(n, 1.0);
        s.n_tokens = 1;
        s.validate("identity stats");
        return s;
      },
      nb::arg("config"),
      "Statistics that carry only the model's identity (equal block energies): enough for uniform plans, "
      "which read nothing else.");

  nb::class_<calib::KVStats>(m, "KVStats",
                             "Calibration statistics as `ratekv calibrate` writes them (include/ratekv/calib/kv_stats.h, "
                             "docs/calibration_stats.md).")
      .def_static("load", &calib::KVStats::load, nb::arg("path"))
      .def("save", &calib::KVStats::save, nb::arg("path"))
      .def("validate", &calib::KVStats::validate, nb::arg("name") = "stats")
      .def("validate_against", &calib::KVStats::validate_against, nb::arg("config"), nb::arg("name") = "stats")
      .def("to_alloc_stats", &calib::KVStats::to_alloc_stats)
      .def_prop_ro("arch", [](const calib::KVStats& s) { return s.model.arch; })
      .def_prop_ro("rope_layout", [](const calib::KVStats& s) { return s.model.rope_layout; })
      .def_prop_ro("n_layers", [](const calib::KVStats& s) { return s.model.n_layers; })
      .def_prop_ro("n_kv_heads", [](const calib::KVStats& s) { return s.model.n_kv_heads; })
      .def_prop_ro("head_dim", [](const calib::KVStats& s) { return s.model.head_dim; })
      .def_ro("n_heads", &calib::KVStats::n_heads)
      .def_ro("n_tokens", &calib::KVStats::n_tokens)
      .def_ro("ctx", &calib::KVStats::ctx)
      .def_prop_rw("model_file", [](const calib::KVStats& s) { return s.model.file; },
                   [](calib::KVStats& s, const std::string& v) { s.model.file = v; })
      .def_prop_rw("model_sha256", [](const calib::KVStats& s) { return s.model.sha256; },
                   [](calib::KVStats& s, const std::string& v) { s.model.sha256 = v; })
      .def_rw("text_file", &calib::KVStats::text_file)
      .def_rw("text_sha256", &calib::KVStats::text_sha256)
      .def(
          "tensor",
          [](const calib::KVStats& s, const std::string& name) {
            const size_t L = s.model.n_layers, Hk = s.model.n_kv_heads, H = s.n_heads, d = s.model.head_dim;
            if (name == "q_block_energy") return to_numpy(s.q_block_energy, {L, Hk, d / 2});
            if (name == "k_block_energy") return to_numpy(s.k_block_energy, {L, Hk, d / 2});
            if (name == "k_pre_mean") return to_numpy(s.k_pre_mean, {L, Hk, d});
            if (name == "k_pre_cov") return to_numpy(s.k_pre_cov, {L, Hk, d, d});
            if (name == "q_pre_sq") return to_numpy(s.q_pre_sq, {L, H, d});
            if (name == "v_sq") return to_numpy(s.v_sq, {L, Hk, d});
            check(s.grad.n_sequences > 0 || name.rfind("grad_sq_", 0) != 0,
                  "stats: no '{}' (the file has no gradient sensitivity)", name);
            if (name == "grad_sq_k_pre") return to_numpy(s.grad.k_pre_sq, {L, Hk, d});
            if (name == "grad_sq_k_post") return to_numpy(s.grad.k_post_sq, {L, Hk, d});
            if (name == "grad_sq_v") return to_numpy(s.grad.v_sq, {L, Hk, d});
            fail("stats: no tensor '{}' (expected q_block_energy, k_block_energy, k_pre_mean, k_pre_cov, q_pre_sq, "
                 "v_sq, grad_sq_k_pre, grad_sq_k_post, grad_sq_v)", name);
          },
          nb::arg("name"), "A statistic as a float64 numpy array (shapes in docs/calibration_stats.md).")
      .def_prop_ro("grad_n_sequences", [](const calib::KVStats& s) { return s.grad.n_sequences; })
      .def_prop_ro("grad_seq_len", [](const calib::KVStats& s) { return s.grad.seq_len; })
      .def_prop_ro("grad_mean_loss", [](const calib::KVStats& s) { return s.grad.mean_loss; })
      .def(
          "set_gradient_sensitivity",
          [](calib::KVStats& s, int64_t n_sequences, int64_t seq_len, double mean_loss,
             nb::ndarray<const double, nb::c_contig, nb::device::cpu> k_pre_sq,
             nb::ndarray<const double, nb::c_contig, nb::device::cpu> k_post_sq,
             nb::ndarray<const double, nb::c_contig, nb::device::cpu> v_sq) {
            check(n_sequences >= 1 && seq_len >= 2, "sensitivity: {} sequences of {} tokens (need ≥ 1 of ≥ 2)",
                  n_sequences, seq_len);
            check(std::isfinite(mean_loss), "sensitivity: mean loss {} is not finite", mean_loss);
            const size_t n = static_cast<size_t>(s.model.n_layers) * s.model.n_kv_heads * s.model.head_dim;
            calib::GradSensitivity g;
            g.n_sequences = n_sequences;
            g.seq_len = seq_len;
            g.mean_loss = mean_loss;
            g.k_pre_sq = from_array(k_pre_sq, n, "grad_sq_k_pre");
            g.k_post_sq = from_array(k_post_sq, n, "grad_sq_k_post");
            g.v_sq = from_array(v_sq, n, "grad_sq_v");
            s.grad = std::move(g);
            s.validate("stats");
          },
          nb::arg("n_sequences"), nb::arg("seq_len"), nb::arg("mean_loss"), nb::arg("k_pre_sq"), nb::arg("k_post_sq"),
          nb::arg("v_sq"),
          "Stores E_t (∂L/∂k_pre)², E_t (∂L/∂k_post)², E_t (∂L/∂v)², each (n_layers, n_kv_heads, head_dim) float64 "
          "(calib/sensitivity.h).")
      .def(
          "set_curves",
          [](calib::KVStats& s, const std::string& quantizer, const std::vector<double>& bits,
             nb::ndarray<const double, nb::c_contig, nb::device::cpu> mse_k,
             nb::ndarray<const double, nb::c_contig, nb::device::cpu> mse_v) {
            const size_t n = static_cast<size_t>(s.model.n_layers) * s.model.n_kv_heads;
            calib::QuantizerCurves qc;
            qc.bits = bits;
            qc.mse_k = from_array(mse_k, n * bits.size(), "mse_k");
            qc.mse_v = from_array(mse_v, n * bits.size(), "mse_v");
            calib::fit_curves(qc, n);
            std::map<std::string, calib::QuantizerCurves> one{{quantizer, qc}};
            calib::validate_curves(one, n, "stats");
            s.curves[quantizer] = std::move(qc);
          },
          nb::arg("quantizer"), nb::arg("bits"), nb::arg("mse_k"), nb::arg("mse_v"),
          "Stores one quantizer's measured distortion (mse_k, mse_v: (n_layers, n_kv_heads, len(bits)) float64, "
          "mean squared error per element) and its fit D = α β^(−b) by calib::fit_curves "
          "(calib/distortion_curves.h, docs/calibration_stats.md).")
      .def(
          "curve",
          [](const calib::KVStats& s, const std::string& quantizer) {
            auto it = s.curves.find(quantizer);
            check(it != s.curves.end(), "stats: no distortion curves of '{}'", quantizer);
            const auto& c = it->second;
            const size_t L = s.model.n_layers, H = s.model.n_kv_heads, nb_ = c.bits.size();
            nb::dict d;
            d["bits"] = c.bits;
            d["mse_k"] = to_numpy(c.mse_k, {L, H, nb_});
            d["mse_v"] = to_numpy(c.mse_v, {L, H, nb_});
            d["alpha_k"] = to_numpy(c.fit.alpha_k, {L, H});
            d["alpha_v"] = to_numpy(c.fit.alpha_v, {L, H});
            d["beta_k"] = c.fit.beta_k;
            d["beta_v"] = c.fit.beta_v;
            return d;
          },
          nb::arg("quantizer"), "A quantizer's measured distortion and fitted curves.")
      .def_prop_ro("curve_names", [](const calib::KVStats& s) {
        std::vector<std::string> r;
        for (const auto& [k, _] : s.curves) r.push_back(k);
        return r;
      });

  nb::class_<calib::KVStatsAccumulator>(m, "KVStatsAccumulator",
                                        "Running sums of every statistic of calib/kv_stats.h (calib/accumulator.h).")
      .def(nb::init<const ModelConfig&>(), nb::arg("config"))
      .def(
          "add",
          [](calib::KVStatsAccumulator& acc, const ModelConfig& cfg, int layer, I32In pos, F32In q_pre, F32In q_post,
             F32In k_pre, F32In k_post, F32In v) {
            check(pos.ndim() == 1, "calibrate: pos must be 1-D");
            const int64_t n = static_cast<int64_t>(pos.shape(0));
            check_shape(q_pre, "calibrate: q_pre", {n, cfg.n_heads, cfg.head_dim});
            check_shape(q_post, "calibrate: q_post", {n, cfg.n_heads, cfg.head_dim});
            check_shape(k_pre, "calibrate: k_pre", {n, cfg.n_kv_heads, cfg.head_dim});
            check_shape(k_post, "calibrate: k_post", {n, cfg.n_kv_heads, cfg.head_dim});
            check_shape(v, "calibrate: v", {n, cfg.n_kv_heads, cfg.head_dim});
            LayerActivations a;
            a.layer = layer;
            a.n = n;
            a.pos = pos.data();
            a.n_heads = cfg.n_heads;
            a.n_kv_heads = cfg.n_kv_heads;
            a.head_dim = cfg.head_dim;
            a.q_pre = q_pre.data();
            a.q_post = q_post.data();
            a.k_pre = k_pre.data();
            a.k_post = k_post.data();
            a.v = v.data();
            nb::gil_scoped_release rel;
            acc.add(a);
          },
          nb::arg("config"), nb::arg("layer"), nb::arg("pos"), nb::arg("q_pre"), nb::arg("q_post"), nb::arg("k_pre"),
          nb::arg("k_post"), nb::arg("v"),
          "Adds one layer's activations of one chunk: q (n, n_heads, head_dim), k, v (n, n_kv_heads, head_dim) "
          "float32, pos (n,) int32 (model.h LayerActivations).")
      .def_prop_ro("n_tokens", &calib::KVStatsAccumulator::n_tokens)
      .def(
          "finish",
          [](const calib::KVStatsAccumulator& acc, int64_t ctx) {
            calib::KVStats s = acc.finish();
            s.ctx = ctx;
            return s;
          },
          nb::arg("ctx"), "Means over everything added (raises if a layer missed a chunk).");

  m.def(
      "validate_curve_options",
      [](const std::vector<std::string>& quantizers, const std::vector<int>& bits) {
        eval::CurveMeasureOptions opt;
        opt.quantizers = quantizers;
        opt.bits = bits;
        eval::validate_curve_options(opt);
      },
      nb::arg("quantizers"), nb::arg("bits"),
      "eval::validate_curve_options: raises RatekvError naming CurveMeasureOptions.quantizers/bits for no, unknown "
      "or repeated quantizers, or widths that are not ≥ 2 distinct values in 1..8 (what DistortionAccumulator "
      "checks, before any activation is captured).");

  nb::class_<eval::DistortionAccumulator>(
      m, "DistortionAccumulator",
      "RateQuant distortion curves measured on captured K/V (include/ratekv/eval/distortion_measure.h): the "
      "accumulator `ratekv calibrate --curves` feeds from the C++ runtime.")
      .def(
          "__init__",
          [](eval::DistortionAccumulator* self, const ModelConfig& cfg, const calib::KVStats& stats,
             const std::vector<std::string>& quantizers, const std::vector<int>& bits, int group_size,
             uint64_t seed) {
            eval::CurveMeasureOptions opt;
            opt.quantizers = quantizers;
            opt.bits = bits;
            opt.group_size = group_size;
            opt.seed = seed;
            new (self) eval::DistortionAccumulator(cfg, stats.to_alloc_stats(), opt);
          },
          nb::arg("config"), nb::arg("stats"), nb::arg("quantizers"), nb::arg("bits"), nb::arg("group_size") = 32,
          nb::arg("seed") = 0,
          "The codecs of every (quantizer, width) plan, made from `stats` (model identity, Block-GTQ block "
          "energies). Raises RatekvError naming CurveMeasureOptions.quantizers/bits for unknown or repeated "
          "quantizers, widths outside 1..8 or fewer than two distinct widths, or stats of another model.")
      .def(
          "add",
          [](eval::DistortionAccumulator& acc, const ModelConfig& cfg, int layer, F32In k_post, F32In v) {
            check(k_post.ndim() == 3, "distortion curves: k_post must be (T, n_kv_heads, head_dim)");
            const int64_t T = static_cast<int64_t>(k_post.shape(0));
            check_shape(k_post, "distortion curves: k_post", {T, cfg.n_kv_heads, cfg.head_dim});
            check_shape(v, "distortion curves: v", {T, cfg.n_kv_heads, cfg.head_dim});
            nb::gil_scoped_release rel;
            acc.add(layer, k_post.data(), v.data(), T);
          },
          nb::arg("config"), nb::arg("layer"), nb::arg("k_post"), nb::arg("v"),
          "Adds one chunk of `layer` (positions 0.. within the chunk): k_post (post-RoPE keys), v, each "
          "(T, n_kv_heads, head_dim) float32 C-contiguous. Raises RatekvError for a wrong shape, a layer out of "
          "range or a non-finite element.")
      .def("tokens", &eval::DistortionAccumulator::tokens, nb::arg("layer"), "Tokens added to `layer` so far.")
      .def(
          "finish_into",
          [](const eval::DistortionAccumulator& acc, calib::KVStats& s) {
            auto curves = acc.finish();
            const size_t n = static_cast<size_t>(s.model.n_layers) * s.model.n_kv_heads;
            calib::validate_curves(curves, n, "stats");
            for (auto& [q, c] : curves) s.curves[q] = std::move(c);
          },
          nb::arg("stats"),
          "Stores the measured mse and fitted curves of every quantizer in `stats` (replacing curves of the same "
          "name). Raises RatekvError when nothing was added, layers received different token counts, or a "
          "measured distortion is zero.");
}

}  // namespace ratekv::py
