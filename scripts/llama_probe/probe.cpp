// ckptfs-llama-probe: load a GGUF with libllama in one of its load modes and greedily generate N tokens.
//
// The client tests compare the token ids it prints for a mounted file with those for the original file,
// and the bench reads its timings. It is examples/simple/simple.cpp cut to what those need, plus:
//   --mode mmap|none|dio   llama_model_params.load_mode (mmap, plain buffered reads, O_DIRECT reads)
//   a JSON line on stdout  tokens, text, load/first-token times, tokens/s, and whether llama.cpp fell back
//                          from O_DIRECT to buffered reads (it only logs a warning when it does).
#include "llama.h"

#include <chrono>
#include <clocale>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static std::string g_warnings;
static bool g_verbose = false;

static void log_cb(ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) {
        g_warnings += text;
    }
    if (g_verbose || level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

static double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

static std::string json_str(const std::string & s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (c < 0x20) {
                    char buf[8];
                    snprintf(buf, sizeof buf, "\\u%04x", c);
                    out += buf;
                } else {
                    out += (char) c;
                }
        }
    }
    return out + "\"";
}

static void batch_set_tokens(llama_batch_ext * batch, const llama_token * tokens, int32_t n_tokens, llama_pos pos_0) {
    llama_batch_ext_clear(batch);
    for (int32_t i = 0; i < n_tokens; ++i) {
        const int32_t idx = llama_batch_ext_add_token(batch, 0, tokens[i]);
        const llama_pos pos = pos_0 + i;
        llama_batch_ext_set_pos(batch, idx, &pos);
    }
    llama_batch_ext_set_output_logits(batch, n_tokens - 1, true);
}

static int usage(const char * argv0) {
    fprintf(stderr, "usage: %s -m MODEL.gguf [--mode mmap|none|dio] [-n N] [-t THREADS] [-p PROMPT] [-v]\n", argv0);
    return 2;
}

int main(int argc, char ** argv) {
    std::setlocale(LC_NUMERIC, "C");
    const double t_start = now_ms();
    std::string model_path, mode = "mmap", prompt = "Hello my name is";
    int n_predict = 16, n_threads = 2;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        const bool has_val = i + 1 < argc;
        if (a == "-m" && has_val) model_path = argv[++i];
        else if (a == "--mode" && has_val) mode = argv[++i];
        else if (a == "-n" && has_val) n_predict = atoi(argv[++i]);
        else if (a == "-t" && has_val) n_threads = atoi(argv[++i]);
        else if (a == "-p" && has_val) prompt = argv[++i];
        else if (a == "-v") g_verbose = true;
        else return usage(argv[0]);
    }
    if (model_path.empty() || n_predict < 1) return usage(argv[0]);

    llama_log_set(log_cb, nullptr);
    llama_backend_init();

    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = 0;
    if (mode == "mmap") mparams.load_mode = LLAMA_LOAD_MODE_MMAP;
    else if (mode == "none") mparams.load_mode = LLAMA_LOAD_MODE_NONE;
    else if (mode == "dio") mparams.load_mode = LLAMA_LOAD_MODE_DIRECT_IO;
    else return usage(argv[0]);

    const double t_load0 = now_ms();
    llama_model * model = llama_model_load_from_file(model_path.c_str(), mparams);
    if (model == nullptr) {
        fprintf(stderr, "ckptfs-llama-probe: cannot load %s\n%s", model_path.c_str(), g_warnings.c_str());
        return 1;
    }
    const double t_load1 = now_ms();
    const llama_vocab * vocab = llama_model_get_vocab(model);

    const int n_prompt = -llama_tokenize(vocab, prompt.c_str(), prompt.size(), nullptr, 0, true, true);
    std::vector<llama_token> prompt_tokens(n_prompt);
    if (llama_tokenize(vocab, prompt.c_str(), prompt.size(), prompt_tokens.data(), prompt_tokens.size(), true, true) < 0) {
        fprintf(stderr, "ckptfs-llama-probe: cannot tokenize the prompt\n");
        return 1;
    }

    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = n_prompt + n_predict;
    cparams.n_batch = n_prompt;
    cparams.n_threads = n_threads;
    cparams.n_threads_batch = n_threads;
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (ctx == nullptr) {
        fprintf(stderr, "ckptfs-llama-probe: cannot create a context\n");
        return 1;
    }
    llama_sampler * smpl = llama_sampler_chain_init(llama_sampler_chain_default_params());
    llama_sampler_chain_add(smpl, llama_sampler_init_greedy());

    llama_batch_ext * batch = llama_batch_ext_init(ctx);
    batch_set_tokens(batch, prompt_tokens.data(), n_prompt, 0);
    int n_tokens = n_prompt;

    std::vector<llama_token> out;
    std::string text;
    double t_first = 0, t_last = 0;
    for (int n_pos = 0; (int) out.size() < n_predict;) {
        if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch)) {
            fprintf(stderr, "ckptfs-llama-probe: decode failed\n");
            return 1;
        }
        n_pos += n_tokens;
        const llama_token id = llama_sampler_sample(smpl, ctx, -1);
        t_last = now_ms();
        if (out.empty()) t_first = t_last;
        out.push_back(id);
        char buf[256];
        const int n = llama_token_to_piece(vocab, id, buf, sizeof buf, 0, true);
        if (n > 0) text.append(buf, n);
        if (llama_vocab_is_eog(vocab, id)) break;
        batch_set_tokens(batch, &id, 1, n_pos);
        n_tokens = 1;
    }

    const bool fell_back = g_warnings.find("Falling back to buffered") != std::string::npos;
    const double gen_s = (t_last - t_first) / 1000.0;
    printf("{\"mode\": %s, \"n_prompt\": %d, \"tokens\": [", json_str(mode).c_str(), n_prompt);
    for (size_t i = 0; i < out.size(); i++) printf("%s%d", i ? ", " : "", out[i]);
    printf("], \"text\": %s, \"load_ms\": %.3f, \"ttft_ms\": %.3f, \"first_token_after_load_ms\": %.3f, "
           "\"tok_s\": %.3f, \"dio_fallback\": %s, \"warnings\": %s}\n",
           json_str(text).c_str(), t_load1 - t_load0, t_first - t_start, t_first - t_load1,
           out.size() > 1 && gen_s > 0 ? (out.size() - 1) / gen_s : 0.0, fell_back ? "true" : "false",
           json_str(g_warnings).c_str());
    fflush(stdout);

    llama_batch_ext_free(batch);
    llama_sampler_free(smpl);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
