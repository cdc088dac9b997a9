// The on-disk reference passes of evaluation windows (eval/reference_cache.h).
#include "ratekv/eval/reference_cache.h"

#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "ratekv/common/error.h"
#include "ratekv/io/safetensors.h"
#include "ratekv/io/sha256.h"

namespace ratekv::eval {

namespace {

constexpr const char* kFormat = "ratekv-eval-reference";
constexpr int kVersion = 1;

int64_t per_window(int64_t ctx) { return ctx - 1 - ctx / 2; }

}  // namespace

std::string reference_key(const std::string& model_sha256, int64_t ctx, int32_t bos_id,
                          std::span<const int32_t> tokens) {
  std::string s = model_sha256 + "|" + std::to_string(ctx) + "|" + std::to_string(bos_id) + "|";
  std::vector<uint8_t> bytes(s.begin(), s.end());
  const auto* t = reinterpret_cast<const uint8_t*>(tokens.data());
  bytes.insert(bytes.end(), t, t + tokens.size_bytes());
  return sha256_hex(bytes);
}

ReferenceCache::ReferenceCache(std::string dir, std::string key, ReferenceShape shape)
    : dir_(std::move(dir)), key_(std::move(key)), shape_(shape) {
  check(!dir_.empty(), "reference cache: empty directory name");
  check(shape_.ctx >= 4 && shape_.n_vocab >= 1 && shape_.n_layers >= 1 && shape_.n_heads >= 1 &&
            shape_.n_kv_heads >= 1 && shape_.head_dim >= 1,
        "reference cache: invalid shape (ctx {}, n_vocab {}, layers {}, heads {}/{}, head_dim {})", shape_.ctx,
        shape_.n_vocab, shape_.n_layers, shape_.n_heads, shape_.n_kv_heads, shape_.head_dim);
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  check(!ec && std::filesystem::is_directory(dir_), "reference cache '{}': cannot create the directory ({})", dir_,
        ec ? ec.message() : "not a directory");
}

std::string ReferenceCache::path(int64_t window) const {
  return (std::filesystem::path(dir_) / ("window" + std::to_string(window) + ".safetensors")).string();
}

std::optional<WindowReference> ReferenceCache::load(int64_t window, bool need_perplexity) const {
  const std::string p = path(window);
  if (!std::filesystem::exists(p)) return std::nullopt;
  const SafetensorsFile f = SafetensorsFile::open(p);
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(f.metadata_value("ratekv"));
  } catch (const nlohmann::json::exception& e) {
    fail("reference cache '{}': metadata 'ratekv' is not JSON ({})", p, e.what());
  }
  check(m.value("format", "") == kFormat && m.value("version", 0) == kVersion,
        "reference cache '{}': format {} version {} (expected {} version {})", p, m.value("format", "?"),
        m.value("version", 0), kFormat, kVersion);
  check(m.value("key", "") == key_,
        "reference cache '{}': made for another model, text or window set (key {}, expected {}); remove it or use "
        "another cache directory", p, m.value("key", ""), key_);
  const ReferenceShape& s = shape_;
  const bool same = m.value("window", -1) == window && m.value("ctx", 0) == s.ctx &&
                    m.value("n_vocab", 0) == s.n_vocab && m.value("n_layers", 0) == s.n_layers &&
                    m.value("n_heads", 0) == s.n_heads && m.value("n_kv_heads", 0) == s.n_kv_heads &&
                    m.value("head_dim", 0) == s.head_dim;
  check(same, "reference cache '{}': shape {} does not match window {} of ctx {}, n_vocab {}, {} layers, {}/{} heads, "
        "head_dim {}", p, m.dump(), window, s.ctx, s.n_vocab, s.n_layers, s.n_heads, s.n_kv_heads, s.head_dim);
  WindowReference w;
  w.perplexity = m.value("perplexity", false);
  if (need_perplexity && !w.perplexity) return std::nullopt;
  check(m.contains("fp_nll") && m["fp_nll"].is_number(), "reference cache '{}': metadata lacks fp_nll", p);
  w.fp_nll = m["fp_nll"].get<double>();
  const int64_t pw = per_window(s.ctx), T = s.ctx;
  f.expect("pos", StDtype::I32, {T});
  w.pos = f.read_i32("pos");
  if (w.perplexity) {
    f.expect("ref_logits", StDtype::F32, {pw, s.n_vocab});
    f.expect("fp_kld", StDtype::F32, {pw});
    f.expect("fp_delta_p", StDtype::F32, {pw});
    f.expect("fp_top1", StDtype::U8, {pw});
    w.ref_logits = f.read_f32("ref_logits");
    const std::vector<float> kld = f.read_f32("fp_kld"), dp = f.read_f32("fp_delta_p");
    const std::vector<uint8_t> top1 = f.read_u8("fp_top1");
    for (int64_t i = 0; i < pw; ++i) w.fp_vs_ref.push_back({kld[i], top1[i] != 0, dp[i]});
  }
  w.layers.resize(s.n_layers);
  for (int l = 0; l < s.n_layers; ++l) {
    const std::string L = std::to_string(l);
    f.expect("q_post." + L, StDtype::F32, {T, s.n_heads, s.head_dim});
    for (const char* n : {"k_pre.", "k_post.", "v."}) f.expect(n + L, StDtype::F32, {T, s.n_kv_heads, s.head_dim});
    w.layers[l].q_post = f.read_f32("q_post." + L);
    w.layers[l].k_pre = f.read_f32("k_pre." + L);
    w.layers[l].k_post = f.read_f32("k_post." + L);
    w.layers[l].v = f.read_f32("v." + L);
  }
  return w;
}

