// cli/flag_names.h — the library names its own parameters (ParamError,
// ratekv/common/param_error.h: "PlanRequest.k_bits", "EvalOptions.ctx",
// "calibrate.ctx", …); each command says which of its flags sets each of
// them, and errors reach the user in the command's words ("--kbits 70: …").
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ratekv/common/param_error.h"

namespace ratekv::cli {

/// One library parameter and the flag of this command that sets it.
struct FlagName {
  std::string param;  ///< ParamError::param(), e.g. "PlanRequest.k_bits"
  std::string flag;   ///< e.g. "--kbits"
};
using FlagNames = std::vector<FlagName>;

/// Runs fn(). A ratekv::ParamError whose param() is listed in `names` is
/// rethrown as ratekv::Error "<flag> <detail>" (joined as ParamError joins);
/// any other exception, and a ParamError of a parameter not listed (it keeps
/// the library's name), passes unchanged.
inline void with_flag_names(const FlagNames& names, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ParamError& e) {
    for (const FlagName& n : names)
      if (n.param == e.param()) throw Error(ParamError::join(n.flag, e.detail()));
    throw;
  }
}

}  // namespace ratekv::cli
