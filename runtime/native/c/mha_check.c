/* mha_check: run the mha-export ONNX artifacts through the ONNX Runtime C API.
 *
 *   mha_check check ARTIFACT_DIR [--json FILE]            every golden case of golden/cases.json
 *   mha_check run MODEL.onnx IN.bin BATCH TOKENS OUT.bin  one input (raw little-endian float32)
 *   mha_check sha256 FILE...                              the digests it checks files with (like sha256sum)
 *   mha_check generate GPT_DIR --prompt-ids 1,2,3 [--max-new-tokens N] ...   new token ids of a GPT folder (gpt.h)
 *
 * On a decoder folder (manifest.json of kind "decoder", or "gpt"), `check` runs the golden generations of
 * golden/generations.json instead (gpt_check.c); every other folder gets the attention check below, unchanged. What
 * this file shares with the decoder side (the ONNX Runtime handles, one-line messages, "C"-locale lines, the ends of a check) is in cli.h.
 *
 * `check` trusts nothing it has not verified: manifest.json is required, and cases.json, every golden
 * file and every model are checked against its size and sha256 before use (cases.json before it is
 * parsed); each (artifact, case) pair of cases.json is validated against the manifest's config (shapes,
 * counts, tolerances, decode schedules) before a buffer is sized from it; the model's own config
 * ("mha.config" metadata) must equal the manifest's; inputs must be finite. `run` does the same with the
 * manifest.json beside MODEL, and says "unverified" when there is none. Every failure is one line; output
 * files are written under a unique temporary name and renamed into place, so concurrent runs never see
 * each other's half-written files.
 *
 * `check` prints one line per case ("ok   FILE CASE max_abs=... rel_l2=..." or "FAIL FILE CASE why") and
 * ends with "N passed, N failed"; --json FILE also writes the results as JSON (common/report.h: the format
 * of runtime/native/web/check.mjs --json, with "runtime": "c").
 *
 * `check` runs the cases.json artifacts of the runtimes onnxruntime, onnxruntime-decode and
 * onnxruntime-decode-inplace; the in-place form's key/value cache is one buffer per tensor, bound through the
 * IoBinding API as both past and present, so ONNX Runtime writes each chunk's rows into it.
 *
 * main() calls setlocale(LC_ALL, "") as an embedding program would; the JSON reader and every number this
 * program prints use the "C" locale (common/json.h), so a decimal-comma locale (de_DE) changes nothing.
 *
 * Built against the headers of Debian's libonnxruntime-dev and the libonnxruntime.so.1 of the
 * onnxruntime Python wheel; the C API is backward compatible, so older headers work with it.
 */
#define _POSIX_C_SOURCE 200809L
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <onnxruntime_c_api.h>

#include "artifact.h"
#include "cli.h"
#include "gpt.h"
#include "report.h"
#include "sha256.h"

#if ORT_API_VERSION < 16
#error "onnxruntime_c_api.h older than API 16: need headers from onnxruntime >= 1.16"
#endif

/* A session from model bytes already read (and verified when a manifest is given); the config from its
 * "mha.config" metadata, which must equal the manifest's. NULL with the reason in why; *unloadable (when
 * given) set when ONNX Runtime itself refused the bytes. */
