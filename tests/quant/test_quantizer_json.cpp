// The Quantizer interface: JSON descriptions round-trip for every kind and bad
// descriptions are rejected with Error; relative_distortion.
#include <gtest/gtest.h>

#include <vector>

#include "ratekv/common/error.h"
#include "ratekv/quant/prng.h"
#include "ratekv/quant/quantizer.h"

using namespace ratekv;
using namespace ratekv::quant;
using nlohmann::json;

TEST(QuantizerJson, RoundTripEveryKind) {
  const std::vector<json> descs = {
      {{"kind", "tq_mse"}, {"dim", 64}, {"bits", 3}, {"seed", 5}, {"rotation", "hadamard"}, {"norm", "fp16"},
       {"norm_correction", true}},
      {{"kind", "tq_prod"}, {"dim", 48}, {"bits", 3}, {"seed", 6}, {"rotation", "haar"}},
      {{"kind", "grouped_tq_mse"}, {"dim", 8}, {"rotation", "haar"}, {"norm", "fp32"}, {"norm_correction", false},
       {"groups", json::array({{{"channels", {0, 1, 4, 5}}, {"bits", 2}, {"seed", 1}},
                               {{"channels", {2, 3}}, {"bits", 4}, {"seed", 2}}})}},
      {{"kind", "kivi_key"}, {"dim", 64}, {"bits", 2}, {"group_size", 32}},
      {{"kind", "kivi_value"}, {"dim", 64}, {"bits", 2}, {"group_size", 32}},
      {{"kind", "quarot"}, {"dim", 64}, {"bits", 4}, {"seed", 9}, {"symmetric", false}, {"group_size", 32},
       {"rotation", "hadamard"}},
      {{"kind", "q8_0"}, {"dim", 64}},
      {{"kind", "q4_0"}, {"dim", 64}},
  };
  SplitMix64 rng(1);
  for (const auto& d : descs) {
    SCOPED_TRACE(d.dump());
    auto q = make_quantizer(d);
    EXPECT_EQ(q->to_json(), d);
    EXPECT_EQ(to_string(q->kind()), d["kind"]);
    auto q2 = make_quantizer(q->to_json());
    const int T = 33, m = q->dim();
    std::vector<float> x(T * m), a(T * m), b(T * m);
    for (auto& v : x) v = (float)rng.gaussian();
    q->fake_quant(x.data(), T, a.data());
    q2->fake_quant(x.data(), T, b.data());
    EXPECT_EQ(a, b);
    const double D = relative_distortion(*q, x.data(), T);
    EXPECT_GT(D, 0.0);
    EXPECT_LT(D, 1.0);
    EXPECT_GT(q->bits_per_element(), q->code_bits_per_element());
  }
}

TEST(QuantizerJson, RejectsBadDescriptions) {
  EXPECT_THROW(make_quantizer(json::array()), Error);
  EXPECT_THROW(make_quantizer({{"kind", "nope"}}), Error);
  EXPECT_THROW(make_quantizer({{"kind", "tq_mse"}, {"bits", 3}}), Error);            // no dim
  EXPECT_THROW(make_quantizer({{"kind", "tq_mse"}, {"dim", "64"}, {"bits", 3}}), Error);  // dim not int
  EXPECT_THROW(make_quantizer({{"kind", "tq_mse"}, {"dim", 64}, {"bits", 3}, {"seed", -1}}), Error);
  EXPECT_THROW(make_quantizer({{"kind", "tq_mse"}, {"dim", 64}, {"bits", 3}, {"rotation", "dct"}}), Error);
  EXPECT_THROW(make_quantizer({{"kind", "kivi_key"}, {"dim", 64}, {"bits", 2}}), Error);  // no group_size
  EXPECT_THROW(make_quantizer({{"kind", "tasq"}, {"dim", 64}}), Error);
  EXPECT_THROW(make_quantizer({{"kind", "q4_0"}, {"dim", 40}}), Error);
  EXPECT_THROW(make_quantizer({{"kind", "grouped_tq_mse"}, {"dim", 8}}), Error);
}
