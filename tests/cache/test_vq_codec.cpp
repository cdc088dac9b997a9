// vq codecs (TaSQ / CQ run time): encode/decode against a scalar reference,
// the shared fp16 scale, effective bits, plan + side-file round trips, bad
// input, and the fake-quant cache's pre-RoPE path on a tiny model.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <random>

#include "../support/tiny_model.h"
#include "ratekv/cache/fake_quant_cache.h"
#include "ratekv/cache/plan_codecs.h"
#include "ratekv/cache/vq_codec.h"
#include "ratekv/common/error.h"
#include "ratekv/common/fp16.h"
#include "ratekv/io/safetensors.h"

using namespace ratekv;
using namespace ratekv::cache;

namespace {

// A vq plan for (L, H, d) with groups of g channels given by `perm` (a
// channel permutation; groups are consecutive runs of it), K = 2^bits.
Plan vq_plan(int L, int H, int d, int g, int bits, bool shared, const std::vector<int>& perm,
             const std::string& arch = "llama") {
  Plan p;
  p.method = "tasq";
  p.model.arch = arch;
  p.model.n_layers = L;
  p.model.n_kv_heads = H;
  p.model.head_dim = d;
  p.model.rope_layout = arch == "llama" ? "interleaved" : "neox";
  p.tensors_file = "side.safetensors";
  p.layers.assign(L, std::vector<HeadPlan>(H));
  for (auto& layer : p.layers)
    for (auto& hp : layer) {
      Codec& c = hp.key;
      c.kind = CodecKind::Vq;
      c.norm = shared ? NormStorage::SharedFP16 : NormStorage::None;
      c.scale_heads = shared ? H : 0;
      c.group_size = g;
      for (int i = 0; i < d; i += g) {
        CodecGroup cg;
        cg.bits = bits;
        cg.channels.assign(perm.begin() + i, perm.begin() + i + g);
        c.groups.push_back(cg);
      }
    }
  return p;
}

VqTensors random_tensors(const Plan& p, uint32_t seed, bool weighted) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.3f, 2.0f);
  VqTensors t = VqTensors::for_plan(p);
  const int d = p.model.head_dim;
  for (int l = 0; l < p.model.n_layers; ++l)
    for (int h = 0; h < p.model.n_kv_heads; ++h) {
      const Codec& c = p.layers[l][h].key;
      auto& e = t.at(l, h, 0);
      e.present = true;
      e.codebooks.resize(c.groups.size() * (size_t{1} << c.groups[0].bits) * c.group_size);
      for (auto& x : e.codebooks) x = round_fp16(nd(rng));  // side files store fp16
      if (weighted) {
        e.channel_scale.resize(d);
        for (auto& x : e.channel_scale) x = round_fp16(ud(rng));
      }
    }
  return t;
}

std::vector<int> shuffled(int d, uint32_t seed) {
  std::vector<int> p(d);
  for (int i = 0; i < d; ++i) p[i] = i;
  std::mt19937 rng(seed);
  std::shuffle(p.begin(), p.end(), rng);
  return p;
}

// Scalar reference of one head: nearest centroid in double, reconstruction.
void reference_head(const Codec& c, const VqTensors::Entry& e, int d, const float* x, double s, float* xhat,
                    std::vector<int>& codes) {
  const int g = c.group_size, K = 1 << c.groups[0].bits;
  codes.clear();
  for (size_t gi = 0; gi < c.groups.size(); ++gi) {
    double best = 1e300;
    int arg = -1;
    for (int j = 0; j < K; ++j) {
      double dist = 0.0;
      for (int i = 0; i < g; ++i) {
        const int ch = c.groups[gi].channels[i];
        const double a = e.channel_scale.empty() ? 1.0 : e.channel_scale[ch];
        const double y = a * x[ch] / s;
        const double diff = y - e.codebooks[(gi * K + j) * g + i];
        dist += diff * diff;
      }
      if (dist < best) best = dist, arg = j;
    }
    codes.push_back(arg);
    for (int i = 0; i < g; ++i) {
      const int ch = c.groups[gi].channels[i];
      const double a = e.channel_scale.empty() ? 1.0 : e.channel_scale[ch];
      xhat[ch] = static_cast<float>(s * e.codebooks[(gi * K + arg) * g + i] / a);
    }
  }
  (void)d;
}

}  // namespace

