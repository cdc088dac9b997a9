// ratekv — command-line entry point. Subcommands live in cmd_*.cpp.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "cli/command.h"
#include "cli/flag_names.h"
#include "ratekv/common/error.h"
#include "ratekv/common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace ratekv::cli {

std::vector<CommandEntry>& command_registry() {
  static std::vector<CommandEntry> r;
  return r;
}

CLI::Validator non_negative_validator(const std::string& of, const std::string& note) {
  return CLI::Validator(
      [of, note](std::string& s) -> std::string {
        if (!s.empty() && s.find_first_not_of("0123456789") == std::string::npos) return "";
        return fmt::format("expected a whole number{} ≥ 0{}, got '{}'", of.empty() ? "" : " of " + of,
                           note.empty() ? "" : " (" + note + ")", s);
      },
      "N >= 0", "non_negative");
}

CLI::Validator non_empty_path_validator(const std::string& expected) {
  return CLI::Validator(
      [expected](std::string& s) -> std::string { return s.empty() ? "empty path; expected " + expected : ""; }, "",
      "non_empty_path");
}

CLI::Validator non_empty_validator(const std::string& expected) {
  return CLI::Validator(
      [expected](std::string& s) -> std::string { return s.empty() ? "empty; expected " + expected : ""; }, "",
      "non_empty");
}

namespace {

// The strict reading for one option (strict_number_options); `kind` is the CLI11 type name's stem.
std::string strict_number(std::string& s, const std::string& kind) {
  if (kind == "FLOAT") {
    if (parse_number<double>(s)) return "";
    return fmt::format("expected a decimal number, got '{}'", s);
  }
  std::optional<std::string> canon;
  if (kind == "UINT") {
    if (const auto v = parse_number<uint64_t>(s)) canon = std::to_string(*v);
  } else if (const auto v = parse_number<int64_t>(s)) {
    canon = std::to_string(*v);
  }
  if (canon) {
    s = *canon;
    return "";
  }
  // Out of range, or not a decimal integer at all: which one, for the message.
  std::string_view d = s;
  if (!d.empty() && (d[0] == '-' || d[0] == '+')) d.remove_prefix(1);
  const bool digits = !d.empty() && d.find_first_not_of("0123456789") == std::string_view::npos;
  if (digits && !(kind == "UINT" && s[0] == '-'))
    return fmt::format("'{}' is out of range (expected {})", s,
                       kind == "UINT" ? "0..18446744073709551615" : "-9223372036854775808..9223372036854775807");
  return fmt::format("expected a decimal {}integer, got '{}'", kind == "UINT" ? "non-negative " : "", s);
}

void strict_numbers_of(CLI::App& app) {
  for (CLI::Option* o : app.get_options()) {
    const std::string t = o->get_type_name();
    const std::string stem = t.substr(0, t.find(':'));
    if (o->get_type_size() == 0 || (stem != "INT" && stem != "UINT" && stem != "FLOAT")) continue;
    // CLI11 runs transforms first and checks last: the transform only rewrites a valid integer in canonical decimal
    // ("010" → "10", which CLI11's base-0 conversion would read as octal); what is invalid passes it unchanged,
    // so the option's own checks (seed_validator, non_negative_validator) name it first, and the check refuses
    // what is left.
    o->transform(CLI::Validator(
        [stem](std::string& s) {
          std::string t = s;
          if (strict_number(t, stem).empty()) s = t;
          return std::string();
        },
        "", "strict_number_canonical"));
    o->check(CLI::Validator([stem](std::string& s) { return strict_number(s, stem); }, "", "strict_number"));
  }
  for (CLI::App* sub : app.get_subcommands({})) strict_numbers_of(*sub);
}

}  // namespace

void strict_number_options(CLI::App& app) { strict_numbers_of(app); }

CLI::Validator seed_validator() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const std::string bad = fmt::format("a seed is an integer in 0..18446744073709551615, got '{}'", s);
        if (s.empty() || s.size() > 20) return bad;
        for (char c : s)
          if (c < '0' || c > '9') return bad;
        if (s.size() == 20 && s > "18446744073709551615") return bad;
        return "";
      },
      "SEED", "seed");
}

