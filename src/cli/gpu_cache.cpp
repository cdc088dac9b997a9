// The GPU engine's cache format from the CLI's cache flags (cli/gpu_cache.h).
#include "cli/gpu_cache.h"

#include "ratekv/cache/plan_codecs.h"
#include "ratekv/common/error.h"
#ifdef RATEKV_HAVE_ENGINE
#include "ratekv/engine/engine.h"
#endif

namespace ratekv::cli {

void require_engine(const std::string& device) {
  if (device != "cuda") return;
#ifndef RATEKV_HAVE_ENGINE
  fail("--device cuda: this build of ratekv has no GPU engine (built without CUDA); use --device cpu");
#else
  // Before any model loads (the engine's own check comes after the weights: minutes for a large model).
  check(!engine::cuda_device_name().empty(),
        "--device cuda: no CUDA device visible (no GPU, no driver, or CUDA_VISIBLE_DEVICES hides it); use --device "
        "cpu");
#endif
}

#ifdef RATEKV_HAVE_ENGINE
engine::CacheFormat gpu_cache_format(const std::optional<Plan>& types, const std::string& ctk, const std::string& ctv,
                                     const std::string& cache_kind, const std::string& plan_file,
                                     const ModelConfig& cfg) {
  if (types) {
    if (ctk == "f16" && ctv == "f16") return engine::CacheFormat::fp16(cfg);
    try {
      return engine::CacheFormat::packed(std::make_shared<const cache::PlanCodecs>(*types, cfg, "cache types"));
    } catch (const Error& e) {
      fail("-ctk {} -ctv {} with --device cuda: {}", ctk, ctv, e.what());
    }
  }
  if (!plan_file.empty()) {
    check(cache_kind != "fake", "--cache fake: the fake-quant cache runs on the CPU only (--device cpu)");
    try {
      return engine::CacheFormat::packed(std::make_shared<const cache::PlanCodecs>(Plan::load(plan_file), cfg, plan_file));
    } catch (const Error& e) {
      fail("--plan {} with --device cuda: {}", plan_file, e.what());
    }
  }
  check(cache_kind == "fp32", "--cache {}: with --device cuda give --plan or -ctk/-ctv", cache_kind);
  return engine::CacheFormat::fp16(cfg);
}
#endif

void check_chunk_option(const std::string& device, int64_t chunk) {
  check(chunk == 0 || (chunk >= 64 && chunk % 64 == 0),
        "--chunk {}: expected a multiple of 64 tokens (the page), or 0 for a one-piece prefill", chunk);
  check(chunk == 0 || device == "cuda", "--chunk: chunked prefill runs on --device cuda only");
}

void check_prefill_mode_option(const std::string& device, const std::string& mode) {
  check(device == "cuda" || mode == "evaluation",
        "--prefill-mode {}: the CPU caches always quantize before attention (evaluation); serving runs on --device "
        "cuda only",
        mode);
}

}  // namespace ratekv::cli
