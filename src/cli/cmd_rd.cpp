// `ratekv rd` — measure rate–distortion curves D(b) of the quantizers on
// vectors (random Gaussian, random unit, or a captured (N, m) float32 file) and
// fit D(b) = α β^(−b) per quantizer (docs/design.md §2.2, §4.2).
//
// D is the normalized distortion Σ‖x − x̂‖² / Σ‖x‖² over the N rows (for unit
// vectors this is E‖u − û‖²), averaged over --n-seeds quantizer seeds (the
// spread is reported). Bits on the fit's axis are code bits b; effective bits
// (metadata included) are printed beside them.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "ratekv/common/error.h"
#include "ratekv/io/npy.h"
#include "ratekv/quant/prng.h"
#include "ratekv/quant/quantizer.h"
#include "ratekv/quant/rd_fit.h"

namespace ratekv::cli {
namespace {

struct RdOptions {
  std::string data = "gaussian";
  int dim = 128;
  int64_t n = 4096;
  std::vector<int> bits = {1, 2, 3, 4, 5};
  std::vector<std::string> quantizers = {"tq_mse", "tq_prod", "kivi_key", "kivi_value", "quarot", "q4_0", "q8_0"};  // q4_0 / q8_0: native width only
  int group_size = 32;
  std::string rotation = "haar";
  uint64_t seed = 0;
  int n_seeds = 3;
  std::string side = "any";
  std::string json_path;
  bool force = false;
  bool dim_given = false;  // --dim on the command line (a .npy file must then have that many columns)
};

// Reads a float32 matrix (N, m): .npy (little-endian '<f4', C order, 2-D;
// read_npy_f32) or raw .f32 (needs m). At most n_rows rows when n_rows > 0;
// sets m and n_rows to what was read. With dim_given, a .npy file must have m
// columns. Throws Error naming the file and what is wrong.
std::vector<float> load_vectors(const std::string& path, int& m, int64_t& n_rows, bool dim_given) {
  std::error_code ec;
  check(std::filesystem::exists(path, ec), "--data: '{}' does not exist (expected gaussian, unit, or the path of a "
        ".npy / raw .f32 file)", path);
  check(std::filesystem::is_regular_file(path, ec), "--data: '{}' is not a regular file (expected gaussian, unit, or "
        "the path of a .npy / raw .f32 file)", path);
  std::ifstream f(path, std::ios::binary);
  check((bool)f, "--data: cannot open '{}'", path);
  char magic[6] = {};
  f.read(magic, 6);
  // A file named .npy is read as .npy whatever its first bytes (read_npy_f32 then names a missing magic), never
  // as raw floats: a damaged or mislabeled .npy would otherwise give silently wrong numbers.
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return (char)std::tolower(c); });
  if (ext == ".npy" || (f.gcount() == 6 && std::memcmp(magic, "\x93NUMPY", 6) == 0)) {
    f.close();
    NpyMatrix x = read_npy_f32(path, "--data");
    check(!dim_given || x.cols == m, "--dim {}: --data '{}' has {} columns (leave --dim out for a .npy file)", m, path,
          x.cols);
    const int64_t rows = n_rows > 0 ? std::min(x.rows, n_rows) : x.rows;
    x.data.resize((size_t)(rows * x.cols));
    m = (int)x.cols;  // ≤ 2^20 (read_npy_f32)
    n_rows = rows;
    return std::move(x.data);
  }
  f.clear();
  f.seekg(0);
  std::vector<char> buf((std::istreambuf_iterator<char>(f)), {});
  check(m >= 1, "--dim: a raw .f32 file needs the vector dimension (got {})", m);
  check(buf.size() % (4 * (size_t)m) == 0 && !buf.empty(),
        "--data: '{}': raw float32 file of {} bytes is not a whole number of {}-float rows (--dim {})", path,
        buf.size(), m, m);
  int64_t rows = (int64_t)(buf.size() / (4 * (size_t)m));
  if (n_rows > 0) rows = std::min(rows, n_rows);
  n_rows = rows;
  std::vector<float> x((size_t)rows * m);
  std::memcpy(x.data(), buf.data(), x.size() * 4);
  for (size_t i = 0; i < x.size(); ++i)
    check(std::isfinite(x[i]), "--data: '{}': non-finite value at row {}, column {}", path, i / m, i % m);
  return x;
}

