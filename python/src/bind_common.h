// Shared helpers of the nanobind bindings (python/src/): array types and
// shape checks that raise ratekv::Error (→ ratekv.RatekvError) naming the
// argument and the expected shape.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "ratekv/cache/plan_codecs.h"
#include "ratekv/common/error.h"

// PlanCodecs holds unique_ptrs: not copyable, though std::vector declares a copy
// constructor; tell nanobind so it never generates a copy.
namespace nanobind::detail {
template <>
struct is_copy_constructible<ratekv::cache::PlanCodecs> : std::false_type {};
}  // namespace nanobind::detail

namespace ratekv::py {

namespace nb = nanobind;

/// Read-only / writable C-contiguous CPU arrays (numpy or torch via DLPack).
using F32In = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
using F32Out = nb::ndarray<float, nb::c_contig, nb::device::cpu>;
using I32In = nb::ndarray<const int32_t, nb::c_contig, nb::device::cpu>;
using I32Out = nb::ndarray<int32_t, nb::c_contig, nb::device::cpu>;
using F64Out = nb::ndarray<double, nb::c_contig, nb::device::cpu>;

inline std::string shape_str(size_t ndim, const int64_t* s) {
  std::string r = "(";
  for (size_t i = 0; i < ndim; ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + (ndim == 1 ? ",)" : ")");
}

/// Throws Error "<what>: shape (…) expected (…)" unless `a` has exactly
/// `shape` (an entry < 0 matches any extent).
template <typename A>
void check_shape(const A& a, const char* what, std::initializer_list<int64_t> shape) {
  bool ok = a.ndim() == shape.size();
  size_t i = 0;
  std::vector<int64_t> want;
  for (int64_t s : shape) {
    want.push_back(s);
    if (ok && s >= 0 && a.shape(i) != static_cast<size_t>(s)) ok = false;
    ++i;
  }
  if (!ok) {
    std::vector<int64_t> got;
    for (size_t k = 0; k < a.ndim(); ++k) got.push_back(static_cast<int64_t>(a.shape(k)));
    std::string w = "(";
    for (size_t k = 0; k < want.size(); ++k) w += (k ? ", " : "") + (want[k] < 0 ? std::string("*") : std::to_string(want[k]));
    w += want.size() == 1 ? ",)" : ")";
    fail("{}: shape {}, expected {}", what, shape_str(got.size(), got.data()), w);
  }
}

}  // namespace ratekv::py
