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

inline Result run_cli(const std::string& args) {
  const std::string cmd = "'" + cli_path().string() + "' " + args + " 2>&1";
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
