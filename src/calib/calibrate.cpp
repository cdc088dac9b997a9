// calibrate(): chunked forward passes with a statistics hook.
#include "ratekv/calib/calibrate.h"

#include <algorithm>

#include "ratekv/calib/accumulator.h"
#include "ratekv/common/error.h"
#include "ratekv/common/param_error.h"
#include "ratekv/common/log.h"

namespace ratekv::calib {

KVStats calibrate(Model& model, std::span<const int32_t> tokens, int64_t ctx) {
  const int64_t N = static_cast<int64_t>(tokens.size());
  check(N >= 1, "calibrate: no calibration tokens");
  check_param(ctx >= 1, "calibrate.ctx", "{}: expected at least 1", ctx);
  check_param(ctx <= model.position_limit(), "calibrate.ctx", "{}: exceeds the model's position limit {}", ctx,
              model.position_limit());
  KVStatsAccumulator acc(model.config());
  ForwardHooks hooks;
  hooks.on_layer = [&](const LayerActivations& a) { acc.add(a); };
  Progress prog("calibrate: tokens", N);
  for (int64_t start = 0; start < N; start += ctx) {
    const int64_t n = std::min(ctx, N - start);
    DenseKVCache cache = model.make_dense_cache(n);
    model.forward(tokens.subspan(start, n), 0, cache, nullptr, false, &hooks);
    prog.update(start + n);
  }
  prog.finish();
  KVStats s = acc.finish();
  s.ctx = ctx;
  return s;
}

}  // namespace ratekv::calib
