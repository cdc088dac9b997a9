// Plan construction from calibration statistics (alloc/make_plan.h).
#include "ratekv/alloc/make_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "ratekv/alloc/block_gtq.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/common/param_error.h"
#include "ratekv/common/log.h"
#include "ratekv/format/stored_bytes.h"

namespace ratekv::alloc {

using nlohmann::json;

uint32_t group_seed(uint64_t seed, int layer, int head, int side, int group) {
  // SplitMix64 finalizer over a packed (layer, head, side, group) tag.
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (1 + ((uint64_t)layer << 32 | (uint64_t)head << 12 |
                                                     (uint64_t)side << 11 | (uint64_t)group));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (uint32_t)((z ^ (z >> 31)) >> 32);
}

namespace {

struct Ctx {
  const CalibStats& st;
  const PlanRequest& rq;
  int d() const { return st.model.head_dim; }
};

// What a statistics map holds, in words: "it has: a, b", or "the file has no <what>" when it is empty
// (it used to say "it has: none", which read as the sensitivity estimator named "none").
std::string what_it_has(const auto& map, const char* what) {
  std::string s;
  for (const auto& [k, v] : map) s += (s.empty() ? "" : ", ") + k;
  return s.empty() ? fmt::format("the file has no {}", what) : "it has: " + s;
}

constexpr const char* kNoCurves = "distortion curves (ratekv calibrate --curves measures them)";
constexpr const char* kNoSensitivity = "sensitivity estimators (ratekv calibrate --sensitivity measures them)";

// Metadata bits per element of a whole-head codec of `quantizer`.
double meta_per_element(const std::string& quantizer, int d, int group_size) {
  if (quantizer == "kivi" || quantizer == "quarot") return 32.0 / group_size;
  if (quantizer == "q8_0" || quantizer == "q4_0") return 16.0 / 32.0;
  if (quantizer == "fp16") return 0.0;
  return 16.0 / d;  // tq-mse, block-gtq: one fp16 norm per head (or group)
}

Codec whole_head_codec(const std::string& quantizer, int bits, int d, int group_size, uint32_t seed) {
  if (quantizer == "tq-mse" || quantizer == "block-gtq") return Codec::tq_mse(bits, d, seed);
  if (quantizer == "fp16") return Codec::fp16();
  Codec c;
  if (quantizer == "q8_0" || quantizer == "q4_0") {
    c.kind = quantizer == "q8_0" ? CodecKind::Q8_0 : CodecKind::Q4_0;
    c.group_size = 32;
    CodecGroup g;
    g.bits = bits;
    for (int i = 0; i < d; ++i) g.channels.push_back(i);
    c.groups.push_back(std::move(g));
    return c;
  }
  c.kind = quantizer == "kivi" ? CodecKind::Kivi : CodecKind::QuaRot;
  c.norm = NormStorage::None;
  c.group_size = group_size;
  CodecGroup g;
  g.bits = bits;
  g.seed = c.kind == CodecKind::QuaRot ? seed : 0;
  for (int i = 0; i < d; ++i) g.channels.push_back(i);
  c.groups.push_back(std::move(g));
  return c;
}

Codec grouped_codec(const BlockAllocation& a, const PlanRequest& rq, int l, int h) {
  Codec c;
  c.kind = CodecKind::TqMseGrouped;
  c.norm = NormStorage::FP16;
  for (size_t g = 0; g < a.groups.size(); ++g) {
    CodecGroup cg;
    cg.bits = a.groups[g].bits;
    cg.blocks = a.groups[g].blocks;
    cg.seed = cg.bits > 0 ? group_seed(rq.seed, l, h, 0, (int)g) : 0;
    c.groups.push_back(std::move(cg));
  }
  return c;
}

// The whole-head width for a uniform budget on one side: code unit = that
// many code bits; effective unit = the largest width whose codec stores at
// most `budget` bits per element (format/stored_bytes.h).
int uniform_width(double budget, const std::string& unit, const std::string& quantizer, int d, int group_size,
                  int b_min, int b_max, const char* param) {
  // Fixed-width codecs (llama.cpp cache types, fp16): the budget must admit them.
  const int fixed = quantizer == "q8_0" ? 8 : quantizer == "q4_0" ? 4 : quantizer == "fp16" ? 16 : 0;
  if (fixed > 0) {
    const double need = unit == "code" ? fixed : whole_head_codec(quantizer, fixed, d, group_size, 0).effective_bits(d);
    check_param(unit == "code" ? std::abs(budget - need) < 1e-9 : budget >= need - 1e-9, param,
                "{} ({} bits per element): {} stores {} {} bits per element", budget, unit, quantizer,
                unit == "code" ? "exactly" : "at least", need);
    return fixed;
  }
  int b;
  if (unit == "code") {
    check_param(std::abs(budget - std::round(budget)) < 1e-9, param,
                "{}: with budget unit \"code\" a uniform codec needs a whole number of bits", budget);
    b = (int)std::round(budget);
  } else {
    b = 0;
    for (int w = 1; w <= 8; ++w)
      if (whole_head_codec(quantizer, w, d, group_size, 0).effective_bits(d) <= budget + 1e-9) b = w;
  }
  // The message's metadata is priced at a width the codec has (a code budget of 9 used to fail inside
  // the message, naming the stored-bytes table instead of the argument).
  const int shown = std::clamp(b, std::max(b_min, 1), std::max(b_max, 1));
  check_param(b >= b_min && b <= b_max, param,
              "{} ({} bits per element): gives {} code bits per element, outside {}..{} for {} at head_dim {} "
              "(expected {} {}..{}{}; stored metadata {:.4g} bits per element at {} bits)",
              budget, unit, b, b_min, b_max, quantizer, d,
              unit == "code" ? "a whole number of code bits in" : "a budget that fits a code of", b_min, b_max,
              unit == "code" ? "" : " bits",
              whole_head_codec(quantizer, shown, d, group_size, 0).effective_bits(d) - shown, shown);
  // An effective budget that would fit a code wider than b_max is beyond what the method reaches: refused
  // (it used to give the b_max plan silently, e.g. 64 bits per element -> 8 code bits).
  if (unit != "code") {
    const double top = whole_head_codec(quantizer, b_max, d, group_size, 0).effective_bits(d);
    check_param(budget < top + 1.0 - 1e-9, param,
                "{} (effective bits per element): above what {} reaches: its widest code, {} bits (b_max), stores "
                "{:.4g} bits per element at head_dim {}; expected a budget below {:.4g}",
                budget, quantizer, b_max, top, d, top + 1.0);
  }
  return b;
}

// The width range a quantizer's fitted curves cover: RateQuant only hands out
// widths in [bits.front(), bits.back()] (DistortionCurves::bits). Explicit
// bounds outside it are an error naming the bound and the fitted widths.
std::pair<int, int> fitted_bounds(const DistortionCurves& c, const std::string& curves_name, int b_min, int b_max) {
  const int lo = std::max(1, (int)std::ceil(c.bits.front() - 1e-9));
  const int hi = std::min(8, (int)std::floor(c.bits.back() + 1e-9));
  check(lo <= hi, "distortion curves \"{}\": fitted at {}..{} bits, no width in 1..8", curves_name, c.bits.front(),
        c.bits.back());
  const int bl = b_min < 0 ? lo : b_min, bh = b_max < 0 ? hi : b_max;
  check_param(bl >= lo, "PlanRequest.b_min",
              "{}: the \"{}\" distortion curves were fitted at {}..{} code bits; RateQuant hands out only widths "
              "its curves cover (measure the curves at the widths you need)",
              bl, curves_name, c.bits.front(), c.bits.back());
  check_param(bh <= hi, "PlanRequest.b_max",
              "{}: the \"{}\" distortion curves were fitted at {}..{} code bits; RateQuant hands out only widths "
              "its curves cover (measure the curves at the widths you need)",
              bh, curves_name, c.bits.front(), c.bits.back());
  return {bl, bh};
}

// Bounds of the whole-head widths (uniform, ratequant): 1 <= b_min <= b_max <= 8.
void check_width_bounds(int lo, int hi, const char* method) {
  check_param(lo >= 1 && lo <= 8, "PlanRequest.b_min", "{}: {} needs a lowest width in 1..8", lo, method);
  check_param(hi >= lo && hi <= 8, "PlanRequest.b_max", "{}: {} needs a highest width in {}..8",
              hi, method, lo);
}

void check_uniform_quantizer(const std::string& q, const char* param) {
  check_param(q == "tq-mse" || q == "kivi" || q == "quarot" || q == "q8_0" || q == "q4_0" || q == "fp16", param,
              "\"{}\": expected tq-mse, kivi, quarot, q8_0, q4_0 or fp16", q);
}

void check_quantizer(const std::string& q) {
  check_param(q == "tq-mse" || q == "kivi" || q == "quarot", "PlanRequest.quantizer",
              "\"{}\": expected tq-mse, kivi or quarot", q);
}

const DistortionCurves& curves_of(const Ctx& c, const std::string& name) {
  auto it = c.st.curves.find(name);
  check(it != c.st.curves.end(), "distortion curves \"{}\": not in the statistics file ({})", name,
        what_it_has(c.st.curves, kNoCurves));
  return it->second;
}

RateQuantProblem ratequant_problem(const Ctx& c, const std::string& curves_name, int b_min, int b_max,
                                   int64_t total) {
  const auto& st = c.st;
  // "none": w_i = 1 for every component (the curves alone; with key_weight, the side calibration's ratio).
  const size_t n_comp = (size_t)st.model.n_layers * st.model.n_kv_heads;
  const Sensitivity ones{std::vector<double>(n_comp, 1.0), std::vector<double>(n_comp, 1.0), "", ""};
  auto sit = st.sensitivity.find(c.rq.sensitivity);
  check_param(c.rq.sensitivity == "none" || sit != st.sensitivity.end(), "PlanRequest.sensitivity",
              "\"{}\": not in the statistics file ({}; \"none\" weighs every component 1)", c.rq.sensitivity,
              what_it_has(st.sensitivity, kNoSensitivity));
  const Sensitivity& sens = c.rq.sensitivity == "none" ? ones : sit->second;
  auto cit = st.curves.find(curves_name);
  check(cit != st.curves.end(), "distortion curves \"{}\": not in the statistics file ({})", curves_name,
        what_it_has(st.curves, kNoCurves));
  const size_t n = (size_t)st.model.n_layers * st.model.n_kv_heads;
  // A side whose sensitivities are all 0 (or whose weighted sensitivities w·α are all below the smallest normal
  // double) has no distortion in RateQuant's model: every component of it would get its lowest width and the
  // plan would predict 0 for it — a degenerate plan, not an allocation. Refused, naming the stats field.
  {
    const std::string file = c.rq.stats_file.empty() ? "the statistics" : c.rq.stats_file;
    const auto positive = [](const std::vector<double>& w) {
      return std::any_of(w.begin(), w.end(), [](double x) { return x > 0.0; });
    };
    if (c.rq.sensitivity != "none") {
      const bool k = positive(sens.k), v = positive(sens.v);
      // Named as the file spells them: the JSON form's fields, or the safetensors tensors they are sums of.
      const bool tensors = !sens.k_tensor.empty();
      const std::string field = fmt::format("sensitivity.{}", c.rq.sensitivity);
      const std::string kf = tensors ? sens.k_tensor : field + ".k", vf = tensors ? sens.v_tensor : field + ".v";
      check_param(k || v, "PlanRequest.sensitivity",
                  "\"{}\": every sensitivity in {} is 0 ({} {} and {}, {} components each): RateQuant would "
                  "predict no distortion at any width; expected positive sensitivities (re-measure them, or use "
                  "\"none\" to weigh every component 1)",
                  c.rq.sensitivity, file, tensors ? "tensors" : "fields", kf, vf, n);
      check_param(k && v, "PlanRequest.sensitivity",
                  "\"{}\": every {} sensitivity in {} is 0 ({} {}, {} components): RateQuant would give every "
                  "{} its lowest width and predict no distortion from the {}; expected positive sensitivities on both "
                  "sides (re-measure them, or use \"none\" to weigh every component 1)",
                  c.rq.sensitivity, k ? "value" : "key", file, tensors ? "tensor" : "field", k ? vf : kf, n,
                  k ? "value" : "key", k ? "values" : "keys");
    }
    double top_k = 0.0, top_v = 0.0;
    for (size_t i = 0; i < n; ++i) {
      top_k = std::max(top_k, c.rq.key_weight * sens.k[i] * cit->second.alpha_k[i]);
      top_v = std::max(top_v, sens.v[i] * cit->second.alpha_v[i]);
    }
    constexpr double kNormal = std::numeric_limits<double>::min();
    check_param(top_v >= kNormal, "PlanRequest.sensitivity",
                "\"{}\": the weighted value sensitivities w·α of {} are all below {:g} (largest {:g}): RateQuant "
                "would predict no distortion from the values; expected sensitivities that are not vanishingly small",
                c.rq.sensitivity, file, kNormal, top_v);
    check_param(top_k >= kNormal, c.rq.key_weight != 1.0 ? "PlanRequest.key_weight" : "PlanRequest.sensitivity",
                "{}: the weighted key sensitivities key_weight·w·α of {} are all below {:g} (largest {:g}): RateQuant "
                "would predict no distortion from the keys",
                c.rq.key_weight != 1.0 ? fmt::format("{:g}", c.rq.key_weight) : "\"" + c.rq.sensitivity + "\"",
                file, kNormal, top_k);
  }
  RateQuantProblem p;
  for (size_t i = 0; i < n; ++i)
    for (int side = 0; side < 2; ++side) {
      p.weight.push_back(side == 0 ? c.rq.key_weight * sens.k[i] : sens.v[i]);
      p.alpha.push_back(side == 0 ? cit->second.alpha_k[i] : cit->second.alpha_v[i]);
      p.beta.push_back(side == 0 ? cit->second.beta_k : cit->second.beta_v);
      p.b_min.push_back(b_min);
      p.b_max.push_back(b_max);
    }
  p.total_bits = total;
  return p;
}

// Σ_i a_i β^(−b) with all K components at kb and all V at vb.
double split_cost(const RateQuantProblem& p, int kb, int vb) {
  std::vector<int> bits(p.weight.size());
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = i % 2 == 0 ? kb : vb;
  return ratequant_distortion(p, bits);
}

// Block-GTQ minimizes J(b) = Σ_i s_i 4^(−b_i) over a head's RoPE blocks (alloc/block_gtq.h): where every
// energy s_i of a (layer, KV head) is 0, J is 0 at every allocation and the lowest-cost one (every key block
// dropped) wins — an artefact of the objective, not an allocation. Such statistics (hand-made or broken; real
// queries and keys have energy) are refused, naming the stats file, the fields and the first such head.
void check_block_energies(const CalibStats& st, const PlanRequest& rq, bool centered) {
  const int L = st.model.n_layers, H = st.model.n_kv_heads;
  int n_zero = 0, first_l = -1, first_h = -1;
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      const std::vector<double> s = centered ? st.centered_block_energies(l, h) : st.block_energies(l, h);
      if (std::any_of(s.begin(), s.end(), [](double x) { return x > 0.0; })) continue;
      if (n_zero++ == 0) first_l = l, first_h = h;
    }
  if (n_zero == 0) return;
  const std::string file = rq.stats_file.empty() ? "the statistics" : rq.stats_file;
  fail_param("make_plan.stats",
             "{}: fields q_block_energy and k_block_energy{} are 0 in every RoPE block of {} of {} (layer, KV head)s "
             "(first: layer {} KV head {}): {}'s objective J = Σ s_i 4^(−b_i) over the block energies s_i = (E q_i² + "
             "E k_i²)/2 is 0 at every allocation there, so every key block would be dropped; expected statistics "
             "with positive query/key energies (re-run ratekv calibrate)",
             file, centered ? " (centered by k_pre_mean, PlanRequest.key_offset mean)" : "", n_zero, L * H, first_l,
             first_h, rq.method);
}

}  // namespace