TEST(VqCodec, EffectiveBitsCountIndicesAndSharedScale) {
  // SmolLM2 shape: d 64, 3 KV heads, g 8, K 1024: 8 indices of 10 bits = 1.25
  // bits/element; the shared fp16 scale adds 16/(3·64).
  const Plan t = vq_plan(2, 3, 64, 8, 10, true, shuffled(64, 3));
  EXPECT_DOUBLE_EQ(t.layers[0][0].key.code_bits(64), 80.0 / 64.0);
  EXPECT_DOUBLE_EQ(t.layers[0][0].key.effective_bits(64), 1.25 + 16.0 / 192.0);
  const Plan cq = vq_plan(2, 3, 64, 8, 10, false, shuffled(64, 3));
  EXPECT_DOUBLE_EQ(cq.layers[1][2].key.effective_bits(64), 1.25);
  // g 4, K 16 at d 12 with 2 heads: 3 groups · 4 bits / 12 = 1, + 16/24.
  const Plan small = vq_plan(1, 2, 12, 4, 4, true, shuffled(12, 1));
  EXPECT_DOUBLE_EQ(small.layers[0][1].key.effective_bits(12), 1.0 + 16.0 / 24.0);
  EXPECT_NEAR(small.achieved().k, 1.0 + 16.0 / 24.0, 1e-12);
  EXPECT_DOUBLE_EQ(small.achieved().v, 16.0);  // values fp16
}

TEST(VqCodec, SharedScaleIsFp16RmsOfWeightedKey) {
  // Σ (a x)² = 4·(3²) over H·d = 2·2 → RMS 3 (exact in fp16).
  EXPECT_EQ(vq_shared_scale(36.0, 2, 2), 3.0f);
  // 0.1 is not an fp16 value: the scale is the fp16 rounding of the RMS.
  EXPECT_EQ(vq_shared_scale(0.01 * 8, 2, 4), round_fp16(0.1f));
  EXPECT_GT(vq_shared_scale(0.0, 3, 64), 0.0f);  // zero key: smallest subnormal
  EXPECT_THROW(vq_shared_scale(1e12, 1, 1), Error);  // RMS 1e6 overflows fp16
  EXPECT_THROW(vq_shared_scale(std::nan(""), 1, 1), Error);
}

TEST(VqCodec, EncodeDecodeMatchesScalarReference) {
  for (int weighted = 0; weighted < 2; ++weighted)
    for (int shared = 0; shared < 2; ++shared) {
      const int L = 1, H = 3, d = 12, g = 4, bits = 5;
      const Plan p = vq_plan(L, H, d, g, bits, shared, shuffled(d, 7 + weighted));
      const VqTensors t = random_tensors(p, 11 + shared, weighted);
      std::vector<std::unique_ptr<VqCodec>> codecs;
      std::vector<const VqCodec*> heads;
      for (int h = 0; h < H; ++h) {
        codecs.push_back(std::make_unique<VqCodec>(p.layers[0][h].key, d, t.at(0, h, 0).codebooks,
                                                   t.at(0, h, 0).channel_scale));
        heads.push_back(codecs.back().get());
      }
      std::mt19937 rng(5);
      const int64_t T = 97;
      std::vector<float> x = ratekv_test::randn(T * H * d, rng, 2.0f), out(x.size());
      std::vector<int32_t> codes(T * H * (d / g));
      std::vector<float> scales(T);
      vq_fake_quant_layer(heads, x.data(), T, out.data(), codes.data(), scales.data());
      for (int64_t tk = 0; tk < T; ++tk) {
        double s = 1.0;
        if (shared) {
          double acc = 0.0;
          for (int h = 0; h < H; ++h)
            for (int c = 0; c < d; ++c) {
              const double a = weighted ? t.at(0, h, 0).channel_scale[c] : 1.0;
              acc += a * a * x[(tk * H + h) * d + c] * x[(tk * H + h) * d + c];
            }
          s = round_fp16(static_cast<float>(std::sqrt(acc / (H * d))));
        }
        ASSERT_EQ(scales[tk], static_cast<float>(s));
        for (int h = 0; h < H; ++h) {
          std::vector<float> ref(d);
          std::vector<int> rc;
          reference_head(p.layers[0][h].key, t.at(0, h, 0), d, &x[(tk * H + h) * d], s, ref.data(), rc);
          for (int gi = 0; gi < d / g; ++gi) ASSERT_EQ(codes[(tk * H + h) * (d / g) + gi], rc[gi]);
          for (int c = 0; c < d; ++c) ASSERT_NEAR(out[(tk * H + h) * d + c], ref[c], 1e-5f * (1 + std::abs(ref[c])));
        }
      }
      // In place gives the same.
      std::vector<float> y = x;
      vq_fake_quant_layer(heads, y.data(), T, y.data());
      EXPECT_EQ(y, out);
    }
}

