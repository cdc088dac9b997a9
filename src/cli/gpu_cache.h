// cli/gpu_cache.h — the GPU engine's cache format from the CLI's cache flags
// (-ctk/-ctv, --plan, --cache), with errors that name the flags.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ratekv/format/plan.h"
#include "ratekv/model/model.h"

#ifdef RATEKV_HAVE_ENGINE
#include "ratekv/engine/cache_format.h"

namespace ratekv::cli {

/// -ctk f16 -ctv f16 (or no cache flag and --cache fp32): the fp16 cache;
/// other -ctk/-ctv types or --plan: the plan's packed cache. Throws Error,
/// naming the flags, when the GPU cannot serve the choice (the engine's reason:
/// q8_0/q4_0, fp16 mixed with packed sides, 0- or 5..8-bit groups, …) or for
/// --cache fake (CPU only).
engine::CacheFormat gpu_cache_format(const std::optional<Plan>& types, const std::string& ctk, const std::string& ctv,
                                     const std::string& cache_kind, const std::string& plan_file,
                                     const ModelConfig& cfg);

}  // namespace ratekv::cli
#endif

namespace ratekv::cli {
/// The one check of --device cuda, called by every command with --device
/// before anything loads: throws Error naming --device in a build without the
/// GPU engine, or when no CUDA device is visible (engine::cuda_device_name()
/// is empty). Does nothing for --device cpu.
void require_engine(const std::string& device);

/// --chunk N (chunked prefill, every command that prefills): throws Error
/// naming --chunk unless N is 0 (one piece) or a positive multiple of the
/// 64-token page, and for N > 0 unless --device is cuda (docs/design.md §10).
void check_chunk_option(const std::string& device, int64_t chunk);

/// --prefill-mode M (perplexity, niah; bench and generate when the flag is
/// given, their default serving applying to cuda only): throws Error naming
/// --prefill-mode for serving without --device cuda (the CPU caches always
/// quantize before attention reads them: evaluation; docs/design.md §9.2).
void check_prefill_mode_option(const std::string& device, const std::string& mode);
}  // namespace ratekv::cli
