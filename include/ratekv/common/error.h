// ratekv/common/error.h — the one exception type the library throws.
//
// Every user-facing failure (bad file, bad parameter, impossible budget, plan
// not matching the model, NaN activations) is ratekv::Error naming the file /
// field / library parameter (ParamError, ratekv/common/param_error.h) and what
// was expected. The CLI prints "error: <message>" and exits with status 1.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace ratekv {

/// A recoverable, user-facing error. what() is a complete sentence fragment
/// such as "model.gguf: tensor 'blk.0.attn_q.weight': data extends past end of
/// file (offset 123, size 456, file 400 bytes)".
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

/// Throws ratekv::Error with an fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

/// Throws ratekv::Error(message) unless `cond` holds. Use for input validation,
/// not for internal invariants (those are assert()).
template <typename... Args>
void check(bool cond, fmt::format_string<Args...> f, Args&&... args) {
  if (!cond) throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace ratekv
