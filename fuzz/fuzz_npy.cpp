// libFuzzer target: read_npy_f32 on arbitrary bytes (the files `ratekv rd
// --data` and `capture` readers take). Only ratekv::Error may escape; a file it
// accepts must hold rows·cols values and survive write_npy_f32 → read_npy_f32
// bit for bit (anything else aborts: a finding).
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "ratekv/common/error.h"
#include "ratekv/io/npy.h"
#include "temp_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ratekv::fuzz::write_temp("in.npy", data, size);
  ratekv::NpyMatrix m;
  try {
    m = ratekv::read_npy_f32(path, "fuzz");
  } catch (const ratekv::Error& e) {
    ratekv::fuzz::rejected(e.what());
    return 0;
  }
  if (m.rows < 1 || m.cols < 1 || m.data.size() != static_cast<size_t>(m.rows * m.cols)) std::abort();
  const std::string again = (ratekv::fuzz::temp_dir() / "again.npy").string();
  ratekv::write_npy_f32(again, m.data, m.rows, m.cols, "fuzz");
  const ratekv::NpyMatrix r = ratekv::read_npy_f32(again, "fuzz");
  if (r.rows != m.rows || r.cols != m.cols ||
      std::memcmp(r.data.data(), m.data.data(), m.data.size() * sizeof(float)) != 0)
    std::abort();
  return 0;
}
