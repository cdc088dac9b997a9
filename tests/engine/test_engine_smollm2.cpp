// The GPU engine on the real SmolLM2-135M-Instruct (Q4_1, dequantized to fp32
// by the CPU runtime, uploaded as bf16) against the CPU runtime on the same
// weights. Needs a GPU and the model (tests/support/assets.h; skipped
// otherwise): logits bound, greedy continuations of 32 tokens, evaluation-mode
// perplexity with a K3V3 plan against the CPU packed cache.
//
// Bound on the logits: besides the synthetic tests' activation roundings the
// weights themselves are rounded to bf16 here (Q4_1 dequantizes to values
// with more than 8 significant bits): about 9 roundings of ~1.1e-3 (RMS) per
// layer over 30 layers, ≈ 1.1e-3·√270 ≈ 1.8e-2 relative; the bound is 5x, 0.1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../support/assets.h"
#include "gpu_util.h"
#include "niah_compare.h"
#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/cache/fake_quant_cache.h"
#include "ratekv/engine/engine.h"
#include "ratekv/engine/niah.h"
#include "ratekv/engine/perplexity.h"
#include "ratekv/eval/baseline_plans.h"
#include "ratekv/io/gguf.h"
#include "ratekv/model/chat_template.h"
#include "ratekv/model/perplexity.h"
#include "ratekv/model/tokenizer.h"