void ReferenceCache::save(int64_t window, const WindowReference& w) const {
  const ReferenceShape& s = shape_;
  const int64_t pw = per_window(s.ctx), T = s.ctx;
  const std::string p = path(window);
  check(static_cast<int64_t>(w.pos.size()) == T && static_cast<int>(w.layers.size()) == s.n_layers,
        "reference cache '{}': window has {} positions and {} layers (expected {} and {})", p, w.pos.size(),
        w.layers.size(), T, s.n_layers);
  SafetensorsWriter out;
  out.add_i32("pos", {T}, w.pos);
  if (w.perplexity) {
    check(static_cast<int64_t>(w.ref_logits.size()) == pw * s.n_vocab &&
              static_cast<int64_t>(w.fp_vs_ref.size()) == pw,
          "reference cache '{}': {} logits and {} comparisons (expected {} and {})", p, w.ref_logits.size(),
          w.fp_vs_ref.size(), pw * s.n_vocab, pw);
    out.add_f32("ref_logits", {pw, s.n_vocab}, w.ref_logits);
    std::vector<float> kld, dp;
    std::vector<uint8_t> top1;
    for (const TokenComparison& c : w.fp_vs_ref) {
      kld.push_back(static_cast<float>(c.kld));
      dp.push_back(static_cast<float>(c.delta_p));
      top1.push_back(c.same_top1 ? 1 : 0);
    }
    out.add_f32("fp_kld", {pw}, kld);
    out.add_f32("fp_delta_p", {pw}, dp);
    out.add_u8("fp_top1", {pw}, top1);
  }
  for (int l = 0; l < s.n_layers; ++l) {
    const WindowReference::Layer& L = w.layers[l];
    const std::string n = std::to_string(l);
    const size_t kv = static_cast<size_t>(T) * s.n_kv_heads * s.head_dim;
    check(L.q_post.size() == static_cast<size_t>(T) * s.n_heads * s.head_dim && L.k_pre.size() == kv &&
              L.k_post.size() == kv && L.v.size() == kv,
          "reference cache '{}': layer {} activations have the wrong sizes", p, l);
    out.add_f32("q_post." + n, {T, s.n_heads, s.head_dim}, L.q_post);
    out.add_f32("k_pre." + n, {T, s.n_kv_heads, s.head_dim}, L.k_pre);
    out.add_f32("k_post." + n, {T, s.n_kv_heads, s.head_dim}, L.k_post);
    out.add_f32("v." + n, {T, s.n_kv_heads, s.head_dim}, L.v);
  }
  const nlohmann::json m = {{"format", kFormat},      {"version", kVersion},        {"key", key_},
                            {"window", window},       {"ctx", s.ctx},               {"n_vocab", s.n_vocab},
                            {"n_layers", s.n_layers}, {"n_heads", s.n_heads},       {"n_kv_heads", s.n_kv_heads},
                            {"head_dim", s.head_dim}, {"perplexity", w.perplexity}, {"fp_nll", w.fp_nll}};
  out.set_metadata("ratekv", m.dump());
  out.write(p);
}

}  // namespace ratekv::eval
