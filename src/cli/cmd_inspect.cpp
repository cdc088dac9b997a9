// `ratekv inspect -m MODEL [--json]`: architecture, attention shape, RoPE,
// context, vocabulary, tensor types, fp16 KV-cache bytes per token.
#include <fmt/format.h>

#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "ratekv/common/error.h"
#include "ratekv/io/gguf.h"
#include "ratekv/model/model.h"

namespace ratekv::cli {
namespace {

struct InspectArgs {
  std::string model;
  bool json = false;
  std::string output;
  bool force = false;
};

nlohmann::ordered_json inspect_json(const GgufFile& f) {
  const ModelConfig c = ModelConfig::from_gguf(f);
  std::map<std::string, std::pair<int64_t, uint64_t>> hist;  // type -> (tensors, bytes)
  uint64_t total_bytes = 0;
  int64_t total_params = 0;
  for (const auto& t : f.tensors()) {
    auto& h = hist[ggml_type_name(t.type)];
    h.first += 1;
    h.second += t.nbytes;
    total_bytes += t.nbytes;
    total_params += t.n_elements();
  }
  nlohmann::ordered_json j;
  j["file"] = f.path();
  j["gguf_version"] = f.version();
  j["name"] = f.get_string("general.name", "");
  j["arch"] = c.arch;
  j["n_layers"] = c.n_layers;
  j["d_model"] = c.d_model;
  j["d_ff"] = c.d_ff;
  j["n_heads"] = c.n_heads;
  j["n_kv_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim;
  j["gqa_ratio"] = c.gqa_ratio();
  j["rope_layout"] = rope_layout_name(c.rope_layout);
  j["rope_theta"] = c.rope_theta;
  j["rms_eps"] = c.rms_eps;
  j["qkv_bias"] = c.qkv_bias;
  j["qk_norm"] = c.qk_norm;
  if (!c.layer_sliding.empty()) {  // Gemma 3: sliding-window layers with their own RoPE base
    std::vector<int> sliding;
    for (int l = 0; l < c.n_layers; ++l)
      if (c.is_sliding(l)) sliding.push_back(l);
    j["sliding_window"] = c.sliding_window;
    j["sliding_layers"] = sliding;
    j["rope_theta_sliding"] = c.rope_theta_swa;
  }
  j["n_ctx_train"] = c.n_ctx_train;
  j["n_vocab"] = c.n_vocab;
  j["tied_embeddings"] = f.find_tensor("output.weight") == nullptr;
  j["n_tensors"] = f.tensors().size();
  j["n_params"] = total_params;
  j["tensor_bytes"] = total_bytes;
  auto& th = j["tensor_types"];
  th = nlohmann::ordered_json::object();
  for (const auto& [name, h] : hist) th[name] = {{"tensors", h.first}, {"bytes", h.second}};
  j["kv_bytes_per_token_fp16"] = c.kv_bytes_per_token_fp16();
  return j;
}

std::string inspect_text(const nlohmann::ordered_json& j) {
  std::string s;
  auto line = [&](const char* k, const std::string& v) { s += fmt::format("{:<26}{}\n", k, v); };
  line("file", j["file"].get<std::string>());
  line("name", j["name"].get<std::string>());
  line("arch", j["arch"].get<std::string>());
  line("layers", std::to_string(j["n_layers"].get<int>()));
  line("d_model / d_ff", fmt::format("{} / {}", j["d_model"].get<int>(), j["d_ff"].get<int>()));
  line("heads / kv heads", fmt::format("{} / {} (GQA ratio {})", j["n_heads"].get<int>(), j["n_kv_heads"].get<int>(),
                                       j["gqa_ratio"].get<int>()));
  line("head_dim", std::to_string(j["head_dim"].get<int>()));
  line("RoPE", fmt::format("{} pairs, theta {}", j["rope_layout"].get<std::string>(), j["rope_theta"].get<double>()));
  if (j["qkv_bias"].get<bool>()) line("attention", "Q/K/V projection biases");
  if (j["qk_norm"].get<bool>()) line("attention", "QK-norm (RMSNorm per head before RoPE)");
  if (j.contains("sliding_window"))
    line("sliding window", fmt::format("{} tokens on {} of {} layers (RoPE theta {} there; the others global)",
                                       j["sliding_window"].get<int64_t>(), j["sliding_layers"].size(),
                                       j["n_layers"].get<int>(), j["rope_theta_sliding"].get<double>()));
  line("context (train)", std::to_string(j["n_ctx_train"].get<int64_t>()));
  line("vocab", fmt::format("{}{}", j["n_vocab"].get<int>(),
                            j["tied_embeddings"].get<bool>() ? " (tied input/output embeddings)" : ""));
  line("parameters", fmt::format("{} in {} tensors, {:.1f} MiB", j["n_params"].get<int64_t>(),
                                 j["n_tensors"].get<size_t>(), j["tensor_bytes"].get<uint64_t>() / 1048576.0));
  for (const auto& [name, h] : j["tensor_types"].items()) {
    line(fmt::format("  {}", name).c_str(), fmt::format("{} tensors, {:.1f} MiB", h["tensors"].get<int64_t>(),
                                                        h["bytes"].get<uint64_t>() / 1048576.0));
  }
  const int64_t kvb = j["kv_bytes_per_token_fp16"].get<int64_t>();
  line("KV cache @ fp16", fmt::format("{} bytes/token ({:.1f} MiB per 1k tokens)", kvb, kvb * 1000 / 1048576.0));
  return s;
}

void run(const InspectArgs& a) {
  const GgufFile f = GgufFile::open(a.model);
  const auto j = inspect_json(f);
  const std::string text = a.json ? j.dump(2) + "\n" : inspect_text(j);
  if (!a.output.empty()) {
    check_output_path(a.output, a.force, "--output");
    std::ofstream out(a.output);
    check(static_cast<bool>(out), "--output: cannot open '{}' for writing", a.output);
    out << text;
    out.close();  // a full disk shows at close, not at <<
    check(static_cast<bool>(out), "--output: failed writing '{}'", a.output);
  } else {
    std::cout << text;
  }
}

Registrar reg("inspect", [](CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  auto* cmd = app.add_subcommand("inspect", "Show a GGUF model's architecture, attention shape, RoPE and tensor types");
  cmd->add_option("-m,--model", args->model, "GGUF model file")->required()->check(CLI::ExistingFile);
  cmd->add_flag("--json", args->json, "print JSON instead of text");
  cmd->add_option("-o,--output", args->output, "write the report to this file instead of stdout")
      ->check(non_empty_path_validator("a file to write the report to (without -o: stdout)"));
  cmd->add_flag("--force", args->force, "overwrite --output if it exists");
  cmd->callback([args] { run(*args); });
});

}  // namespace
}  // namespace ratekv::cli
