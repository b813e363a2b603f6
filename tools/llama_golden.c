/* mha-llama-golden: a GGUF through libllama (llama.cpp), driven by token ids: what the GPT export's gguf
 * validation (mha_runtime.gguf.llama_cpp) asks of llama.cpp itself. Built by tools/llama_cpp.sh into
 * .cache/llama.cpp/build/bin/ beside libllama.
 *
 *   mha-llama-golden MODEL.gguf LOGITS.bin [--threads N] [--kv f32|default]
 *
 * Reads commands on stdin, one a line; answers each with one JSON line on stdout; appends float32 logits (the
 * host's byte order, n_vocab per row) to LOGITS.bin. Every command starts from an empty cache.
 *   generate N ID...   prefill the prompt ids, then N greedy steps (argmax of llama.cpp's logits, the first
 *                      maximum): {"ids": [N new ids]}; the first step's logits (one row) go to LOGITS.bin
 *   score FIRST ID...  the ids in one batch: {"rows": K}; the logits at positions FIRST .. n-1 (K rows)
 *   tokenize HEX       the UTF-8 text (hex) by the GGUF's own tokenizer, special tokens as text, with the BOS
 *                      where the file's tokenizer.ggml.add_bos_token says so (llama.cpp's add_special, as a
 *                      folder's tokenizer.json post-processor puts Gemma's <bos> first): {"ids": [...]}
 * The first line printed is {"n_vocab": V, "n_ctx_train": C}. Any failure: one line on stderr, exit 1.
 * --kv f32 (the default): a float32 key/value cache and no flash attention, so the logits differ from the
 * model's own only by llama.cpp's kernels; --kv default: llama.cpp's defaults (float16 cache), what its tools run.
 */
#define _POSIX_C_SOURCE 200809L /* getline */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)user;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static void die(const char *what) {
    fprintf(stderr, "mha-llama-golden: %s\n", what);
    exit(1);
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* The whitespace-separated integers of `text` into ids (at most cap); returns the count or -1. */
static int parse_ids(char *text, llama_token *ids, int cap, int n_vocab) {
    int n = 0;
    for (char *tok = strtok(text, " \t\r\n"); tok; tok = strtok(NULL, " \t\r\n")) {
        char *end;
        long v = strtol(tok, &end, 10);
        if (*end || v < 0 || v >= n_vocab || n >= cap) return -1;
        ids[n++] = (llama_token)v;
    }
    return n;
}

static void decode(struct llama_context *ctx, struct llama_batch *batch, const llama_token *ids, int n, int pos0,
                   int first_output) {
    batch->n_tokens = n;
    for (int i = 0; i < n; i++) {
        batch->token[i] = ids[i];
        batch->pos[i] = pos0 + i;
        batch->n_seq_id[i] = 1;
        batch->seq_id[i][0] = 0;
        batch->logits[i] = i >= first_output;
    }
    if (llama_decode(ctx, *batch) != 0) die("llama_decode failed");
}

int main(int argc, char **argv) {
    if (argc < 3) die("usage: mha-llama-golden MODEL.gguf LOGITS.bin [--threads N] [--kv f32|default]");
    int threads = 1, kv_f32 = 1;
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kv") && i + 1 < argc) {
            const char *kv = argv[++i];
            if (!strcmp(kv, "f32")) kv_f32 = 1;
            else if (!strcmp(kv, "default")) kv_f32 = 0;
            else die("--kv: expected f32 or default");
        } else die("unknown argument");
    }
    if (threads < 1) die("--threads: expected a positive count");
    llama_log_set(quiet, NULL);
    llama_backend_init();

    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) die("cannot load the model");
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    const int n_ctx = llama_model_n_ctx_train(model);

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)n_ctx;
    cp.n_batch = cp.n_ubatch = (uint32_t)n_ctx;
    cp.n_seq_max = 1;
    cp.n_threads = cp.n_threads_batch = threads;
    cp.no_perf = true;
    if (kv_f32) {
        cp.type_k = cp.type_v = GGML_TYPE_F32;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    }
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) die("cannot create the context");

    FILE *out = fopen(argv[2], "wb");
    if (!out) die("cannot open the logits file");
    struct llama_batch batch = llama_batch_init(n_ctx, 0, 1);
    llama_token *ids = malloc(sizeof(llama_token) * (size_t)n_ctx);
    size_t line_cap = 1 << 16;
    char *line = malloc(line_cap);
    if (!ids || !line) die("out of memory");
    printf("{\"n_vocab\": %d, \"n_ctx_train\": %d}\n", n_vocab, n_ctx);
    fflush(stdout);

    ssize_t len;
    while ((len = getline(&line, &line_cap, stdin)) > 0) {
        char *rest = strchr(line, ' ');
        if (!rest) die("expected a command and its arguments");
        *rest++ = '\0';
        llama_memory_clear(llama_get_memory(ctx), true);
        if (!strcmp(line, "generate")) {
            char *end;
            long new_tokens = strtol(rest, &end, 10);
            int n = parse_ids(end, ids, n_ctx, n_vocab);
            if (n < 1 || new_tokens < 1 || n + new_tokens > n_ctx + 1) die("generate: bad count or ids");
            decode(ctx, &batch, ids, n, 0, n - 1);
            const float *logits = llama_get_logits_ith(ctx, -1);
            if (fwrite(logits, sizeof(float), (size_t)n_vocab, out) != (size_t)n_vocab) die("write failed");
            printf("{\"ids\": [");
            for (long t = 0; t < new_tokens; t++) {
                llama_token next = argmax(logits, n_vocab);
                printf(t ? ", %d" : "%d", next);
                if (t + 1 < new_tokens) {
                    decode(ctx, &batch, &next, 1, n + (int)t, 0);
                    logits = llama_get_logits_ith(ctx, -1);
                }
            }
            printf("]}\n");
        } else if (!strcmp(line, "score")) {
            char *end;
            long first = strtol(rest, &end, 10);
            int n = parse_ids(end, ids, n_ctx, n_vocab);
            if (n < 1 || first < 0 || first >= n) die("score: bad first position or ids");
            decode(ctx, &batch, ids, n, 0, (int)first);
            for (int i = (int)first; i < n; i++)
                if (fwrite(llama_get_logits_ith(ctx, i), sizeof(float), (size_t)n_vocab, out) != (size_t)n_vocab)
                    die("write failed");
            printf("{\"rows\": %d}\n", n - (int)first);
        } else if (!strcmp(line, "tokenize")) {
            size_t hex = strcspn(rest, "\r\n");
            if (hex % 2) die("tokenize: expected hex");
            char *text = malloc(hex / 2 + 1);
            if (!text) die("out of memory");
            for (size_t i = 0; i < hex / 2; i++) {
                unsigned byte;
                if (sscanf(rest + 2 * i, "%2x", &byte) != 1) die("tokenize: expected hex");
                text[i] = (char)byte;
            }
            int cap = (int)(hex / 2) + 8;
            llama_token *toks = malloc(sizeof(llama_token) * (size_t)cap);
            if (!toks) die("out of memory");
            int n = llama_tokenize(vocab, text, (int32_t)(hex / 2), toks, cap, true, false);
            if (n < 0) die("tokenize failed");
            printf("{\"ids\": [");
            for (int i = 0; i < n; i++) printf(i ? ", %d" : "%d", toks[i]);
            printf("]}\n");
            free(toks);
            free(text);
        } else {
            die("unknown command (generate, score, tokenize)");
        }
        fflush(stdout);
    }
    if (fclose(out) != 0) die("cannot write the logits file");
    free(line);
    free(ids);
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
