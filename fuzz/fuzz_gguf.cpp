// libFuzzer target: GgufFile::parse on arbitrary bytes, then every getter-free
// path a loader takes — walk the metadata, dequantize every tensor whose type
// is supported. Only ratekv::Error may escape parse/dequantize; anything else
// (crash, sanitizer report, other exception, huge allocation) is a finding.
#include <cmath>
#include <cstdint>
#include <vector>

#include "ratekv/common/error.h"
#include "ratekv/io/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    ratekv::GgufFile f = ratekv::GgufFile::parse({data, size}, "fuzz.gguf");
    volatile size_t sink = f.metadata().size();
    for (const auto& [key, v] : f.metadata()) {
      if (auto* s = std::get_if<std::string>(&v.v)) sink = sink + s->size();
      if (v.type == ratekv::GgufValueType::ARRAY) {
        // Typed getters must either convert or throw Error.
        try { (void)f.get_float_array(key); } catch (const ratekv::Error&) {}
        try { (void)f.get_int_array(key); } catch (const ratekv::Error&) {}
        try { (void)f.get_string_array(key); } catch (const ratekv::Error&) {}
      } else {
        try { (void)f.get_int(key); } catch (const ratekv::Error&) {}
        try { (void)f.get_float(key); } catch (const ratekv::Error&) {}
      }
    }
    for (const ratekv::GgufTensor& t : f.tensors()) {
      if (!ratekv::ggml_can_dequantize(t.type)) continue;
      std::vector<float> w = f.dequantize(t);
      if (!w.empty()) sink = sink + (std::isfinite(w[0]) ? 1 : 0);
      if (t.n_rows() > 0 && !t.ne.empty()) {
        std::vector<float> row((size_t)t.ne[0]);
        ratekv::dequantize_rows(t, t.n_rows() - 1, 1, row.data());
      }
    }
    (void)sink;
  } catch (const ratekv::Error&) {
  }
  return 0;
}
