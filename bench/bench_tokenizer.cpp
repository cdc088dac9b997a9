// bench_tokenizer — SmolLM2 tokenizer throughput on a real text file.
//
// Text: $RATEKV_BENCH_TEXT, else $RATEKV_ASSETS/text/calib.txt (Python docs
// sources, tools/fetch_assets.sh). Model: $RATEKV_ASSETS/models/SmolLM2-135M-
// Instruct.Q4_1.gguf. Reports tokens/s and bytes/s for: full encode, the regex
// pre-tokenizer alone, BPE of every word without the per-word cache, and
// decode; then prints ratios against full encode measured in the same run.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "model/tokenizer_bpe.h"
#include "model/tokenizer_pretokenize.h"
#include "model/tokenizer_utf8.h"
#include "ratekv/io/gguf.h"
#include "ratekv/model/tokenizer.h"

namespace {

std::string assets() {
  const char* env = std::getenv("RATEKV_ASSETS");
  const char* home = std::getenv("HOME");
  return env ? env : std::string(home ? home : "") + "/.cache/ratekv/assets";
}

struct Setup {
  std::unique_ptr<ratekv::GgufFile> file;
  std::unique_ptr<ratekv::Tokenizer> tok;
  std::unique_ptr<ratekv::tok::BpeModel> bpe;
  std::string text, text_path, error;
  std::vector<int32_t> ids;
  Setup() {
    const std::string model = assets() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
    const char* t = std::getenv("RATEKV_BENCH_TEXT");
    text_path = t ? t : assets() + "/text/calib.txt";
    if (!std::filesystem::exists(model) || !std::filesystem::exists(text_path)) {
      error = "needs " + model + " and " + text_path + " (tools/fetch_assets.sh)";
      return;
    }
    file = std::make_unique<ratekv::GgufFile>(ratekv::GgufFile::open(model));
    tok = std::make_unique<ratekv::Tokenizer>(ratekv::Tokenizer::from_gguf(*file));
    bpe = std::make_unique<ratekv::tok::BpeModel>(file->get_string_array("tokenizer.ggml.tokens"),
                                                  file->get_string_array("tokenizer.ggml.merges"));
    std::ifstream in(text_path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
    ids = tok->encode(text, false);
  }
};

Setup& setup() {
  static Setup s;
  return s;
}

void counters(benchmark::State& st, const Setup& s) {
  st.counters["tokens/s"] = benchmark::Counter(static_cast<double>(s.ids.size()) * static_cast<double>(st.iterations()),
                                               benchmark::Counter::kIsRate);
  st.SetBytesProcessed(static_cast<int64_t>(s.text.size()) * st.iterations());
  st.SetLabel(std::filesystem::path(s.text_path).filename().string() + ", " + std::to_string(s.text.size()) +
              " bytes, " + std::to_string(s.ids.size()) + " tokens");
}

void BM_Encode(benchmark::State& st) {
  auto& s = setup();
  if (!s.error.empty()) return st.SkipWithError(s.error.c_str());
  for (auto _ : st) benchmark::DoNotOptimize(s.tok->encode(s.text, false));
  counters(st, s);
}

void BM_PreTokenizeOnly(benchmark::State& st) {
  auto& s = setup();
  if (!s.error.empty()) return st.SkipWithError(s.error.c_str());
  const ratekv::tok::PreTokenizer pre(s.tok->pre_tokenizer_regexes());
  for (auto _ : st) {
    const std::string canon = ratekv::tok::utf8_canonicalize(s.text);
    size_t n = 0;
    pre.split(canon, [&](size_t, size_t len) { n += len; });
    benchmark::DoNotOptimize(n);
  }
  counters(st, s);
}

void BM_EncodeWithoutWordCache(benchmark::State& st) {
  auto& s = setup();
  if (!s.error.empty()) return st.SkipWithError(s.error.c_str());
  const ratekv::tok::PreTokenizer pre(s.tok->pre_tokenizer_regexes());
  for (auto _ : st) {
    const std::string canon = ratekv::tok::utf8_canonicalize(s.text);
    std::vector<int32_t> out;
    pre.split(canon, [&](size_t off, size_t len) { s.bpe->encode_word(std::string_view(canon).substr(off, len), out); });
    benchmark::DoNotOptimize(out.data());
  }
  counters(st, s);
}

void BM_Decode(benchmark::State& st) {
  auto& s = setup();
  if (!s.error.empty()) return st.SkipWithError(s.error.c_str());
  for (auto _ : st) benchmark::DoNotOptimize(s.tok->decode(s.ids));
  counters(st, s);
}

BENCHMARK(BM_Encode)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_PreTokenizeOnly)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_EncodeWithoutWordCache)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond)->MinTime(2.0);

// Records mean real time per iteration so main() can print ratios.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  std::map<std::string, double> seconds;
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs)
      if (!r.error_occurred && r.iterations > 0)
        seconds[r.benchmark_name()] = r.real_accumulated_time / static_cast<double>(r.iterations);
    ConsoleReporter::ReportRuns(runs);
  }
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  RatioReporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  const auto base = rep.seconds.find("BM_Encode/min_time:2.000");
  if (base != rep.seconds.end()) {
    std::printf("\nratios against BM_Encode (time per pass; > 1 = slower than full encode):\n");
    for (const auto& [name, sec] : rep.seconds) std::printf("  %-40s %.3f\n", name.c_str(), sec / base->second);
  }
  benchmark::Shutdown();
}
