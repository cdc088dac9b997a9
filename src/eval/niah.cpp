// Needle-in-a-haystack retrieval (include/ratekv/eval/niah.h).
#include "ratekv/eval/niah.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <typeinfo>

#include "ratekv/cache/fake_quant_cache.h"
#include "ratekv/common/param_error.h"
#include "ratekv/cache/packed_kv_cache.h"
#include "ratekv/common/error.h"

namespace ratekv::eval {

namespace {

// 40 cities; the needle picks one per trial.
const char* const kCities[] = {
    "Lisbon",  "Nairobi",  "Osaka",     "Toronto",   "Lima",     "Helsinki", "Cairo",   "Hanoi",
    "Dublin",  "Santiago", "Montreal",  "Warsaw",    "Bogota",   "Oslo",     "Manila",  "Zurich",
    "Athens",  "Jakarta",  "Madrid",    "Seoul",     "Vienna",   "Mumbai",   "Prague",  "Havana",
    "Denver",  "Kyoto",    "Budapest",  "Casablanca", "Auckland", "Glasgow", "Tehran",  "Quito",
    "Bangkok", "Stockholm", "Marseille", "Karachi",  "Phoenix",  "Istanbul", "Riga",    "Perth"};
constexpr int kNumCities = sizeof(kCities) / sizeof(kCities[0]);

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

std::string load_haystack(const std::string& dir,
                          const std::function<void(const std::string& path, std::string_view text)>& on_file) {
  namespace fs = std::filesystem;
  check(fs::is_directory(dir), "haystack: '{}' is not a directory (expected $RATEKV_ASSETS/text/haystack, see "
        "docs/assets.md and tools/fetch_assets.sh)", dir);
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".txt") files.push_back(e.path().string());
  check(!files.empty(), "haystack: '{}' holds no .txt files", dir);
  std::sort(files.begin(), files.end());
  std::string all;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    check(static_cast<bool>(in), "haystack: cannot read '{}'", f);
    if (!all.empty()) all += "\n\n";
    const size_t start = all.size();
    all.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (on_file) on_file(f, std::string_view(all).substr(start));
  }
  return all;
}

std::pair<std::string, std::string> niah_needle(uint64_t seed, int64_t ctx, int depth, int trial) {
  uint64_t h = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(ctx) * 1000003ull + depth * 1009ull + trial));
  const std::string city = kCities[h % kNumCities];
  h = splitmix64(h);
  const uint64_t code = 1000000 + h % 9000000;
  return {city, std::to_string(code)};
}

std::vector<double> niah_depths(const NiahConfig& cfg) {
  std::vector<double> d;
  if (!cfg.depth_fractions.empty()) {
    for (size_t i = 0; i < cfg.depth_fractions.size(); ++i) {
      const double x = cfg.depth_fractions[i];
      check_param(x >= 0.0 && x <= 1.0, "NiahConfig.depth_fractions", "{}: a depth is a fraction in [0, 1]", x);
      check_param(i == 0 || x > cfg.depth_fractions[i - 1], "NiahConfig.depth_fractions",
                  "{} after {}: depths must be strictly increasing", x, cfg.depth_fractions[i - 1]);
    }
    return cfg.depth_fractions;
  }
  check_param(cfg.n_depths >= 2, "NiahConfig.n_depths", "{} depths: need ≥ 2 (0 and 1)", cfg.n_depths);
  for (int i = 0; i < cfg.n_depths; ++i) d.push_back(static_cast<double>(i) / (cfg.n_depths - 1));
  return d;
}

int64_t niah_answer_tokens(const Tokenizer& tok, const NiahConfig& cfg) {
  int64_t most = 0;
  const int n_depths = static_cast<int>(niah_depths(cfg).size());
  for (int64_t ctx : cfg.context_lengths)
    for (int di = 0; di < n_depths; ++di)
      for (int tr = 0; tr < cfg.trials; ++tr) {
        std::string answer(1, ' ');  // appended, not " " + code: GCC 12 draws a false -Wrestrict on that
        answer += niah_needle(cfg.seed, ctx, di, tr).second;
        most = std::max(most, static_cast<int64_t>(tok.encode(answer, false).size()));
      }
  return most;
}

void check_niah_answer_length(const Tokenizer& tok, const NiahConfig& cfg) {
  const int64_t need = niah_answer_tokens(tok, cfg);
  check_param(cfg.max_new_tokens >= need, "NiahConfig.max_new_tokens",
              "{}: the 7-digit answers take up to {} tokens with this model's tokenizer; a shorter cap cuts every "
              "answer and scores every trial wrong (need ≥ {})",
              cfg.max_new_tokens, need, need);
}