static OrtSession *open_model(const unsigned char *bytes, size_t len, const char *path, const MhaManifest *m,
                              MhaConfig *cfg, int *unloadable, char *why, size_t n) {
    OrtSessionOptions *opts = NULL;
    OrtSession *session = NULL;
    OrtModelMetadata *meta = NULL;
    OrtAllocator *alloc = NULL;
    char *text = NULL, what[4200];
    snprintf(what, sizeof what, "%s: ONNX Runtime cannot load it", path);
    if (failed(ort->CreateSessionOptions(&opts), what, why, n) ||
        failed(ort->SetIntraOpNumThreads(opts, 1), what, why, n)) {
        if (opts) ort->ReleaseSessionOptions(opts);
        return NULL;
    }
    if (failed(ort->CreateSessionFromArray(env, bytes, len, opts, &session), what, why, n)) {
        if (unloadable) *unloadable = 1;
        ort->ReleaseSessionOptions(opts);
        return NULL;
    }
    ort->ReleaseSessionOptions(opts);
    snprintf(what, sizeof what, "%s: metadata", path);
    if (failed(ort->GetAllocatorWithDefaultOptions(&alloc), what, why, n) ||
        failed(ort->SessionGetModelMetadata(session, &meta), what, why, n) ||
        failed(ort->ModelMetadataLookupCustomMetadataMap(meta, alloc, "mha.config", &text), what, why, n))
        goto fail;
    if (text == NULL) {
        snprintf(why, n, "%s: expected 'mha.config' in the model's metadata, found none", path);
        goto fail;
    }
    snprintf(what, sizeof what, "%s: metadata 'mha.config'", path);
    int bad = mha_config_parse(text, strlen(text), what, cfg, why, n);
    if (!bad && m) bad = mha_config_same(cfg, what, &m->config, m->path, why, n);
    alloc->Free(alloc, text);
    if (bad) goto fail;
    ort->ReleaseModelMetadata(meta);
    return session;
fail:
    if (meta) ort->ReleaseModelMetadata(meta);
    ort->ReleaseSession(session);
    return NULL;
}

static OrtValue *tensor(float *data, const int64_t *shape, size_t rank, char *why, size_t n) {
    size_t count = 1;
    for (size_t i = 0; i < rank; i++) count *= (size_t)shape[i];
    static float dummy;  /* a zero-size cache still needs a valid pointer */
    OrtValue *value = NULL;
    if (failed(ort->CreateTensorWithDataAsOrtValue(cpu, count ? data : &dummy, count * sizeof(float), shape, rank,
                                                   ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &value), "input tensor", why, n))
        return NULL;
    return value;
}

/* The float data of an output, after checking that it is float32 of exactly `shape`. */
static float *output_data(OrtValue *value, const char *name, const int64_t *shape, size_t rank, char *why, size_t n) {
    OrtTensorTypeAndShapeInfo *info = NULL;
    ONNXTensorElementDataType type;
    size_t got_rank = 0;
    int64_t dims[8];
    float *data = NULL;
    if (failed(ort->GetTensorTypeAndShape(value, &info), name, why, n)) return NULL;
    int bad = failed(ort->GetTensorElementType(info, &type), name, why, n) ||
              failed(ort->GetDimensionsCount(info, &got_rank), name, why, n);
    if (!bad && (type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || got_rank != rank)) {
        snprintf(why, n, "output '%s': expected float32 of rank %zu, got element type %d of rank %zu", name, rank,
                 (int)type, got_rank);
        bad = 1;
    }
    if (!bad) bad = failed(ort->GetDimensions(info, dims, rank), name, why, n);
    for (size_t i = 0; !bad && i < rank; i++)
        if (dims[i] != shape[i]) {
            snprintf(why, n, "output '%s': expected axis %zu of size %lld, got %lld", name, i, (long long)shape[i],
                     (long long)dims[i]);
            bad = 1;
        }
    ort->ReleaseTensorTypeAndShapeInfo(info);
    if (!bad && failed(ort->GetTensorMutableData(value, (void **)&data), name, why, n)) bad = 1;
    return bad ? NULL : data;
}

/* x (B, T, d_in) -> out (B, T, H*d_out) in one call. */
static int run_plain(OrtSession *s, const MhaConfig *c, float *x, long long B, long long T, float *out, char *why,
                     size_t n) {
    int64_t shape[3] = {B, T, c->d_in}, want[3] = {B, T, c->num_heads * c->d_out};
    OrtValue *in = tensor(x, shape, 3, why, n), *result = NULL;
    const char *in_names[] = {"x"}, *out_names[] = {"context"};
    if (!in) return 1;
    int bad = failed(ort->Run(s, NULL, in_names, (const OrtValue *const *)&in, 1, out_names, 1, &result),
                     "ONNX Runtime run", why, n);
    float *y = bad ? NULL : output_data(result, "context", want, 3, why, n);
    if (y) memcpy(out, y, (size_t)(B * T * want[2]) * sizeof(float));
    ort->ReleaseValue(in);
    if (result) ort->ReleaseValue(result);
    return y == NULL;
}

