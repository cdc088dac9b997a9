// `ratekv capture --queries` on the real SmolLM2-135M model (9 query heads,
// 3 KV heads, head_dim 64): the q_layer<l>.npy files have shape
// (n_heads · N, head_dim), head-major; --queries leaves the K/V files
// byte-for-byte as they are without it; the queries of the first tokens do
// not depend on later tokens (causal model), which also checks the head-major
// row order h · N + t across two different N; and capture refuses to
// overwrite an existing q_layer file without --force.
//
// Runs the built CLI; skips without it, without the SmolLM2 / eval text
// assets, and in the sanitizer build (five model loads and forwards).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../support/assets.h"
#include "../support/temp_dir.h"
#include "cli_runner.h"
#include "ratekv/io/npy.h"

namespace fs = std::filesystem;
using ratekv_test::cli_path;
using ratekv_test::run_cli;
using ratekv_test::shell_quote;
using ratekv_test::TempDir;

namespace {

constexpr int64_t kHeads = 9, kKvHeads = 3, kHeadDim = 64;  // SmolLM2-135M

std::string file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

/// ‖a − b‖ / ‖a‖ over one head_dim row of each matrix.
double row_rel_diff(const ratekv::NpyMatrix& a, int64_t ra, const ratekv::NpyMatrix& b, int64_t rb) {
  double d = 0, n = 0;
  for (int64_t c = 0; c < a.cols; ++c) {
    const double x = a.data[ra * a.cols + c], y = b.data[rb * b.cols + c];
    d += (x - y) * (x - y);
    n += x * x;
  }
  return std::sqrt(d / n);
}

double row_norm(const ratekv::NpyMatrix& a, int64_t r) {
  double n = 0;
  for (int64_t c = 0; c < a.cols; ++c) n += (double)a.data[r * a.cols + c] * a.data[r * a.cols + c];
  return std::sqrt(n);
}

class CaptureQueries : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(cli_path())) GTEST_SKIP() << "ratekv CLI not built at " << cli_path();
    const char* san = std::getenv("RATEKV_SANITIZE_RUN");
    if (san && std::string(san) == "1") GTEST_SKIP() << "model-scale CLI test skipped in the sanitizer build";
    model_ = ratekv_test::smollm2_path();
    text_ = fs::path(ratekv_test::assets_dir()) / "text" / "eval.txt";
    if (!fs::exists(model_)) GTEST_SKIP() << "SmolLM2 asset missing: " << model_;
    if (!fs::exists(text_)) GTEST_SKIP() << "eval text asset missing: " << text_;
  }
  /// `ratekv capture` of the first `tokens` tokens of eval.txt, layers 0 and 2, into dir_/out.
  ratekv_test::Result capture(const std::string& out, int tokens, const std::string& extra) const {
    return run_cli("capture -m " + shell_quote(model_.string()) + " -f " + shell_quote(text_.string()) +
                   " --tokens " + std::to_string(tokens) + " --ctx 9 --layers 0,2 -o " +
                   shell_quote((dir_ / out).string()) + " " + extra);
  }
  fs::path model_, text_;
  TempDir dir_{"capture_queries"};
};

