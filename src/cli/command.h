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

/// Validates an output path before any work is done: throws ratekv::Error
/// naming the flag and the path when it is empty, its directory does not
/// exist, it is a directory, or it exists and `force` is not set. Call it for
/// every output path at the start of a command.
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
