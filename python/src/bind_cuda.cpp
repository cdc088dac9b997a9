// Bindings: the CUDA packed cache (src/cuda kernels). Built only when the
// library has CUDA (RATEKV_HAVE_CUDA); otherwise ratekv._core.has_cuda is
// False and the CUDA custom ops raise a clear error.
#include <nanobind/nanobind.h>

#include "bind_common.h"

namespace ratekv::py {

void bind_cuda(nb::module_& m) {
#ifdef RATEKV_PY_CUDA
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif
}

}  // namespace ratekv::py