json PlanDiagnostics::to_json() const {
  json j = json::object();
  if (!key_j.empty()) {
    double a = 0, b = 0;
    for (size_t i = 0; i < key_j.size(); ++i) {
      a += key_j[i];
      b += key_j_uniform[i];
    }
    j["block_gtq"] = {{"key_j", key_j}, {"key_j_uniform", key_j_uniform}, {"sum_j", a}, {"sum_j_uniform", b}};
  }
  if (ratequant) {
    const auto& r = *ratequant;
    j["ratequant"] = {{"bits", r.bits},
                      {"distortion", r.distortion},
                      {"relaxed_bits", r.relaxed.bits},
                      {"relaxed_distortion", r.relaxed.distortion},
                      {"relaxed_n_clipped", r.relaxed.n_clipped},
                      {"log_lambda", r.relaxed.log_lambda},
                      {"uniform_continuous_distortion", r.uniform_distortion},
                      {"am_gm", r.am_gm},
                      {"component_order", "(layer * n_kv_heads + head) * 2 + side, side 0 = K, 1 = V"}};
  }
  if (uniform_split)
    j["uniform_split"] = {{"k_bits", uniform_split->k_bits}, {"v_bits", uniform_split->v_bits},
                          {"predicted_distortion", uniform_split->cost}};
  if (predicted_uniform > 0) j["predicted_uniform_distortion"] = predicted_uniform;
  return j;
}

