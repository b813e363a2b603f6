/* The in-place decoder through IO binding (gpt.h says how the cache is bound): a session over the verified bytes
 * of a form (open_verified), one forward pass (run_forward), and the generation loop (generate_ids) both commands
 * run. */
#define _POSIX_C_SOURCE 200809L
#include "gpt_private.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void run_close(GptRun *r) {
    if (r->bind) ort->ReleaseIoBinding(r->bind);
    for (size_t i = 0; r->bufv && i < r->nbuf; i++)
        if (r->bufv[i]) ort->ReleaseValue(r->bufv[i]);
    for (size_t i = 0; r->buf && i < r->nbuf; i++) free(r->buf[i]);
    free(r->buf);
    free(r->bufv);
    free(r->counts);
    if (r->logits_v) ort->ReleaseValue(r->logits_v);
    if (r->ids_v) ort->ReleaseValue(r->ids_v);
    if (r->past_v) ort->ReleaseValue(r->past_v);
    free(r->logits);
    free(r->ids);
    if (r->session) ort->ReleaseSession(r->session);
    memset(r, 0, sizeof *r);
}

static OrtValue *float_tensor(float *data, const int64_t *shape, size_t rank, size_t count, const char *what,
                              char *why, size_t n) {
    OrtValue *v = NULL;
    if (failed(ort->CreateTensorWithDataAsOrtValue(cpu, data, count * sizeof(float), shape, rank,
                                                   ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &v), what, why, n))
        return NULL;
    return v;
}

/* A session over the verified bytes of gpt.inplace.onnx, its contract and metadata checked, and the cache, the
 * logits and past_tokens bound. */
static int run_open(GptRun *r, const unsigned char *bytes, size_t len, const char *path, const MhaGptManifest *m,
                    long long threads, char *why, size_t n) {
    memset(r, 0, sizeof *r);
    const MhaGptShapes *cfg = &m->shapes;
    r->cfg = *cfg;
    OrtSessionOptions *opts = NULL;
    char what[4200];
    say(what, sizeof what, "%s: ONNX Runtime cannot load it", path);
    int bad = failed(ort->CreateSessionOptions(&opts), what, why, n) ||
              (threads > 0 && failed(ort->SetIntraOpNumThreads(opts, (int)threads), what, why, n)) ||
              failed(ort->CreateSessionFromArray(env, bytes, len, opts, &r->session), what, why, n);
    if (opts) ort->ReleaseSessionOptions(opts);
    if (!bad) bad = check_metadata(r->session, m->config, path, why, n) || check_contract(r->session, cfg, path, why, n);
    if (bad) { run_close(r); return 1; }
    long long KV = cfg->kv_heads, C = cfg->context_length, D = cfg->head_dim;
    r->nbuf = 2 * (size_t)cfg->n_layers;
    r->buf = calloc(r->nbuf, sizeof *r->buf);
    r->bufv = calloc(r->nbuf, sizeof *r->bufv);
    r->counts = calloc(r->nbuf, sizeof *r->counts);
    r->logits = calloc((size_t)cfg->vocab_size, sizeof(float));
    r->ids = calloc((size_t)C, sizeof(int64_t));
    if (!r->buf || !r->bufv || !r->counts || !r->logits || !r->ids) { say(why, n, "out of memory"); run_close(r); return 1; }
    int64_t logits_shape[2] = {1, cfg->vocab_size}, past_shape[1] = {1};
    bad = failed(ort->CreateIoBinding(r->session, &r->bind), "IO binding", why, n);
    for (size_t i = 0; !bad && i < r->nbuf; i++) {
        char past[64], present[64];
        snprintf(past, sizeof past, "past_key_values.%zu.%s", i / 2, i % 2 ? "value" : "key");
        snprintf(present, sizeof present, "present.%zu.%s", i / 2, i % 2 ? "value" : "key");
        /* the layer's rows: context_length, or its window (<= context_length: the manifest reader's bound) */
        int64_t cache_shape[4] = {1, KV, cfg->cache_length[i / 2], D};
        r->counts[i] = (size_t)(KV * cache_shape[2] * D);  /* <= MHA_GPT_MAX_CACHE_FLOATS (shapes_fit) */
        if (!(r->buf[i] = calloc(r->counts[i], sizeof(float)))) { say(why, n, "out of memory for the cache"); bad = 1; break; }
        /* one OrtValue over one buffer, bound as both: ONNX Runtime writes the new rows into it in place */
        bad = !(r->bufv[i] = float_tensor(r->buf[i], cache_shape, 4, r->counts[i], "cache tensor", why, n)) ||
              failed(ort->BindInput(r->bind, past, r->bufv[i]), "bind past", why, n) ||
              failed(ort->BindOutput(r->bind, present, r->bufv[i]), "bind present", why, n);
    }
    if (!bad)
        bad = !(r->logits_v = float_tensor(r->logits, logits_shape, 2, (size_t)cfg->vocab_size, "logits tensor", why, n)) ||
              failed(ort->BindOutput(r->bind, "next_token_logits", r->logits_v), "bind next_token_logits", why, n) ||
              failed(ort->CreateTensorWithDataAsOrtValue(cpu, &r->past_tokens, sizeof r->past_tokens, past_shape, 1,
                                                         ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, &r->past_v),
                     "past_tokens tensor", why, n);
    if (bad) { run_close(r); return 1; }
    return 0;
}

