// llama_ref: dumps reference outputs of llama.cpp (libllama) for ratekv's fixtures.
// Built and run only by tools/make_reference_fixtures.sh (never in CI); it links the
// libllama.so produced by tools/build_llamacpp.sh.
//
// Usage:
//   llama_ref logits MODEL PROMPT_FILE OUT_BIN
//       Tokenizes the bytes of PROMPT_FILE (parse_special = true, BOS as the model's
//       tokenizer.ggml.add_bos_token says), evaluates them in ONE batch and writes the
//       logits of every position to OUT_BIN: raw little-endian float32, row-major
//       [n_tokens][n_vocab]. Prints one JSON line {"ids":[...],"n_vocab":N} to stdout.
//   llama_ref greedy MODEL PROMPT_FILE N_NEW
//       Prefills the prompt, then decodes up to N_NEW tokens one at a time taking the
//       argmax (ties -> lowest id), stopping after an end-of-generation token. Prints one
//       JSON line {"prompt_ids":[...],"ids":[...],"margins":[...],"text":"...",
//       "stopped_at_eog":bool} where
//       margins[i] = top1 - top2 logit at step i and text is the detokenized continuation
//       (an end-of-generation token, if produced, is the last id and is not in text).
//   llama_ref dequant MODEL OUT_GGUF
//       Writes a copy of MODEL with every tensor converted to F32 by llama.cpp's own
//       dequantizer (llama_model_quantize, ftype ALL_F32, allow_requantize, pure): the
//       weights are exactly the dequantized Q4_1/Q8_0 values, so a forward pass on it is
//       an fp32 computation on the same weights.
//
// Context settings (both modes): n_threads = 2, K and V cache in F32, flash attention
// off, n_ctx = n_batch = n_ubatch = 512, so attention and the cache are fp32. Matmuls
// use whatever ggml's CPU backend does for the weight type of MODEL (for Q4_1/Q8_0
// weights it quantizes activations to Q8_1/Q8_0; run on an F32-dequantized copy of the
// model to get fp32 activations: see tools/make_reference_fixtures.sh).
#include "llama.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

[[noreturn]] void die(const std::string& msg) {
    std::fprintf(stderr, "llama_ref: error: %s\n", msg.c_str());
    std::exit(1);
}

std::string read_file(const char* path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) die(std::string("cannot open prompt file '") + path + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

void quiet_log(ggml_log_level level, const char* text, void*) {
    if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

// JSON string literal (UTF-8 passed through, control characters escaped).
std::string json_str(const std::string& s) {
    std::string o = "\"";
    for (unsigned char c : s) {
        switch (c) {
            case '"': o += "\\\""; break;
            case '\\': o += "\\\\"; break;
            case '\n': o += "\\n"; break;
            case '\r': o += "\\r"; break;
            case '\t': o += "\\t"; break;
            default:
                if (c < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04x", c);
                    o += buf;
                } else {
                    o += static_cast<char>(c);
                }
        }
    }
    return o + "\"";
}

std::string json_ids(const std::vector<llama_token>& ids) {
    std::string o = "[";
    for (size_t i = 0; i < ids.size(); ++i) o += (i ? "," : "") + std::to_string(ids[i]);
    return o + "]";
}

struct Runtime {
    llama_model* model = nullptr;
    llama_context* ctx = nullptr;
    const llama_vocab* vocab = nullptr;
    int n_vocab = 0;

    explicit Runtime(const char* model_path) {
        llama_log_set(quiet_log, nullptr);
        llama_backend_init();
        llama_model_params mp = llama_model_default_params();
        mp.n_gpu_layers = 0;
        model = llama_model_load_from_file(model_path, mp);
        if (!model) die(std::string("cannot load model '") + model_path + "'");
        vocab = llama_model_get_vocab(model);
        n_vocab = llama_vocab_n_tokens(vocab);
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = 512;
        cp.n_batch = 512;
        cp.n_ubatch = 512;
        cp.n_threads = 2;
        cp.n_threads_batch = 2;
        cp.type_k = GGML_TYPE_F32;
        cp.type_v = GGML_TYPE_F32;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
        ctx = llama_init_from_model(model, cp);
        if (!ctx) die("cannot create llama context");
    }
    ~Runtime() {
        llama_free(ctx);
        llama_model_free(model);
        llama_backend_free();
    }

    std::vector<llama_token> tokenize(const std::string& text) const {
        const bool add_bos = llama_vocab_get_add_bos(vocab);
        int n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), nullptr, 0, add_bos, true);
        std::vector<llama_token> ids(n < 0 ? -n : n);
        n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), ids.data(),
                           static_cast<int32_t>(ids.size()), add_bos, true);
        if (n < 0) die("tokenization failed");
        ids.resize(n);
        return ids;
    }

    // Evaluates ids at positions pos0.. in one batch; every position outputs logits.
    void decode(const std::vector<llama_token>& ids, int pos0) {
        llama_batch b = llama_batch_init(static_cast<int32_t>(ids.size()), 0, 1);
        for (size_t i = 0; i < ids.size(); ++i) {
            b.token[i] = ids[i];
            b.pos[i] = pos0 + static_cast<int>(i);
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = 1;
        }
        b.n_tokens = static_cast<int32_t>(ids.size());
        const int rc = llama_decode(ctx, b);
        llama_batch_free(b);
        if (rc != 0) die("llama_decode failed with code " + std::to_string(rc));
    }

    std::string piece(llama_token t) const {
        char buf[256];
        const int n = llama_token_to_piece(vocab, t, buf, sizeof buf, 0, true);
        if (n < 0) die("token piece too long");
        return std::string(buf, n);
    }
};

