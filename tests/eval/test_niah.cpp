// NIAH scoring and needles: exact-digit scoring, deterministic 7-digit needles,
// haystack loading errors.
#include <gtest/gtest.h>

#include <set>

#include "ratekv/error.h"
#include "ratekv/eval/niah.h"

using namespace ratekv;
using namespace ratekv::eval;

TEST(Niah, CorrectNeedsTheFirstDigitRunToBeTheCode) {
  EXPECT_TRUE(niah_correct(" 1234567.", "1234567"));
  EXPECT_TRUE(niah_correct("The code is 1234567, I think", "1234567"));
  EXPECT_FALSE(niah_correct(" 12345678", "1234567"));      // longer run
  EXPECT_FALSE(niah_correct(" 123456", "1234567"));        // truncated
  EXPECT_FALSE(niah_correct(" 7 then 1234567", "1234567"));  // first run is another number
  EXPECT_FALSE(niah_correct(" the secret code", "1234567"));
  EXPECT_FALSE(niah_correct("", "1234567"));
}

TEST(Niah, NeedlesAreDeterministicAndVaried) {
  std::set<std::string> codes, cities;
  for (int trial = 0; trial < 10; ++trial) {
    const auto a = niah_needle(0, 1024, 3, trial), b = niah_needle(0, 1024, 3, trial);
    EXPECT_EQ(a, b);
    ASSERT_EQ(a.second.size(), 7u);
    EXPECT_NE(a.second[0], '0');
    codes.insert(a.second);
    cities.insert(a.first);
  }
  EXPECT_EQ(codes.size(), 10u);
  EXPECT_GE(cities.size(), 5u);
  EXPECT_NE(niah_needle(0, 1024, 3, 0), niah_needle(1, 1024, 3, 0));
}

TEST(Niah, MissingHaystackIsAnError) {
  EXPECT_THROW(load_haystack("/nonexistent/haystack"), Error);
}
