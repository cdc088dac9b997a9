// libFuzzer target: the calibration statistics `ratekv plan --stats` reads,
// in both forms (calib::load_alloc_stats sniffs safetensors vs JSON):
//   safetensors: calib::KVStats::load → to_alloc_stats → validate;
//   JSON:        load_stats_json.
// Every per-(layer, head) accessor the allocators use runs on what loaded,
// and what loaded (either form) must serialize to the JSON form and parse
// back (stats_from_json(stats_to_json())) unchanged.
// Only ratekv::Error may escape; a broken round trip aborts (a finding).
#include <cstdint>
#include <cstdlib>

#include "ratekv/calib/kv_stats.h"
#include "ratekv/common/error.h"
#include "ratekv/format/calib_stats.h"
#include "temp_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ratekv::fuzz::write_temp("stats", data, size);
  ratekv::CalibStats s;
  try {
    s = ratekv::calib::load_alloc_stats(path);
  } catch (const ratekv::Error& e) {
    ratekv::fuzz::rejected(e.what());
    return 0;
  }
  volatile double sink = 0;
  for (int l = 0; l < s.model.n_layers; ++l)
    for (int h = 0; h < s.model.n_kv_heads; ++h)
      for (double e : s.block_energies(l, h)) sink = sink + e;
  const nlohmann::json j = ratekv::stats_to_json(s);
  try {
    if (ratekv::stats_to_json(ratekv::stats_from_json(j, "round trip")) != j) std::abort();
  } catch (const ratekv::Error&) {
    std::abort();  // statistics that loaded must reload from their own JSON form
  }
  return 0;
}
