// rotation_dump M BITS SEED OUT — writes, as raw float32, the Haar rotation Π of TQ-MSE (m×m, row-major,
// y = Π u, built by ratekv::quant::Rotation(haar, m, seed) applied to the unit vectors), then the
// 2^BITS − 1 Lloyd–Max thresholds and the 2^BITS levels of lloyd_max_codebook(m, BITS).
// Helper of tools/code_tie/hf_code_tie_probe.py (which says how to compile it: with -march=native like the
// libraries it links, or Eigen's alignment differs and the program aborts at exit); not part of the build.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "ratekv/quant/rotation.h"
#include "ratekv/quant/lloyd_max.h"
using namespace ratekv::quant;
int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: rotation_dump M BITS SEED OUT (M: group width, BITS: 1..4, OUT: output file)\n");
    return 2;
  }
  int m = atoi(argv[1]), bits = atoi(argv[2]);
  unsigned long long seed = strtoull(argv[3], nullptr, 10);
  Rotation r(RotationKind::haar, m, seed);
  std::vector<float> P(m * m), e(m), y(m);
  for (int j = 0; j < m; ++j) {
    for (int i = 0; i < m; ++i) e[i] = i == j ? 1.f : 0.f;
    r.apply(e.data(), y.data());
    for (int i = 0; i < m; ++i) P[i * m + j] = y[i];
  }
  const Codebook& cb = lloyd_max_codebook(m, bits);
  FILE* f = fopen(argv[4], "wb");
  if (!f) {
    fprintf(stderr, "rotation_dump: cannot write %s\n", argv[4]);
    return 1;
  }
  fwrite(P.data(), 4, P.size(), f);
  fwrite(cb.thresholds.data(), 4, cb.thresholds.size(), f);
  fwrite(cb.levels.data(), 4, cb.levels.size(), f);
  fclose(f);
}