bool niah_correct(const std::string& answer, const std::string& code) {
  size_t i = 0;
  while (i < answer.size() && !(answer[i] >= '0' && answer[i] <= '9')) ++i;
  size_t j = i;
  while (j < answer.size() && answer[j] >= '0' && answer[j] <= '9') ++j;
  return i < answer.size() && answer.compare(i, j - i, code) == 0 && j - i == code.size();
}

std::unique_ptr<KVCache> clone_cache(const KVCache& c) {
  if (const auto* p = dynamic_cast<const cache::PackedKVCache*>(&c)) {
    if (p->fp16_window() != 0) return nullptr;
    return std::make_unique<cache::PackedKVCache>(*p);
  }
  if (const auto* f = dynamic_cast<const cache::FakeQuantKVCache*>(&c)) {
    if (f->fp16_window() != 0) return nullptr;
    const ModelConfig& m = f->codecs().config();
    for (int l = 0; l < m.n_layers; ++l)
      for (int h = 0; h < m.n_kv_heads; ++h)
        for (auto side : {cache::KVSide::key, cache::KVSide::value}) {
          const quant::Quantizer* q = f->codecs().quantizer(l, h, side);
          if (q && q->scope() != quant::QuantScope::per_vector) return nullptr;
        }
    return std::make_unique<cache::FakeQuantKVCache>(*f);
  }
  if (typeid(c) == typeid(DenseKVCache)) return std::make_unique<DenseKVCache>(static_cast<const DenseKVCache&>(c));
  return nullptr;
}

nlohmann::json NiahGrid::to_json() const {
  nlohmann::ordered_json tr = nlohmann::ordered_json::array();
  for (const auto& t : trials)
    tr.push_back({{"context_length", t.context_length}, {"depth", t.depth}, {"trial", t.trial}, {"city", t.city},
                  {"code", t.code}, {"needle_token", t.needle_token}, {"answer", t.answer}, {"correct", t.correct}});
  nlohmann::ordered_json j;
  j["name"] = name;
  j["context_lengths"] = context_lengths;
  j["depths"] = depths;
  j["accuracy"] = accuracy;
  j["trials_per_cell"] = trials_done;
  j["cache_bytes_per_token"] = cache_bytes_per_token;
  j["seconds"] = seconds;
  j["trials"] = tr;
  return j;
}

namespace {

// The fewest haystack tokens a prompt carries (a needle needs some text around it).
constexpr int64_t kNiahMinHaystack = 16;

std::vector<int32_t> niah_head_tokens(const Tokenizer& tok, bool add_bos, const NiahConfig& cfg) {
  check_param(cfg.chatml || cfg.system_prompt.empty(), "NiahConfig.system_prompt",
              "a system turn needs the ChatML prompt (chatml = false, system_prompt '{}')", cfg.system_prompt);
  std::string head;
  if (!cfg.system_prompt.empty()) head += "<|im_start|>system\n" + cfg.system_prompt + "<|im_end|>\n";
  if (cfg.chatml) head += "<|im_start|>user\n";
  head += "Read the document below. Somewhere in it is a secret code; remember it.\n\n";
  return tok.encode(head, add_bos, /*parse_special=*/cfg.chatml);
}

}  // namespace

