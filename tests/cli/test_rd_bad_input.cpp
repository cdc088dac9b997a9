// Regression tests for `ratekv rd --data` on hostile inputs: each must end with
// exit status 1 and an "error: ..." line naming the input and what was expected,
// never an abort from an uncaught exception.
//
// Runs the built CLI (<build>/bin/ratekv, next to this test's <build>/tests/);
// skips when that binary has not been built.
#include <gtest/gtest.h>

#include "../support/temp_dir.h"
#include "cli_runner.h"

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <sys/wait.h>

namespace fs = std::filesystem;
using ratekv_test::cli_path;
using ratekv_test::Result;
using ratekv_test::run_cli;
using ratekv_test::TempDir;

namespace {

class RdBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(cli_path())) GTEST_SKIP() << "ratekv CLI not built at " << cli_path();
  }
  TempDir dir_{"rd_bad_input"};
};

TEST_F(RdBadInput, DirectoryAsData) {
  // Used to abort: "terminate called ... basic_filebuf::underflow error reading the file: Is a directory".
  const fs::path d = dir_ / "vectors.npy";
  fs::create_directories(d);
  const Result r = run_cli("rd --data '" + d.string() + "'");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("error: --data: '" + d.string() + "' is not a regular file"), std::string::npos) << r.output;
}

TEST_F(RdBadInput, MissingData) {
  const fs::path f = dir_ / "absent.npy";
  const Result r = run_cli("rd --data '" + f.string() + "'");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("error: --data: '" + f.string() + "' does not exist"), std::string::npos) << r.output;
}

TEST_F(RdBadInput, NpyShapeWhoseByteSizeWrapsAround) {
  // Shape (2^62, 1): 2^62 * 1 * 4 bytes wraps to 0 in 64 bits, which matched the empty payload and then asked
  // std::vector for 2^62 floats (abort: "cannot create std::vector larger than max_size()").
  std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 1), }";
  while ((10 + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  const fs::path f = dir_ / "huge.npy";
  {
    std::ofstream o(f, std::ios::binary);
    o.write("\x93NUMPY\x01\x00", 8);
    const uint16_t len = (uint16_t)h.size();
    o.put((char)(len & 0xff));
    o.put((char)(len >> 8));
    o << h;
  }
  const Result r = run_cli("rd --quantizers tq_mse --data '" + f.string() + "'");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("shape (4611686018427387904, 1) needs more data than the 0 bytes after the header"),
            std::string::npos)
      << r.output;
}

TEST_F(RdBadInput, WellFormedNpyStillLoads) {
  // 3 rows of dimension 4 (awkward, non-power-of-two row count): the loader accepts it and reports the shape.
  std::string h = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }";
  while ((10 + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  const fs::path f = dir_ / "ok.npy";
  {
    std::ofstream o(f, std::ios::binary);
    o.write("\x93NUMPY\x01\x00", 8);
    const uint16_t len = (uint16_t)h.size();
    o.put((char)(len & 0xff));
    o.put((char)(len >> 8));
    o << h;
    for (int i = 0; i < 12; ++i) {
      const float v = 0.25f * (float)(i + 1) * ((i % 3) ? 1.f : -1.f);
      o.write(reinterpret_cast<const char*>(&v), 4);
    }
  }
  const Result r = run_cli("rd --quantizers tq_mse --bits 1,2 --data '" + f.string() + "'");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("m = 4, N = 3 vectors"), std::string::npos) << r.output;
}

// A report that fails only when the file is closed (a full disk) used to exit 0 with nothing written.
TEST_F(RdBadInput, JsonOnAFullDiskIsAnError) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const Result r = run_cli("rd --n 64 --bits 1,2 --quantizers tq_mse --n-seeds 1 --json /dev/full --force");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("error: --json: write to '/dev/full' failed"), std::string::npos) << r.output;
}

}  // namespace