// The description of quantizer `name` at b bits, or null if the format does
// not offer b (symmetric QuaRot needs b ≥ 2). q8_0 / q4_0 have one width.
nlohmann::json describe(const std::string& name, int b, int m, uint64_t seed, const RdOptions& o) {
  using nlohmann::json;
  if (name == "tq_mse") return {{"kind", "tq_mse"}, {"dim", m}, {"bits", b}, {"seed", seed}, {"rotation", o.rotation}};
  if (name == "tq_prod") return {{"kind", "tq_prod"}, {"dim", m}, {"bits", b}, {"seed", seed}, {"rotation", o.rotation}};
  if (name == "kivi_key") return {{"kind", "kivi_key"}, {"dim", m}, {"bits", b}, {"group_size", o.group_size}};
  if (name == "kivi_value") return {{"kind", "kivi_value"}, {"dim", m}, {"bits", b}, {"group_size", o.group_size}};
  if (name == "quarot") {
    if (b < 2) return nullptr;
    return {{"kind", "quarot"}, {"dim", m}, {"bits", b}, {"seed", seed}};
  }
  if (name == "q8_0") return json{{"kind", "q8_0"}, {"dim", m}};
  if (name == "q4_0") return json{{"kind", "q4_0"}, {"dim", m}};
  fail("--quantizers: unknown quantizer '{}' (expected tq_mse, tq_prod, kivi_key, kivi_value, quarot, q8_0, q4_0)",
       name);
}

bool is_seeded(const std::string& name) { return name == "tq_mse" || name == "tq_prod" || name == "quarot"; }

