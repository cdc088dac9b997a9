#include "alloc/json_file.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "ratekv/error.h"

namespace ratekv::alloc {

nlohmann::json read_json_file(const std::string& path, const char* what) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  check(!ec, "{}: cannot read {}: {}", path, what, ec.message());
  check(size <= (uint64_t)1 << 30, "{}: {} file of {} bytes is larger than the 1 GiB limit", path, what, size);
  std::ifstream in(path, std::ios::binary);
  check((bool)in, "{}: cannot open {} for reading", path, what);
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::parse_error& e) {
    fail("{}: invalid JSON: {}", path, e.what());
  }
}

}  // namespace ratekv::alloc
