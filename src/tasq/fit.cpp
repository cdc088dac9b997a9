// Capturing calibration activations and fitting TaSQ / CQ plans (ratekv/tasq/fit.h).
#include "ratekv/tasq/fit.h"

#include <chrono>
#include <cmath>

#include <Eigen/Core>

#include "ratekv/common/error.h"
#include "ratekv/common/param_error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/common/log.h"
#include "ratekv/model/backward.h"
#include "ratekv/quant/prng.h"
#include "ratekv/tasq/channel_weights.h"
#include "ratekv/tasq/grouping.h"

namespace ratekv::tasq {

using nlohmann::json;

FitCaptures capture_for_fit(Model& model, std::span<const int32_t> tokens, int64_t ctx, bool keep_values,
                            bool fisher) {
  const ModelConfig& cfg = model.config();
  const int64_t N = static_cast<int64_t>(tokens.size());
  check(N >= 1, "tasq fit: no calibration tokens");
  check_param(ctx >= 1 && ctx <= model.position_limit(), "capture_for_fit.ctx", "{}: expected 1..{}", ctx,
              model.position_limit());
  FitCaptures cap;
  cap.cfg = cfg;
  cap.n_tokens = N;
  cap.ctx = ctx;
  const int64_t row = static_cast<int64_t>(cfg.n_kv_heads) * cfg.head_dim;
  cap.k_pre.resize(cfg.n_layers);
  cap.v.resize(cfg.n_layers);
  for (int l = 0; l < cfg.n_layers; ++l) {
    cap.k_pre[l].resize(N * row);
    if (keep_values) cap.v[l].resize(N * row);
  }
  QueryWeightAccumulator qw(cfg);
  int64_t start = 0;
  ForwardHooks hooks;
  hooks.on_layer = [&](const LayerActivations& a) {
    qw.add(a);
    std::copy(a.k_pre, a.k_pre + a.n * row, cap.k_pre[a.layer].begin() + start * row);
    if (keep_values) std::copy(a.v, a.v + a.n * row, cap.v[a.layer].begin() + start * row);
  };
  const auto t0 = std::chrono::steady_clock::now();
  if (!fisher) {
    Progress prog("tasq fit: calibration tokens", N);
    for (; start < N;) {
      const int64_t n = std::min(ctx, N - start);
      DenseKVCache kv = model.make_dense_cache(n);
      model.forward(tokens.subspan(start, n), 0, kv, nullptr, false, &hooks);
      start += n;
      prog.update(start);
    }
    prog.finish();
    spdlog::info("tasq fit: forward passes over {} tokens (keys, query weights) in {:.1f} s", N,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  } else {
    // One backward pass per window: its forward pass feeds the same hook
    // (keys, values, query weights; ModelBackward::backward's hooks), its
    // reverse pass the Fisher weights — no separate forward pass.
    cap.k_grad_sq.resize(cfg.n_layers);
    for (auto& g : cap.k_grad_sq) g.assign(N * row, 0.0f);
    const ModelBackward<float> bw(model);
    Progress pg("tasq fit: forward + backward passes (keys, Fisher weights), tokens", N);
    for (; start < N;) {
      const int64_t n = std::min(ctx, N - start);
      if (n >= 2) {
        bw.backward(
            tokens.subspan(start, n),
            [&](const LayerKVGrad<float>& g) {
              float* dst = cap.k_grad_sq[g.layer].data() + start * row;
              for (int64_t i = 0; i < n * row; ++i) dst[i] = g.dk_pre[i] * g.dk_pre[i];
            },
            nullptr, nullptr, &hooks);
      } else {  // a single token has no loss: forward only, its Fisher weight stays 0
        DenseKVCache kv = model.make_dense_cache(n);
        model.forward(tokens.subspan(start, n), 0, kv, nullptr, false, &hooks);
      }
      start += n;
      pg.update(start);
    }
    pg.finish();
    spdlog::info("tasq fit: forward + backward passes over {} tokens (keys, query weights, Fisher weights) in {:.1f} s",
                 N, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  cap.query_weights = qw.finish();
  return cap;
}

namespace {

int log2_exact(int k, const char* param) {
  check_param(k >= 2 && k <= 65536 && (k & (k - 1)) == 0, param, "{}: expected a power of two in 2..65536", k);
  int b = 0;
  while ((1 << b) < k) ++b;
  return b;
}

uint64_t codebook_seed(uint64_t seed, int l, int h, int s, int g) {
  return quant::mix_seed(seed, ((static_cast<uint64_t>(l) * 4096 + h) * 2 + s) * 65536 + g);
}

// Fits one side of one layer: all heads. x (N, H, d). Returns per-head codecs.
struct SideFit {
  std::vector<Codec> codecs;
  json diag = json::array();
};

SideFit fit_side(const std::vector<float>& x, const std::vector<float>* grad_sq, int64_t N, const ModelConfig& cfg,
                 int l, int side,
                 const std::vector<double>* weights /* (H, d) normalized or null */, bool normalization,
                 const std::string& grouping /* "matching" | "pairs" | "channels" */, int g, int K,
                 const FitOptions& opt, VqTensors& out) {
  const int H = cfg.n_kv_heads, d = cfg.head_dim,
            bits = log2_exact(K, side == 0 ? "FitOptions.centroids" : "FitOptions.value_centroids");
  const int64_t row = static_cast<int64_t>(H) * d;
  // Channel scales a = sqrt(w), rounded to fp16 first: the side file stores them as fp16 (the cost
  // reported), so the fit uses exactly the scales the cache will.
  std::vector<float> a(row, 1.0f);
  if (weights)
    for (int64_t i = 0; i < row; ++i) a[i] = round_fp16(static_cast<float>(std::sqrt(std::max((*weights)[i], 1e-6))));
  // z = a ⊙ x / s, with the shared fp16 scale s computed exactly as the cache does.
  std::vector<float> z(x.size()), scale(N, 1.0f);
  for (int64_t t = 0; t < N; ++t) {
    const float* xt = x.data() + t * row;
    float s = 1.0f;
    if (normalization) {
      double acc = 0.0;
      for (int64_t i = 0; i < row; ++i) {
        const double y = static_cast<double>(a[i]) * xt[i];
        acc += y * y;
      }
      s = cache::vq_shared_scale(acc, H, d);
    }
    const float inv = 1.0f / s;
    scale[t] = s;
    for (int64_t i = 0; i < row; ++i) z[t * row + i] = a[i] * xt[i] * inv;
  }
  const auto pairs = rope_pairs(cfg.rope_layout, d);
  SideFit res;
  for (int h = 0; h < H; ++h) {
    // Covariance of z_h.
    Eigen::MatrixXf zh(N, d);
    for (int64_t t = 0; t < N; ++t)
      for (int c = 0; c < d; ++c) zh(t, c) = z[t * row + static_cast<int64_t>(h) * d + c];
    const Eigen::RowVectorXd mean = zh.cast<double>().colwise().mean();
    const Eigen::MatrixXf zc = zh.rowwise() - mean.cast<float>();
    const Eigen::MatrixXd cov = (zc.transpose() * zc).cast<double>() / static_cast<double>(N);
    std::vector<double> sigma(static_cast<size_t>(d) * d);
    for (int i = 0; i < d; ++i)
      for (int j = 0; j < d; ++j) sigma[static_cast<size_t>(i) * d + j] = 0.5 * (cov(i, j) + cov(j, i));
    std::vector<std::vector<int>> groups;
    const auto contig_pairs = contiguous_pair_groups(pairs, g);
    const double cost_pairs = partition_cost(sigma, d, contig_pairs);
    const double cost_channels = partition_cost(sigma, d, contiguous_channel_groups(d, g));
    bool fallback = false;
    double cost_matched = std::nan("");
    if (grouping == "matching") {
      groups = match_groups(sigma, d, pairs, g);
      cost_matched = partition_cost(sigma, d, groups);
      if (cost_matched > cost_pairs) {
        groups = contig_pairs;
        fallback = true;
      }
    } else if (grouping == "pairs") {
      groups = contig_pairs;
    } else {
      groups = contiguous_channel_groups(d, g);
    }
    const double cost = partition_cost(sigma, d, groups);
    // Codebooks.
    VqTensors::Entry& e = out.at(l, h, side);
    e.present = true;
    e.codebooks.clear();
    std::vector<float> pts(static_cast<size_t>(N) * g);
    std::vector<float> fw;
    int zero_fisher_groups = 0;
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      for (int64_t t = 0; t < N; ++t)
        for (int i = 0; i < g; ++i) pts[t * g + i] = zh(t, groups[gi][i]);
      if (grad_sq) {  // F_t = s_t² Σ_{i∈G} g_i² / a_i²
        fw.assign(N, 0.0f);
        double mean = 0.0;
        for (int64_t t = 0; t < N; ++t) {
          double f = 0.0;
          for (int ch : groups[gi]) {
            const int64_t o = t * row + static_cast<int64_t>(h) * d + ch;
            f += static_cast<double>((*grad_sq)[o]) / (static_cast<double>(a[h * d + ch]) * a[h * d + ch]);
          }
          f *= static_cast<double>(scale[t]) * scale[t];
          fw[t] = static_cast<float>(f);
          mean += f;
        }
        mean /= static_cast<double>(N);
        check(std::isfinite(mean), "tasq fit: Fisher weights of layer {} head {} group {} are not finite", l, h, gi);
        if (mean > 0.0) {
          for (auto& f : fw) f = std::max(f, static_cast<float>(1e-6 * mean));
        } else {
          // Every gradient of the group is exactly 0: no query reads these channels on the
          // calibration text (Gemma 3's layer 12 has query channels that q-norm zeroes, and
          // channel weights at their floor). The loss does not rank their errors; k-means
          // runs unweighted for this group.
          fw.clear();
          ++zero_fisher_groups;
        }
      }
      KMeansOptions km;
      km.n_centroids = K;
      km.n_iter = opt.kmeans_iters;
      km.seed = codebook_seed(opt.seed, l, h, side, static_cast<int>(gi));
      std::vector<float> cb = kmeans_codebook(pts.data(), N, g, fw, km);
      for (float& c : cb) c = round_fp16(c);  // stored as fp16 (the side file, the reported cost)
      e.codebooks.insert(e.codebooks.end(), cb.begin(), cb.end());
    }
    if (weights) e.channel_scale.assign(a.begin() + static_cast<int64_t>(h) * d, a.begin() + static_cast<int64_t>(h + 1) * d);
    Codec c;
    c.kind = CodecKind::Vq;
    c.norm = normalization ? NormStorage::SharedFP16 : NormStorage::None;
    c.scale_heads = normalization ? H : 0;
    c.group_size = g;
    for (const auto& grp : groups) {
      CodecGroup cg;
      cg.bits = bits;
      cg.channels = grp;
      c.groups.push_back(std::move(cg));
    }
    res.codecs.push_back(std::move(c));
    res.diag.push_back({{"layer", l},
                        {"head", h},
                        {"logdet_chosen", cost},
                        {"logdet_matched", std::isnan(cost_matched) ? json(nullptr) : json(cost_matched)},
                        {"logdet_contiguous_pairs", cost_pairs},
                        {"logdet_contiguous_channels", cost_channels},
                        {"contiguous_fallback", fallback},
                        {"fisher_zero_groups", zero_fisher_groups}});
  }
  return res;
}

}  // namespace

void validate_fit_options(const ModelConfig& cfg, int64_t n_tokens, const FitOptions& opt) {
  const int d = cfg.head_dim;
  check_param(opt.method == "tasq" || opt.method == "cq", "FitOptions.method", "{}: expected tasq or cq", opt.method);
  check_param(opt.values == "cq" || opt.values == "fp16", "FitOptions.values", "{}: expected cq or fp16", opt.values);
  check_param(opt.group >= 1 && d % opt.group == 0, "FitOptions.group", "{}: expected a divisor of head_dim {}",
              opt.group, d);
  if (opt.method == "tasq")
    check_param(opt.group >= 2 && (opt.group & (opt.group - 1)) == 0, "FitOptions.group",
                "{}: TaSQ groups whole RoPE pairs by matching: expected 2, 4, 8, … dividing head_dim {}", opt.group,
                d);
  log2_exact(opt.centroids, "FitOptions.centroids");
  check_param(n_tokens >= opt.centroids, "FitOptions.centroids",
              "{}: more centroids per codebook than the {} calibration tokens", opt.centroids, n_tokens);
  check_param(opt.kmeans_iters >= 1 && opt.kmeans_iters <= 1000, "FitOptions.kmeans_iters", "{}: expected 1..1000",
              opt.kmeans_iters);
  if (opt.values == "cq") {
    check_param(opt.value_group >= 1 && d % opt.value_group == 0, "FitOptions.value_group",
                "{}: expected a divisor of head_dim {}", opt.value_group, d);
    log2_exact(opt.value_centroids, "FitOptions.value_centroids");
    check_param(n_tokens >= opt.value_centroids, "FitOptions.value_centroids",
                "{}: more centroids per codebook than the {} calibration tokens", opt.value_centroids, n_tokens);
  }
}

FitResult fit_vq_plan(const FitCaptures& cap, const FitOptions& opt) {
  const ModelConfig& cfg = cap.cfg;
  const int L = cfg.n_layers, H = cfg.n_kv_heads, d = cfg.head_dim;
  validate_fit_options(cfg, cap.n_tokens, opt);
  if (opt.values == "cq")
    check_param(!cap.v.empty() && !cap.v[0].empty(), "FitOptions.values",
                "cq: needs the values in the captures (capture_for_fit with keep_values)");
  const bool tasq = opt.method == "tasq";
  if (opt.fisher)
    check(cap.k_grad_sq.size() == static_cast<size_t>(L) && !cap.k_grad_sq[0].empty(),
          "tasq fit: Fisher weighting needs the key gradients (capture with fisher)");
  const bool weighting = tasq && opt.weighting, normalization = tasq && opt.normalization;
  const std::string grouping = !tasq ? "channels" : opt.grouping ? "matching" : "pairs";

  std::vector<double> w = cap.query_weights;
  normalize_unit_mean(w, d);

  FitResult r;
  Plan& p = r.plan;
  p.method = tasq ? "tasq" : "cq";
  p.model.arch = cfg.arch;
  p.model.n_layers = L;
  p.model.n_kv_heads = H;
  p.model.head_dim = d;
  p.model.rope_layout = rope_layout_name(cfg.rope_layout);
  p.seed = opt.seed;
  p.budget_unit = "effective";
  p.tensors_file = p.method + ".tensors.safetensors";  // the caller names the real file
  p.layers.assign(L, std::vector<HeadPlan>(H));
  r.tensors = VqTensors::for_plan(p);
  json diag_k = json::array(), diag_v = json::array();
  int fallbacks = 0, fisher_zero = 0;
  const auto t0 = std::chrono::steady_clock::now();
  Progress prog(fmt::format("{} fit: layers (k-means {}×{} per group)", p.method, opt.centroids, opt.group), L);
  for (int l = 0; l < L; ++l) {
    std::vector<double> wl(w.begin() + static_cast<int64_t>(l) * H * d, w.begin() + static_cast<int64_t>(l + 1) * H * d);
    SideFit k = fit_side(cap.k_pre[l], opt.fisher ? &cap.k_grad_sq[l] : nullptr, cap.n_tokens, cfg, l, 0, weighting ? &wl : nullptr, normalization, grouping,
                         opt.group, opt.centroids, opt, r.tensors);
    for (int h = 0; h < H; ++h) p.layers[l][h].key = k.codecs[h];
    for (auto& e : k.diag) {
      fallbacks += e["contiguous_fallback"].get<bool>();
      fisher_zero += e["fisher_zero_groups"].get<int>();
      diag_k.push_back(e);
    }
    if (opt.values == "cq") {
      SideFit v = fit_side(cap.v[l], nullptr, cap.n_tokens, cfg, l, 1, nullptr, false, "channels", opt.value_group,
                           opt.value_centroids, opt, r.tensors);
      for (int h = 0; h < H; ++h) p.layers[l][h].value = v.codecs[h];
    }
    prog.update(l + 1);
  }
  prog.finish();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("{} fit: grouping + k-means of {} layers in {:.1f} s", p.method, L, secs);
  const Plan::Achieved ach = p.achieved();
  p.budget_k = ach.k;
  p.budget_v = ach.v;
  p.fit = {{"method", p.method},
           {"weighting", weighting ? "query-guided diag(Ã), unit mean per head" : "none"},
           {"normalization", normalization ? "shared fp16 RMS scale per token per layer" : "none"},
           {"grouping", grouping == "matching" ? "hierarchical min-weight perfect matching on log det (LEMON)"
                        : grouping == "pairs"  ? "contiguous RoPE pairs"
                                               : "contiguous channels"},
           {"kmeans", opt.fisher ? "fisher (F = s² Σ_G g²/w, g = dL/dk_pre of each window's causal LM loss)"
                                 : "plain (unweighted)"},
           {"kmeans_iters", opt.kmeans_iters},
           {"kmeans_seed", opt.seed},
           {"group", opt.group},
           {"centroids", opt.centroids},
           {"values", opt.values == "cq" ? fmt::format("cq g={} K={}", opt.value_group, opt.value_centroids) : "fp16"},
           {"calibration_tokens", cap.n_tokens},
           {"ctx", cap.ctx},
           {"contiguous_fallbacks", fallbacks},
           {"fisher_zero_groups", fisher_zero},
           {"codebook_bytes_fp16", r.tensors.codebook_bytes()}};
  r.diagnostics = {{"key_groups", diag_k}, {"fit_seconds", secs}, {"contiguous_fallbacks", fallbacks},
                   {"fisher_zero_groups", fisher_zero}};
  return r;
}

}  // namespace ratekv::tasq
