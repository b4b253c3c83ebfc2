// ckptfs-llama-probe: load a GGUF with libllama in one of its load modes and greedily generate N tokens,
// or (--embed TEXT) compute the sentence embedding of TEXT with the model's pooling.
//
// The client tests compare the token ids (or the embedding) it prints for a mounted file with those for the
// original file, and the bench reads its timings. Generation is llama.cpp's simple example cut to what those
// need; the embedding is llama.cpp's embedding example for one prompt. Plus:
//   --mode mmap|none|dio   llama_model_params.load_mode (mmap, plain buffered reads, O_DIRECT reads)
//   a JSON line on stdout  tokens, text, load/first-token times, tokens/s, and whether llama.cpp fell back
//                          from O_DIRECT to buffered reads (it only logs a warning when it does); with
//                          --embed: the prompt's tokens, the pooling type and the embedding, each float
//                          printed with 9 significant digits so that it reads back as the same float32.
#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
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
    fprintf(stderr, "usage: %s -m MODEL.gguf [--mode mmap|none|dio] [-n N] [-t THREADS] [-p PROMPT] [-v]\n"
                    "       %s -m MODEL.gguf [--mode mmap|none|dio] [-t THREADS] --embed TEXT [--embd-normalize N] [-v]\n",
            argv0, argv0);
    return 2;
}

static std::vector<llama_token> tokenize(const llama_vocab * vocab, const std::string & text) {
    const int n = -llama_tokenize(vocab, text.c_str(), text.size(), nullptr, 0, true, true);
    std::vector<llama_token> tokens(n);
    if (n <= 0 || llama_tokenize(vocab, text.c_str(), text.size(), tokens.data(), tokens.size(), true, true) < 0) {
        fprintf(stderr, "ckptfs-llama-probe: cannot tokenize the prompt\n");
        tokens.clear();
    }
    return tokens;
}

static llama_context * new_context(llama_model * model, llama_context_params cparams, int n_threads) {
    cparams.n_threads = n_threads;
    cparams.n_threads_batch = n_threads;
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (ctx == nullptr) fprintf(stderr, "ckptfs-llama-probe: cannot create a context\n");
    return ctx;
}

static void print_tokens(const std::vector<llama_token> & tokens) {
    printf("[");
    for (size_t i = 0; i < tokens.size(); i++) printf("%s%d", i ? ", " : "", tokens[i]);
    printf("]");
}

// common_embd_normalize of llama.cpp's common library (which the probe does not link): the same sums in double.
static void normalize(const float * inp, float * out, int n, int embd_norm) {
    double sum = 0.0;
    if (embd_norm == -1) {
        sum = 1.0;
    } else if (embd_norm == 0) {
        for (int i = 0; i < n; i++) sum = std::max(sum, (double) std::abs(inp[i]));
        sum /= 32760.0;
    } else if (embd_norm == 2) {
        for (int i = 0; i < n; i++) sum += inp[i] * inp[i];
        sum = std::sqrt(sum);
    } else {
        for (int i = 0; i < n; i++) sum += std::pow(std::abs(inp[i]), embd_norm);
        sum = std::pow(sum, 1.0 / embd_norm);
    }
    const float norm = sum > 0.0 ? 1.0 / sum : 0.0f;
    for (int i = 0; i < n; i++) out[i] = inp[i] * norm;
}

static bool fell_back() {
    return g_warnings.find("Falling back to buffered") != std::string::npos;
}

// Greedy generation of n_predict tokens after the prompt; prints the JSON line. Returns the exit status.
static int generate(llama_model * model, const std::string & mode, const std::string & prompt, int n_predict,
                    int n_threads, double t_start, double t_load0, double t_load1) {
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const std::vector<llama_token> prompt_tokens = tokenize(vocab, prompt);
    const int n_prompt = prompt_tokens.size();
    if (n_prompt == 0) return 1;

    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = n_prompt + n_predict;
    cparams.n_batch = n_prompt;
    llama_context * ctx = new_context(model, cparams, n_threads);
    if (ctx == nullptr) return 1;
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

    const double gen_s = (t_last - t_first) / 1000.0;
    printf("{\"mode\": %s, \"n_prompt\": %d, \"tokens\": ", json_str(mode).c_str(), n_prompt);
    print_tokens(out);
    printf(", \"text\": %s, \"load_ms\": %.3f, \"ttft_ms\": %.3f, \"first_token_after_load_ms\": %.3f, "
           "\"tok_s\": %.3f, \"dio_fallback\": %s, \"warnings\": %s}\n",
           json_str(text).c_str(), t_load1 - t_load0, t_first - t_start, t_first - t_load1,
           out.size() > 1 && gen_s > 0 ? (out.size() - 1) / gen_s : 0.0, fell_back() ? "true" : "false",
           json_str(g_warnings).c_str());
    fflush(stdout);

    llama_batch_ext_free(batch);
    llama_sampler_free(smpl);
    llama_free(ctx);
    return 0;
}

