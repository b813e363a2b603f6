/* mha_check: run the mha-export ONNX artifacts through the ONNX Runtime C API.
 *
 *   mha_check check ARTIFACT_DIR                      every golden case in golden/cases.tsv
 *   mha_check run MODEL.onnx IN.bin BATCH TOKENS OUT.bin   one input (raw little-endian float32)
 *
 * The input contract (d_in, context_length) is read from the model's metadata ("mha.config").
 * Built against the headers of Debian's libonnxruntime-dev and the libonnxruntime.so.1 of the
 * onnxruntime Python wheel; the C API is backward compatible, so older headers work with it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <onnxruntime_c_api.h>

#if ORT_API_VERSION < 16
#error "onnxruntime_c_api.h older than API 16: need headers from onnxruntime >= 1.16"
#endif

static const OrtApi *ort;
static OrtEnv *env;
static OrtMemoryInfo *cpu;

typedef struct { long d_in, d_out, num_heads, context_length; } Config;

/* Print ORT's message for a failed call and return 1 (0 when the call succeeded). */
static int failed(OrtStatus *status, const char *what, const char *path) {
    if (status == NULL) return 0;
    fprintf(stderr, "error: %s %s: %s\n", what, path, ort->GetErrorMessage(status));
    ort->ReleaseStatus(status);
    return 1;
}

static long json_int(const char *json, const char *key) {
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    const char *at = strstr(json, pattern);
    return at ? strtol(at + strlen(pattern), NULL, 10) : -1;
}

/* Open a session and read the config from its metadata; NULL (after a message) on any failure. */
static OrtSession *open_model(const char *path, Config *cfg) {
    OrtSessionOptions *opts;
    OrtSession *session = NULL;
    if (failed(ort->CreateSessionOptions(&opts), "session options for", path)) return NULL;
    failed(ort->SetIntraOpNumThreads(opts, 1), "threads for", path);
    OrtStatus *st = ort->CreateSession(env, path, opts, &session);
    ort->ReleaseSessionOptions(opts);
    if (failed(st, "cannot load model", path)) return NULL;
    OrtModelMetadata *meta;
    OrtAllocator *alloc;
    char *text = NULL;
    if (failed(ort->GetAllocatorWithDefaultOptions(&alloc), "allocator for", path)) return NULL;
    if (failed(ort->SessionGetModelMetadata(session, &meta), "metadata of", path)) return NULL;
    failed(ort->ModelMetadataLookupCustomMetadataMap(meta, alloc, "mha.config", &text), "metadata of", path);
    ort->ReleaseModelMetadata(meta);
    if (text == NULL) {
        fprintf(stderr, "error: %s: expected 'mha.config' in the model's metadata, found none\n", path);
        ort->ReleaseSession(session);
        return NULL;
    }
    cfg->d_in = json_int(text, "d_in");
    cfg->d_out = json_int(text, "d_out");
    cfg->num_heads = json_int(text, "num_heads");
    cfg->context_length = json_int(text, "context_length");
    alloc->Free(alloc, text);
    return session;
}

/* The contract check, before ONNX Runtime sees the data; 0 when the shape fits. */
static int check_shape(const Config *cfg, long batch, long tokens, long d_in, char *why, size_t n) {
    if (d_in != cfg->d_in)
        snprintf(why, n, "expected last axis d_in=%ld, got %ld", cfg->d_in, d_in);
    else if (batch < 1)
        snprintf(why, n, "expected batch >= 1, got %ld", batch);
    else if (tokens < 1 || tokens > cfg->context_length)
        snprintf(why, n, "expected 1 <= tokens <= context_length=%ld, got %ld", cfg->context_length, tokens);
    else
        return 0;
    return 1;
}

static float *read_floats(const char *path, size_t count) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "error: %s: cannot open\n", path); return NULL; }
    float *data = malloc(count * sizeof(float) + 1);
    size_t got = fread(data, sizeof(float), count, f);
    int extra = fgetc(f) != EOF;
    fclose(f);
    if (got != count || extra) {
        fprintf(stderr, "error: %s: expected %zu float32 values, found %s\n", path, count, extra ? "more" : "fewer");
        free(data);
        return NULL;
    }
    return data;
}

static OrtValue *tensor(float *data, const int64_t *shape, size_t rank) {
    size_t count = 1;
    for (size_t i = 0; i < rank; i++) count *= (size_t)shape[i];
    static float dummy;  /* a zero-size cache still needs a valid pointer */
    OrtValue *value = NULL;
    if (failed(ort->CreateTensorWithDataAsOrtValue(cpu, count ? data : &dummy, count * sizeof(float), shape, rank,
                                                   ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &value), "tensor", ""))
        return NULL;
    return value;
}