bool allocates_with_ratequant(const PlanRequest& req) {
  return req.method == "ratequant" || req.method == "ratequant+block-gtq" ||
         (req.method == "uniform" && req.avg_bits.has_value());
}

Plan make_plan(const CalibStats& st, const PlanRequest& rq, PlanDiagnostics* diag) {
  st.validate("stats");
  check_param(rq.budget_unit == "effective" || rq.budget_unit == "code", "PlanRequest.budget_unit",
              "\"{}\": expected effective or code", rq.budget_unit);
  // Budgets are bits per element: reject NaN / inf / negative / absurd values here, naming the parameter, before
  // any allocator converts them to integer widths.
  auto check_budget = [](double b, const char* param) {
    check_param(std::isfinite(b) && b >= 0 && b <= 64, param, "{}: expected a finite number of bits per element in 0..64",
                b);
  };
  check_budget(rq.k_bits, "PlanRequest.k_bits");
  check_budget(rq.v_bits, "PlanRequest.v_bits");
  if (rq.avg_bits) check_budget(*rq.avg_bits, "PlanRequest.avg_bits");
  check_param(rq.fp16_window >= 0, "PlanRequest.fp16_window", "{}: expected >= 0", rq.fp16_window);
  check_param(rq.sink_tokens >= 0, "PlanRequest.sink_tokens", "{}: expected >= 0", rq.sink_tokens);
  const std::string vquant = rq.v_quantizer.empty() ? rq.quantizer : rq.v_quantizer;
  for (const std::string& q : {rq.quantizer, vquant})
    if (q == "kivi" || q == "quarot")
      check_param(rq.group_size >= 1 && st.model.head_dim % rq.group_size == 0, "PlanRequest.group_size",
                  "{}: expected a divisor of head_dim {} for {}", rq.group_size, st.model.head_dim, q);
  check_param(std::isfinite(rq.key_weight) && rq.key_weight >= kMinKeyWeight && rq.key_weight <= kMaxKeyWeight,
              "PlanRequest.key_weight", "{}: expected a factor in 1e-6..1e6 (1 = the sensitivities as measured)",
              rq.key_weight);
  static_assert(kMinKeyWeight == 1e-6 && kMaxKeyWeight == 1e6, "the message above states the range");
  check_param(rq.key_weight == 1.0 || allocates_with_ratequant(rq), "PlanRequest.key_weight",
              "{} with method {}: the key weight scales RateQuant's sensitivities (methods "
              "ratequant, ratequant+block-gtq, or uniform with an average budget); this plan uses none",
              rq.key_weight, rq.method);
  // Sensitivities and curves select RateQuant's allocation; a plan that allocates without it would ignore them.
  {
    const bool rq_alloc = allocates_with_ratequant(rq);
    check_param(rq_alloc || rq.sensitivity == "grad", "PlanRequest.sensitivity",
                "\"{}\" with method {}: the sensitivity weighs RateQuant's components (methods ratequant, "
                "ratequant+block-gtq, or uniform with an average budget); this plan uses none",
                rq.sensitivity, rq.method);
    check_param(rq_alloc || rq.curves_from.empty(), "PlanRequest.curves_from",
                "\"{}\" with method {}: distortion curves drive RateQuant's allocation (methods ratequant, "
                "ratequant+block-gtq, or uniform with an average budget); this plan uses none",
                rq.curves_from, rq.method);
  }
  check_param(rq.key_offset == "none" || rq.key_offset == "mean", "PlanRequest.key_offset",
              "\"{}\": expected none or mean", rq.key_offset);
  const bool centered = rq.key_offset == "mean";
  if (centered) {
    check_param(rq.method == "uniform" || rq.method == "block-gtq", "PlanRequest.key_offset",
                "mean with method {}: key offsets are offered for uniform and block-gtq plans (RateQuant's distortion "
                "curves are measured on keys without an offset)", rq.method);
    check_param(!st.k_pre_mean.empty(), "PlanRequest.key_offset",
                "mean: the statistics have no k_pre_mean (statistics from ratekv calibrate have it)");
  }
  PlanDiagnostics local;
  PlanDiagnostics& dg = diag ? *diag : local;
  dg = PlanDiagnostics{};
  const Ctx c{st, rq};
  const int d = c.d(), L = st.model.n_layers, H = st.model.n_kv_heads;

  Plan p;
  p.method = rq.method;
  p.model = st.model;
  p.stats_file = rq.stats_file;
  p.seed = rq.seed;
  p.fp16_window = rq.fp16_window;
  p.sink_tokens = rq.sink_tokens;
  p.budget_unit = rq.budget_unit;
  p.budget_k = rq.k_bits;
  p.budget_v = rq.v_bits;
  p.layers.assign(L, std::vector<HeadPlan>(H));
  auto seed_of = [&](int l, int h, int side) { return group_seed(rq.seed, l, h, side, 0); };

  if (rq.method == "uniform") {
    check_uniform_quantizer(rq.quantizer, "PlanRequest.quantizer");
    check_uniform_quantizer(vquant, "PlanRequest.v_quantizer");
    int lo = rq.b_min < 0 ? 1 : rq.b_min, hi = rq.b_max < 0 ? 8 : rq.b_max;
    check_width_bounds(lo, hi, "uniform");
    int kb, vb;
    if (rq.avg_bits) {
      // RateQuant's uniform baseline at a fractional average.
      check_quantizer(rq.quantizer);
      check_param(vquant == rq.quantizer, "PlanRequest.v_quantizer",
                  "{}: the uniform K/V split at an average budget needs the key quantizer ({}) for the values too",
                  vquant, rq.quantizer);
      const double avg = *rq.avg_bits -
                         (rq.budget_unit == "effective" ? meta_per_element(rq.quantizer, d, rq.group_size) : 0.0);
      const std::string cn = rq.curves_from.empty() ? rq.quantizer : rq.curves_from;
      std::tie(lo, hi) = fitted_bounds(curves_of(c, cn), cn, rq.b_min, rq.b_max);
      const RateQuantProblem prob = ratequant_problem(c, cn, lo, hi, 0);
      dg.uniform_split = best_uniform_split(avg, [&](int k, int v) { return split_cost(prob, k, v); });
      kb = dg.uniform_split->k_bits;
      vb = dg.uniform_split->v_bits;
      check_param(kb >= lo && kb <= hi && vb >= lo && vb <= hi, "PlanRequest.avg_bits",
                  "{}: uniform split K{}V{} is outside {}..{} (the widths the \"{}\" curves were fitted at)",
                  *rq.avg_bits, kb, vb, lo, hi, cn);
      if (rq.budget_unit == "effective") {
        const double stored = 0.5 * (whole_head_codec(rq.quantizer, kb, d, rq.group_size, 0).effective_bits(d) +
                                     whole_head_codec(rq.quantizer, vb, d, rq.group_size, 0).effective_bits(d));
        check_param(stored <= *rq.avg_bits + 1e-9, "PlanRequest.avg_bits",
                    "{} (effective): the uniform split K{}V{} stores {:.4g} bits per element on average, above the "
                    "budget", *rq.avg_bits, kb, vb, stored);
      }
      p.budget_k = p.budget_v = *rq.avg_bits;
    } else {
      kb = uniform_width(rq.k_bits, rq.budget_unit, rq.quantizer, d, rq.group_size, lo, hi, "PlanRequest.k_bits");
      vb = uniform_width(rq.v_bits, rq.budget_unit, vquant, d, rq.group_size, lo, hi, "PlanRequest.v_bits");
    }
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        p.layers[l][h].key = whole_head_codec(rq.quantizer, kb, d, rq.group_size, seed_of(l, h, 0));
        p.layers[l][h].value = whole_head_codec(vquant, vb, d, rq.group_size, seed_of(l, h, 1));
      }
  } else if (rq.method == "block-gtq") {
    // Block-GTQ is TQ-MSE keys (per RoPE block) and TQ-MSE values at k_bits / v_bits: a request naming another
    // codec, an average budget or curves would be silently ignored.
    check_param(rq.quantizer == "tq-mse", "PlanRequest.quantizer",
                "\"{}\": block-gtq quantizes with tq-mse only (other codecs: method uniform or ratequant)",
                rq.quantizer);
    check_param(rq.v_quantizer.empty() || rq.v_quantizer == "tq-mse", "PlanRequest.v_quantizer",
                "\"{}\": block-gtq stores values with tq-mse only", rq.v_quantizer);
    check_param(!rq.avg_bits, "PlanRequest.avg_bits",
                "{}: block-gtq takes separate key and value budgets (k_bits, v_bits); an average budget is for "
                "ratequant and the uniform baseline", rq.avg_bits.value_or(0.0));
    check_param(rq.curves_from.empty(), "PlanRequest.curves_from",
                "\"{}\": block-gtq allocates from the RoPE block energies, not from distortion curves (ratequant "
                "does)", rq.curves_from);
    check_block_energies(st, rq, centered);
    BlockGtqOptions opt;  // the packed format's prices (format/stored_bytes.h)
    opt.b_min = rq.b_min < 0 ? 0 : rq.b_min;
    opt.b_max = rq.b_max < 0 ? 4 : rq.b_max;
    // Stored bits per head per token: code unit = what uniform TQ-MSE at that many code bits stores.
    int64_t kbudget;
    if (rq.budget_unit == "code") {
      check_param(std::abs(rq.k_bits - std::round(rq.k_bits)) < 1e-9 && rq.k_bits >= 1 && rq.k_bits <= 8,
                  "PlanRequest.k_bits",
                  "{} (code): Block-GTQ's code budget names uniform TQ-MSE at a whole number of code bits 1..8, "
                  "whose stored bits it gets",
                  rq.k_bits);
      kbudget = scalar_group_stored_bits(d, (int)std::lround(rq.k_bits));
    } else {
      kbudget = budget_bits_for(rq.k_bits, d);
      // Below the cheapest non-empty key group every block of every head gets 0 bits (the price depends on
      // head_dim only): a plan that stores no key anywhere, attention uniform over the tokens. 0-bit groups are
      // a supported allocation outcome (docs/design.md §3.3: blocks a head can spare); a budget that drops every
      // key of the model is not a Block-GTQ configuration, so it is refused, with the range that is.
      // (With b_min ≥ 1 no block can be dropped: allocate_block_gtq reports a budget below b_min everywhere.)
      const int64_t cheapest = block_group_cost(2, 1, opt);
      check_param(opt.b_min > 0 || opt.b_max == 0 || kbudget >= cheapest, "PlanRequest.k_bits",
                  "{} (effective): block-gtq would store no key at all (the cheapest key group, one RoPE block at "
                  "1 bit with its fp16 norm and {}-channel tile, takes {} bits per head at head_dim {}); expected "
                  "{:g}..{:g} bits per element (b {}..{})",
                  rq.k_bits, opt.tile_channels, cheapest, d, (double)cheapest / d,
                  (double)block_group_cost(d, opt.b_max, opt) / d, opt.b_min, opt.b_max);
    }
    const int vb = uniform_width(rq.v_bits, rq.budget_unit, "tq-mse", d, 0, 1, 8, "PlanRequest.v_bits");
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        const std::vector<double> s = centered ? st.centered_block_energies(l, h) : st.block_energies(l, h);
        BlockAllocation a;
        try {
          a = allocate_block_gtq(s, kbudget, opt);
        } catch (const Error& e) {
          fail_param("PlanRequest.k_bits", "{} ({}): {}", rq.k_bits, rq.budget_unit, e.what());
        }
        // Uniform at the same stored budget, for the J comparison (widths in opt's range).
        BlockGtqOptions uopt = opt;
        double ju = std::nan("");
        try {
          ju = allocate_block_uniform(s, kbudget, uopt).distortion;
        } catch (const Error&) {
        }
        dg.key_j.push_back(a.distortion);
        dg.key_j_uniform.push_back(ju);
        p.layers[l][h].key = grouped_codec(a, rq, l, h);
        p.layers[l][h].value = Codec::tq_mse(vb, d, seed_of(l, h, 1));
      }
  } else if (rq.method == "ratequant" || rq.method == "ratequant+block-gtq") {
    const bool composed = rq.method == "ratequant+block-gtq";
    check_param(rq.v_quantizer.empty() || rq.v_quantizer == rq.quantizer, "PlanRequest.v_quantizer",
                "{}: ratequant uses one quantizer for both sides (the key quantizer, {})", rq.v_quantizer,
                rq.quantizer);
    check_param(!composed || rq.quantizer == "tq-mse", "PlanRequest.quantizer",
                "\"{}\": ratequant+block-gtq quantizes with tq-mse only (Block-GTQ keys, TQ-MSE values)",
                rq.quantizer);
    const std::string quantizer = composed ? "block-gtq" : rq.quantizer;
    if (!composed) check_quantizer(quantizer);
    const std::string cn = rq.curves_from.empty() ? quantizer : rq.curves_from;
    if (composed) check_block_energies(st, rq, false);
    if (rq.b_min >= 0 || rq.b_max >= 0)
      check_width_bounds(rq.b_min < 0 ? 1 : rq.b_min, rq.b_max < 0 ? 8 : rq.b_max, "ratequant");
    const auto [lo, hi] = fitted_bounds(curves_of(c, cn), cn, rq.b_min, rq.b_max);
    check_width_bounds(lo, hi, "ratequant");
    const double avg = rq.avg_bits ? *rq.avg_bits : 0.5 * (rq.k_bits + rq.v_bits);
    const char* avg_param = rq.avg_bits ? "PlanRequest.avg_bits" : "PlanRequest.k_bits";
    // The budget as the request gave it: avg_bits, or the mean of k_bits and v_bits (named both).
    const std::string shown =
        rq.avg_bits ? fmt::format("{}", avg)
                    : fmt::format("{} and PlanRequest.v_bits {}: a mean of {}", rq.k_bits, rq.v_bits, avg);
    const int64_t M = 2 * (int64_t)L * H;
    // What one component stores per token at width b (key and value alike: a composed key splits
    // exactly uniform TQ-MSE's stored bits at b over its blocks).
    auto stored_bits = [&](int b) {
      return composed ? scalar_group_stored_bits(d, b)
                      : (int64_t)std::llround(whole_head_codec(quantizer, b, d, rq.group_size, 0).effective_bits(d) * d);
    };
    // A budget above every component at the widest fitted width cannot be spent: refused, naming the
    // maximum (it used to give the all-b_max plan silently, e.g. avg_bits 20 -> 5 code bits).
    {
      const double top = rq.budget_unit == "code" ? (double)hi : (double)stored_bits(hi) / d;
      check_param(avg <= top + 1e-9, avg_param,
                  "{} ({} bits per element): above what {} reaches with the \"{}\" curves: every component at its "
                  "widest width, {} code bits ({}), stores {:.4g} bits per element; expected at most {:.4g} bits per "
                  "element",
                  shown, rq.budget_unit, rq.method, cn, hi,
                  rq.b_max >= 0 ? "PlanRequest.b_max" : "the curves' widest fitted width", top, top);
      // Below every component at its lowest width: the allocator's own message named no parameter.
      const double bottom = rq.budget_unit == "code" ? (double)lo : (double)stored_bits(lo) / d;
      check_param(avg >= bottom - 1e-9, avg_param,
                  "{} ({} bits per element): below what {} reaches with the \"{}\" curves: every component at its "
                  "lowest width, {} code bits ({}), stores {:.4g} bits per element; expected at least {:.4g}",
                  shown, rq.budget_unit, rq.method, cn, lo,
                  rq.b_min >= 0 ? "PlanRequest.b_min" : "the curves' lowest fitted width", bottom, bottom);
    }
    if (rq.budget_unit == "code") {
      const double t = avg * (double)M;
      check_param(std::abs(t - std::round(t)) < 1e-6, avg_param,
                  "{}: {} components × {} = {} is not a whole number of bits; choose an average that is a "
                  "multiple of 1/{}",
                  avg, M, avg, t, M);
      try {
        dg.ratequant = allocate_ratequant(ratequant_problem(c, cn, lo, hi, (int64_t)std::llround(t)));
      } catch (const ParamError&) {
        throw;
      } catch (const Error& e) {
        fail_param(avg_param, "{} (code): {}", shown, e.what());
      }
    } else {
      // Stored bits: Σ_i stored_bits(b_i) ≤ avg · d · M, exactly (widths > 4 store an extension norm).
      const RateQuantProblem prob = ratequant_problem(c, cn, lo, hi, 0);
      std::vector<std::vector<int64_t>> price((size_t)M);
      for (auto& row : price)
        for (int b = lo; b <= hi; ++b) row.push_back(stored_bits(b));
      const int64_t budget = (int64_t)std::floor(avg * d * (double)M + 1e-9);
      try {
        dg.ratequant = allocate_ratequant_priced(prob, price, budget);
      } catch (const Error& e) {
        fail_param(avg_param, "{} (effective): {}", shown, e.what());
      }
    }
    int64_t total = 0;
    for (int b : dg.ratequant->bits) total += b;
    dg.predicted_uniform = 0.0;
    {
      const RateQuantProblem prob = ratequant_problem(c, cn, lo, hi, total);
      const double code_avg = (double)total / M;
      dg.uniform_split = best_uniform_split(std::clamp(code_avg, (double)lo, (double)hi),
                                            [&](int k, int v) { return split_cost(prob, k, v); });
      dg.predicted_uniform = dg.uniform_split->cost;
    }
    p.budget_k = p.budget_v = avg;
    const auto& bits = dg.ratequant->bits;
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        const size_t i = ((size_t)l * H + h) * 2;
        const int kb = bits[i], vb = bits[i + 1];
        if (composed) {
          const BlockGtqOptions opt{0, 8};
          const BlockAllocation a = allocate_block_gtq(st.block_energies(l, h), scalar_group_stored_bits(d, kb), opt);
          p.layers[l][h].key = grouped_codec(a, rq, l, h);
          p.layers[l][h].value = Codec::tq_mse(vb, d, seed_of(l, h, 1));
        } else {
          p.layers[l][h].key = whole_head_codec(quantizer, kb, d, rq.group_size, seed_of(l, h, 0));
          p.layers[l][h].value = whole_head_codec(quantizer, vb, d, rq.group_size, seed_of(l, h, 1));
        }
      }
  } else {
    fail_param("PlanRequest.method", "\"{}\": expected uniform, block-gtq, ratequant or ratequant+block-gtq",
               rq.method);
  }
  // Codec options: norm correction on the TQ-MSE codecs, the key offsets (docs/design.md §2.4, §2.5).
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      for (Codec* cd : {&p.layers[l][h].key, &p.layers[l][h].value})
        if (rq.norm_correction && (cd->kind == CodecKind::TqMse || cd->kind == CodecKind::TqMseGrouped))
          cd->norm_correction = true;
      Codec& k = p.layers[l][h].key;
      if (centered && k.kind != CodecKind::FP16) {
        const double* mu = st.k_pre_mean.data() + ((size_t)l * H + h) * d;
        k.offset.resize(d);
        for (int i = 0; i < d; ++i) {
          // A mean beyond fp16 was reported as the plan's own offset being invalid (plan.validate below).
          check(std::isfinite(mu[i]) && std::abs(mu[i]) <= 65504.0,
                "{}: k_pre_mean[layer {}, KV head {}, channel {}] = {}: outside the fp16 range ±65504 the key "
                "offset is stored in (PlanRequest.key_offset mean)",
                rq.stats_file.empty() ? "the statistics" : rq.stats_file, l, h, i, mu[i]);
          k.offset[i] = round_fp16((float)mu[i]);
        }
      }
    }
  if (centered) p.method += "+key-offset";
  p.validate("plan");
  std::string first;
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h)
      for (int side = 0; side < 2; ++side) {
        const Codec& cd = side == 0 ? p.layers[l][h].key : p.layers[l][h].value;
        if (cd.kind == CodecKind::FP16) continue;
        bool any = false;
        for (const auto& g : cd.groups) any = any || g.bits > 0;
        if (any) continue;
        if (dg.zero_bit_sides++ == 0) first = fmt::format("layer {} KV head {} {}", l, h, side == 0 ? "keys" : "values");
      }
  if (dg.zero_bit_sides > 0)
    spdlog::warn("plan: {} of {} (layer, KV head, side) codecs store 0 bits (first: {}): keys scored 0 / values "
                 "dropped there; raise the budget or the lowest width if that is not intended",
                 dg.zero_bit_sides, 2 * L * H, first);
  return p;
}