void run_rd(const RdOptions& o) {
  using nlohmann::json;
  check(o.n_seeds >= 1 && o.n_seeds <= 1000, "--n-seeds: {} is out of range (expected 1..1000)", o.n_seeds);
  check(!o.bits.empty(), "--bits: give at least one bit width");
  for (int b : o.bits) check(b >= 1 && b <= 8, "--bits: {} is out of range (expected 1..8)", b);
  const std::optional<int> twice = first_repeat(o.bits);
  check(!twice, "--bits: {} is listed twice (each width is measured once)", twice.value_or(0));
  if (!o.json_path.empty() && o.json_path != "-") check_output_path(o.json_path, o.force, "--json");
  check(!o.quantizers.empty(), "--quantizers: give at least one quantizer");
  auto has = [&](const char* q) { return std::find(o.quantizers.begin(), o.quantizers.end(), q) != o.quantizers.end(); };
  for (const auto& q : o.quantizers) (void)describe(q, 2, 32, 0, o);  // unknown names, before any data is made
  const bool kivi = has("kivi_key") || has("kivi_value");
  check(!kivi || (o.group_size >= 1 && o.group_size <= 65536),
        "--group-size {}: expected 1..65536 (the KIVI group: tokens for kivi_key, channels for kivi_value)",
        o.group_size);
  check(o.rotation == "haar" || o.rotation == "hadamard" || o.rotation == "identity",
        "--rotation '{}': expected haar, hadamard or identity", o.rotation);
  check(o.side == "key" || o.side == "value" || o.side == "any", "--side '{}': expected key, value or any", o.side);

  int m = o.dim;
  int64_t n = o.n;
  std::vector<float> x;
  if (o.data == "gaussian" || o.data == "unit") {
    check(m >= 2 && m <= 65536, "--dim: {} is out of range (expected 2..65536)", m);
    check(n >= 1 && n <= (int64_t)1 << 24, "--n: {} is out of range (expected 1..2^24)", n);
    check((double)n * m <= 1e9, "--n × --dim = {} elements is too many (at most 1e9)", (double)n * m);
    quant::SplitMix64 rng(quant::mix_seed(o.seed, 0xda7a));
    x.resize((size_t)n * m);
    for (auto& v : x) v = (float)rng.gaussian();
    if (o.data == "unit")
      for (int64_t i = 0; i < n; ++i) {
        double s = 0;
        for (int j = 0; j < m; ++j) s += (double)x[i * m + j] * x[i * m + j];
        for (int j = 0; j < m; ++j) x[i * m + j] = (float)(x[i * m + j] / std::sqrt(s));
      }
  } else {
    check(n >= 0, "--n: {} is out of range (a file: 0 = all rows, or at most this many rows)", n);
    x = load_vectors(o.data, m, n, o.dim_given);
  }

  // The data's shape against the quantizers, in the flags' words (the quantizers' own errors name their
  // description fields: "q4_0: dim 100 …", "rotation: randomized Hadamard …").
  const bool tq = has("tq_mse") || has("tq_prod");
  check(!tq || o.rotation != "hadamard" || (m & (m - 1)) == 0,
        "--rotation hadamard: the randomized Hadamard transform needs a power-of-two dimension, --dim / the data has "
        "{} (use --rotation haar)", m);
  for (const char* g : {"q4_0", "q8_0"})
    check(!has(g) || m % 32 == 0,
          "--quantizers {}: llama.cpp's blocks hold 32 values; --dim / the data has {} (a multiple of 32 needed)", g,
          m);
  // KIVI key groups: kivi_key quantizes groups of --group-size tokens and keeps the rest (N mod group) in fp16;
  // with fewer than one group of vectors nothing is quantized and the "fit" is one of fp16 rounding. (kivi_value
  // groups channels; a group wider than the vector is the whole vector, quant/kivi.h.)
  check(!has("kivi_key") || o.group_size <= n,
        "--group-size {}: kivi_key quantizes groups of that many vectors (tokens), and there are only {} (--n / the "
        "data's rows): nothing would be quantized; expected --group-size ≤ {} (or leave kivi_key out of "
        "--quantizers)", o.group_size, n, n);

  json points = json::array(), fits = json::array();
  std::string table = fmt::format("{:<11} {:>4} {:>9} {:>12} {:>12} {:>12}\n", "quantizer", "bits", "eff_bits",
                                  "D_mean", "D_min", "D_max");
  std::string skipped;  // widths a quantizer does not offer, named under the table
  std::string fit_table =
      fmt::format("{:<11} {:>10} {:>8} {:>10} {:>9}\n", "quantizer", "alpha", "beta", "bit_range", "rmse_ln");
  for (const auto& name : o.quantizers) {
    std::vector<quant::RDPoint> curve;
    // Fixed-width formats are measured once, at their own width, whatever --bits says.
    const std::vector<int> widths = name == "q8_0" ? std::vector<int>{8} : name == "q4_0" ? std::vector<int>{4} : o.bits;
    for (int b : widths) {
      if (describe(name, b, m, 0, o).is_null()) {
        skipped += fmt::format("{} at {} bit: not measured (symmetric QuaRot needs >= 2 code bits)\n", name, b);
        continue;
      }
      const int ns = is_seeded(name) ? o.n_seeds : 1;
      std::vector<double> ds;
      double eff = 0;
      json desc0;
      for (int s = 0; s < ns; ++s) {
        const json desc = describe(name, b, m, quant::mix_seed(o.seed, 1000 + s), o);
        auto q = quant::make_quantizer(desc);
        if (s == 0) desc0 = desc;
        eff = q->bits_per_element((int64_t)n);
        ds.push_back(quant::relative_distortion(*q, x.data(), n));
      }
      double mean = 0;
      for (double d : ds) mean += d / ds.size();
      const double dmin = *std::min_element(ds.begin(), ds.end()), dmax = *std::max_element(ds.begin(), ds.end());
      table += fmt::format("{:<11} {:>4} {:>9.4f} {:>12.6g} {:>12.6g} {:>12.6g}\n", name, b, eff, mean, dmin, dmax);
      points.push_back({{"quantizer", name}, {"side", o.side}, {"bits", b}, {"effective_bits", eff},
                        {"distortion", mean}, {"distortion_per_seed", ds}, {"description", desc0}});
      if (mean > 0) curve.push_back({(double)b, mean});
    }
    if (curve.size() >= 2) {
      const auto f = quant::fit_rd(curve);
      fit_table += fmt::format("{:<11} {:>10.4g} {:>8.4f} {:>10} {:>9.4f}\n", name, f.alpha, f.beta,
                               fmt::format("{}..{}", f.bits_min, f.bits_max), f.rmse_log);
      fits.push_back({{"quantizer", name}, {"side", o.side}, {"alpha", f.alpha}, {"beta", f.beta},
                      {"bits_min", f.bits_min}, {"bits_max", f.bits_max}, {"rmse_log", f.rmse_log},
                      {"n_points", curve.size()}});
    }
  }
  const json out = {{"command", "ratekv rd"},
                    {"data", o.data},
                    {"dim", m},
                    {"n_vectors", n},
                    {"seed", o.seed},
                    {"n_seeds", o.n_seeds},
                    {"side", o.side},
                    {"distortion", "sum ||x - xhat||^2 / sum ||x||^2 over all vectors, mean over seeds"},
                    {"fit", "D(b) = alpha * beta^(-b), least squares on ln D over the listed code bits b"},
                    {"kivi_group_size", o.group_size},
                    {"points", points},
                    {"fits", fits}};
  if (o.json_path == "-") {
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  // A fit needs two widths with a nonzero distortion; say so instead of printing an empty table.
  if (fits.empty())
    fit_table = "no fit: D(b) = alpha * beta^(-b) needs at least two --bits widths with a nonzero distortion\n";
  std::printf("data %s, m = %d, N = %lld vectors, %d seed(s), side %s; D = Σ‖x − x̂‖² / Σ‖x‖² (relative "
              "distortion; mean/min/max over seeds)\n\n%s%s\n%s",
              o.data.c_str(), m, (long long)n, o.n_seeds, o.side.c_str(), table.c_str(), skipped.c_str(),
              fit_table.c_str());
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    check((bool)f, "--json: cannot write '{}'", o.json_path);
    f << out.dump(2) << "\n";
    f.close();  // a full disk shows at close, not at <<
    check((bool)f, "--json: write to '{}' failed", o.json_path);
  }
}

