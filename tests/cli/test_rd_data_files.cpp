// `ratekv rd --data FILE`: a file named .npy without the .npy magic is an
// error (not raw floats), and --n counts rows of a file whenever it is given
// (also as 4096, the generated-data default); a negative --n is an error; a
// --dim given for a .npy file must match its columns.
// Runs the built CLI; skips when it has not been built. No model needed.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "../support/temp_dir.h"
#include "cli_runner.h"

using ratekv_test::cli_path;
using ratekv_test::Result;
using ratekv_test::run_cli;
using ratekv_test::TempDir;

namespace {

class RdDataFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(cli_path())) GTEST_SKIP() << "ratekv CLI not built at " << cli_path();
  }
  // A (rows, 2) '<f4' .npy with finite, non-zero values.
  fs::path write_npy(const std::string& name, int64_t rows) const {
    std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(rows) + ", 2), }";
    while ((10 + h.size() + 1) % 64 != 0) h += ' ';
    h += '\n';
    std::vector<float> x((size_t)rows * 2);
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0.5f + (float)(i % 7) - (float)(i % 3);
    const fs::path f = dir_ / name;
    std::ofstream o(f, std::ios::binary);
    o.write("\x93NUMPY\x01\x00", 8);
    o.put((char)(h.size() & 0xff));
    o.put((char)(h.size() >> 8));
    o << h;
    o.write(reinterpret_cast<const char*>(x.data()), (std::streamsize)(x.size() * 4));
    return f;
  }
  TempDir dir_{"rd_data_files"};
};

TEST_F(RdDataFiles, NpyNameWithoutMagicIsAnError) {
  // 512 bytes of text named .npy used to be read as one raw 128-float row and gave D = inf with exit 0.
  const fs::path f = dir_ / "notes.npy";
  std::ofstream(f, std::ios::binary) << std::string(512, 'a');
  const Result r = run_cli("rd --quantizers kivi_key --bits 2 --data '" + f.string() + "'");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("error: --data: '" + f.string() + "': not a .npy file (no \\x93NUMPY magic)"),
            std::string::npos)
      << r.output;
  // Upper-case extension too.
  const fs::path g = dir_ / "NOTES.NPY";
  std::ofstream(g, std::ios::binary) << std::string(512, 'a');
  const Result r2 = run_cli("rd --quantizers kivi_key --bits 2 --data '" + g.string() + "'");
  EXPECT_EQ(r2.status, 1) << r2.output;
  EXPECT_NE(r2.output.find("not a .npy file"), std::string::npos) << r2.output;
}

TEST_F(RdDataFiles, RowLimitCountsWhenGivenAsTheDefaultValue) {
  // --n 4096 on a 4097-row file used to read all 4097 rows (4096 was taken for "not given").
  const fs::path f = write_npy("rows.npy", 4097);
  const std::string base = "rd --quantizers kivi_value --bits 2 --n-seeds 1 --data '" + f.string() + "'";
  const Result given = run_cli(base + " --n 4096");
  EXPECT_EQ(given.status, 0) << given.output;
  EXPECT_NE(given.output.find("m = 2, N = 4096 vectors"), std::string::npos) << given.output;
  const Result all = run_cli(base);
  EXPECT_EQ(all.status, 0) << all.output;
  EXPECT_NE(all.output.find("m = 2, N = 4097 vectors"), std::string::npos) << all.output;
  const Result some = run_cli(base + " --n 97");
  EXPECT_NE(some.output.find("m = 2, N = 97 vectors"), std::string::npos) << some.output;
  // A negative --n used to mean "all rows".
  const Result neg = run_cli(base + " --n -5");
  EXPECT_EQ(neg.status, 1) << neg.output;
  EXPECT_NE(neg.output.find("error: --n: -5 is out of range"), std::string::npos) << neg.output;
}

TEST_F(RdDataFiles, DimThatDisagreesWithTheNpyColumns) {
  // --dim 64 on a (97, 2) .npy was silently ignored (the file's 2 columns were used).
  const fs::path f = write_npy("cols2.npy", 97);
  const std::string base = "rd --quantizers kivi_value --bits 2 --n-seeds 1 --data '" + f.string() + "'";
  const Result bad = run_cli(base + " --dim 64");
  EXPECT_EQ(bad.status, 1) << bad.output;
  EXPECT_NE(bad.output.find("error: --dim 64: --data '" + f.string() + "' has 2 columns"), std::string::npos)
      << bad.output;
  const Result same = run_cli(base + " --dim 2");
  EXPECT_EQ(same.status, 0) << same.output;
  EXPECT_NE(same.output.find("m = 2, N = 97 vectors"), std::string::npos) << same.output;
}

}  // namespace