/* The decode form: feed x in the (validated) schedule's chunks from an empty key/value cache, gather each
 * chunk's context. The schedule adds up to T, so every copy below stays inside x and out. */
static int run_decode(OrtSession *s, const MhaConfig *c, const float *x, long long B, long long T,
                      const long long *schedule, size_t chunks, float *out, char *why, size_t n) {
    long long H = c->num_heads, d = c->d_out, D = H * d, past = 0;
    float *key = NULL, *value = NULL, *chunk = NULL;
    const char *in_names[] = {"x", "past_key", "past_value"};
    const char *out_names[] = {"context", "present_key", "present_value"};
    int bad = 0;
    for (size_t i = 0; !bad && i < chunks; i++) {
        long long len = schedule[i];
        if (len < 1 || past + len > T) {  /* mha_case_parse refuses such schedules; never trust a caller */
            snprintf(why, n, "schedule: chunk %lld at token %lld passes tokens=%lld", len, past, T);
            bad = 1;
            break;
        }
        chunk = malloc((size_t)(B * len * c->d_in) * sizeof(float));
        if (!chunk) { snprintf(why, n, "out of memory"); bad = 1; break; }
        for (long long b = 0; b < B; b++)  /* x[:, past:past+len] as its own contiguous block */
            memcpy(chunk + b * len * c->d_in, x + (b * T + past) * c->d_in, (size_t)(len * c->d_in) * sizeof(float));
        int64_t xs[3] = {B, len, c->d_in}, cs[4] = {B, H, past, d};
        int64_t ctx_shape[3] = {B, len, D}, cache_shape[4] = {B, H, past + len, d};
        OrtValue *inputs[3] = {tensor(chunk, xs, 3, why, n), tensor(key, cs, 4, why, n), tensor(value, cs, 4, why, n)};
        OrtValue *outputs[3] = {NULL, NULL, NULL};
        bad = !inputs[0] || !inputs[1] || !inputs[2] ||
              failed(ort->Run(s, NULL, in_names, (const OrtValue *const *)inputs, 3, out_names, 3, outputs),
                     "ONNX Runtime run", why, n);
        float *ctx = bad ? NULL : output_data(outputs[0], "context", ctx_shape, 3, why, n);
        float *pk = ctx ? output_data(outputs[1], "present_key", cache_shape, 4, why, n) : NULL;
        float *pv = pk ? output_data(outputs[2], "present_value", cache_shape, 4, why, n) : NULL;
        if (!bad && !pv) bad = 1;
        if (!bad) {
            for (long long b = 0; b < B; b++)
                memcpy(out + (b * T + past) * D, ctx + b * len * D, (size_t)(len * D) * sizeof(float));
            past += len;
            size_t cache = (size_t)(B * H * past * d) * sizeof(float);
            free(key);
            free(value);
            key = malloc(cache ? cache : 1);
            value = malloc(cache ? cache : 1);
            if (!key || !value) { snprintf(why, n, "out of memory"); bad = 1; }
            else { memcpy(key, pk, cache); memcpy(value, pv, cache); }
        }
        for (int j = 0; j < 3; j++) {
            if (inputs[j]) ort->ReleaseValue(inputs[j]);
            if (outputs[j]) ort->ReleaseValue(outputs[j]);
        }
        free(chunk);
        chunk = NULL;
    }
    free(key);
    free(value);
    if (!bad && past != T) { snprintf(why, n, "schedule adds up to %lld, expected tokens=%lld", past, T); bad = 1; }
    return bad;
}

/* The in-place form (mha.decode-inplace.onnx): one key and one value buffer of (B, H, context_length, d_out),
 * zeroed, bound through IO binding as both past_key/past_value and present_key/present_value, so ONNX Runtime
 * writes each chunk's new rows into them; past_tokens (int32, B) says how many rows hold a past. Each chunk's
 * x and context are bound over two buffers sized for the longest chunk. */
