// alloc/json_file.h — reading a bounded JSON document from disk (plans,
// allocator statistics). Internal to the alloc module.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace ratekv::alloc {

/// Parses the JSON file at `path` (at most 1 GiB). `what` names the document
/// in messages ("plan", "statistics"). Throws Error naming the path for an
/// unreadable, oversized or invalid file.
nlohmann::json read_json_file(const std::string& path, const char* what);

}  // namespace ratekv::alloc
