// cli/flag_names.h — the library names its own parameters (ParamError,
// ratekv/common/param_error.h: "PlanRequest.k_bits", "EvalOptions.ctx",
// "calibrate.ctx", …); each command says which of its flags sets each of
// them, and errors reach the user in the command's words ("--kbits 70: …").
#pragma once

#include <algorithm>
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

/// `text` with every listed library parameter it mentions replaced by its flag
/// (longest names first, so that no name is replaced inside a longer one).
inline std::string with_flags_in(std::string text, const FlagNames& names) {
  std::vector<const FlagName*> order;
  for (const FlagName& n : names) order.push_back(&n);
  std::stable_sort(order.begin(), order.end(),
                   [](const FlagName* a, const FlagName* b) { return a->param.size() > b->param.size(); });
  for (const FlagName* n : order)
    for (size_t at = text.find(n->param); at != std::string::npos; at = text.find(n->param, at + n->flag.size()))
      text.replace(at, n->param.size(), n->flag);
  return text;
}

/// Runs fn(). A ratekv::ParamError whose param() is listed in `names` is
/// rethrown as ratekv::Error "<flag> <detail>" (joined as ParamError joins),
/// the other listed parameters its detail mentions named by their flags too
/// ("... 3 code bits (PlanRequest.b_min)" → "(--bmin)"); any other exception,
/// and a ParamError of a parameter not listed (it keeps the library's name),
/// passes unchanged.
inline void with_flag_names(const FlagNames& names, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ParamError& e) {
    for (const FlagName& n : names)
      if (n.param == e.param()) throw Error(ParamError::join(n.flag, with_flags_in(e.detail(), names)));
    throw;
  }
}

}  // namespace ratekv::cli
