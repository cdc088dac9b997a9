// ratekv/common/parallel_errors.h — carrying an exception out of an OpenMP
// parallel region. An exception may not leave a region: the runtime calls
// std::terminate and the whole process aborts (a Python interpreter included),
// even when the region's `if` clause runs it on one thread. Loops whose body
// can throw (check()/fail() on a bad value: an fp16 overflow of a norm or a
// scale, a non-finite input) run each iteration through FirstError::run and
// rethrow the first error after the region.
#pragma once

#include <exception>
#include <mutex>
#include <utility>

namespace ratekv {

/// The first exception thrown by any iteration of a parallel loop:
///
///   FirstError err;
///   #pragma omp parallel for
///   for (int i = 0; i < n; ++i) err.run([&] { body(i); });   // `return` skips an iteration
///   err.rethrow();
///
/// run() never throws; later iterations still run (their errors are dropped).
/// rethrow() throws the captured exception, if any, on the calling thread.
class FirstError {
 public:
  template <class F>
  void run(F&& f) noexcept {
    try {
      std::forward<F>(f)();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!err_) err_ = std::current_exception();
    }
  }
  void rethrow() const {
    if (err_) std::rethrow_exception(err_);
  }

 private:
  std::mutex mu_;
  std::exception_ptr err_;
};

}  // namespace ratekv