static int run_decode_inplace(OrtSession *s, const MhaConfig *c, const float *x, long long B, long long T,
                              const long long *schedule, size_t chunks, float *out, char *why, size_t n) {
    long long H = c->num_heads, d = c->d_out, D = H * d, C = c->context_length, past = 0, longest = 0;
    for (size_t i = 0; i < chunks; i++) longest = schedule[i] > longest ? schedule[i] : longest;
    size_t cache;
    if (__builtin_mul_overflow((size_t)B, (size_t)(H * d), &cache) || __builtin_mul_overflow(cache, (size_t)C, &cache) ||
        cache > SIZE_MAX / sizeof(float)) {
        snprintf(why, n, "expected a key/value cache of batch * num_heads * context_length * d_out float32 values that "
                 "fits in memory, got batch=%lld", B);
        return 1;
    }
    float *key = calloc(cache, sizeof(float)), *value = calloc(cache, sizeof(float));
    float *chunk = malloc((size_t)(B * (longest ? longest : 1) * c->d_in) * sizeof(float));
    float *ctx = malloc((size_t)(B * (longest ? longest : 1) * D) * sizeof(float));
    int32_t *past_tokens = malloc((size_t)B * sizeof(int32_t));
    OrtIoBinding *bind = NULL;
    OrtValue *kv = NULL, *vv = NULL, *pv = NULL, *xv = NULL, *cv = NULL, **bound = NULL;
    OrtAllocator *alloc = NULL;
    size_t nbound = 0;
    int64_t cache_shape[4] = {B, H, C, d}, tokens_shape[1] = {B};
    int bad = 0;
    if (!key || !value || !chunk || !ctx || !past_tokens) { snprintf(why, n, "out of memory"); bad = 1; }
    if (!bad) {
        bad = !(kv = tensor(key, cache_shape, 4, why, n)) || !(vv = tensor(value, cache_shape, 4, why, n)) ||
              failed(ort->CreateTensorWithDataAsOrtValue(cpu, past_tokens, (size_t)B * sizeof(int32_t), tokens_shape,
                                                         1, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, &pv),
                     "past_tokens tensor", why, n) ||
              failed(ort->GetAllocatorWithDefaultOptions(&alloc), "allocator", why, n) ||
              failed(ort->CreateIoBinding(s, &bind), "IO binding", why, n) ||
              failed(ort->BindInput(bind, "past_key", kv), "bind past_key", why, n) ||
              failed(ort->BindInput(bind, "past_value", vv), "bind past_value", why, n) ||
              failed(ort->BindInput(bind, "past_tokens", pv), "bind past_tokens", why, n);
    }
    for (size_t i = 0; !bad && i < chunks; i++) {
        long long len = schedule[i];
        /* mha_case_parse refuses such schedules; never trust a caller */
        if (len < 1 || past + len > T || T > C) {
            snprintf(why, n, "schedule: chunk %lld at token %lld passes tokens=%lld", len, past, T);
            bad = 1;
            break;
        }
        if (past > 0 && len > 1 && B > 1) {
            snprintf(why, n, "schedule: a chunk of %lld tokens after a past of %lld needs batch 1 (ONNX Runtime's "
                     "GroupQueryAttention), got batch %lld: feed single tokens", len, past, B);
            bad = 1;
            break;
        }
        for (long long b = 0; b < B; b++) {  /* x[:, past:past+len] as its own contiguous block */
            memcpy(chunk + b * len * c->d_in, x + (b * T + past) * c->d_in, (size_t)(len * c->d_in) * sizeof(float));
            past_tokens[b] = (int32_t)past;
        }
        int64_t xs[3] = {B, len, c->d_in}, ctx_shape[3] = {B, len, D};
        bad = !(xv = tensor(chunk, xs, 3, why, n)) || !(cv = tensor(ctx, ctx_shape, 3, why, n)) ||
              failed(ort->BindInput(bind, "x", xv), "bind x", why, n) ||
              (ort->ClearBoundOutputs(bind), 0) ||  /* bound in this order, read back in this order */
              failed(ort->BindOutput(bind, "context", cv), "bind context", why, n) ||
              failed(ort->BindOutput(bind, "present_key", kv), "bind present_key", why, n) ||  /* = past_key */
              failed(ort->BindOutput(bind, "present_value", vv), "bind present_value", why, n) ||
              failed(ort->RunWithBinding(s, NULL, bind), "ONNX Runtime run", why, n) ||
              failed(ort->GetBoundOutputValues(bind, alloc, &bound, &nbound), "bound outputs", why, n);
        if (!bad && nbound != 3) {
            snprintf(why, n, "expected 3 bound outputs (context, present_key, present_value), got %zu", nbound);
            bad = 1;
        }
        /* the outputs in binding order: context, present_key, present_value; checked, then read in place */
        float *got = bad ? NULL : output_data(bound[0], "context", ctx_shape, 3, why, n);
        float *pk = got ? output_data(bound[1], "present_key", cache_shape, 4, why, n) : NULL;
        float *pvv = pk ? output_data(bound[2], "present_value", cache_shape, 4, why, n) : NULL;
        if (!bad && !pvv) bad = 1;
        if (!bad && (got != ctx || pk != key || pvv != value)) {
            snprintf(why, n, "IO binding: expected ONNX Runtime to write into the bound buffers, it returned others");
            bad = 1;
        }
        if (!bad) {
            for (long long b = 0; b < B; b++)
                memcpy(out + (b * T + past) * D, ctx + b * len * D, (size_t)(len * D) * sizeof(float));
            past += len;
        }
        for (size_t j = 0; bound && j < nbound; j++) ort->ReleaseValue(bound[j]);
        if (bound) alloc->Free(alloc, bound);
        bound = NULL;
        nbound = 0;
        if (xv) ort->ReleaseValue(xv);
        if (cv) ort->ReleaseValue(cv);
        xv = cv = NULL;
    }
    if (bind) ort->ReleaseIoBinding(bind);
    if (kv) ort->ReleaseValue(kv);
    if (vv) ort->ReleaseValue(vv);
    if (pv) ort->ReleaseValue(pv);
    free(key);
    free(value);
    free(chunk);
    free(ctx);
    free(past_tokens);
    if (!bad && past != T) { snprintf(why, n, "schedule adds up to %lld, expected tokens=%lld", past, T); bad = 1; }
    return bad;
}