std::vector<std::vector<NiahPrompt>> niah_prompts(const Tokenizer& tok, bool add_bos,
                                                  const std::vector<int32_t>& haystack, const NiahConfig& cfg,
                                                  int64_t ctx) {
  check(cfg.trials >= 1, "niah: {} trials per cell (need ≥ 1)", cfg.trials);
  const std::vector<double> depths = niah_depths(cfg);
  const int n_depths = static_cast<int>(depths.size());
  const std::vector<int32_t> head_tok = niah_head_tokens(tok, add_bos, cfg);
  // Needle sentences and questions first: the context must hold the longest of them (a ParamError naming the
  // shortest context that does, so that a front end can say it before any model work).
  std::vector<std::vector<std::vector<int32_t>>> needles(n_depths, std::vector<std::vector<int32_t>>(cfg.trials)),
      tails = needles;
  int64_t most = 0;
  for (int tr = 0; tr < cfg.trials; ++tr)
    for (int di = 0; di < n_depths; ++di) {
      const auto [city, code] = niah_needle(cfg.seed, ctx, di, tr);
      needles[di][tr] = tok.encode(" The secret code for " + city + " is " + code + ". ", false);
      const std::string question = "What is the secret code for " + city + "? Answer with the 7-digit number only.";
      const std::string primed = "The secret code for " + city + " is";
      tails[di][tr] = cfg.chatml ? tok.encode("\n\n" + question + "<|im_end|>\n<|im_start|>assistant\n" + primed, false,
                                              /*parse_special=*/true)
                                 : tok.encode("\n\nQuestion: " + question + "\nAnswer: " + primed, false);
      most = std::max(most, static_cast<int64_t>(head_tok.size() + needles[di][tr].size() + tails[di][tr].size()));
    }
  check_param(ctx >= most + kNiahMinHaystack, "NiahConfig.context_lengths",
              "{}: too short for the prompt (instruction, needle sentence and question take up to {} tokens with "
              "this model's tokenizer, plus at least {} haystack tokens); need ≥ {}",
              ctx, most, kNiahMinHaystack, most + kNiahMinHaystack);
  std::vector<std::vector<NiahPrompt>> prompts(n_depths, std::vector<NiahPrompt>(cfg.trials));
  for (int tr = 0; tr < cfg.trials; ++tr)
    for (int di = 0; di < n_depths; ++di) {
      const auto [city, code] = niah_needle(cfg.seed, ctx, di, tr);
      const std::vector<int32_t>& needle = needles[di][tr];
      const std::vector<int32_t>& tail = tails[di][tr];
      const int64_t fixed = static_cast<int64_t>(head_tok.size() + needle.size() + tail.size());
      const int64_t n_hay = ctx - fixed;
      check(n_hay <= static_cast<int64_t>(haystack.size()), "niah: haystack has {} tokens, context {} needs {}",
            haystack.size(), ctx, n_hay);
      // Insertion point: depth · n_hay, moved back to just after a sentence end.
      int64_t at = static_cast<int64_t>(depths[di] * static_cast<double>(n_hay) + 0.5);
      if (at > 0 && at < n_hay) {
        for (int64_t k = at; k > 0 && at - k < 256; --k) {
          const std::string& s = tok.token_text(haystack[k - 1]);
          if (s.find('.') != std::string::npos || s.find('\n') != std::string::npos ||
              s.find("\xc4\x8a") != std::string::npos) {  // byte-level BPE renders '\n' as U+010A
            at = k;
            break;
          }
        }
      }
      NiahPrompt& P = prompts[di][tr];
      P.city = city;
      P.code = code;
      P.tokens = head_tok;
      P.tokens.insert(P.tokens.end(), haystack.begin(), haystack.begin() + at);
      P.needle_at = static_cast<int64_t>(P.tokens.size());
      P.tokens.insert(P.tokens.end(), needle.begin(), needle.end());
      P.tokens.insert(P.tokens.end(), haystack.begin() + at, haystack.begin() + n_hay);
      P.tokens.insert(P.tokens.end(), tail.begin(), tail.end());
    }
  return prompts;
}

CpuNiahAnswerer::CpuNiahAnswerer(Model& model, std::function<std::unique_ptr<KVCache>(int64_t)> make_cache,
                                 const NiahConfig& cfg, std::vector<float>* answer_logits)
    : model_(model), make_cache_(std::move(make_cache)), cfg_(cfg), answer_logits_(answer_logits) {}

int64_t CpuNiahAnswerer::position_limit() const { return model_.position_limit(); }

void CpuNiahAnswerer::begin_context(int64_t ctx, const std::vector<std::vector<NiahPrompt>>& prompts) {
  // Shared prefix per depth (identical tokens in every trial of the cell)
  // and its prefilled cache, built on first use and kept for later rounds.
  ctx_ = ctx;
  share_ = cfg_.share_prefix && clone_cache(*make_cache_(ctx + cfg_.max_new_tokens)) != nullptr;
  shared_.assign(prompts.size(), 0);
  for (size_t di = 0; di < prompts.size(); ++di) {
    shared_[di] = prompts[di].at(0).needle_at;
    for (const NiahPrompt& P : prompts[di]) shared_[di] = std::min(shared_[di], P.needle_at);
  }
  prefix_.clear();
  prefix_.resize(prompts.size());
}

std::vector<int32_t> NiahAnswerer::greedy_answer(std::vector<float>& logits, int max_new,
                                                const std::function<bool(int32_t)>& is_eog,
                                                std::vector<float>* answer_logits,
                                                const std::function<void(int32_t, int)>& step) {
  std::vector<int32_t> out;
  for (int i = 0; i < max_new; ++i) {
    if (answer_logits) answer_logits->insert(answer_logits->end(), logits.begin(), logits.end());
    const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (is_eog(next)) break;
    out.push_back(next);
    if (i + 1 == max_new) break;
    step(next, i);
  }
  return out;
}