TEST(VqCodec, CentroidInputDecodesExactly) {
  // A key equal to a reconstruction codeword (unit scale) encodes to it.
  const Plan p = vq_plan(1, 1, 8, 8, 3, false, shuffled(8, 2));
  const VqTensors t = random_tensors(p, 3, true);
  const VqCodec c(p.layers[0][0].key, 8, t.at(0, 0, 0).codebooks, t.at(0, 0, 0).channel_scale);
  for (int j = 0; j < 8; ++j) {
    std::vector<float> x(8);
    for (int i = 0; i < 8; ++i) {
      const int ch = p.layers[0][0].key.groups[0].channels[i];
      x[ch] = t.at(0, 0, 0).codebooks[j * 8 + i] / t.at(0, 0, 0).channel_scale[ch];
    }
    int32_t z = -1;
    c.encode(x.data(), 1.0f, &z);
    EXPECT_EQ(z, j);
  }
}

TEST(VqCodec, PlanAndSideFileRoundTrip) {
  const auto dir = std::filesystem::temp_directory_path() / "ratekv_vq_roundtrip";
  std::filesystem::create_directories(dir);
  Plan p = vq_plan(2, 3, 16, 8, 4, true, shuffled(16, 9));
  p.tensors_file = "rt.tensors.safetensors";
  p.fit = {{"kmeans", "plain"}, {"weighting", "none"}};
  // Values CQ: contiguous channels, no scale.
  for (auto& layer : p.layers)
    for (auto& hp : layer) {
      hp.value.kind = CodecKind::Vq;
      hp.value.group_size = 4;
      for (int i = 0; i < 16; i += 4) hp.value.groups.push_back({6, {}, {i, i + 1, i + 2, i + 3}, 0});
    }
  VqTensors t = random_tensors(p, 4, true);
  std::mt19937 rng(8);
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 3; ++h) {
      auto& e = t.at(l, h, 1);
      e.present = true;
      e.codebooks = ratekv_test::randn(4 * 64 * 4, rng, 1.0f);
      for (auto& x : e.codebooks) x = round_fp16(x);
    }
  t.save((dir / "rt.tensors.safetensors").string());
  p.save((dir / "rt.json").string());
  const Plan q = Plan::load((dir / "rt.json").string());
  EXPECT_EQ(q.to_json(), p.to_json());
  EXPECT_EQ(q.fit["kmeans"], "plain");
  EXPECT_EQ(q.source_dir, dir.string());
  const VqTensors u = VqTensors::load((dir / "rt.tensors.safetensors").string(), q);
  for (size_t i = 0; i < t.entries.size(); ++i) {
    EXPECT_EQ(u.entries[i].present, t.entries[i].present);
    EXPECT_EQ(u.entries[i].codebooks, t.entries[i].codebooks);
    EXPECT_EQ(u.entries[i].channel_scale, t.entries[i].channel_scale);
  }
  EXPECT_EQ(u.codebook_bytes(), 2 * 3 * (2 * 16 * 8 + 4 * 64 * 4) * 2);

  // Side file of another plan (K 32 instead of 16) → Error naming the tensor.
  Plan other = p;
  for (auto& layer : other.layers)
    for (auto& hp : layer)
      for (auto& g : hp.key.groups) g.bits = 5;
  try {
    VqTensors::load((dir / "rt.tensors.safetensors").string(), other);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("l0.h0.key.codebooks"), std::string::npos) << e.what();
  }
  // Not a side file at all.
  EXPECT_THROW(VqTensors::load((dir / "rt.json").string(), q), Error);
  std::filesystem::remove_all(dir);
}