/* golden/NAME read against the manifest, as count finite float32 values. */
static float *golden_floats(const MhaManifest *m, const char *dir, const char *name, size_t count, char *why,
                            size_t n) {
    char rel[300], path[4400];
    unsigned char *bytes;
    size_t len;
    float *values = NULL;
    snprintf(rel, sizeof rel, "golden/%s", name);
    if (mha_read_verified(m, dir, rel, &bytes, &len, why, n)) return NULL;
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    mha_floats(bytes, len, count, path, &values, why, n);
    free(bytes);
    return values;
}

typedef struct {
    char file[256];
    OrtSession *session;
    MhaConfig cfg;
    char error[1024];  /* why the model was refused, for each of its cases */
    int unloadable;    /* ... by ONNX Runtime itself (the JSON's not_loadable) */
} Loaded;

static void load(Loaded *l, const char *dir, const char *file, const MhaManifest *m) {
    if (strcmp(l->file, file) == 0) return;
    if (l->session) ort->ReleaseSession(l->session);
    l->session = NULL;
    l->error[0] = '\0';
    l->unloadable = 0;
    snprintf(l->file, sizeof l->file, "%s", file);
    unsigned char *bytes;
    size_t len;
    char path[4400];
    if (mha_read_verified(m, dir, file, &bytes, &len, l->error, sizeof l->error)) return;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    l->session = open_model(bytes, len, path, m, &l->cfg, &l->unloadable, l->error, sizeof l->error);
    free(bytes);
}

