// libFuzzer target: SafetensorsFile::parse on arbitrary bytes, then read every
// tensor through the typed readers. Only ratekv::Error may escape.
#include <cstdint>
#include <vector>

#include "ratekv/common/error.h"
#include "ratekv/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    ratekv::SafetensorsFile f = ratekv::SafetensorsFile::parse(std::vector<uint8_t>(data, data + size), "fuzz.st");
    volatile size_t sink = f.metadata().size();
    for (const ratekv::StTensor& t : f.tensors()) {
      switch (t.dtype) {
        case ratekv::StDtype::F32: case ratekv::StDtype::F16: case ratekv::StDtype::BF16:
          sink = sink + f.read_f32(t.name).size();
          break;
        case ratekv::StDtype::I32: sink = sink + f.read_i32(t.name).size(); break;
        case ratekv::StDtype::I64: sink = sink + f.read_i64(t.name).size(); break;
        case ratekv::StDtype::U8: sink = sink + f.read_u8(t.name).size(); break;
      }
      (void)f.expect(t.name, t.dtype, t.shape);
    }
    (void)sink;
  } catch (const ratekv::Error&) {
  }
  return 0;
}