namespace {

using namespace ratekv;
using engine::CacheFormat;
using engine::Engine;
using engine::EngineOptions;
using engine::PrefillMode;
using engine_test::have_gpu;
using engine_test::rel_l2;

struct Smol {
  GgufFile file;
  Tokenizer tok;
  Model model;
  bool add_bos;
  explicit Smol(const std::string& p)
      : file(GgufFile::open(p)),
        tok(Tokenizer::from_gguf(file)),
        model(Model::load(file)),
        add_bos(file.has("tokenizer.ggml.add_bos_token") && file.get_bool("tokenizer.ggml.add_bos_token")) {}
};

Smol* smol() {
  static std::unique_ptr<Smol> s;
  if (!s && std::filesystem::exists(ratekv_test::smollm2_path())) s = std::make_unique<Smol>(ratekv_test::smollm2_path());
  return s.get();
}

const std::string& eval_text_path() {
  static const std::string p = ratekv_test::assets_dir() + "/text/eval.txt";
  return p;
}

// The first max_chars of the eval text (the caller skips when it is absent).
std::string eval_text(size_t max_chars) {
  std::ifstream in(eval_text_path());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str().substr(0, max_chars);
}

std::unique_ptr<Engine> gpu(const Smol& s, const CacheFormat& f, int64_t prefill = 512) {
  EngineOptions o;
  o.max_prefill_tokens = prefill;
  o.pool_bytes = size_t{2} << 30;
  return Engine::create(s.model.config(), s.model.weights(), f, o);
}

int argmax(const float* x, int n) { return static_cast<int>(std::max_element(x, x + n) - x); }

const char* kPrompts[] = {
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "To make a cup of tea, first",
    "Water boils at a temperature of",
    "The quick brown fox",
    "In mathematics, a prime number is",
};

TEST(EngineSmolLM2, LogitsAndGreedyContinuationsMatchCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  Smol* s = smol();
  if (!s) GTEST_SKIP() << "SmolLM2 not found at " << ratekv_test::smollm2_path();
  const ModelConfig& c = s->model.config();
  const int V = c.n_vocab, steps = 32;
  auto eng = gpu(*s, CacheFormat::fp16(c));
  int agree = 0, n = 0;
  double worst = 0;
  for (const char* p : kPrompts) {
    const std::vector<int32_t> prompt = s->tok.encode(p, true);
    const int np = static_cast<int>(prompt.size());
    // prefill logits (every row)
    std::vector<float> g(size_t(np) * V), cl(size_t(np) * V);
    const int seq = eng->add_sequence(np + steps);
    eng->prefill(seq, prompt, PrefillMode::serving, g);
    DenseKVCache kv = s->model.make_dense_cache(np + steps);
    s->model.forward(prompt, 0, kv, cl.data(), true);
    for (int i = 0; i < np; ++i) worst = std::max(worst, rel_l2(g, cl, size_t(i) * V, V));
    // greedy: each side follows its own argmax
    std::vector<int32_t> gt(steps), ct(steps);
    int32_t t = argmax(g.data() + size_t(np - 1) * V, V);
    std::vector<int32_t> out(steps - 1);
    gt[0] = t;
    eng->decode(std::span<const int>(&seq, 1), std::span<const int32_t>(&t, 1), steps - 1, out);
    std::copy(out.begin(), out.end(), gt.begin() + 1);
    std::vector<float> lc(cl.end() - V, cl.end());
    int diverge = -1;
    double margin = 0;
    for (int k = 0; k < steps; ++k) {
      ct[k] = argmax(lc.data(), V);
      if (ct[k] != gt[k] && diverge < 0) {
        diverge = k;
        std::vector<float> sorted(lc);
        std::nth_element(sorted.begin(), sorted.begin() + 1, sorted.end(), std::greater<float>());
        margin = sorted[0] - sorted[1];
      }
      if (k + 1 < steps) s->model.forward(std::span<const int32_t>(&ct[k], 1), np + k, kv, lc.data(), false);
    }
    ++n;
    if (diverge < 0) {
      ++agree;
      std::printf("  \"%s\": 32 of 32 greedy tokens agree\n", p);
    } else {
      std::printf("  \"%s\": diverges at token %d (CPU top-2 margin there %.3f)\n", p, diverge, margin);
      // A divergence must come from a near tie, not a wrong model.
      EXPECT_LT(margin, 0.5) << p;
    }
    eng->remove_sequence(seq);
  }
  std::printf("  SmolLM2 fp16 cache: worst prefill row rel L2 %.3e; greedy 32-token agreement %d of %d prompts\n",
              worst, agree, n);
  EXPECT_LT(worst, 0.1);
  EXPECT_GE(agree, n / 2);
}

// Evaluation-mode perplexity (K3V3, 4 windows of 512 tokens of the eval text)
// on the GPU against the CPU packed cache with the same plan; the difference
// must be within the spread that the plan's rotation seeds make on the CPU
// (three seeds), the noise any code flip is part of.
TEST(EngineSmolLM2, EvaluationPerplexityMatchesCpuPackedCache) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  Smol* s = smol();
  if (!s) GTEST_SKIP() << "SmolLM2 not found at " << ratekv_test::smollm2_path();
  if (!std::filesystem::exists(eval_text_path())) GTEST_SKIP() << "eval text not found at " << eval_text_path();
  const std::string text = eval_text(60000);
  const std::vector<int32_t> toks = s->tok.encode(text, true);
  const ModelConfig& c = s->model.config();
  const int64_t ctx = 512, chunks = 4;
  ASSERT_GE(toks.size(), size_t(2 * ctx * chunks));
  std::vector<double> cpu;
  for (uint64_t seed : {7, 8, 9}) {
    auto codecs = std::make_shared<const cache::PlanCodecs>(eval::cache_type_plan("tq3", "tq3", c, seed), c);
    cache::PackedKVCache kv(c.kv_shape(ctx), codecs);
    cpu.push_back(perplexity(s->model, kv, toks, ctx, chunks, s->add_bos, s->tok.bos_id()).ppl);
  }
  auto codecs = std::make_shared<const cache::PlanCodecs>(eval::cache_type_plan("tq3", "tq3", c, 7), c);
  auto eng = gpu(*s, CacheFormat::packed(codecs));
  const double g = engine::gpu_perplexity(*eng, toks, ctx, chunks, s->add_bos, s->tok.bos_id(),
                                          PrefillMode::evaluation).ppl;
  const double serving = engine::gpu_perplexity(*eng, toks, ctx, chunks, s->add_bos, s->tok.bos_id(),
                                                PrefillMode::serving).ppl;
  auto e16 = gpu(*s, CacheFormat::fp16(c));
  const double g16 = engine::gpu_perplexity(*e16, toks, ctx, chunks, s->add_bos, s->tok.bos_id(),
                                            PrefillMode::evaluation).ppl;
  DenseKVCache dense = s->model.make_dense_cache(ctx);
  const double c32 = perplexity(s->model, dense, toks, ctx, chunks, s->add_bos, s->tok.bos_id()).ppl;
  const double spread = *std::max_element(cpu.begin(), cpu.end()) - *std::min_element(cpu.begin(), cpu.end());
  std::printf("  SmolLM2 ppl (ctx 512, %lld chunks): CPU K3V3 seeds 7/8/9 %.4f %.4f %.4f (spread %.4f); GPU K3V3 "
              "seed 7 evaluation %.4f, serving %.4f; CPU fp32 %.4f, GPU fp16 %.4f\n",
              (long long)chunks, cpu[0], cpu[1], cpu[2], spread, g, serving, c32, g16);
  EXPECT_LT(std::fabs(g - cpu[0]), std::max(spread, 0.01 * cpu[0]));
  EXPECT_LT(std::fabs(g16 - c32), 0.01 * c32);
}