/* x (B, T, d_in) -> out (B, T, H*d_out) in one call. */
static int run_plain(OrtSession *s, const Config *c, float *x, long B, long T, float *out) {
    int64_t shape[3] = {B, T, c->d_in};
    OrtValue *in = tensor(x, shape, 3), *result = NULL;
    const char *in_names[] = {"x"}, *out_names[] = {"context"};
    if (!in || failed(ort->Run(s, NULL, in_names, (const OrtValue *const *)&in, 1, out_names, 1, &result), "run", ""))
        return 1;
    float *y;
    if (failed(ort->GetTensorMutableData(result, (void **)&y), "output", "")) return 1;
    memcpy(out, y, (size_t)(B * T * c->num_heads * c->d_out) * sizeof(float));
    ort->ReleaseValue(in);
    ort->ReleaseValue(result);
    return 0;
}

/* The decode form: feed x in chunks from an empty key/value cache, gather each chunk's context. */
static int run_decode(OrtSession *s, const Config *c, float *x, long B, long T, const char *schedule, float *out) {
    long H = c->num_heads, d = c->d_out, D = H * d, past = 0;
    float *key = NULL, *value = NULL;
    const char *in_names[] = {"x", "past_key", "past_value"};
    const char *out_names[] = {"context", "present_key", "present_value"};
    for (const char *p = schedule; *p;) {
        char *end;
        long n = strtol(p, &end, 10);
        p = *end == ',' ? end + 1 : end;
        float *chunk = malloc((size_t)(B * n * c->d_in) * sizeof(float) + 1);
        for (long b = 0; b < B; b++)  /* x[:, past:past+n] as its own contiguous block */
            memcpy(chunk + b * n * c->d_in, x + (b * T + past) * c->d_in, (size_t)(n * c->d_in) * sizeof(float));
        int64_t xs[3] = {B, n, c->d_in}, cs[4] = {B, H, past, d};
        OrtValue *inputs[3] = {tensor(chunk, xs, 3), tensor(key, cs, 4), tensor(value, cs, 4)};
        OrtValue *outputs[3] = {NULL, NULL, NULL};
        if (failed(ort->Run(s, NULL, in_names, (const OrtValue *const *)inputs, 3, out_names, 3, outputs), "run", ""))
            return 1;
        float *ctx, *pk, *pv;
        if (failed(ort->GetTensorMutableData(outputs[0], (void **)&ctx), "output", "") ||
            failed(ort->GetTensorMutableData(outputs[1], (void **)&pk), "output", "") ||
            failed(ort->GetTensorMutableData(outputs[2], (void **)&pv), "output", ""))
            return 1;
        for (long b = 0; b < B; b++)
            memcpy(out + (b * T + past) * D, ctx + b * n * D, (size_t)(n * D) * sizeof(float));
        past += n;
        size_t cache = (size_t)(B * H * past * d) * sizeof(float);
        free(key); free(value);
        key = malloc(cache + 1); value = malloc(cache + 1);
        memcpy(key, pk, cache); memcpy(value, pv, cache);
        for (int i = 0; i < 3; i++) { ort->ReleaseValue(inputs[i]); ort->ReleaseValue(outputs[i]); }
        free(chunk);
    }
    free(key); free(value);
    if (past != T) { fprintf(stderr, "error: schedule %s adds up to %ld, expected %ld\n", schedule, past, T); return 1; }
    return 0;
}