const Registrar reg{"rd", [](CLI::App& app) {
  auto opt = std::make_shared<RdOptions>();
  auto* sub = app.add_subcommand(
      "rd", "Measure distortion D(b) of each quantizer at chosen bit widths and fit D(b) = α β^(−b).");
  sub->add_option("--data", opt->data, "gaussian | unit | PATH of an (N, m) float32 .npy or raw .f32 file")
      ->capture_default_str();
  auto* dim_opt =
      sub->add_option("--dim", opt->dim, "vector dimension m (generated data and raw .f32 files; .npy: its columns)")
          ->capture_default_str();
  auto* n_opt = sub->add_option("--n", opt->n,
                                 "number of vectors (generated data; files: at most this many rows, default or 0: all)")
                    ->capture_default_str();
  add_list_option(sub, "--bits", opt->bits, "code bit widths, e.g. 1,2,3,4,5");
  add_list_option(sub, "--quantizers", opt->quantizers, "tq_mse,tq_prod,kivi_key,kivi_value,quarot,q4_0,q8_0");
  sub->add_option("--group-size", opt->group_size, "KIVI group size (keys: tokens, values: channels)")
      ->capture_default_str();
  sub->add_option("--rotation", opt->rotation, "TQ rotation: haar | hadamard | identity")->capture_default_str();
  sub->add_option("--seed", opt->seed, "seed of the data and of the quantizer seeds")
      ->capture_default_str()
      ->check(seed_validator());
  sub->add_option("--n-seeds", opt->n_seeds, "quantizer seeds averaged per point (seeded kinds)")
      ->capture_default_str();
  sub->add_option("--side", opt->side, "label for the data: key | value | any")->capture_default_str();
  sub->add_option("--json", opt->json_path, "write results as JSON to PATH ('-' = stdout instead of the table)")
      ->check(non_empty_path_validator("a file to write the JSON to, or - for stdout"));
  sub->add_flag("--force", opt->force, "overwrite the --json file if it exists");
  sub->callback([opt, n_opt, dim_opt] {
    opt->dim_given = dim_opt->count() > 0;
    // Files: all rows unless --n is given (also when it is given as 4096, the generated-data default).
    if (opt->data != "gaussian" && opt->data != "unit" && n_opt->count() == 0) opt->n = 0;
    run_rd(*opt);
  });
}};

}  // namespace
}  // namespace ratekv::cli