// The CPU runtime on the same weights rounded to bf16 (round to nearest even),
// as the GPU engine uploads them: the noise reference of the packed rows below.
Model bf16_model(const Model& m) {
  ModelWeights w = m.weights();
  const auto round = [](std::vector<float>& v) {
    for (float& f : v) {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
      std::memcpy(&f, &u, 4);
    }
  };
  round(w.token_embd), round(w.output), round(w.output_norm);
  for (LayerWeights& l : w.layers)
    for (std::vector<float>* v : {&l.attn_norm, &l.wqkv, &l.bqkv, &l.wo, &l.ffn_norm, &l.w_gate_up, &l.w_down,
                                  &l.attn_q_norm, &l.attn_k_norm, &l.attn_post_norm, &l.ffn_post_norm})
      round(*v);
  return Model::from_weights(m.config(), std::move(w));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : (v[(v.size() - 1) / 2] + v[v.size() / 2]) / 2;
}

// NIAH on the GPU (engine::EngineNiahAnswerer, `niah --device cuda`) against
// the CPU (eval::CpuNiahAnswerer, `niah`) on SmolLM2: the prompts of
// eval::niah_prompts at context 512 (3 depths × 2 trials; the haystack is the
// eval text, the essays are not on the GPU machine), ChatML system turn of the
// model's template, 10 answer tokens, evaluation mode, fp16 and K3V3 (one
// piece) and K3V3 in chunks of 128.
// fp16: per trial, answer logits within 0.1 (the bound of
// LogitsAndGreedyContinuationsMatchCpu) while the answers agree, a divergence
// only at a CPU top-2 margin below 0.05.
// K3V3: no fixed bound holds on this model. A key or value coordinate within
// the rounding of a Lloyd–Max midpoint flips a whole level, and on SmolLM2 at
// 3 bits (PPL +30 % over fp16) one flip moves the answer logits far: measured
// on the H200 (2026-12-02) the GPU's rows were 0.16–1.8 (rel L2) from the
// CPU's, and the CPU itself on bf16-rounded weights is 0.2–1.3 from the CPU on
// fp32 weights (same prompts, 2 cores; the CPU's own answers also change with
// its thread count). So the reference is that noise, measured in the same
// run: the CPU runtime on the GPU's bf16 weights against the CPU on fp32. The
// GPU passes if the median over trials of its worst row and of its first row
// (right after the prefill, where both sides have seen the same tokens) are
// within 2x the reference's median (+0.02, the fp16 bound's scale; at most 0.7): a model-
// scale check that the GPU's packed path is as close to the CPU as the weight
// rounding alone makes it; the kernels' exact checks are the synthetic tests'
// (test_engine.cpp, tests/cuda). Equal answers are equal NIAH verdicts (a
// function of the decoded text); the verdict agreement over every trial is
// printed.
TEST(EngineSmolLM2, NiahAnswersAndVerdictsMatchCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible";
  Smol* s = smol();
  if (!s) GTEST_SKIP() << "SmolLM2 not found at " << ratekv_test::smollm2_path();
  if (!std::filesystem::exists(eval_text_path())) GTEST_SKIP() << "eval text not found at " << eval_text_path();
  const std::vector<int32_t> hay = s->tok.encode(eval_text(8000), false);
  const ModelConfig& c = s->model.config();
  const int V = c.n_vocab;
  eval::NiahConfig nc;
  nc.context_lengths = {512};
  nc.n_depths = 3;
  nc.trials = 2;
  nc.max_new_tokens = 10;
  nc.system_prompt = chatml_default_system(s->file.get_string("tokenizer.chat_template", ""));
  eval::check_niah_answer_length(s->tok, nc);
  const auto prompts = eval::niah_prompts(s->tok, s->add_bos, hay, nc, 512);
  const auto is_eog = [&](int32_t t) { return s->tok.is_eog(t); };
  Plan f16;
  static_cast<PlanTarget&>(f16.model) = cache::plan_target(c);
  f16.method = "fp16";
  f16.budget_k = f16.budget_v = 16;
  f16.layers.assign(c.n_layers, std::vector<HeadPlan>(c.n_kv_heads, HeadPlan{Codec::fp16(), Codec::fp16()}));
  struct Case {
    const char* name;
    Plan plan;
    int64_t chunk;
  };
  int verdicts = 0, agree = 0;
  Model ref_model = bf16_model(s->model);
  for (const Case& k : {Case{"fp16", f16, 0}, Case{"K3V3", eval::cache_type_plan("tq3", "tq3", c, 7), 0},
                        Case{"K3V3 chunk 128", eval::cache_type_plan("tq3", "tq3", c, 7), 128}}) {
    const bool fp16 = std::string(k.name) == "fp16";
    auto codecs = std::make_shared<const cache::PlanCodecs>(k.plan, c);
    const auto make_cache = [&](int64_t n) -> std::unique_ptr<KVCache> {
      if (fp16) return std::make_unique<cache::FakeQuantKVCache>(c.kv_shape(n), codecs);
      return std::make_unique<cache::PackedKVCache>(c.kv_shape(n), codecs);
    };
    std::vector<float> cl, gl, rl;
    eval::CpuNiahAnswerer cpu(s->model, make_cache, nc, &cl);
    cpu.begin_context(512, prompts);
    std::unique_ptr<eval::CpuNiahAnswerer> ref;
    if (!fp16) {
      ref = std::make_unique<eval::CpuNiahAnswerer>(ref_model, make_cache, nc, &rl);
      ref->begin_context(512, prompts);
    }
    auto eng = gpu(*s, fp16 ? CacheFormat::fp16(c) : CacheFormat::packed(codecs), 512);
    engine::EngineNiahAnswerer g(*eng, PrefillMode::evaluation, k.chunk, &gl);
    std::vector<double> g_worst, g_first, r_worst, r_first;
    for (int tr = 0; tr < nc.trials; ++tr)
      for (int di = 0; di < nc.n_depths; ++di) {
        const eval::NiahPrompt& P = prompts[di][tr];
        const std::vector<int32_t> ct = cpu.answer(di, tr, P, nc.max_new_tokens, is_eog);
        const std::vector<int32_t> gt = g.answer(di, tr, P, nc.max_new_tokens, is_eog);
        const std::string ca = s->tok.decode(ct, true), ga = s->tok.decode(gt, true);
        const engine_test::AnswerComparison r = engine_test::compare_answers(cl, gl, V);
        std::printf("  %s depth %d trial %d (code %s): CPU '%s' GPU '%s'; %d rows, worst rel L2 %.3e, first %.3e%s\n",
                    k.name, di, tr, P.code.c_str(), ca.c_str(), ga.c_str(), r.rows, r.worst, rel_l2(gl, cl, 0, V),
                    r.diverge < 0 ? "" : (", diverge at " + std::to_string(r.diverge) + " margin " +
                                          std::to_string(r.margin)).c_str());
        ++verdicts;
        agree += eval::niah_correct(ca, P.code) == eval::niah_correct(ga, P.code);
        if (fp16) {
          EXPECT_LT(r.worst, 0.1) << k.name << " depth " << di << " trial " << tr;
          if (r.diverge < 0) EXPECT_EQ(ct, gt);
          else EXPECT_LT(r.margin, 0.05) << k.name << " depth " << di << " trial " << tr;
          continue;
        }
        g_worst.push_back(r.worst), g_first.push_back(rel_l2(gl, cl, 0, V));
        const std::vector<int32_t> rt = ref->answer(di, tr, P, nc.max_new_tokens, is_eog);
        const engine_test::AnswerComparison q = engine_test::compare_answers(cl, rl, V);
        r_worst.push_back(q.worst), r_first.push_back(rel_l2(rl, cl, 0, V));
        std::printf("    reference (CPU, bf16 weights) '%s'; %d rows, worst rel L2 %.3e, first %.3e%s\n",
                    s->tok.decode(rt, true).c_str(), q.rows, q.worst, r_first.back(),
                    q.diverge < 0 ? "" : (", diverge at " + std::to_string(q.diverge) + " margin " +
                                          std::to_string(q.margin)).c_str());
      }
    if (!fp16) {
      std::printf("  %s medians: GPU worst %.3e first %.3e; reference worst %.3e first %.3e\n", k.name,
                  median(g_worst), median(g_first), median(r_worst), median(r_first));
      // Capped at 0.7: unrelated logit rows of equal norm are ≈ √2 apart, so a
      // noisy reference must not let a broken path through (the GPU's medians
      // were 0.32–0.33 on the H200).
      EXPECT_LT(median(g_worst), std::min(2 * median(r_worst) + 0.02, 0.7)) << k.name;
      EXPECT_LT(median(g_first), std::min(2 * median(r_first) + 0.02, 0.7)) << k.name;
    }
  }
  std::printf("  SmolLM2 NIAH at 512: verdicts equal in %d of %d trials (diverged answers included)\n", agree,
              verdicts);
}

}  // namespace
