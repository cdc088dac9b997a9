// ratekv/common/param_error.h — the Error of a bad parameter value, carrying
// the parameter's library name so that a front end can say it in its own
// words: the CLI maps it to the flag that set it (src/cli/flag_names.h).
#pragma once

#include <string>
#include <utility>

#include "ratekv/common/error.h"

namespace ratekv {

/// An Error caused by the value of one parameter of a library call: a field of
/// an options struct or an argument of a function. param() is its library
/// name, "<Owner>.<name>" with Owner the struct or the function
/// ("PlanRequest.k_bits", "EvalOptions.ctx", "calibrate.ctx"); detail() is the
/// rest of the message, usually starting with the value. what() is
/// "<param> <detail>" ("<param><detail>" when detail starts with ':'), e.g.
///   "PlanRequest.k_bits 70: expected a finite number of bits per element in 0..64".
class ParamError : public Error {
 public:
  ParamError(std::string param, std::string detail)
      : Error(join(param, detail)), param_(std::move(param)), detail_(std::move(detail)) {}
  const std::string& param() const { return param_; }
  const std::string& detail() const { return detail_; }
  /// "<name> <detail>", or "<name><detail>" when detail is empty or starts
  /// with ':' (how what() joins; front ends join their own name the same way).
  static std::string join(const std::string& name, const std::string& detail) {
    return detail.empty() || detail[0] == ':' ? name + detail : name + " " + detail;
  }

 private:
  std::string param_;
  std::string detail_;
};

/// Throws ParamError for parameter `param` ("<Owner>.<name>") with an
/// fmt-formatted detail.
template <typename... Args>
[[noreturn]] void fail_param(std::string param, fmt::format_string<Args...> f, Args&&... args) {
  throw ParamError(std::move(param), fmt::format(f, std::forward<Args>(args)...));
}

/// Throws ParamError for `param` unless `cond` holds.
template <typename... Args>
void check_param(bool cond, const char* param, fmt::format_string<Args...> f, Args&&... args) {
  if (!cond) throw ParamError(param, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace ratekv