/* One (artifact, case) pair of cases.json: 1 passed, 0 failed (its line printed, and reported, either way). */
static int check_case(const char *dir, const MhaManifest *m, Loaded *l, const MhaCase *c, MhaReport *report) {
    char why[1024] = "";
    float *x = NULL, *want = NULL, *got = NULL;
    MhaCompare r = {0, 0, 0};
    load(l, dir, c->file, m);
    if (!l->session) {
        snprintf(why, sizeof why, "%s", l->error);
        if (l->unloadable) mha_report_not_loadable(report, l->error);
        else mha_report_artifact_error(report, l->error);
    }
    if (!why[0]) x = golden_floats(m, dir, c->input_bin, c->input_count, why, sizeof why);
    if (!why[0]) want = golden_floats(m, dir, c->output_bin, c->output_count, why, sizeof why);
    if (!why[0] && !(got = calloc(c->output_count ? c->output_count : 1, sizeof(float))))
        snprintf(why, sizeof why, "out of memory for %zu values", c->output_count);
    if (!why[0]) {
        if (c->schedule && c->inplace)
            run_decode_inplace(l->session, &l->cfg, x, c->batch, c->tokens, c->schedule, c->chunks, got, why, sizeof why);
        else if (c->schedule)
            run_decode(l->session, &l->cfg, x, c->batch, c->tokens, c->schedule, c->chunks, got, why, sizeof why);
        else run_plain(l->session, &l->cfg, x, c->batch, c->tokens, got, why, sizeof why);
    }
    if (!why[0]) r = mha_compare(got, want, c->output_count, c->atol, c->rtol, c->has_rel_l2, c->rel_l2);
    if (why[0])
        print_c("FAIL %-20s %-10s %s\n", c->file, c->name, why);
    else if (r.ok)
        print_c("ok   %-20s %-10s max_abs=%.3g rel_l2=%.3g\n", c->file, c->name, r.max_abs, r.rel_l2);
    else if (c->has_rel_l2)
        print_c("FAIL %-20s %-10s max_abs=%.3g rel_l2=%.3g atol=%g rel_l2<=%g\n", c->file, c->name, r.max_abs, r.rel_l2,
                c->atol, c->rel_l2);
    else
        print_c("FAIL %-20s %-10s max_abs=%.3g rel_l2=%.3g atol=%g\n", c->file, c->name, r.max_abs, r.rel_l2, c->atol);
    mha_report_case(report, c->name, why[0] ? NULL : &r, why[0] ? why : NULL);
    free(x);
    free(want);
    free(got);
    return !why[0] && r.ok;
}

/* The runtimes of cases.json this runner runs (TorchScript artifacts are the C++ runner's). */
static int ours(const char *runtime) {
    return strcmp(runtime, MHA_ONNX_RUNTIME) == 0 || strcmp(runtime, MHA_DECODE_RUNTIME) == 0 ||
           strcmp(runtime, MHA_DECODE_INPLACE_RUNTIME) == 0;
}

static int check_dir(const char *dir, const char *json_path) {
    MhaManifest m;
    char err[1024], path[4400];
    snprintf(path, sizeof path, "%s/golden/cases.json", dir);
    struct stat st;
    if (stat(path, &st) != 0) {
        char why[4500];
        snprintf(why, sizeof why, "%s: expected golden fixtures (made by `mha export`), found none", path);
        return stop(dir, json_path, why);
    }
    if (mha_manifest_load(dir, &m, err, sizeof err)) return stop(dir, json_path, err);
    unsigned char *bytes;
    size_t len;
    MhaCases doc;
    /* verified against the manifest's size and sha256 before a byte of it is parsed */
    int bad = mha_read_verified(&m, dir, "golden/cases.json", &bytes, &len, err, sizeof err);
    if (!bad) {
        bad = mha_cases_parse((const char *)bytes, len, path, &m.config, &doc, err, sizeof err);
        free(bytes);
    }
    if (bad) {
        mha_manifest_free(&m);
        return stop(dir, json_path, err);
    }
    int passed = 0, failures = 0;
    Loaded loaded = {"", NULL, {0, 0, 0, 0}, "", 0};
    MhaReport report;
    mha_report_init(&report, "c", dir);
    mha_report_version(&report, "onnxruntime", OrtGetApiBase()->GetVersionString());
    for (size_t a = 0; a < doc.nartifacts; a++)
        for (size_t i = 0; i < doc.ncases; i++) {
            MhaCase c;
            if (mha_case_get(&doc, a, i, &m.config, &c, err, sizeof err)) {
                if (!c.split) {  /* no usable file, runtime or name: whose it is cannot be told; every runner fails it */
                    char line[5500];
                    snprintf(line, sizeof line, "%s artifacts[%zu] cases[%zu]: %s", path, a, i, err);
                    print_c("FAIL %s\n", line);
                    mha_report_error(&report, line);
                    failures++;
                } else if (ours(c.runtime)) {
                    print_c("FAIL %-20s %-10s %s\n", c.file, c.name, err);
                    mha_report_artifact(&report, a, c.file, c.runtime);
                    mha_report_case(&report, c.name, NULL, err);
                    failures++;
                }  /* else another runner's artifact (TorchScript: the C++ runner's) */
                mha_case_free(&c);
                continue;
            }
            if (ours(c.runtime)) {
                mha_report_artifact(&report, a, c.file, c.runtime);
                check_case(dir, &m, &loaded, &c, &report) ? passed++ : failures++;
            }
            mha_case_free(&c);
        }
    mha_cases_free(&doc);
    if (loaded.session) ort->ReleaseSession(loaded.session);
    mha_manifest_free(&m);
    printf("%d passed, %d failed\n", passed, failures);
    if (passed + failures == 0) fprintf(stderr, "error: %s: no ONNX case found\n", path);
    int rc = finish(&report, passed, failures, json_path, err, sizeof err);
    mha_report_free(&report);
    return rc;
}

