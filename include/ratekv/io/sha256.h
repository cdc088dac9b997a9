// ratekv/io/sha256.h — SHA-256 (FIPS 180-4) of byte strings and files, used to
// record which model and text a statistics file or plan was made from.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace ratekv {

/// Lower-case hex SHA-256 digest (64 characters) of `data`.
std::string sha256_hex(std::span<const uint8_t> data);

/// Lower-case hex SHA-256 digest of the whole file at `path`, read in 1 MiB
/// pieces. Throws Error naming the path when it cannot be opened or read.
std::string sha256_file(const std::string& path);

}  // namespace ratekv