std::string plan_summary(const Plan& p) {
  const int d = p.model.head_dim;
  std::string out = fmt::format(
      "plan: method {}, model {} ({} layers × {} KV heads, head_dim {}, {}), budget {} K {} V {}\n", p.method,
      p.model.file.empty() ? p.model.arch : p.model.file, p.model.n_layers, p.model.n_kv_heads, d,
      p.model.rope_layout, p.budget_unit, p.budget_k, p.budget_v);
  out += "widths: bits:count, counting RoPE blocks for tq-mse-grouped and heads otherwise\n";
  out += fmt::format("{:>5}  {:<32} {:>7}  {:<24} {:>7}\n", "layer", "K widths", "K eff", "V widths", "V eff");
  auto hist = [&](const std::vector<HeadPlan>& heads, bool key) {
    std::map<int, int, std::greater<>> count;
    bool grouped = false;
    for (const auto& h : heads) {
      const Codec& c = key ? h.key : h.value;
      if (c.kind == CodecKind::FP16) count[16]++;
      for (const auto& g : c.groups) {
        if (c.kind == CodecKind::TqMseGrouped) {
          count[g.bits] += (int)g.blocks.size();
          grouped = true;
        } else {
          count[g.bits]++;
        }
      }
    }
    std::string s = grouped ? "blk " : "";
    for (const auto& [b, n] : count) s += fmt::format("{}:{} ", b, n);
    return s;
  };
  for (size_t l = 0; l < p.layers.size(); ++l) {
    double ke = 0, ve = 0;
    for (const auto& h : p.layers[l]) {
      ke += h.key.effective_bits(d);
      ve += h.value.effective_bits(d);
    }
    ke /= p.layers[l].size();
    ve /= p.layers[l].size();
    out += fmt::format("{:>5}  {:<32} {:>7.4f}  {:<24} {:>7.4f}\n", l, hist(p.layers[l], true), ke,
                       hist(p.layers[l], false), ve);
  }
  const auto a = p.achieved();
  out += fmt::format("achieved stored bits/element: K {:.4f}  V {:.4f}  total {:.4f}   (code bits: K {:.4f}  V {:.4f})\n",
                     a.k, a.v, a.total, a.k_code, a.v_code);
  const PlanStoredBytes sb = plan_stored_bytes(p);
  auto parts = [](const StoredBytes& b) {
    return fmt::format("codes {:g}, padding {:g}, norms {:g}, scales {:g}, fp16 {:g}", b.codes / 64.0, b.padding / 64.0,
                       b.norms / 64.0, b.scales / 64.0, b.fp16 / 64.0);
  };
  out += fmt::format("stored bytes/token (all layers and KV heads): {:g} = K {:g} ({}) + V {:g} ({})", sb.bytes_per_token(),
                     sb.k.per_token(), parts(sb.k), sb.v.per_token(), parts(sb.v));
  if (sb.per_sequence_max > 0)
    out += fmt::format("; per sequence up to {} bytes more (KIVI keys' unfilled token group, fp16)", sb.per_sequence_max);
  if (sb.fixed_bytes > 0) {
    const int64_t cb = plan_codebook_bytes(p), off = plan_offset_bytes(p);
    out += fmt::format("; per plan {} bytes (fp16:", sb.fixed_bytes);
    if (cb > 0) out += fmt::format(" vq codebooks {}", cb);
    if (off > 0) out += fmt::format("{} key offsets {}", cb > 0 ? "," : "", off);
    out += ")";
  }
  out += "\n";
  return out;
}

}  // namespace ratekv::alloc
