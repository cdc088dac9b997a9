// PerplexityScorer (ratekv/model/perplexity.h) against closed forms: logits whose softmax at the
// target is known exactly, so every scored token's NLL, the PPL and its ± follow by hand
// (llama-perplexity's definitions, restated here in double), plus the scored positions, the BOS
// substitution, the chunk count and the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ratekv/common/error.h"
#include "ratekv/model/perplexity.h"

using namespace ratekv;

namespace {

constexpr int V = 11;

// The logit the target gets at row j of chunk c (others 0): NLL = log(e^a + V − 1) − a.
double target_logit(int64_t c, int64_t j) {
  return 0.37 * static_cast<double>(j) - 0.9 * static_cast<double>(c) + 0.25;
}
double closed_form_nll(double a) { return std::log(std::exp(a) + (V - 1)) - a; }

// Row j of chunk c: logit a at tokens[start + j + 1], 0 elsewhere; rows that are not scored get a
// different target so that scoring a wrong row changes the result.
std::vector<float> chunk_logits(const std::vector<int32_t>& tokens, int64_t c, int64_t n_ctx) {
  std::vector<float> l(static_cast<size_t>(n_ctx) * V, 0.0f);
  for (int64_t j = 0; j < n_ctx; ++j) {
    const int64_t next = c * n_ctx + j + 1;
    const int32_t target = next < static_cast<int64_t>(tokens.size()) ? tokens[next] : 0;
    const bool scored = j >= n_ctx / 2 && j < n_ctx - 1;
    l[j * V + (scored ? target : (target + 1) % V)] = static_cast<float>(target_logit(c, j));
  }
  return l;
}

std::vector<int32_t> text(int64_t n) {
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((7 * i + 3) % V);
  return t;
}

}  // namespace

TEST(PerplexityScorer, MatchesTheClosedFormOnAnOddContext) {
  const int64_t n_ctx = 7;  // odd: scored rows 3..5 (n_ctx − 1 − n_ctx/2 = 3 per chunk)
  const std::vector<int32_t> tokens = text(3 * n_ctx + 5);  // a 5-token tail that is dropped
  PerplexityScorer s("perplexity", tokens, n_ctx, /*max_chunks=*/0, /*add_bos=*/false, -1);
  ASSERT_EQ(s.result().n_chunks, 3);
  double sum = 0, sum2 = 0;
  int64_t count = 0;
  for (int64_t c = 0; c < 3; ++c) {
    const std::vector<float> l = chunk_logits(tokens, c, n_ctx);
    s.add_chunk(c, l.data(), V);
    double chunk_sum = 0;
    for (int64_t j = 3; j <= 5; ++j) {
      // The logit is stored as float: the closed form takes the same rounded value.
      const double nll = closed_form_nll(static_cast<float>(target_logit(c, j)));
      sum += nll;
      sum2 += nll * nll;
      chunk_sum += nll;
      ++count;
    }
    EXPECT_NEAR(s.result().chunk_ppl[c], std::exp(chunk_sum / 3), 1e-12 * std::exp(chunk_sum / 3));
  }
  const double mean = sum / count, ppl = std::exp(mean);
  const double err = ppl * std::sqrt((sum2 / count - mean * mean) / (count - 1));
  EXPECT_EQ(s.result().n_scored, 9);
  EXPECT_NEAR(s.result().mean_nll, mean, 1e-12);
  EXPECT_NEAR(s.result().ppl, ppl, 1e-12 * ppl);
  EXPECT_NEAR(s.result().ppl_err, err, 1e-9 * err);
  EXPECT_GT(err, 0.01);  // the rows' NLLs differ: a real spread, not a zero
}

TEST(PerplexityScorer, ChunkTokensPutBosFirstAndMaxChunksCaps) {
  const int64_t n_ctx = 5;
  const std::vector<int32_t> tokens = text(4 * n_ctx);
  PerplexityScorer s("perplexity", tokens, n_ctx, /*max_chunks=*/2, /*add_bos=*/true, /*bos_id=*/9);
  EXPECT_EQ(s.result().n_chunks, 2);
  EXPECT_EQ(s.result().n_ctx, n_ctx);
  const std::vector<int32_t> c1 = s.chunk_tokens(1);
  ASSERT_EQ(c1.size(), 5u);
  EXPECT_EQ(c1[0], 9);
  for (int i = 1; i < 5; ++i) EXPECT_EQ(c1[i], tokens[5 + i]) << i;
  PerplexityScorer plain("perplexity", tokens, n_ctx, 0, false, -1);
  EXPECT_EQ(plain.result().n_chunks, 4);
  EXPECT_EQ(plain.chunk_tokens(2)[0], tokens[10]);
}

TEST(PerplexityScorer, RefusalsNameTheCallerAndTheLimit) {
  const std::vector<int32_t> tokens = text(20);
  auto message = [&](int64_t n_ctx, bool add_bos, int32_t bos) {
    try {
      PerplexityScorer("gpu_perplexity", tokens, n_ctx, 0, add_bos, bos);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(3, false, -1).find("gpu_perplexity: context 3 is too small (need >= 4)"), std::string::npos);
  EXPECT_NE(message(11, false, -1).find("the text has 20 tokens; need at least 2·n_ctx = 22"), std::string::npos);
  EXPECT_NE(message(10, true, -1).find("gpu_perplexity: add_bos is set but the model has no BOS token"),
            std::string::npos);
  EXPECT_EQ(message(10, true, 0), "no error");  // exactly 2·n_ctx tokens, BOS id 0: accepted
}