static int check_dir(const char *dir) {
    static char line[1 << 16];  /* a decode schedule lists one chunk per token: long lines */
    char path[4096];
    snprintf(path, sizeof path, "%s/golden/cases.tsv", dir);
    FILE *f = fopen(path, "r");
    if (!f) { fprintf(stderr, "error: %s: expected golden fixtures (made by `mha export`), found none\n", path); return 1; }
    int passed = 0, failures = 0;
    char loaded[512] = "";
    OrtSession *session = NULL;
    Config cfg = {0};
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        static char sched[1 << 16];
        char file[512], kind[64], runtime[64], rel[32], name[128], xin[512], yout[512];
        double atol, rtol;
        long B, T, d_in, D;
        if (sscanf(line, "%511s %63s %63s %lf %lf %31s %127s %ld %ld %ld %ld %511s %511s %65535s", file, kind, runtime,
                   &atol, &rtol, rel, name, &B, &T, &d_in, &D, xin, yout, sched) != 14) {
            fprintf(stderr, "error: %s: malformed line: %s", path, line);
            failures++;
            continue;
        }
        int decode = strcmp(runtime, "onnxruntime-decode") == 0;
        if (strcmp(runtime, "onnxruntime") != 0 && !decode) continue;  /* TorchScript: the C++ runner's job */
        if (strcmp(file, loaded) != 0) {
            if (session) ort->ReleaseSession(session);
            snprintf(path, sizeof path, "%s/%s", dir, file);
            session = open_model(path, &cfg);
            snprintf(loaded, sizeof loaded, "%s", file);
        }
        char why[256] = "";
        if (!session) {
            snprintf(why, sizeof why, "model did not load");
        } else if (check_shape(&cfg, B, T, d_in, why, sizeof why) == 0 && D != cfg.num_heads * cfg.d_out) {
            snprintf(why, sizeof why, "expected output width %ld, got %ld", cfg.num_heads * cfg.d_out, D);
        }
        float *x = NULL, *want = NULL, *got = NULL;
        if (!why[0]) {
            snprintf(path, sizeof path, "%s/golden/%s", dir, xin);
            x = read_floats(path, (size_t)(B * T * d_in));
            snprintf(path, sizeof path, "%s/golden/%s", dir, yout);
            want = read_floats(path, (size_t)(B * T * D));
            got = calloc((size_t)(B * T * D), sizeof(float));
            if (!x || !want) snprintf(why, sizeof why, "fixture files unreadable");
            else if (decode ? run_decode(session, &cfg, x, B, T, sched, got) : run_plain(session, &cfg, x, B, T, got))
                snprintf(why, sizeof why, "ONNX Runtime failed");
        }
        double max_abs = 0, diff2 = 0, ref2 = 0;
        int ok = !why[0];
        for (long i = 0; ok && i < B * T * D; i++) {
            double a = got[i], e = want[i], diff = fabs(a - e);
            if (!isfinite(a) || diff > atol + rtol * fabs(e)) ok = 0;
            if (diff > max_abs || !isfinite(a)) max_abs = isfinite(a) ? diff : INFINITY;
            diff2 += diff * diff;
            ref2 += e * e;
        }
        double rel_l2 = ref2 > 0 ? sqrt(diff2 / ref2) : sqrt(diff2);
        if (ok && strcmp(rel, "-") != 0 && rel_l2 > atof(rel)) ok = 0;
        if (ok) {
            passed++;
            printf("ok   %-20s %-10s max_abs=%.3g rel_l2=%.3g\n", file, name, max_abs, rel_l2);
        } else {
            failures++;
            if (why[0]) printf("FAIL %-20s %-10s %s\n", file, name, why);
            else printf("FAIL %-20s %-10s max_abs=%.3g rel_l2=%.3g atol=%g\n", file, name, max_abs, rel_l2, atol);
        }
        free(x); free(want); free(got);
    }
    fclose(f);
    if (session) ort->ReleaseSession(session);
    printf("%d passed, %d failed\n", passed, failures);
    if (passed + failures == 0) fprintf(stderr, "error: %s/golden/cases.tsv: no ONNX case found\n", dir);
    return failures > 0 || passed == 0;
}

static int run_one(char **argv) {
    Config cfg;
    OrtSession *s = open_model(argv[2], &cfg);
    if (!s) return 1;
    long B = strtol(argv[4], NULL, 10), T = strtol(argv[5], NULL, 10);
    char why[256];
    if (check_shape(&cfg, B, T, cfg.d_in, why, sizeof why)) { fprintf(stderr, "error: input: %s\n", why); return 1; }
    float *x = read_floats(argv[3], (size_t)(B * T * cfg.d_in));
    if (!x) return 1;
    size_t n = (size_t)(B * T * cfg.num_heads * cfg.d_out);
    float *y = malloc(n * sizeof(float));
    if (run_plain(s, &cfg, x, B, T, y)) return 1;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", argv[6]);
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(y, sizeof(float), n, f) != n || fclose(f) != 0 || rename(tmp, argv[6]) != 0) {
        fprintf(stderr, "error: %s: cannot write\n", argv[6]);
        remove(tmp);
        return 1;
    }
    printf("wrote %s [%ld, %ld, %ld]\n", argv[6], B, T, cfg.num_heads * cfg.d_out);
    return 0;
}

int main(int argc, char **argv) {
    ort = OrtGetApiBase()->GetApi(ORT_API_VERSION);
    if (!ort) { fprintf(stderr, "error: libonnxruntime does not offer C API version %d\n", ORT_API_VERSION); return 1; }
    if (failed(ort->CreateEnv(ORT_LOGGING_LEVEL_ERROR, "mha_check", &env), "environment", "")) return 1;
    if (failed(ort->CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &cpu), "memory info", "")) return 1;
    if (argc == 3 && strcmp(argv[1], "check") == 0) return check_dir(argv[2]);
    if (argc == 7 && strcmp(argv[1], "run") == 0) return run_one(argv);
    fprintf(stderr, "usage: mha_check check ARTIFACT_DIR | mha_check run MODEL.onnx IN.bin BATCH TOKENS OUT.bin\n");
    return 2;
}