/* tokens[0:T] at positions past..past+T-1 -> r->logits (the last token's), checked finite. */
static int run_forward(GptRun *r, const int64_t *tokens, long long T, long long past, char *why, size_t n) {
    if (T < 1 || past < 0 || past + T > r->cfg.context_length) {  /* the callers refuse this first */
        say(why, n, "expected 1..%lld positions, got %lld tokens after %lld", r->cfg.context_length, T, past);
        return 1;
    }
    memcpy(r->ids, tokens, (size_t)T * sizeof(int64_t));
    if (r->ids_v) ort->ReleaseValue(r->ids_v);
    r->ids_v = NULL;
    r->past_tokens = (int32_t)past;
    int64_t ids_shape[2] = {1, T};
    int bad = failed(ort->CreateTensorWithDataAsOrtValue(cpu, r->ids, (size_t)T * sizeof(int64_t), ids_shape, 2,
                                                         ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, &r->ids_v),
                     "input_ids tensor", why, n) ||
              failed(ort->BindInput(r->bind, "input_ids", r->ids_v), "bind input_ids", why, n) ||
              failed(ort->BindInput(r->bind, "past_tokens", r->past_v), "bind past_tokens", why, n) ||
              failed(ort->RunWithBinding(r->session, NULL, r->bind), "ONNX Runtime run", why, n);
    if (!bad && !r->checked) {  /* once: the outputs are our buffers, in binding order */
        OrtAllocator *alloc = NULL;
        OrtValue **bound = NULL;
        size_t nbound = 0;
        bad = failed(ort->GetAllocatorWithDefaultOptions(&alloc), "allocator", why, n) ||
              failed(ort->GetBoundOutputValues(r->bind, alloc, &bound, &nbound), "bound outputs", why, n);
        if (!bad && nbound != r->nbuf + 1) {
            say(why, n, "expected %zu bound outputs, got %zu", r->nbuf + 1, nbound);
            bad = 1;
        }
        for (size_t i = 0; !bad && i < nbound; i++) {
            void *data = NULL;
            bad = failed(ort->GetTensorMutableData(bound[i], &data), "bound output", why, n);
            if (!bad && data != (i < r->nbuf ? (void *)r->buf[i] : (void *)r->logits)) {
                say(why, n, "IO binding: expected ONNX Runtime to write into the bound buffers, it returned others");
                bad = 1;
            }
        }
        for (size_t i = 0; bound && i < nbound; i++) ort->ReleaseValue(bound[i]);
        if (bound) alloc->Free(alloc, bound);
        r->checked = !bad;
    }
    for (long long i = 0; !bad && i < r->cfg.vocab_size; i++)
        if (!isfinite(r->logits[i])) {
            say(why, n, "next_token_logits: expected finite values, got %s at index %lld",
                     isnan(r->logits[i]) ? "nan" : "inf", i);
            bad = 1;
        }
    return bad;
}

int generate_ids(GptRun *r, const int64_t *prompt, long long T, const Request *q, void *scratch, float *first,
                 Result *out, char *why, size_t n) {
    MhaPcg64 rng;
    mha_pcg64_seed(&rng, q->seed);
    out->count = 0;
    out->stop = "max_new_tokens";
    for (size_t i = 0; i < r->nbuf; i++) memset(r->buf[i], 0, r->counts[i] * sizeof(float));
    double start = now_s();
    if (run_forward(r, prompt, T, 0, why, n)) return 1;
    if (first) memcpy(first, r->logits, (size_t)r->cfg.vocab_size * sizeof(float));
    for (;;) {
        int64_t token = mha_gpt_next_id(r->logits, r->cfg.vocab_size, q->temperature, q->top_k, &rng, scratch);
        if (out->count == 0) out->ttft = now_s() - start;
        int stop = 0;
        for (size_t e = 0; e < q->neos && !stop; e++) stop = token == q->eos[e];
        if (stop) { out->stop = "eos"; break; }
        out->ids[out->count++] = token;
        if (out->count >= q->max_new) break;
        if (run_forward(r, &token, 1, T + out->count - 1, why, n)) return 1;
    }
    out->seconds = now_s() - start;
    return 0;
}

int open_verified(GptRun *r, const MhaGptManifest *m, const char *dir, const char *form, long long threads,
                  char *why, size_t n) {
    unsigned char *bytes;
    size_t len;
    char path[4400];
    if (mha_read_verified(&m->files, dir, form, &bytes, &len, why, n)) return 1;
    say(path, sizeof path, "%s/%s", dir, form);
    int bad = run_open(r, bytes, len, path, m, threads, why, n);
    free(bytes);
    return bad;
}
