// The real SmolLM2-135M-Instruct Q4_1 GGUF: metadata, tensor table, and every
// tensor dequantizing to finite values. Skips when the asset is missing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "../support/assets.h"
#include "ratekv/io/gguf.h"

using namespace ratekv;

namespace {

// The SmolLM2 GGUF (tests/support/assets.h), "" when absent.
std::string model_path() {
  const std::string p = ratekv_test::smollm2_path();
  return std::filesystem::exists(p) ? p : "";
}

}  // namespace

TEST(GgufModel, SmolLM2Metadata) {
  const std::string path = model_path();
  if (path.empty()) GTEST_SKIP() << "SmolLM2 GGUF not found under $RATEKV_ASSETS/models (run tools/fetch_assets.sh)";
  GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.block_count"), 30);
  EXPECT_EQ(f.get_int("llama.attention.head_count"), 9);
  EXPECT_EQ(f.get_int("llama.attention.head_count_kv"), 3);
  EXPECT_EQ(f.get_int("llama.embedding_length"), 576);
  EXPECT_EQ(f.get_int("llama.context_length"), 8192);
  EXPECT_EQ(f.get_float("llama.rope.freq_base"), 100000.0);
  EXPECT_EQ(f.metadata().size(), 33u);  // header kv_count
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  EXPECT_EQ(tokens.size(), 49152u);

  // 30 layers x 9 tensors + token_embd + output_norm (tied output embedding).
  ASSERT_EQ(f.tensors().size(), 272u);
  const GgufTensor& emb = f.tensor("token_embd.weight");
  EXPECT_EQ(emb.ne, (std::vector<int64_t>{576, 49152}));
  const GgufTensor& q = f.tensor("blk.0.attn_q.weight");
  EXPECT_EQ(q.ne, (std::vector<int64_t>{576, 576}));
  EXPECT_EQ(q.type, GgmlType::Q4_1);
  EXPECT_EQ(f.tensor("blk.29.attn_k.weight").ne, (std::vector<int64_t>{576, 192}));
  EXPECT_EQ(f.tensor("blk.7.ffn_up.weight").ne, (std::vector<int64_t>{576, 1536}));
  EXPECT_EQ(f.tensor("output_norm.weight").type, GgmlType::F32);
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);

  std::set<std::string> types;
  for (const GgufTensor& t : f.tensors()) {
    types.insert(ggml_type_name(t.type));
    const std::vector<float> w = f.dequantize(t);
    ASSERT_EQ((int64_t)w.size(), t.n_elements()) << t.name;
    double sumsq = 0;
    for (float x : w) {
      ASSERT_TRUE(std::isfinite(x)) << t.name;
      sumsq += (double)x * x;
    }
    EXPECT_GT(sumsq, 0.0) << t.name;  // no all-zero tensor
  }
  EXPECT_TRUE(types.count("Q4_1"));
  // Row access agrees with the whole-tensor dequantization.
  const std::vector<float> all = f.dequantize(emb);
  std::vector<float> row(576);
  dequantize_rows(emb, 49151, 1, row.data());
  EXPECT_TRUE(std::equal(row.begin(), row.end(), all.end() - 576));
}