std::vector<int32_t> CpuNiahAnswerer::answer(int di, int, const NiahPrompt& P, int max_new,
                                             const std::function<bool(int32_t)>& is_eog) {
  const std::vector<int32_t>& prompt = P.tokens;
  const int V = model_.config().n_vocab;
  std::vector<float> logits(V);
  std::unique_ptr<KVCache> cache;
  int64_t start = 0;
  const size_t d = static_cast<size_t>(di);
  if (share_ && d < shared_.size() && shared_[d] > 0) {
    if (!prefix_[d]) {
      prefix_[d] = make_cache_(ctx_ + cfg_.max_new_tokens);
      model_.forward(std::span<const int32_t>(prompt.data(), shared_[d]), 0, *prefix_[d], nullptr, false);
    }
    cache = clone_cache(*prefix_[d]);
    start = shared_[d];
  } else {
    cache = make_cache_(static_cast<int64_t>(prompt.size()) + max_new);
  }
  model_.forward(std::span<const int32_t>(prompt.data() + start, prompt.size() - start), start, *cache,
                 logits.data(), false);
  if (answer_logits_) answer_logits_->clear();
  std::vector<int32_t> out = greedy_answer(logits, max_new, is_eog, answer_logits_, [&](int32_t next, int i) {
    model_.forward(std::span<const int32_t>(&next, 1), static_cast<int64_t>(prompt.size()) + i, *cache,
                   logits.data(), false);
  });
  bytes_per_token_ = static_cast<double>(cache->bytes()) / static_cast<double>(cache->n_tokens());
  return out;
}

NiahGrid run_niah(NiahAnswerer& answerer, const Tokenizer& tok, bool add_bos, const std::vector<int32_t>& haystack,
                  const NiahConfig& cfg, const std::string& name,
                  const std::function<void(int, int, const NiahGrid&)>& progress) {
  check(!cfg.context_lengths.empty(), "niah: no context lengths");
  check(cfg.trials >= 1, "niah: {} trials per cell (need ≥ 1)", cfg.trials);
  check(cfg.max_new_tokens >= 1, "niah: max_new_tokens {} must be ≥ 1", cfg.max_new_tokens);
  check_niah_answer_length(tok, cfg);
  const auto t_start = std::chrono::steady_clock::now();
  NiahGrid grid;
  grid.name = name;
  grid.context_lengths = cfg.context_lengths;
  grid.depths = niah_depths(cfg);
  const int n_depths = static_cast<int>(grid.depths.size());
  grid.accuracy.assign(cfg.context_lengths.size(), std::vector<double>(n_depths, 0.0));
  const auto is_eog = [&tok](int32_t t) { return tok.is_eog(t); };

  const int total = static_cast<int>(cfg.context_lengths.size()) * n_depths * cfg.trials;
  int done = 0;
  for (size_t ci = 0; ci < cfg.context_lengths.size(); ++ci) {
    const int64_t ctx = cfg.context_lengths[ci];
    check(ctx + cfg.max_new_tokens <= answerer.position_limit(),
          "niah: context {} + {} answer tokens exceed the model's position limit {}", ctx, cfg.max_new_tokens,
          answerer.position_limit());
    // All prompts of this context first (tokenization only), so each depth's
    // shared prefix (up to its earliest needle) is known.
    const std::vector<std::vector<NiahPrompt>> prompts = niah_prompts(tok, add_bos, haystack, cfg, ctx);
    answerer.begin_context(ctx, prompts);
    // Trial-major order: after k rounds every depth has k trials, so a run
    // stopped early (progress callback output) is still a full, coarser grid.
    for (int tr = 0; tr < cfg.trials; ++tr)
      for (int di = 0; di < n_depths; ++di) {
        const NiahPrompt& P = prompts[di][tr];
        const std::vector<int32_t> out = answerer.answer(di, tr, P, cfg.max_new_tokens, is_eog);
        NiahTrial t;
        t.context_length = ctx;
        t.depth = grid.depths[di];
        t.trial = tr;
        t.city = P.city;
        t.code = P.code;
        t.answer = tok.decode(out, /*skip_special=*/true);
        t.needle_token = P.needle_at;
        t.correct = niah_correct(t.answer, P.code);
        grid.trials.push_back(std::move(t));
        // Accuracy of the cell over the trials done so far.
        int n_cell = 0, n_ok = 0;
        for (const NiahTrial& x : grid.trials)
          if (x.context_length == ctx && x.depth == grid.depths[di]) {
            ++n_cell;
            n_ok += x.correct;
          }
        grid.accuracy[ci][di] = static_cast<double>(n_ok) / n_cell;
        grid.trials_done = tr + 1;
        grid.cache_bytes_per_token = answerer.cache_bytes_per_token();
        grid.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
        if (progress) progress(++done, total, grid);
      }
  }
  grid.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return grid;
}

NiahGrid run_niah(Model& model, const Tokenizer& tok, bool add_bos, const std::vector<int32_t>& haystack,
                  const std::function<std::unique_ptr<KVCache>(int64_t)>& make_cache, const NiahConfig& cfg,
                  const std::string& name, const std::function<void(int, int, const NiahGrid&)>& progress) {
  CpuNiahAnswerer cpu(model, make_cache, cfg);
  return run_niah(cpu, tok, add_bos, haystack, cfg, name, progress);
}

}  // namespace ratekv::eval
