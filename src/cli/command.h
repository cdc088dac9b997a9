// cli/command.h — self-registering subcommands of the `ratekv` tool.
//
// Each src/cli/cmd_<name>.cpp defines a static Registrar with a setup
// function that adds its CLI11 subcommand (flags, help text) and sets its
// callback. main.cpp builds the app from every registrar, sorted by name.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace ratekv::cli {

/// setup(app) must create exactly one subcommand on `app` and attach a
/// callback; the callback throws ratekv::Error for user errors.
using SetupFn = std::function<void(CLI::App& app)>;

struct CommandEntry {
  std::string name;
  SetupFn setup;
};

std::vector<CommandEntry>& command_registry();

/// Registers a subcommand at static-initialization time.
struct Registrar {
  Registrar(std::string name, SetupFn fn) { command_registry().push_back({std::move(name), std::move(fn)}); }
};

/// CLI11 check of a `--seed` value: an unsigned decimal integer in 0..2^64-1.
/// CLI11 parses "-1" into a uint64_t as 2^64-1 and accepts it; with this check
/// a negative, fractional or out-of-range seed is a usage error (exit 2)
/// "--seed: a seed is an integer in 0..18446744073709551615, got '-1'".
/// Add it to every option that reads a seed.
CLI::Validator seed_validator();

/// Validates an output path before any work is done: throws ratekv::Error
/// naming the flag and the path when it is empty, its directory does not
/// exist, it is a directory, it exists and `force` is not set, or nothing can
/// be written in its directory (probed by creating and removing an empty
/// hidden file there, so a read-only file system or a missing permission fails
/// now, not after a long run; an existing file with --force must also be
/// writable). Call it for every output path at the start of a command.
void check_output_path(const std::string& path, bool force, const std::string& flag);

/// Whether the output directory `dir` exists. Throws ratekv::Error naming the
/// flag and the path when `dir` is empty or exists and is not a directory.
bool output_dir_exists(const std::string& dir, const std::string& flag);

/// Creates the output directory `dir` (and missing parents) if needed. Throws
/// ratekv::Error naming the flag and the path when `dir` is empty, exists and
/// is not a directory, or cannot be created (a parent is a file, no
/// permission), never std::filesystem::filesystem_error.
void make_output_dir(const std::string& dir, const std::string& flag);

}  // namespace ratekv::cli
