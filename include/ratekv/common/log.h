// ratekv/common/log.h — logging and progress for long work.
//
// Logging goes through spdlog to stderr (stdout is kept for results and JSON).
// Progress prints "label: done/total (pct) eta" at most a few times a second,
// only when stderr is a terminal or RATEKV_PROGRESS=1, so CI logs stay short.
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace ratekv {

/// Sets the global log level from a name ("trace".."off"); throws ParamError
/// "set_log_level.level" on an unknown name.
void set_log_level(const std::string& level);

/// A progress counter for loops over `total` units (tokens, sequences, layers).
/// Not thread-safe: call update() from one thread.
class Progress {
 public:
  Progress(std::string label, int64_t total);
  /// Marks `done` units finished (absolute count, not a delta).
  void update(int64_t done);
  /// Prints the final line with the elapsed time.
  void finish();
  ~Progress();

 private:
  std::string label_;
  int64_t total_;
  bool enabled_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_, last_;
};

}  // namespace ratekv