// The sentence embedding of text, as llama.cpp's embedding example does it for one prompt: a context with embeddings
// on and the model's own pooling (from its GGUF), every token of the prompt (special tokens added, as the
// tokenizer's settings ask) in sequence 0 with its output on, one decode, then the pooled vector of the
// sequence (for pooling "none", each token's vector), normalized like --embd-normalize (-1: none, 0: max
// absolute to int16 range, 2: euclidean, p: p-norm). Prints the JSON line; returns the exit status.
static int embed(llama_model * model, const std::string & mode, const std::string & text, int embd_norm,
                 int n_threads, double t_load0, double t_load1) {
    const llama_vocab * vocab = llama_model_get_vocab(model);
    if (llama_model_has_encoder(model) && llama_model_has_decoder(model)) {
        fprintf(stderr, "ckptfs-llama-probe: no embeddings from an encoder-decoder model\n");
        return 1;
    }
    const std::vector<llama_token> tokens = tokenize(vocab, text);
    const int n_tokens = tokens.size();
    if (n_tokens == 0) return 1;

    llama_context_params cparams = llama_context_default_params();
    cparams.embeddings = true;
    cparams.n_ctx = n_tokens;
    cparams.n_batch = n_tokens;    // the whole prompt in one batch,
    cparams.n_ubatch = n_tokens;   // and one ubatch: a non-causal model must see every token at once
    cparams.n_seq_max = 1;
    llama_context * ctx = new_context(model, cparams, n_threads);
    if (ctx == nullptr) return 1;
    const enum llama_pooling_type pooling = llama_pooling_type(ctx);

    llama_batch_ext * batch = llama_batch_ext_init(ctx);
    for (int i = 0; i < n_tokens; i++) {
        const int32_t idx = llama_batch_ext_add_token(batch, 0, tokens[i]);
        const llama_pos pos = i;
        llama_batch_ext_set_pos(batch, idx, &pos);
        llama_batch_ext_set_output_embd(batch, idx, true);
    }
    if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch) != 0) {
        fprintf(stderr, "ckptfs-llama-probe: decode failed\n");
        return 1;
    }

    // rows of the output: the pooled sequence, or each token when the model does not pool
    const int n_embd = pooling == LLAMA_POOLING_TYPE_RANK ? (int) llama_model_n_cls_out(model)
                                                           : llama_model_n_embd_out(model);
    const int n_rows = pooling == LLAMA_POOLING_TYPE_NONE ? n_tokens : 1;
    std::vector<float> out(n_rows * (size_t) n_embd);
    for (int r = 0; r < n_rows; r++) {
        const float * row = pooling == LLAMA_POOLING_TYPE_NONE ? llama_get_embeddings_ith(ctx, r)
                                                               : llama_get_embeddings_seq(ctx, 0);
        if (row == nullptr) {
            fprintf(stderr, "ckptfs-llama-probe: llama.cpp returned no embedding\n");
            return 1;
        }
        normalize(row, out.data() + r * (size_t) n_embd, n_embd, embd_norm);
    }

    const char * pooling_names[] = {"none", "mean", "cls", "last", "rank"};
    const bool named = pooling >= LLAMA_POOLING_TYPE_NONE && pooling <= LLAMA_POOLING_TYPE_RANK;
    printf("{\"mode\": %s, \"n_prompt\": %d, \"tokens\": ", json_str(mode).c_str(), n_tokens);
    print_tokens(tokens);
    printf(", \"pooling\": %s, \"n_embd\": %d, \"embd_normalize\": %d, \"embedding\": ",
           json_str(named ? pooling_names[pooling] : "unknown").c_str(), n_embd, embd_norm);
    if (pooling == LLAMA_POOLING_TYPE_NONE) printf("[");
    for (int r = 0; r < n_rows; r++) {
        printf("%s[", r ? ", " : "");
        for (int i = 0; i < n_embd; i++) {
            const float v = out[r * (size_t) n_embd + i];
            if (std::isfinite(v)) printf("%s%.9g", i ? ", " : "", v);
            else printf("%snull", i ? ", " : "");  // JSON has no NaN or infinity
        }
        printf("]");
    }
    if (pooling == LLAMA_POOLING_TYPE_NONE) printf("]");
    printf(", \"load_ms\": %.3f, \"dio_fallback\": %s, \"warnings\": %s}\n", t_load1 - t_load0,
           fell_back() ? "true" : "false", json_str(g_warnings).c_str());
    fflush(stdout);

    llama_batch_ext_free(batch);
    llama_free(ctx);
    return 0;
}

int main(int argc, char ** argv) {
    std::setlocale(LC_NUMERIC, "C");
    const double t_start = now_ms();
    std::string model_path, mode = "mmap", prompt = "Hello my name is", embed_text;
    bool embedding = false;
    int n_predict = 16, n_threads = 2, embd_norm = 2;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        const bool has_val = i + 1 < argc;
        if (a == "-m" && has_val) model_path = argv[++i];
        else if (a == "--mode" && has_val) mode = argv[++i];
        else if (a == "-n" && has_val) n_predict = atoi(argv[++i]);
        else if (a == "-t" && has_val) n_threads = atoi(argv[++i]);
        else if (a == "-p" && has_val) prompt = argv[++i];
        else if (a == "--embed" && has_val) { embed_text = argv[++i]; embedding = true; }
        else if (a == "--embd-normalize" && has_val) embd_norm = atoi(argv[++i]);
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

    const int status = embedding ? embed(model, mode, embed_text, embd_norm, n_threads, t_load0, t_load1)
                                 : generate(model, mode, prompt, n_predict, n_threads, t_start, t_load0, t_load1);
    llama_model_free(model);
    llama_backend_free();
    return status;
}
