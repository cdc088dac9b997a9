// ratekv._core — the Python extension (nanobind): a thin binding of the C++
// library, no second implementation of any method (docs/design.md §11). The Python
// package (python/ratekv/) wraps it with torch-facing helpers, custom ops and
// the Hugging Face cache.
//
// Arrays cross the boundary as nanobind ndarrays (DLPack / buffer protocol):
// numpy arrays and CPU torch tensors alike, C-contiguous float32 / int32, no
// copies. Outputs are written into caller-allocated arrays, so Python decides
// where memory lives. Every ratekv::Error becomes ratekv.RatekvError (a
// ValueError) with the library's message.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bind_common.h"

namespace nb = nanobind;

namespace ratekv::py {
void bind_config(nb::module_& m);
void bind_plan(nb::module_& m);
void bind_stats(nb::module_& m);
void bind_cache(nb::module_& m);
void bind_page_pool(nb::module_& m);
void bind_cuda(nb::module_& m);
}  // namespace ratekv::py

NB_MODULE(_core, m) {
  m.doc() = "ratekv C++ core (nanobind). Use the `ratekv` package, not this module directly.";
  nb::exception<ratekv::Error>(m, "RatekvError", PyExc_ValueError);
  ratekv::py::bind_config(m);
  ratekv::py::bind_plan(m);
  ratekv::py::bind_stats(m);
  ratekv::py::bind_cache(m);
  ratekv::py::bind_page_pool(m);
  ratekv::py::bind_cuda(m);
}
