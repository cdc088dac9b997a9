// tools/ref/ggml_quant_fixture.cpp — writes the shared q8_0/q4_0 test vectors
// by calling ggml's OWN reference quantizers (libggml-base), so ratekv's
// reimplementation (include/ratekv/quant/ggml_blocks.h) is tested against
// llama.cpp rather than against itself. Not part of the CMake build; run once:
//
//   B=$HOME/.cache/ratekv/llama-build
//   g++ -O2 -std=c++20 -Iinclude tools/ref/ggml_quant_fixture.cpp -L$B/bin -lggml-base \
//       -Wl,-rpath,$B/bin -o /tmp/ggml_quant_fixture
//   /tmp/ggml_quant_fixture tests/fixtures/quant/ggml_q8_0_q4_0.bin
//
// File layout (little-endian): "RKVQ", u32 version = 1, u32 n_rows, u32 k
// (values per row, a multiple of 32), then per row: k float32 inputs,
// (k/32)·34 bytes of block_q8_0, (k/32)·18 bytes of block_q4_0.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "ratekv/quant/prng.h"

extern "C" {
// ggml-quants.h (internal header) signatures; blocks passed as raw bytes.
void quantize_row_q8_0_ref(const float* x, void* y, int64_t k);
void quantize_row_q4_0_ref(const float* x, void* y, int64_t k);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT.bin\n", argv[0]);
    return 1;
  }
  const uint32_t k = 96;  // three blocks per row
  std::vector<std::vector<float>> rows;
  ratekv::quant::SplitMix64 rng(20261129);
  auto gauss_row = [&](double scale) {
    std::vector<float> r(k);
    for (auto& v : r) v = (float)(scale * rng.gaussian());
    return r;
  };
  rows.push_back(std::vector<float>(k, 0.0f));                      // all zero: d = 0
  for (double s : {1.0, 1e-3, 1e-6, 3e-8, 10.0, 1000.0, 3e4}) rows.push_back(gauss_row(s));
  {  // q8_0 ties: amax = 127 -> d = 1, id = 1, so x.5 values are exact ties for roundf
    std::vector<float> r(k);
    for (uint32_t j = 0; j < k; ++j) r[j] = (j % 32 == 0) ? 127.0f : (float)((int)(j % 32) - 16) + 0.5f;
    rows.push_back(r);
  }
  {  // q4_0: max = -8 -> d = 1; values on the truncation edges
    std::vector<float> r(k);
    for (uint32_t j = 0; j < k; ++j) r[j] = (j % 32 == 0) ? -8.0f : -8.0f + 0.25f * (float)(j % 32) * (j % 2 ? 1 : 1.5f);
    rows.push_back(r);
  }
  {  // |max| ties with opposite signs: the first one sets the sign of q4_0's d
    std::vector<float> r = gauss_row(0.1);
    r[3] = 5.0f;
    r[7] = -5.0f;
    r[32 + 2] = -5.0f;
    r[32 + 9] = 5.0f;
    rows.push_back(r);
  }
  {  // one outlier per block
    std::vector<float> r = gauss_row(0.01);
    r[5] = 40.0f;
    r[40] = -300.0f;
    r[90] = 0.5f;
    rows.push_back(r);
  }
  for (int i = 0; i < 4; ++i) rows.push_back(gauss_row(std::exp(rng.gaussian())));

  FILE* f = std::fopen(argv[1], "wb");
  if (!f) {
    std::perror(argv[1]);
    return 1;
  }
  const uint32_t hdr[3] = {1u, (uint32_t)rows.size(), k};
  std::fwrite("RKVQ", 1, 4, f);
  std::fwrite(hdr, 4, 3, f);
  std::vector<uint8_t> q8(k / 32 * 34), q4(k / 32 * 18);
  for (const auto& r : rows) {
    quantize_row_q8_0_ref(r.data(), q8.data(), k);
    quantize_row_q4_0_ref(r.data(), q4.data(), k);
    std::fwrite(r.data(), 4, k, f);
    std::fwrite(q8.data(), 1, q8.size(), f);
    std::fwrite(q4.data(), 1, q4.size(), f);
  }
  std::fclose(f);
  std::printf("wrote %zu rows of %u values to %s\n", rows.size(), k, argv[1]);
  return 0;
}
