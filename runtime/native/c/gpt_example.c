// Greedy generation with gpt.inplace.onnx through the ONNX Runtime C API: load, bind each layer's cache buffer as
// both past and present (IO binding), prefill the prompt, then one token per step, argmax. Token ids in and out.
// Usage: gpt_example DIR/gpt.inplace.onnx [N_NEW [ID...]]. (mha_check generate also checks the sha256 first.)
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <onnxruntime_c_api.h>

static const OrtApi *ort;
static void ok(OrtStatus *st) {
    if (st) { fprintf(stderr, "error: %s\n", ort->GetErrorMessage(st)); exit(1); }
}

// A whole decimal integer in lo..hi, or one line and exit 1 (atoi took "abc" for 0 and -5 for a count).
static long long int_arg(const char *text, long long lo, long long hi, const char *what) {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) {
        fprintf(stderr, "error: %s: expected an integer from %lld to %lld, got '%.30s'\n", what, lo, hi, text);
        exit(1);
    }
    return v;
}

// Input `index`'s dims (rank 4 at most) from the session.
static void input_dims(OrtSession *s, size_t index, int64_t *dims, size_t rank) {
    OrtTypeInfo *info; const OrtTensorTypeAndShapeInfo *t;
    ok(ort->SessionGetInputTypeInfo(s, index, &info));
    ok(ort->CastTypeInfoToTensorInfo(info, &t));
    ok(ort->GetDimensions(t, dims, rank));
    ort->ReleaseTypeInfo(info);
}

int main(int argc, char **argv) {
    ort = OrtGetApiBase()->GetApi(ORT_API_VERSION);
    OrtEnv *env; OrtSessionOptions *opts; OrtSession *s; OrtMemoryInfo *cpu; OrtIoBinding *bind;
    OrtTypeInfo *info; const OrtTensorTypeAndShapeInfo *t; OrtAllocator *alloc;
    ok(ort->CreateEnv(ORT_LOGGING_LEVEL_WARNING, "gpt", &env));
    ok(ort->CreateSessionOptions(&opts));
    ok(ort->CreateSession(env, argc > 1 ? argv[1] : "gpt.inplace.onnx", opts, &s));
    ok(ort->CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &cpu));
    ok(ort->GetAllocatorWithDefaultOptions(&alloc));
    size_t inputs; int64_t cache[4], logits_shape[2];  // cache [1, KV, C, D] (key/value heads); logits [1, V]
    ok(ort->SessionGetInputCount(s, &inputs));
    ok(ort->SessionGetOutputTypeInfo(s, 0, &info));  // next_token_logits
    ok(ort->CastTypeInfoToTensorInfo(info, &t));
    ok(ort->GetDimensions(t, logits_shape, 2));
    ort->ReleaseTypeInfo(info);
    // Each layer's C is its own input's: context_length, or a sliding window's rows (a layer that keeps only its
    // window); the context is the largest.
    int64_t C = 0, V = logits_shape[1], n = argc > 3 ? argc - 3 : 1;
    for (size_t i = 2; i < inputs; i++) {
        input_dims(s, i, cache, 4);
        if (cache[2] > C) C = cache[2];
    }
    int layers = (int)(inputs - 2) / 2, new_tokens = argc > 2 ? (int)int_arg(argv[2], 1, C, "N_NEW") : 8;
    logits_shape[0] = 1;
    if (n + new_tokens > C) { fprintf(stderr, "error: prompt + new tokens pass context_length %lld\n", (long long)C); return 1; }
    int64_t *ids = calloc((size_t)(n + new_tokens), sizeof *ids);  // the prompt, then the new ids
    // the prompt's ids, or id 0 (in every vocabulary)
    for (int64_t i = 0; i < n; i++) ids[i] = argc > 3 ? int_arg(argv[3 + i], 0, V - 1, "ID") : 0;
    // one zeroed buffer per layer and per key/value, bound as BOTH past_key_values.{i}.* and present.{i}.*
    ok(ort->CreateIoBinding(s, &bind));
    float **buf = calloc(2 * (size_t)layers, sizeof *buf), *logits = calloc((size_t)V, sizeof *logits);
    OrtValue **kv = calloc(2 * (size_t)layers, sizeof *kv), *lv, *iv = NULL, *pv;
    for (int i = 0; i < 2 * layers; i++) {
        char past[64], present[64];
        snprintf(past, sizeof past, "past_key_values.%d.%s", i / 2, i % 2 ? "value" : "key");
        snprintf(present, sizeof present, "present.%d.%s", i / 2, i % 2 ? "value" : "key");
        input_dims(s, 2 + (size_t)i, cache, 4);  // past_key_values.{i/2}.*: [batch, KV, C, D]
        cache[0] = 1;
        size_t count = (size_t)(cache[1] * cache[2] * cache[3]);
        buf[i] = calloc(count, sizeof(float));
        ok(ort->CreateTensorWithDataAsOrtValue(cpu, buf[i], count * sizeof(float), cache, 4,
                                               ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &kv[i]));
        ok(ort->BindInput(bind, past, kv[i]));
        ok(ort->BindOutput(bind, present, kv[i]));  // the same OrtValue: ORT writes the new rows in place
    }
    ok(ort->CreateTensorWithDataAsOrtValue(cpu, logits, (size_t)V * sizeof(float), logits_shape, 2,
                                           ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &lv));
    ok(ort->BindOutput(bind, "next_token_logits", lv));
    int32_t past_tokens = 0;  // cached rows before this call's tokens
    int64_t one = 1;
    ok(ort->CreateTensorWithDataAsOrtValue(cpu, &past_tokens, sizeof past_tokens, &one, 1,
                                           ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, &pv));
    ok(ort->BindInput(bind, "past_tokens", pv));
    int64_t at = 0, len = n;  // prefill: the whole prompt at position 0; then each new token alone
    for (int step = 0; step < new_tokens; step++) {
        int64_t shape[2] = {1, len};
        if (iv) ort->ReleaseValue(iv);
        ok(ort->CreateTensorWithDataAsOrtValue(cpu, ids + at, (size_t)len * sizeof(int64_t), shape, 2,
                                               ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, &iv));
        ok(ort->BindInput(bind, "input_ids", iv));
        past_tokens = (int32_t)at;
        ok(ort->RunWithBinding(s, NULL, bind));
        int64_t best = 0;  // argmax: the first maximum
        for (int64_t v = 1; v < V; v++)
            if (logits[v] > logits[best]) best = v;
        at += len;
        ids[at] = best;
        len = 1;
        printf("%s%lld", step ? "," : "", (long long)best);
    }
    printf("\n");
    for (int i = 0; i < 2 * layers; i++) { ort->ReleaseValue(kv[i]); free(buf[i]); }
    ort->ReleaseValue(lv); ort->ReleaseValue(pv); if (iv) ort->ReleaseValue(iv);
    free(kv); free(buf); free(logits); free(ids);
    ort->ReleaseIoBinding(bind); ort->ReleaseMemoryInfo(cpu); ort->ReleaseSession(s);
    ort->ReleaseSessionOptions(opts); ort->ReleaseEnv(env);
    return 0;
}