int cmd_logits(const char* model, const char* prompt_file, const char* out_bin) {
    Runtime rt(model);
    const std::vector<llama_token> ids = rt.tokenize(read_file(prompt_file));
    if (ids.empty() || ids.size() > 512) die("prompt must give 1..512 tokens");
    rt.decode(ids, 0);
    std::FILE* f = std::fopen(out_bin, "wb");
    if (!f) die(std::string("cannot write '") + out_bin + "'");
    for (size_t i = 0; i < ids.size(); ++i) {
        const float* row = llama_get_logits_ith(rt.ctx, static_cast<int32_t>(i));
        if (!row) die("no logits for position " + std::to_string(i));
        if (std::fwrite(row, sizeof(float), rt.n_vocab, f) != static_cast<size_t>(rt.n_vocab)) die("short write");
    }
    std::fclose(f);
    std::printf("{\"ids\":%s,\"n_vocab\":%d}\n", json_ids(ids).c_str(), rt.n_vocab);
    return 0;
}

int cmd_greedy(const char* model, const char* prompt_file, int n_new) {
    Runtime rt(model);
    const std::vector<llama_token> prompt = rt.tokenize(read_file(prompt_file));
    if (prompt.empty() || prompt.size() + n_new > 512) die("prompt + N_NEW must fit in 512 tokens");
    std::vector<llama_token> out;
    std::vector<float> margins;
    std::string text;
    bool eog = false;
    rt.decode(prompt, 0);
    int pos = static_cast<int>(prompt.size());
    for (int step = 0; step < n_new; ++step) {
        const float* row = llama_get_logits_ith(rt.ctx, -1);
        int best = 0;
        for (int v = 1; v < rt.n_vocab; ++v)
            if (row[v] > row[best]) best = v;
        float second = -INFINITY;
        for (int v = 0; v < rt.n_vocab; ++v)
            if (v != best && row[v] > second) second = row[v];
        out.push_back(best);
        margins.push_back(row[best] - second);
        if (llama_vocab_is_eog(rt.vocab, best)) {
            eog = true;
            break;
        }
        text += rt.piece(best);
        rt.decode({best}, pos++);
    }
    std::string m = "[";
    for (size_t i = 0; i < margins.size(); ++i) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%s%.6g", i ? "," : "", margins[i]);
        m += buf;
    }
    m += "]";
    std::printf("{\"prompt_ids\":%s,\"ids\":%s,\"margins\":%s,\"text\":%s,\"stopped_at_eog\":%s}\n",
                json_ids(prompt).c_str(), json_ids(out).c_str(), m.c_str(), json_str(text).c_str(),
                eog ? "true" : "false");
    return 0;
}

int cmd_dequant(const char* model, const char* out) {
    llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    llama_model_quantize_params qp = llama_model_quantize_default_params();
    qp.nthread = 2;
    qp.ftype = LLAMA_FTYPE_ALL_F32;
    qp.allow_requantize = true;
    qp.pure = true;
    const uint32_t rc = llama_model_quantize(model, out, &qp);
    llama_backend_free();
    if (rc != 0) die(std::string("llama_model_quantize to F32 failed for '") + model + "'");
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc == 4 && std::strcmp(argv[1], "dequant") == 0) return cmd_dequant(argv[2], argv[3]);
    if (argc == 5 && std::strcmp(argv[1], "logits") == 0) return cmd_logits(argv[2], argv[3], argv[4]);
    if (argc == 5 && std::strcmp(argv[1], "greedy") == 0) {
        const int n = std::atoi(argv[4]);
        if (n <= 0 || n > 256) die("N_NEW must be in 1..256");
        return cmd_greedy(argv[2], argv[3], n);
    }
    std::fprintf(stderr,
                 "usage: llama_ref logits MODEL PROMPT_FILE OUT_BIN\n"
                 "       llama_ref greedy MODEL PROMPT_FILE N_NEW\n"
                 "       llama_ref dequant MODEL OUT_GGUF\n");
    return 2;
}
