// libFuzzer target: a plan file and its tensor side file, as `ratekv eval`,
// `niah`, `perplexity` and the caches read them. The input is the plan JSON,
// optionally followed by the marker "\0RATEKV-SIDE\0" and the side file's
// bytes (tools/make_fuzz_seeds.py fuzz_plan writes seeds in that form).
//   Plan::load → validate → achieved; a plan load accepted must serialize
//   and parse back (Plan::from_json(to_json())) to the same JSON;
//   a plan with vq codecs: VqTensors::load of the side file against it.
// Only ratekv::Error may escape; a broken round trip aborts (a finding).
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "ratekv/common/error.h"
#include "ratekv/format/plan.h"
#include "ratekv/format/vq_tensors.h"
#include "temp_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static constexpr std::string_view kMarker{"\0RATEKV-SIDE\0", 13};
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t cut = in.find(kMarker);
  const size_t plan_size = cut == std::string_view::npos ? size : cut;
  const std::string plan_path = ratekv::fuzz::write_temp("plan.json", data, plan_size);
  ratekv::Plan p;
  try {
    p = ratekv::Plan::load(plan_path);
    p.validate("fuzz");
  } catch (const ratekv::Error& e) {
    ratekv::fuzz::rejected(e.what());
    return 0;
  }
  volatile double sink = p.achieved().total;
  (void)sink;
  const nlohmann::json j = p.to_json();
  try {
    if (ratekv::Plan::from_json(j, "round trip").to_json() != j) std::abort();
  } catch (const ratekv::Error&) {
    std::abort();  // a plan that loaded must reload from its own serialization
  }
  bool vq = false;
  for (const auto& layer : p.layers)
    for (const auto& h : layer) vq = vq || h.key.kind == ratekv::CodecKind::Vq || h.value.kind == ratekv::CodecKind::Vq;
  if (!vq || cut == std::string_view::npos) return 0;
  const size_t off = cut + kMarker.size();
  const std::string side = ratekv::fuzz::write_temp("side.safetensors", data + off, size - off);
  try {
    const ratekv::VqTensors t = ratekv::VqTensors::load(side, p);
    sink = static_cast<double>(t.codebook_bytes());
  } catch (const ratekv::Error& e) {
    ratekv::fuzz::rejected(e.what());
  }
  return 0;
}
