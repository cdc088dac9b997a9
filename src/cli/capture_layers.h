// The layers `ratekv capture` records when --layers is not given.
#pragma once

#include <vector>

namespace ratekv::cli {

/// First, middle and last layer of a model of n_layers ≥ 1 layers, ascending
/// and without repeats: {0} for 1 layer, {0, 1} for 2, {0, n/2, n−1} from 3
/// on (a 1- or 2-layer model used to be refused with "--layers: layer … given
/// twice" for a flag the user had not given).
inline std::vector<int> default_capture_layers(int n_layers) {
  std::vector<int> layers;
  for (const int l : {0, n_layers / 2, n_layers - 1})  // non-decreasing: repeats are adjacent
    if (layers.empty() || layers.back() != l) layers.push_back(l);
  return layers;
}

}  // namespace ratekv::cli
