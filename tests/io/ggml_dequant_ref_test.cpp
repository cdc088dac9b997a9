// dequantize_row against ggml's own dequantization (tests/fixtures/quant/ggml_dequant_ref.bin,
// written by tools/ref/ggml_dequant_fixture.cpp with libggml-base's to_float): real blocks of
// every quantized type the packaged models use (SmolLM2 Q4_1/Q8_0; Gemma 3 and
// Qwen2.5-Coder-0.5B/1.5B Q5_0/Q8_0/Q4_K/Q6_K, incl. their token_embd/output rows) and blocks
// ggml_quantize_chunk made from seeded Gaussian rows for F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, Q4_K, Q5_K, Q6_K. Equality is bit for bit. Runs without any asset.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "ratekv/io/gguf.h"

using namespace ratekv;

namespace {

struct RefEntry {
  GgmlType type;
  int64_t n_blocks;
  std::string label;
  std::vector<uint8_t> blocks;
  std::vector<float> values;
};

std::vector<RefEntry> read_fixture(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "missing " << path;
  std::vector<RefEntry> out;
  if (!in) return out;
  char magic[4];
  uint32_t hdr[2];
  in.read(magic, 4);
  in.read(reinterpret_cast<char*>(hdr), 8);
  EXPECT_EQ(std::string(magic, 4), "RKVD");
  EXPECT_EQ(hdr[0], 1u);
  for (uint32_t i = 0; i < hdr[1] && in; ++i) {
    uint32_t h[3];
    in.read(reinterpret_cast<char*>(h), 12);
    RefEntry e;
    e.type = static_cast<GgmlType>(h[0]);
    e.n_blocks = h[1];
    e.label.resize(h[2]);
    in.read(e.label.data(), h[2]);
    e.blocks.resize(static_cast<size_t>(e.n_blocks * ggml_block_bytes(e.type)));
    e.values.resize(static_cast<size_t>(e.n_blocks * ggml_block_size(e.type)));
    in.read(reinterpret_cast<char*>(e.blocks.data()), static_cast<std::streamsize>(e.blocks.size()));
    in.read(reinterpret_cast<char*>(e.values.data()), static_cast<std::streamsize>(e.values.size() * 4));
    out.push_back(std::move(e));
  }
  EXPECT_TRUE(in) << "truncated " << path;
  return out;
}

}  // namespace

TEST(GgmlDequantRef, EqualsGgmlToFloatBitForBit) {
  const auto entries = read_fixture(std::string(RATEKV_SOURCE_DIR) + "/tests/fixtures/quant/ggml_dequant_ref.bin");
  ASSERT_GE(entries.size(), 30u);
  std::map<std::string, int> real, synthetic;
  for (const RefEntry& e : entries) {
    std::vector<float> got(e.values.size(), -999.0f);
    dequantize_row(e.type, e.blocks.data(), got.data(), static_cast<int64_t>(got.size()));
    size_t differ = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::memcmp(&got[i], &e.values[i], 4) != 0) {
        if (differ++ == 0) first = i;
      }
    }
    EXPECT_EQ(differ, 0u) << e.label << " (" << ggml_type_name(e.type) << "): " << differ << " of " << got.size()
                          << " values differ; first at " << first << ": ours " << got[first] << ", ggml "
                          << e.values[first];
    (e.label.rfind("synthetic:", 0) == 0 ? synthetic : real)[ggml_type_name(e.type)] += 1;
  }
  // Every type the packaged models store, from real weights; every decodable type from ggml's encoder.
  for (const char* t : {"Q4_1", "Q8_0", "Q5_0", "Q4_K", "Q6_K"}) EXPECT_GE(real[t], 2) << t;
  for (const char* t : {"F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"})
    EXPECT_EQ(synthetic[t], 1) << t;
}
