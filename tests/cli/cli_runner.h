// tests/cli/cli_runner.h — runs the built `ratekv` CLI from a test.
//
// The binary is <build>/bin/ratekv, next to this test's <build>/tests/; tests
// skip when it has not been built.
#pragma once

#include <cstdio>
#include <filesystem>
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

}  // namespace ratekv_test