void check_output_path(const std::string& path, bool force, const std::string& flag) {
  namespace fs = std::filesystem;
  check(!path.empty(), "{}: empty output path", flag);
  // error_code forms throughout: a name too long or an unreadable parent is a clean error, not filesystem_error.
  std::error_code ec;
  const fs::path parent = fs::path(path).parent_path();
  check(parent.empty() || fs::is_directory(parent, ec), "{}: directory '{}' of '{}' does not exist", flag,
        parent.string(), path);
  check(!fs::is_directory(path, ec), "{}: '{}' is a directory; expected a file path", flag, path);
  // symlink_status: a dangling symbolic link is an existing entry too (writing through it would create its
  // target elsewhere, or fail after other outputs were written).
  if (!force && fs::exists(fs::symlink_status(path, ec))) {
    fail("{}: '{}' already exists; refusing to overwrite it (pass --force to replace it)", flag, path);
  }
  // Writable? An existing file (--force) must open for writing (without truncating it yet); other existing
  // entries (devices such as /dev/null, FIFOs: opening one could block) are left to the write. A new file is
  // probed by creating and removing an empty file beside it (access(2) would not do: root passes every
  // permission check, and a read-only file system shows only on creation).
  if (fs::exists(path, ec)) {
    if (fs::is_regular_file(path, ec)) {
      const int f = ::open(path.c_str(), O_WRONLY);
      check(f >= 0, "{}: cannot write '{}' ({})", flag, path, std::strerror(errno));
      ::close(f);
    }
    return;
  }
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  std::string probe = (fs::path(dir) / ".ratekv-write-probe-XXXXXX").string();
  const int fd = ::mkstemp(probe.data());
  check(fd >= 0, "{}: cannot write '{}': cannot create a file in '{}' ({})", flag, path, dir, std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

bool output_dir_exists(const std::string& dir, const std::string& flag) {
  namespace fs = std::filesystem;
  check(!dir.empty(), "{}: empty output directory", flag);
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (!fs::exists(st)) return false;
  check(fs::is_directory(st), "{}: '{}' exists and is not a directory; expected an output directory", flag, dir);
  return true;
}

void make_output_dir(const std::string& dir, const std::string& flag) {
  namespace fs = std::filesystem;
  if (output_dir_exists(dir, flag)) return;
  std::error_code ec;
  fs::create_directories(dir, ec);
  check(!ec && fs::is_directory(dir), "{}: cannot create the output directory '{}': {}", flag, dir,
        ec ? ec.message() : std::string("not a directory after creation"));
}

}  // namespace ratekv::cli

int main(int argc, char** argv) {
  CLI::App app{
      "ratekv — rate–distortion-optimal KV-cache compression for RoPE LLMs.\n"
      "Calibrate a GGUF model on unlabeled text, allocate bits (uniform, Block-GTQ, RateQuant),\n"
      "measure attention error / perplexity / retrieval, and generate from a packed cache.",
      "ratekv"};
  app.require_subcommand(1);
  app.footer(
      "Exit status: 0 success; 1 bad input (file, field, value) or a failure while running, with an\n"
      "'error: ...' line; 2 usage error (unknown flag or subcommand, a value of the wrong type or one\n"
      "that fails the option's own check, such as an input FILE that does not exist).");
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off")
      ->capture_default_str()
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}))  // a usage error: exit 2
      ->each([](const std::string& s) {
        ratekv::cli::with_flag_names({{"set_log_level.level", "--log-level"}}, [&] { ratekv::set_log_level(s); });
      });
  app.set_version_flag("--version", "ratekv 0.1.0");
  auto& reg = ratekv::cli::command_registry();
  std::sort(reg.begin(), reg.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (auto& c : reg) c.setup(app);
  ratekv::cli::strict_number_options(app);
  try {
    // stdout carries results (tables, JSON); all logging goes to stderr.
    spdlog::set_default_logger(spdlog::stderr_color_mt("ratekv"));
    spdlog::set_pattern("[%l] %v");
    // llama.cpp spells the cache types -ctk / -ctv (one dash, three letters),
    // which CLI11 cannot declare as a short name: map them to the long names.
    std::vector<std::string> args;
    for (int i = argc - 1; i >= 1; --i) {  // CLI11 takes the arguments in reverse order
      std::string a = argv[i];
      for (const auto& [from, to] : {std::pair<std::string, std::string>{"-ctk", "--cache-type-k"},
                                     std::pair<std::string, std::string>{"-ctv", "--cache-type-v"}})
        if (a == from || a.rfind(from + "=", 0) == 0) a = to + a.substr(from.size());
      args.push_back(std::move(a));
    }
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    // --help / --version exit 0; a usage error (unknown flag or subcommand, a
    // value that does not parse or fails its check) prints CLI11's message,
    // which names the option, on an 'error: ' line and exits 2 (not CLI11's
    // own 100+ codes). A first argument that is no command is named (CLI11
    // says only "A subcommand is required").
    if (e.get_exit_code() == 0) return app.exit(e);
    std::string what = e.what();
    // strict_number_options has read the value in 64-bit range already, so a conversion that still fails is a
    // value beyond a narrower (32-bit) option: CLI11 says only "Could not convert: --flag = value".
    if (const std::string head = "Could not convert: "; e.get_name() == "ConversionError" && what.rfind(head, 0) == 0) {
      const std::string rest = what.substr(head.size());
      if (const size_t eq = rest.find(" = "); eq != std::string::npos) {
        // Only an integer in 64-bit range that an int flag cannot hold; other conversions (true/false flags
        // given 'maybe') keep CLI11's words.
        const std::string value = rest.substr(eq + 3);
        if (ratekv::cli::parse_number<int64_t>(value))
          what = rest.substr(0, eq) + ": '" + value +
                 "' is out of range for this flag (expected an integer in -2147483648..2147483647)";
      }
    }
    if (argc >= 2 && argv[1][0] != '-' &&
        std::none_of(reg.begin(), reg.end(), [&](const auto& c) { return c.name == argv[1]; })) {
      what = std::string("unknown command '") + argv[1] + "' (expected one of:";
      for (const auto& c : reg) what += " " + c.name;
      what += ")";
    }
    std::fprintf(stderr, "error: %s\nRun with --help for more information.\n", what.c_str());
    return 2;
  } catch (const ratekv::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    // Last resort: a library exception that escaped validation is still a
    // clean error, never an abort. Each such case is a bug to report. It is a
    // failure while running (1), not a usage error (2).
    std::fprintf(stderr, "error: %s (internal: unexpected exception, please report)\n", e.what());
    return 1;
  }
  return 0;
}
