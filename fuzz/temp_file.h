// fuzz/temp_file.h — the readers under fuzz take file paths (their real entry
// points: existence and size checks, format sniffing), so each target writes
// its input to files in one private directory per fuzzer process, created on
// first use under $TMPDIR (default /tmp) and removed at exit.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace ratekv::fuzz {

/// The process's scratch directory (created once; removed at exit).
inline const std::filesystem::path& temp_dir() {
  static const std::filesystem::path dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/ratekv-fuzz-XXXXXX";
    if (!mkdtemp(tmpl.data())) std::abort();
    std::atexit([] { std::error_code ec; std::filesystem::remove_all(temp_dir(), ec); });
    return std::filesystem::path(tmpl);
  }();
  return dir;
}

/// With RATEKV_FUZZ_VERBOSE set, prints why the reader rejected an input (to
/// check that the seeds are accepted: `RATEKV_FUZZ_VERBOSE=1 fuzz_x -runs=0 SEEDS`).
inline void rejected(const char* what) {
  static const bool verbose = std::getenv("RATEKV_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "rejected: %s\n", what);
}

/// Writes bytes [data, data + size) to temp_dir()/name and returns its path.
inline std::string write_temp(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = (temp_dir() / name).string();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

}  // namespace ratekv::fuzz
