// The layers `ratekv capture` records without --layers (src/cli/capture_layers.h):
// first, middle and last, ascending, each once — also for models of 1 and 2
// layers, which {0, n/2, n−1} used to turn into a refusal ("layer 0 given
// twice" / "layer 1 given twice") of a flag the user had not given. No GGUF
// asset has fewer than 30 layers, so this is checked on the helper itself.
#include <gtest/gtest.h>

#include <vector>

#include "cli/capture_layers.h"

using ratekv::cli::default_capture_layers;

TEST(CaptureDefaultLayers, FirstMiddleLastWithoutRepeats) {
  EXPECT_EQ(default_capture_layers(1), (std::vector<int>{0}));
  EXPECT_EQ(default_capture_layers(2), (std::vector<int>{0, 1}));
  EXPECT_EQ(default_capture_layers(3), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(default_capture_layers(4), (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(default_capture_layers(30), (std::vector<int>{0, 15, 29}));  // SmolLM2-135M
  EXPECT_EQ(default_capture_layers(36), (std::vector<int>{0, 18, 35}));  // Qwen2.5-3B
}
