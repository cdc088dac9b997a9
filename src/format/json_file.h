// format/json_file.h — reading a bounded JSON document from disk (plans,
// calibration statistics; the CLI's panel reports).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace ratekv::format {

/// Parses the JSON file at `path` (at most 1 GiB), which must hold a JSON
/// object. `what` names the document in messages ("plan", "statistics");
/// `expected` says what the file should be when it is not JSON at all
/// ("a JSON plan (…)"): "<path>: not <expected>: it starts with …" (its first
/// characters or bytes, and GGUF / safetensors when it is one). Throws Error
/// naming the path for an unreadable, oversized, non-JSON or invalid file.
nlohmann::json read_json_file(const std::string& path, const char* what, const char* expected);

}  // namespace ratekv::format