// A side file of another plan whose tensors have the same sizes (group size 4
// with 16 centroids vs group size 8 with 16 centroids at d = 16: G·K·g = 256
// both; or the same group size with another channel matching) used to load and
// decode silently wrong; save(path, plan) records the plan's vq layout digest
// and load() rejects a mismatch naming the file and the field.
TEST(VqCodec, SideFileOfAnotherPlanWithSameSizesIsAnError) {
  const auto dir = std::filesystem::temp_directory_path() / "ratekv_vq_layout_digest";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "a.tensors.safetensors").string();
  const Plan g4 = vq_plan(2, 3, 16, 4, 4, true, shuffled(16, 3));
  const Plan g8 = vq_plan(2, 3, 16, 8, 4, true, shuffled(16, 3));
  const Plan g4_other_matching = vq_plan(2, 3, 16, 4, 4, true, shuffled(16, 4));
  const VqTensors t8 = random_tensors(g8, 5, true);
  ASSERT_EQ(t8.at(0, 0, 0).codebooks.size(), 256u);
  ASSERT_EQ(random_tensors(g4, 5, true).at(0, 0, 0).codebooks.size(), 256u);
  EXPECT_NE(vq_layout_digest(g4), vq_layout_digest(g8));
  EXPECT_NE(vq_layout_digest(g4), vq_layout_digest(g4_other_matching));
  EXPECT_EQ(vq_layout_digest(g8), vq_layout_digest(vq_plan(2, 3, 16, 8, 4, true, shuffled(16, 3))));

  t8.save(path, g8);
  const VqTensors back = VqTensors::load(path, g8);
  EXPECT_EQ(back.at(1, 2, 0).codebooks, t8.at(1, 2, 0).codebooks);
  for (const Plan* wrong : {&g4, &g4_other_matching}) {
    try {
      VqTensors::load(path, *wrong);
      FAIL() << "a side file fitted for another plan loaded";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(path), std::string::npos) << m;
      EXPECT_NE(m.find("layout_sha256"), std::string::npos) << m;
      EXPECT_NE(m.find("another plan"), std::string::npos) << m;
    }
  }
  // save(path, plan) refuses tensors that do not fit the plan.
  EXPECT_THROW(t8.save(path, vq_plan(2, 3, 16, 8, 5, true, shuffled(16, 3))), Error);
  // Files without the digest (written by save(path), as before) still load.
  t8.save(path);
  EXPECT_NO_THROW(VqTensors::load(path, g4));
  // A centroid past the fp16 range decoded to inf keys and NaN attention without an error: the side
  // file stores fp16, so it cannot be saved; an fp16 inf written by hand is rejected on load.
  VqTensors huge = t8;
  huge.at(1, 0, 0).codebooks[7] = 3e38f;
  try {
    huge.save(path);
    FAIL() << "a centroid of 3e38 saved";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("l1.h0.key.codebooks[7] = 3e+38: not an fp16 number"), std::string::npos)
        << e.what();
  }
  huge.at(1, 0, 0).codebooks[7] = std::numeric_limits<float>::infinity();
  huge.save(path);
  try {
    VqTensors::load(path, g8);
    FAIL() << "a centroid of inf loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("l1.h0.key.codebooks: centroid"), std::string::npos) << e.what();
  }
  // Values that are not fp16 numbers are not silently rounded.
  VqTensors fine = t8;
  fine.at(0, 1, 0).codebooks[3] = 0.1f;
  EXPECT_THROW(fine.save(path), Error);
  // The side file stores fp16 (the cost the plan reports): a file with F32 tensors is rejected by name.
  {
    SafetensorsWriter w;
    const SafetensorsFile f = SafetensorsFile::open(path);  // the inf file: copy its metadata and tensors as F32
    for (const auto& [k, v] : f.metadata()) w.set_metadata(k, v);
    for (const StTensor& t : f.tensors()) w.add_f32(t.name, t.shape, f.read_f32(t.name));
    w.write(path);
  }
  try {
    VqTensors::load(path, g8);
    FAIL() << "an F32 side file loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("codebooks: stored as F32, expected F16"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(VqCodec, BadPlansAreErrors) {
  Plan p = vq_plan(1, 2, 8, 4, 3, true, shuffled(8, 1));
  EXPECT_NO_THROW(p.validate());
  Plan no_side = p;
  no_side.tensors_file.reset();
  EXPECT_THROW(no_side.validate(), Error);
  Plan mixed = p;  // one head shares the scale, the other does not
  mixed.layers[0][1].key.norm = NormStorage::None;
  mixed.layers[0][1].key.scale_heads = 0;
  EXPECT_THROW(mixed.validate(), Error);
  Plan short_group = p;
  short_group.layers[0][0].key.groups[0].channels.pop_back();
  EXPECT_THROW(short_group.validate(), Error);
  Plan wide = p;
  for (auto& g : wide.layers[0][0].key.groups) g.bits = 17;
  EXPECT_THROW(wide.validate(), Error);
  Plan uneven = p;
  uneven.layers[0][0].key.groups[1].bits = 2;
  EXPECT_THROW(uneven.validate(), Error);
  Plan scale_elsewhere = p;
  scale_elsewhere.layers[0][0].value.norm = NormStorage::SharedFP16;
  EXPECT_THROW(scale_elsewhere.validate(), Error);
  // JSON: unknown norm name.
  nlohmann::json j = p.to_json();
  j["layers"][0]["heads"][0]["key"]["norm"] = "shared-fp8";
  EXPECT_THROW(Plan::from_json(j, "p.json"), Error);

  // Plan for another model → Error from PlanCodecs; side file for the plan
  // but missing one head's codebooks → Error.
  const ModelConfig cfg = ratekv_test::tiny_model(1, RopeLayout::Interleaved, 8).config();
  Plan for_tiny = vq_plan(cfg.n_layers, cfg.n_kv_heads, 8, 4, 3, true, shuffled(8, 2));
  auto t = std::make_shared<VqTensors>(random_tensors(for_tiny, 1, true));
  EXPECT_NO_THROW(PlanCodecs(for_tiny, cfg, "tiny", t));
  Plan wrong_model = vq_plan(cfg.n_layers + 1, cfg.n_kv_heads, 8, 4, 3, true, shuffled(8, 2));
  EXPECT_THROW(PlanCodecs(wrong_model, cfg, "wrong", t), Error);
  auto missing = std::make_shared<VqTensors>(*t);
  missing->at(1, 1, 0).present = false;
  EXPECT_THROW(PlanCodecs(for_tiny, cfg, "tiny", missing), Error);
  auto extra = std::make_shared<VqTensors>(*t);
  extra->at(0, 0, 1).present = true;  // codebook for an fp16 value codec
  extra->at(0, 0, 1).codebooks.assign(2 * 8 * 4, 0.5f);
  EXPECT_THROW(PlanCodecs(for_tiny, cfg, "tiny", extra), Error);
  // A plan file whose side file does not exist.
  EXPECT_THROW(PlanCodecs(for_tiny, cfg, "tiny"), Error);
}

