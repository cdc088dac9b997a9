// ratekv/io/npy.h — 2-D float32 matrices in NumPy's .npy format: the files that
// `ratekv capture` writes (post-RoPE K, V, Q) and `ratekv rd --data` and the
// GPU attention test read.
//
// Format (NumPy NEP 1, "A Simple File Format for NumPy Arrays"): magic
// "\x93NUMPY", major and minor version bytes, a little-endian header length
// (uint16 for 1.0, uint32 for 2.0 / 3.0), an ASCII (3.0: UTF-8) Python dict
// literal {'descr': ..., 'fortran_order': ..., 'shape': (...), } padded with
// spaces and ending in '\n', then the raw array data. Only the case this
// project uses is supported: dtype '<f4' (little-endian IEEE float32), C order,
// two dimensions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ratekv {

/// A 2-D float32 matrix, C order: data[r * cols + c].
struct NpyMatrix {
  int64_t rows = 0, cols = 0;
  std::vector<float> data;
};

/// Reads a 2-D little-endian float32 ('<f4') C-order .npy file (format 1.0/2.0/3.0). `what` prefixes
/// messages (a flag name or a role, e.g. "--data"). Throws ratekv::Error naming the path and what is
/// wrong: missing/not a regular file, truncated header, bad dtype/order/shape, data size mismatch,
/// non-finite values (row, column).
///
/// Shape (rows, cols) must have rows ≥ 1 and 1 ≤ cols ≤ 2^20, and the data after the header must be
/// exactly rows · cols · 4 bytes; sizes are checked against the file size before anything is allocated.
NpyMatrix read_npy_f32(const std::string& path, const std::string& what);

/// Writes `data` (rows × cols, C order) as a format-1.0 '<f4' .npy (header padded to 64 bytes).
/// Throws ratekv::Error naming the path on a failed or short write. Does not check for existing files
/// (callers do, with check_output_path).
///
/// Needs rows ≥ 1, cols ≥ 1 and data.size() == rows · cols (else ratekv::Error), so that every file
/// written reads back with read_npy_f32.
void write_npy_f32(const std::string& path, std::span<const float> data, int64_t rows, int64_t cols,
                   const std::string& what);

}  // namespace ratekv
