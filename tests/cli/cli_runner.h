// tests/cli/cli_runner.h — runs the built `ratekv` CLI from a test.
//
// The binary is <build>/bin/ratekv, next to this test's <build>/tests/; tests
// skip when it has not been built.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <sys/wait.h>

namespace fs = std::filesystem;

namespace ratekv_test {

inline fs::path cli_path() { return fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "bin" / "ratekv"; }

struct Result {
  int status = -1;  // exit status, or 128 + signal
  std::string output;  // stdout and stderr together
};

/// s in single quotes for the shell (built with append: GCC 12 reports a
/// false -Wrestrict for "'" + std::string&&).
inline std::string shell_quote(const std::string& s) {
  std::string r;
  r.reserve(s.size() + 2);
  r.push_back('\'');
  r.append(s);
  r.push_back('\'');
  return r;
}

inline Result run_cli(const std::string& args) {
  std::string cmd = shell_quote(cli_path().string());
  cmd.append(" ").append(args).append(" 2>&1");
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
  return r;
}

/// load_model's log line once the weights are in: output without it failed
/// before the (slow) weight load.
inline constexpr const char* kWeightsLoaded = "fp32 weights";

/// Runs `args` and expects exit `status` (1: with an "error: " line), each of
/// `needles` in the output, no weights loaded (kWeightsLoaded absent) and no
/// "internal" (unexpected-exception) error.
inline void expect_error_before_weights(const std::string& args, int status,
                                        std::initializer_list<std::string> needles) {
  const Result r = run_cli(args);
  EXPECT_EQ(r.status, status) << args << "\n" << r.output;
  if (status == 1) {
    EXPECT_NE(r.output.find("error: "), std::string::npos) << args << "\n" << r.output;
  }
  for (const auto& n : needles) EXPECT_NE(r.output.find(n), std::string::npos) << n << "\n" << r.output;
  EXPECT_EQ(r.output.find(kWeightsLoaded), std::string::npos) << "weights were loaded first:\n" << r.output;
  EXPECT_EQ(r.output.find("internal"), std::string::npos) << r.output;
}

/// The same for exit status 1 (a clean "error: ..." of a bad input).
inline void expect_error_before_weights(const std::string& args, std::initializer_list<std::string> needles) {
  expect_error_before_weights(args, 1, needles);
}

}  // namespace ratekv_test
