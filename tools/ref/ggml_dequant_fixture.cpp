// tools/ref/ggml_dequant_fixture.cpp — writes tests/fixtures/quant/ggml_dequant_ref.bin: blocks
// of every ggml type ratekv dequantizes, each with ggml's OWN dequantization of it
// (ggml_get_type_traits(type)->to_float, libggml-base), so ratekv's dequantize_row is tested
// against llama.cpp rather than against an encoder written beside it
// (tests/io/ggml_dequant_ref_test.cpp). Two sources of blocks:
//   * real weights: for every quantized type in each GGUF given (SmolLM2 Q4_1/Q8_0, Gemma 3
//     and Qwen2.5-Coder Q4_K/Q5_0/Q6_K/Q8_0), 8 consecutive blocks from the middle of the
//     first and of the last tensor of that type;
//   * synthetic: for each of F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, 8 blocks
//     that ggml_quantize_chunk made from seeded Gaussian rows (one row with a large outlier).
// Not part of the CMake build; run once (needs tools/build_llamacpp.sh):
//
//   B=$HOME/.cache/ratekv/llama-build; S=$HOME/.cache/ratekv/llama_cpp_python-0.3.36/vendor/llama.cpp
//   g++ -O2 -std=c++17 -I$S/ggml/include tools/ref/ggml_dequant_fixture.cpp -L$B/bin -lggml-base -Wl,-rpath,$B/bin -o /tmp/ggml_dequant_fixture
//   /tmp/ggml_dequant_fixture tests/fixtures/quant/ggml_dequant_ref.bin MODEL.gguf ...
//
// File layout (little-endian): "RKVD", u32 version = 1, u32 n_entries, then per entry:
//   u32 ggml type id, u32 n_blocks, u32 label length L, L bytes of label (source and tensor),
//   n_blocks · type_size bytes of blocks, n_blocks · block_size float32 values (ggml's output).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ggml.h"
#include "gguf.h"

namespace {

struct Entry {
  ggml_type type;
  std::string label;
  std::vector<uint8_t> blocks;
  std::vector<float> values;
};

Entry make_entry(ggml_type type, std::string label, const uint8_t* blocks, int64_t n_blocks) {
  Entry e{type, std::move(label), {}, {}};
  const size_t bytes = static_cast<size_t>(n_blocks) * ggml_type_size(type);
  e.blocks.assign(blocks, blocks + bytes);
  e.values.resize(static_cast<size_t>(n_blocks * ggml_blck_size(type)));
  ggml_get_type_traits(type)->to_float(e.blocks.data(), e.values.data(), n_blocks * ggml_blck_size(type));
  return e;
}

bool wanted(ggml_type t) {
  switch (t) {
    case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1: case GGML_TYPE_Q8_0:
    case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K: case GGML_TYPE_F16: case GGML_TYPE_BF16:
      return true;
    default:
      return false;
  }
}

void from_model(const char* path, std::vector<Entry>& out) {
  gguf_init_params p{/*no_alloc=*/true, /*ctx=*/nullptr};
  gguf_context* g = gguf_init_from_file(path, p);
  if (!g) {
    std::fprintf(stderr, "cannot read %s\n", path);
    std::exit(1);
  }
  FILE* f = std::fopen(path, "rb");
  const std::string base = std::strrchr(path, '/') ? std::strrchr(path, '/') + 1 : path;
  const int64_t n = gguf_get_n_tensors(g);
  for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
    const ggml_type type = static_cast<ggml_type>(t);
    if (!wanted(type) || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16) continue;
    int64_t first = -1, last = -1;
    for (int64_t i = 0; i < n; ++i)
      if (gguf_get_tensor_type(g, i) == type) {
        if (first < 0) first = i;
        last = i;
      }
    for (int64_t i : {first, last}) {
      if (i < 0 || (i == last && last == first && i != first)) continue;
      const size_t size = gguf_get_tensor_size(g, i), tb = ggml_type_size(type);
      const int64_t nb = static_cast<int64_t>(size / tb), take = 8, at = nb / 2;
      std::vector<uint8_t> buf(take * tb);
      std::fseek(f, static_cast<long>(gguf_get_data_offset(g) + gguf_get_tensor_offset(g, i) + at * tb), SEEK_SET);
      if (std::fread(buf.data(), 1, buf.size(), f) != buf.size()) std::exit(1);
      out.push_back(make_entry(type, base + ":" + gguf_get_tensor_name(g, i) + ":block" + std::to_string(at),
                               buf.data(), take));
      if (first == last) break;
    }
  }
  std::fclose(f);
  gguf_free(g);
}

void synthetic(std::vector<Entry>& out) {
  const ggml_type types[] = {GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0,
                             GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
  std::mt19937 rng(20261201);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (ggml_type type : types) {
    const int64_t per_row = 256, rows = 8 * ggml_blck_size(type) / per_row > 0 ? 8 * ggml_blck_size(type) / per_row : 1;
    const int64_t n = rows * per_row;  // a whole number of blocks, >= 8 blocks of 32 or 8 of 256
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = nd(rng) * std::exp(nd(rng));
    x[n / 3] = 250.0f;  // one outlier
    std::vector<uint8_t> q(rows * ggml_row_size(type, per_row));
    ggml_quantize_chunk(type, x.data(), q.data(), 0, rows, per_row, nullptr);
    out.push_back(make_entry(type, std::string("synthetic:") + ggml_type_name(type), q.data(),
                             n / ggml_blck_size(type)));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s OUT.bin [MODEL.gguf ...]\n", argv[0]);
    return 1;
  }
  std::vector<Entry> entries;
  synthetic(entries);
  for (int i = 2; i < argc; ++i) from_model(argv[i], entries);
  FILE* f = std::fopen(argv[1], "wb");
  if (!f) {
    std::perror(argv[1]);
    return 1;
  }
  const uint32_t hdr[2] = {1u, static_cast<uint32_t>(entries.size())};
  std::fwrite("RKVD", 1, 4, f);
  std::fwrite(hdr, 4, 2, f);
  for (const Entry& e : entries) {
    const uint32_t h[3] = {static_cast<uint32_t>(e.type), static_cast<uint32_t>(e.values.size() / ggml_blck_size(e.type)),
                           static_cast<uint32_t>(e.label.size())};
    std::fwrite(h, 4, 3, f);
    std::fwrite(e.label.data(), 1, e.label.size(), f);
    std::fwrite(e.blocks.data(), 1, e.blocks.size(), f);
    std::fwrite(e.values.data(), 4, e.values.size(), f);
    std::printf("%-60s %s x%zu\n", e.label.c_str(), ggml_type_name(e.type), e.values.size() / ggml_blck_size(e.type));
  }
  std::fclose(f);
  return 0;
}