/* count floats to path as little-endian float32 (whatever the host), through a unique temporary file beside it
 * renamed into place. */
static int write_floats(const char *path, const float *y, size_t count, char *why, size_t n) {
    unsigned char *bytes = malloc(count ? count * 4 : 1);
    if (!bytes) { snprintf(why, n, "%s: out of memory", path); return 1; }
    for (size_t i = 0; i < count; i++) {
        uint32_t bits;
        memcpy(&bits, &y[i], 4);
        for (int b = 0; b < 4; b++) bytes[4 * i + (size_t)b] = (unsigned char)(bits >> (8 * b));
    }
    int bad = mha_write_atomically(path, bytes, count * 4, why, n) != MHA_OK;
    free(bytes);
    return bad;
}

static int run_one(char **argv) {
    const char *model = argv[2], *input = argv[3], *output = argv[6];
    char why[1024] = "", dir[4096];
    MhaManifest m;
    int have_manifest = 0;
    unsigned char *bytes = NULL;
    size_t len = 0;
    long long B, T;
    OrtSession *s = NULL;
    float *x = NULL, *y = NULL;
    const char *slash = strrchr(model, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - model) : 1, slash ? model : ".");
    if (slash == model) snprintf(dir, sizeof dir, "/");
    int rc = mha_manifest_load(dir, &m, why, sizeof why);
    if (rc == MHA_MISSING) {
        fprintf(stderr, "warning: unverified: no manifest.json beside %s; its sha256 and config are not checked\n", model);
        why[0] = '\0';
        rc = mha_read_file(model, &bytes, &len, why, sizeof why);
    } else if (rc == MHA_OK) {
        have_manifest = 1;
        rc = mha_read_verified(&m, dir, slash ? slash + 1 : model, &bytes, &len, why, sizeof why);
    }
    MhaConfig cfg;
    if (!rc && !(s = open_model(bytes, len, model, have_manifest ? &m : NULL, &cfg, NULL, why, sizeof why))) rc = 1;
    free(bytes);
    bytes = NULL;
    if (!rc && !arg_int(argv[4], 1, 1 << 20, &B)) {
        snprintf(why, sizeof why, "BATCH: expected an integer from 1 to %d, got '%.30s'", 1 << 20, argv[4]);
        rc = 1;
    }
    if (!rc && !arg_int(argv[5], 1, cfg.context_length, &T)) {
        snprintf(why, sizeof why, "TOKENS: expected 1 <= tokens <= context_length=%lld, got '%.30s'",
                 cfg.context_length, argv[5]);
        rc = 1;
    }
    size_t in_count = 0, out_count = 0;
    if (!rc) {
        size_t bt = (size_t)B * (size_t)T;  /* B <= 2^20, T <= 2^24: fits */
        if (__builtin_mul_overflow(bt, (size_t)cfg.d_in, &in_count) ||
            __builtin_mul_overflow(bt, (size_t)(cfg.num_heads * cfg.d_out), &out_count) || out_count > SIZE_MAX / 4) {
            snprintf(why, sizeof why, "BATCH * TOKENS: expected a size that fits in memory, got %lld * %lld", B, T);
            rc = 1;
        } else if (mha_read_file(input, &bytes, &len, why, sizeof why) || mha_floats(bytes, len, in_count, input, &x, why, sizeof why))
            rc = 1;
        free(bytes);
    }
    if (!rc && !(y = malloc(out_count * sizeof(float)))) { snprintf(why, sizeof why, "out of memory"); rc = 1; }
    if (!rc && run_plain(s, &cfg, x, B, T, y, why, sizeof why)) rc = 1;
    if (!rc && write_floats(output, y, out_count, why, sizeof why)) rc = 1;
    if (!rc) print_c("wrote %s [%lld, %lld, %lld]\n", output, B, T, cfg.num_heads * cfg.d_out);
    else fprintf(stderr, "error: %s\n", why);
    free(x);
    free(y);
    if (s) ort->ReleaseSession(s);
    if (have_manifest) mha_manifest_free(&m);
    return rc ? 1 : 0;
}