TEST(VqCodec, FakeQuantCacheQuantizesPreRopeAndRotates) {
  {  // (the tiny models' forward pass is "llama" only: interleaved RoPE)
    const RopeLayout layout = RopeLayout::Interleaved;
    Model m = ratekv_test::tiny_model(3, layout, 8);
    const ModelConfig& cfg = m.config();
    Plan p = vq_plan(cfg.n_layers, cfg.n_kv_heads, 8, 4, 3, true, shuffled(8, 5),
                     layout == RopeLayout::NeoX ? "qwen2" : "llama");
    auto t = std::make_shared<VqTensors>(random_tensors(p, 2, true));
    auto codecs = std::make_shared<const PlanCodecs>(p, cfg, "tiny", t);
    FakeQuantOptions fo;
    fo.quantize_v = false;
    FakeQuantKVCache cache(cfg.kv_shape(64), codecs, fo);
    // Capture the originals the model appends.
    std::vector<std::vector<float>> kpre(cfg.n_layers), kpost(cfg.n_layers);
    ForwardHooks hooks;
    hooks.on_layer = [&](const LayerActivations& a) {
      kpre[a.layer].assign(a.k_pre, a.k_pre + a.n * cfg.n_kv_heads * 8);
      kpost[a.layer].assign(a.k_post, a.k_post + a.n * cfg.n_kv_heads * 8);
    };
    std::vector<int32_t> toks{3, 14, 15, 9, 2, 6, 5, 35, 8, 9, 7};
    m.forward(toks, 0, cache, nullptr, false, &hooks);
    const int64_t T = static_cast<int64_t>(toks.size()), row = cfg.n_kv_heads * 8;
    for (int l = 0; l < cfg.n_layers; ++l) {
      std::vector<float> expect(T * row);
      codecs->fake_quant_layer(l, KVSide::key, kpre[l].data(), T, expect.data());
      for (int64_t tk = 0; tk < T; ++tk)
        apply_rope(expect.data() + tk * row, cfg.n_kv_heads, 8, tk, cfg.rope_layout, cfg.rope_theta);
      const auto got = cache.keys(l);
      ASSERT_EQ(static_cast<int64_t>(got.size()), T * row);
      for (int64_t i = 0; i < T * row; ++i) ASSERT_FLOAT_EQ(got[i], expect[i]) << "layer " << l << " i " << i;
      // The evaluation's sequence reconstruction agrees with the cache.
      std::vector<std::int32_t> pos(T);
      for (int64_t i = 0; i < T; ++i) pos[i] = static_cast<int32_t>(i);
      std::vector<float> seq(T * row);
      fake_quant_sequence(*codecs, l, KVSide::key, kpost[l].data(), kpre[l].data(), pos.data(), T, 0, 0, seq.data());
      for (int64_t i = 0; i < T * row; ++i) ASSERT_FLOAT_EQ(seq[i], expect[i]);
      EXPECT_THROW(fake_quant_sequence(*codecs, l, KVSide::key, kpost[l].data(), T, 0, 0, seq.data()), Error);
    }
  }
}
