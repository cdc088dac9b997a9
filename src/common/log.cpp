#include "ratekv/common/log.h"

#include <cstdio>
#include <cstdlib>
#include <unistd.h>

#include "ratekv/common/error.h"
#include "ratekv/common/param_error.h"

namespace ratekv {

void set_log_level(const std::string& level) {
  const auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") {
    fail_param("set_log_level.level", "'{}': unknown level (expected trace, debug, info, warn, error, off)", level);
  }
  spdlog::set_level(lvl);
}

static bool progress_enabled() {
  if (const char* e = std::getenv("RATEKV_PROGRESS")) return std::string(e) == "1";
  return isatty(fileno(stderr)) != 0;
}

Progress::Progress(std::string label, int64_t total)
    : label_(std::move(label)), total_(total), enabled_(progress_enabled()) {
  start_ = last_ = std::chrono::steady_clock::now();
}

void Progress::update(int64_t done) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (done < total_ && now - last_ < std::chrono::milliseconds(250)) return;
  last_ = now;
  const double el = std::chrono::duration<double>(now - start_).count();
  const double frac = total_ > 0 ? (double)done / (double)total_ : 1.0;
  const double eta = frac > 0 ? el * (1.0 - frac) / frac : 0.0;
  std::fprintf(stderr, "\r%s: %lld/%lld (%.0f%%) elapsed %.1fs eta %.1fs   ", label_.c_str(),
               (long long)done, (long long)total_, 100.0 * frac, el, eta);
  std::fflush(stderr);
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (!enabled_) return;
  const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::fprintf(stderr, "\r%s: %lld/%lld done in %.1fs            \n", label_.c_str(), (long long)total_,
               (long long)total_, el);
}

Progress::~Progress() { finish(); }

}  // namespace ratekv
