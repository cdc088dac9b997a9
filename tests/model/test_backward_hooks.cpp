// ModelBackward::backward's forward hooks: the activations its taped forward
// pass shows equal Model::forward's hook (the independent path), so a caller
// can take keys, values and query statistics from the backward pass alone.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "../support/tiny_model.h"
#include "ratekv/common/error.h"
#include "ratekv/model/model.h"
#include "ratekv/model/backward.h"

using namespace ratekv;

namespace {

struct Captured {
  std::vector<std::vector<float>> q_pre, q_post, k_pre, k_post, v;  // [layer]
  std::vector<std::vector<int32_t>> pos;
  int calls = 0;
};

ForwardHooks capture_into(Captured& c, int n_layers) {
  c.q_pre.resize(n_layers), c.q_post.resize(n_layers), c.k_pre.resize(n_layers), c.k_post.resize(n_layers);
  c.v.resize(n_layers), c.pos.resize(n_layers);
  ForwardHooks h;
  h.on_layer = [&c](const LayerActivations& a) {
    const int64_t q = a.n * a.n_heads * a.head_dim, kv = a.n * a.n_kv_heads * a.head_dim;
    c.q_pre[a.layer].assign(a.q_pre, a.q_pre + q);
    c.q_post[a.layer].assign(a.q_post, a.q_post + q);
    c.k_pre[a.layer].assign(a.k_pre, a.k_pre + kv);
    c.k_post[a.layer].assign(a.k_post, a.k_post + kv);
    c.v[a.layer].assign(a.v, a.v + kv);
    c.pos[a.layer].assign(a.pos, a.pos + a.n);
    ++c.calls;
  };
  return h;
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) scale = std::max(scale, std::abs(double{b[i]}));
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double{a[i]} - b[i]));
  return m / std::max(scale, 1e-30);
}

}  // namespace

// GQA 2 (default tiny shape) and GQA 3, lengths 2, 17 and 31 (the backward
// pass is arch "llama": interleaved RoPE).
TEST(BackwardHooks, ForwardActivationsMatchModelForward) {
  {
    const RopeLayout layout = RopeLayout::Interleaved;
    for (int kv : {2, 1})
      for (int64_t n : {2, 17, 31}) {
        SCOPED_TRACE(testing::Message() << "n_kv_heads " << kv << " n " << n);
        ratekv_test::TinyShape s;
        s.n_heads = kv == 1 ? 3 : 4;
        s.n_kv_heads = kv;
        Model m = ratekv_test::tiny_model(5, s, layout);
        const int L = m.config().n_layers;
        std::mt19937 g(static_cast<uint32_t>(n));
        std::vector<int32_t> tokens(n);
        for (auto& t : tokens) t = static_cast<int32_t>(g() % m.config().n_vocab);
        Captured ref, got;
        const ForwardHooks href = capture_into(ref, L), hgot = capture_into(got, L);
        DenseKVCache cache = m.make_dense_cache(n);
        m.forward(tokens, 0, cache, nullptr, false, &href);
        int grads = 0;
        const ModelBackward<float> bw(m);
        bw.backward(tokens, [&](const LayerKVGrad<float>&) { ++grads; }, nullptr, nullptr, &hgot);
        EXPECT_EQ(got.calls, L);  // the first forward pass only, not the recomputations
        EXPECT_EQ(grads, L);
        for (int l = 0; l < L; ++l) {
          EXPECT_LT(max_rel(got.q_pre[l], ref.q_pre[l]), 1e-5) << "layer " << l;
          EXPECT_LT(max_rel(got.q_post[l], ref.q_post[l]), 1e-5) << "layer " << l;
          EXPECT_LT(max_rel(got.k_pre[l], ref.k_pre[l]), 1e-5) << "layer " << l;
          EXPECT_LT(max_rel(got.k_post[l], ref.k_post[l]), 1e-5) << "layer " << l;
          EXPECT_LT(max_rel(got.v[l], ref.v[l]), 1e-5) << "layer " << l;
          EXPECT_EQ(got.pos[l], ref.pos[l]);
          // RoPE moved something: pre and post differ beyond position 0.
          EXPECT_GT(max_rel(got.k_post[l], got.k_pre[l]), 1e-3) << "layer " << l;
        }
      }
  }
}

TEST(BackwardHooks, DoubleRejectsHooks) {
  Model m = ratekv_test::tiny_model(3);
  const ModelBackward<double> bw(m);
  ForwardHooks h;
  h.on_layer = [](const LayerActivations&) {};
  const std::vector<int32_t> tokens = {1, 2, 3};
  EXPECT_THROW(bw.backward(tokens, [](const LayerKVGrad<double>&) {}, nullptr, nullptr, &h), Error);
}