/* The digest of each file, as sha256sum prints it: what `check` compares with the manifest. */
static int sha256_files(int argc, char **argv) {
    int bad = 0;
    for (int i = 2; i < argc; i++) {
        unsigned char *bytes;
        size_t len;
        char why[1024], hex[65];
        if (mha_read_file(argv[i], &bytes, &len, why, sizeof why)) { fprintf(stderr, "error: %s\n", why); bad = 1; continue; }
        sha256_hex(bytes, len, hex);
        printf("%s  %s\n", hex, argv[i]);
        free(bytes);
    }
    return bad;
}

/* check ARTIFACT_DIR [--json FILE] (--json before or after the folder): 1 when the arguments are these. */
static int check_args(int argc, char **argv, const char **dir, const char **json_path) {
    *dir = *json_path = NULL;
    if (argc < 3 || strcmp(argv[1], "check") != 0) return 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0 && i + 1 < argc && !*json_path && argv[i + 1][0]) *json_path = argv[++i];
        else if (strncmp(argv[i], "--", 2) != 0 && !*dir) *dir = argv[i];
        else return 0;
    }
    return *dir != NULL;
}

int main(int argc, char **argv) {
    setlocale(LC_ALL, "");  /* as an embedding program would: nothing below may depend on LC_NUMERIC */
    if (argc >= 3 && strcmp(argv[1], "sha256") == 0) return sha256_files(argc, argv);
    const char *dir, *json_path;
    int check = check_args(argc, argv, &dir, &json_path), run = argc == 7 && strcmp(argv[1], "run") == 0;
    int generate = argc >= 2 && strcmp(argv[1], "generate") == 0;
    if (!check && !run && !generate) {
        fprintf(stderr, "usage: mha_check check ARTIFACT_DIR [--json FILE] | mha_check run MODEL.onnx IN.bin BATCH "
                        "TOKENS OUT.bin | mha_check sha256 FILE... | mha_check generate GPT_DIR --prompt-ids 1,2,3 "
                        "[--max-new-tokens N] [--temperature T] [--top-k K] [--seed S] [--no-eos] [--threads N] "
                        "[--json]\n");
        return 2;
    }
    ort = OrtGetApiBase()->GetApi(ORT_API_VERSION);
    if (!ort) { fprintf(stderr, "error: libonnxruntime does not offer C API version %d\n", ORT_API_VERSION); return 1; }
    char why[1024];
    if (failed(ort->CreateEnv(ORT_LOGGING_LEVEL_FATAL, "mha_check", &env), "environment", why, sizeof why) ||
        failed(ort->CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &cpu), "memory info", why, sizeof why)) {
        fprintf(stderr, "error: %s\n", why);
        return 1;
    }
    int rc = generate ? mha_gpt_generate(argc, argv)
             : check && mha_is_gpt_folder(dir) ? mha_gpt_check(dir, json_path)  /* golden generations */
             : check ? check_dir(dir, json_path) : run_one(argv);
    ort->ReleaseMemoryInfo(cpu);
    ort->ReleaseEnv(env);
    return rc;
}
