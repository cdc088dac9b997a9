// cli/command.h — self-registering subcommands of the `ratekv` tool.
//
// Each src/cli/cmd_<name>.cpp defines a static Registrar with a setup
// function that adds its CLI11 subcommand (flags, help text) and sets its
// callback. main.cpp builds the app from every registrar, sorted by name.
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
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

/// The strict reading of a number given to a flag: decimal only (an optional sign, then digits; for floating
/// point also a fraction, an exponent, inf and nan), the whole string, within T's range. CLI11 2.1's own
/// conversion reads "010" as octal 8 and "0x10" as 16, saturates an out-of-range integer (`-c
/// 99999999999999999999` ran as -c 9223372036854775807) and reads "" as 0.0 (`--kbits ""` planned at 0 bits).
/// nullopt when `s` does not read as T. Used by add_list_option and strict_number_options.
template <typename T>
std::optional<T> parse_number(std::string_view s) {
  static_assert((std::is_integral_v<T> && !std::is_same_v<T, bool>) || std::is_floating_point_v<T>);
  const bool plus = !s.empty() && s[0] == '+';
  if (plus) s.remove_prefix(1);
  if (s.empty() || s[0] == '+' || (s[0] == '-' && (plus || std::is_unsigned_v<T>))) return std::nullopt;  // "+-5"
  T v{};
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

/// Gives every option of `app` and its subcommands whose value type is an integer or a floating-point
/// number (CLI11 type names INT, UINT, FLOAT) the strict reading of parse_number (64-bit range; CLI11 then
/// narrows to the option's own type and refuses what does not fit; main.cpp words that refusal as "<flag>: '…' is
/// out of range for this flag"): a usage error (exit 2) "<flag>: expected a
/// decimal integer, got '0x10'" / "… '99999999999999999999' is out of range" / "expected a decimal number, got
/// ''". An option's own checks (seed_validator, non_negative_validator) still speak first.
/// Integers reach CLI11 in canonical decimal ("010" → "10"). main.cpp calls it after every command's setup.
void strict_number_options(CLI::App& app);

/// CLI11 check of a `--seed` value: an unsigned decimal integer in 0..2^64-1.
/// CLI11 parses "-1" into a uint64_t as 2^64-1 and accepts it; with this check
/// a negative, fractional or out-of-range seed is a usage error (exit 2)
/// "--seed: a seed is an integer in 0..18446744073709551615, got '-1'".
/// Add it to every option that reads a seed.
CLI::Validator seed_validator();
/// Validator of a whole number ≥ 0 given as digits only: "expected a whole number ≥ 0, got '-64'", or with
/// `of` = "layers" and `note` = "0 = all": "expected a whole number of layers ≥ 0 (0 = all), got '-1'" (CLI11's
/// NonNegativeNumber printed the top of its range, DBL_MAX, in full). Overflow of the option's type is left to
/// CLI11's conversion ("… could not be converted").
CLI::Validator non_negative_validator(const std::string& of = "", const std::string& note = "");
/// Validator of a path option whose absence means something (a default file, stdout, no output): an empty
/// argument is a usage error (exit 2) "<flag>: empty path; expected <expected>" — `--haystack ""` used to be
/// read as the flag left out (the default haystack), `--out ""` as stdout. Adds nothing to the help's type.
CLI::Validator non_empty_path_validator(const std::string& expected);

/// A CLI11 validator refusing an empty string argument (not a path), e.g. `-p ''`: the message
/// reads "<flag>: empty; expected <expected>".
CLI::Validator non_empty_validator(const std::string& expected);

/// The first item of a list flag's values that equals an earlier one (nullopt
/// when all differ): for flags whose items must be distinct, e.g. panel and rd
/// --bits, each with its own message.
template <class T>
std::optional<T> first_repeat(const std::vector<T>& items) {
  for (size_t i = 0; i < items.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (items[i] == items[j]) return items[i];
  return std::nullopt;
}

/// The items of one comma-list argument, empty ones refused: throws
/// CLI::ValidationError "<flag>: '16,,': item 2 is empty; expected values
/// separated by single commas (e.g. 16,32)" (a usage error, exit 2).
inline std::vector<std::string> split_list_argument(const std::string& raw, const std::string& flag) {
  std::vector<std::string> items;
  for (size_t start = 0;;) {
    const size_t at = raw.find(',', start);
    items.push_back(raw.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) break;
    start = at + 1;
  }
  for (size_t i = 0; i < items.size(); ++i)
    if (items[i].empty())
      throw CLI::ValidationError(flag, "'" + raw + "': item " + std::to_string(i + 1) +
                                           " is empty; expected values separated by single commas (e.g. 16,32)");
  return items;
}

/// A comma-list option ("-p 16,32"; repeating the flag adds items) read into
/// `out`, replacing its default when given. Use it for every list flag instead
/// of CLI11's ->delimiter(','), whose splitting drops empty items silently
/// ("-p 16,," ran -p 16): here an empty item, an item that does not convert to
/// T, or one `each` refuses (e.g. CLI::IsMember) is a usage error naming the
/// flag (split_list_argument; exit 2). `names` as for add_option
/// ("-p,--n-prompt"; errors say "-p/--n-prompt"). Do not chain ->check() on the
/// result (it would see the unsplit argument): pass the check as `each`.
template <class T>
CLI::Option* add_list_option(CLI::App* app, const std::string& names, std::vector<T>& out,
                             const std::string& description, CLI::Validator each = CLI::Validator()) {
  std::string flag = names;
  for (char& c : flag)
    if (c == ',') c = '/';
  std::string defaults;
  for (const T& v : out) defaults += (defaults.empty() ? "" : ",") + CLI::detail::to_string(v);
  CLI::Option* o = app->add_option_function<std::vector<std::string>>(
      names,
      [&out, flag, each](const std::vector<std::string>& raw) {
        std::vector<T> v;
        for (const std::string& r : raw)
          for (std::string item : split_list_argument(r, flag)) {
            const std::string bad = each(item);
            if (!bad.empty()) throw CLI::ValidationError(flag, bad);
            T x{};
            bool ok;
            if constexpr ((std::is_integral_v<T> && !std::is_same_v<T, bool>) || std::is_floating_point_v<T>) {
              const std::optional<T> n = parse_number<T>(item);  // decimal only ("010" was octal 8)
              ok = n.has_value();
              if (ok) x = *n;
            } else {
              ok = CLI::detail::lexical_cast(item, x);
            }
            if (!ok)
              throw CLI::ValidationError(flag, "'" + item + "': expected " +
                                                   (std::is_integral_v<T> ? "an integer" : "a number") +
                                                   (std::is_integral_v<T> ? " (decimal, in range)" : ""));
            v.push_back(std::move(x));
          }
        out = std::move(v);
      },
      description);
  o->type_name("LIST");
  if (!defaults.empty()) o->default_str(defaults);
  return o;
}

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