TEST_F(CaptureQueries, ShapesKvUnchangedAndPrefixInvariant) {
  auto r = capture("q9", 9, "--queries");
  ASSERT_EQ(r.status, 0) << r.output;
  r = capture("kv9", 9, "");
  ASSERT_EQ(r.status, 0) << r.output;
  r = capture("q5", 5, "--queries");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "kv9" / "q_layer0.npy")) << "q file written without --queries";

  for (int l : {0, 2}) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const std::string ks = "k_layer" + std::to_string(l) + ".npy", vs = "v_layer" + std::to_string(l) + ".npy",
                      qs = "q_layer" + std::to_string(l) + ".npy";
    const auto k = ratekv::read_npy_f32((dir_ / "q9" / ks).string(), "k");
    const auto v = ratekv::read_npy_f32((dir_ / "q9" / vs).string(), "v");
    const auto q = ratekv::read_npy_f32((dir_ / "q9" / qs).string(), "q");
    EXPECT_EQ(k.rows, kKvHeads * 9);
    EXPECT_EQ(k.cols, kHeadDim);
    EXPECT_EQ(v.rows, kKvHeads * 9);
    EXPECT_EQ(v.cols, kHeadDim);
    ASSERT_EQ(q.rows, kHeads * 9);
    ASSERT_EQ(q.cols, kHeadDim);

    // --queries adds a file; it changes nothing in the others.
    const std::string kb = file_bytes(dir_ / "q9" / ks);
    EXPECT_GT(kb.size(), (size_t)(kKvHeads * 9 * kHeadDim * 4));
    EXPECT_EQ(kb, file_bytes(dir_ / "kv9" / ks));
    EXPECT_EQ(file_bytes(dir_ / "q9" / vs), file_bytes(dir_ / "kv9" / vs));

    // Real queries: every row nonzero (finite is checked by read_npy_f32), heads distinct.
    for (int64_t row = 0; row < q.rows; ++row) EXPECT_GT(row_norm(q, row), 1e-3) << "q row " << row;
    EXPECT_GT(row_rel_diff(q, 0 * 9 + 0, q, 1 * 9 + 0), 1e-2) << "heads 0 and 1 have the same query at token 0";

    // Prefix invariance: tokens 0..4 see the same causal context with --tokens 5 and --tokens 9. Rows are
    // h·N + t, so with N = 5 vs N = 9 a wrong row order would compare different heads or tokens.
    const auto q5 = ratekv::read_npy_f32((dir_ / "q5" / qs).string(), "q");
    const auto k5 = ratekv::read_npy_f32((dir_ / "q5" / ks).string(), "k");
    ASSERT_EQ(q5.rows, kHeads * 5);
    ASSERT_EQ(k5.rows, kKvHeads * 5);
    for (int64_t h = 0; h < kHeads; ++h) {
      EXPECT_NEAR(row_norm(q5, h * 5 + 0), row_norm(q, h * 9 + 0), 1e-5 * row_norm(q, h * 9 + 0)) << "head " << h;
      for (int64_t t = 0; t < 5; ++t)
        EXPECT_LT(row_rel_diff(q, h * 9 + t, q5, h * 5 + t), 1e-5) << "q head " << h << " token " << t;
    }
    for (int64_t h = 0; h < kKvHeads; ++h)
      for (int64_t t = 0; t < 5; ++t)
        EXPECT_LT(row_rel_diff(k, h * 9 + t, k5, h * 5 + t), 1e-5) << "k head " << h << " token " << t;
  }
}

TEST_F(CaptureQueries, RefusesToOverwriteQueryFileWithoutForce) {
  const fs::path out = dir_ / "existing";
  fs::create_directories(out);
  { std::ofstream(out / "q_layer0.npy") << "keep me"; }
  auto r = capture("existing", 9, "--queries");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("error: -o: '" + (out / "q_layer0.npy").string() + "' already exists"), std::string::npos)
      << r.output;
  EXPECT_EQ(file_bytes(out / "q_layer0.npy"), "keep me");
  EXPECT_FALSE(fs::exists(out / "k_layer0.npy")) << "wrote K before refusing";

  // Without --queries the q file is not an output, so it does not block; with --force it is replaced.
  r = capture("existing", 9, "");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(file_bytes(out / "q_layer0.npy"), "keep me");
  r = capture("existing", 9, "--queries --force");
  ASSERT_EQ(r.status, 0) << r.output;
  const auto q = ratekv::read_npy_f32((out / "q_layer0.npy").string(), "q");
  EXPECT_EQ(q.rows, kHeads * 9);
  EXPECT_EQ(q.cols, kHeadDim);
}

}  // namespace
