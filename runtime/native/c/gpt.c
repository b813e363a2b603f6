/* See gpt.h. */
#define _POSIX_C_SOURCE 200809L
#include "gpt.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "json.h"
#include "report.h"

#define MAX_GPT_MANIFEST ((size_t)4 << 20)         /* the Python reader's bound */
#define MAX_GENERATIONS_FILE ((size_t)16 << 20)
#define MAX_CASES 10000
#define MAX_NEW_TOKENS_ARG 1000000
#define ARTIFACT_RUNTIME "onnxruntime-decode-inplace"  /* the JSON's artifact "runtime": IO binding, in place */

static const OrtApi *ort;
static OrtEnv *env;
static OrtMemoryInfo *cpu;

/* snprintf into a message buffer: a message cut short is still one line (what the messages are for). */
static void say(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *buf, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
}

/* ORT's message for a failed call, as one line in why; 1 when the call failed. */
static int failed(OrtStatus *status, const char *what, char *why, size_t n) {
    if (status == NULL) return 0;
    const char *msg = ort->GetErrorMessage(status);
    size_t len = strcspn(msg, "\n");
    say(why, n, "%s: %.*s", what, (int)(len > 300 ? 300 : len), msg);
    ort->ReleaseStatus(status);
    return 1;
}

/* printf with the "C" locale's '.' whatever setlocale chose: the lines are parsed by other programs. */
static void print_c(FILE *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void print_c(FILE *out, const char *fmt, ...) {
    char line[8192];
    va_list ap;
    va_start(ap, fmt);
    int w = json_vsnprintf_c(line, sizeof line, fmt, ap);
    va_end(ap);
    if (w < 0) { fputs("error: cannot format a line in the \"C\" locale\n", out); return; }
    fputs(line, out);
    if ((size_t)w >= sizeof line) fputc('\n', out);  /* cut short: still one line */
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* --- the manifest ------------------------------------------------------------------------------------------ */

/* obj[key] an integer in lo..hi. */
static int int_field(const JsonValue *obj, const char *key, long long lo, long long hi, const char *where,
                     long long *out, char *err, size_t n) {
    const JsonValue *v = json_get(obj, key);
    if (!v || v->type != JSON_NUMBER || !v->is_integer || v->integer < lo || v->integer > hi) {
        if (v && v->type == JSON_NUMBER)
            say(err, n, "%s: expected '%s' an integer from %lld to %lld, got %.17g", where, key, lo, hi, v->number);
        else
            say(err, n, "%s: expected '%s' an integer from %lld to %lld, got %s", where, key, lo, hi,
                     v ? json_type_name(v) : "nothing");
        return MHA_ERROR;
    }
    *out = v->integer;
    return MHA_OK;
}

static int gpt_config_from(const JsonValue *c, const char *where, MhaGptConfig *cfg, char *err, size_t n) {
    if (!c || c->type != JSON_OBJECT) {
        say(err, n, "%s: expected a config object, got %s", where, json_type_name(c));
        return MHA_ERROR;
    }
    if (int_field(c, "vocab_size", 1, MHA_GPT_MAX_VOCAB, where, &cfg->vocab_size, err, n) ||
        int_field(c, "context_length", 1, MHA_GPT_MAX_CONTEXT, where, &cfg->context_length, err, n) ||
        int_field(c, "emb_dim", 1, MHA_GPT_MAX_EMB, where, &cfg->emb_dim, err, n) ||
        int_field(c, "n_heads", 1, MHA_GPT_MAX_HEADS, where, &cfg->n_heads, err, n) ||
        int_field(c, "n_layers", 1, MHA_GPT_MAX_LAYERS, where, &cfg->n_layers, err, n))
        return MHA_ERROR;
    if (cfg->emb_dim % cfg->n_heads) {
        say(err, n, "%s: emb_dim %lld is not divisible by n_heads %lld", where, cfg->emb_dim, cfg->n_heads);
        return MHA_ERROR;
    }
    return MHA_OK;
}

/* The manifest's text (bounded), or MHA_MISSING. */
static int read_manifest_text(const char *dir, char *path, size_t path_size, unsigned char **text, size_t *len,
                              char *err, size_t n) {
    *text = NULL;
    if (mha_join(path, path_size, dir, "manifest.json", err, n)) return MHA_ERROR;
    struct stat st;
    if (stat(path, &st) != 0 && errno == ENOENT) {
        say(err, n, "%s: expected a manifest (made by `mha export --gpt`), found none", path);
        return MHA_MISSING;
    }
    if (mha_read_file(path, text, len, err, n)) return MHA_ERROR;
    if (*len > MAX_GPT_MANIFEST) {
        say(err, n, "%s: expected a manifest of at most %zu bytes, got %zu", path, MAX_GPT_MANIFEST, *len);
        free(*text);
        *text = NULL;
        return MHA_ERROR;
    }
    return MHA_OK;
}

int mha_is_gpt_folder(const char *dir) {
    char path[4096], err[512];
    unsigned char *text;
    size_t len;
    if (read_manifest_text(dir, path, sizeof path, &text, &len, err, sizeof err)) return 0;
    JsonValue *root = json_parse((const char *)text, len, err, sizeof err);
    free(text);
    const JsonValue *kind = json_get(root, "kind");
    int gpt = kind && kind->type == JSON_STRING && strcmp(kind->str, MHA_GPT_KIND) == 0;
    json_free(root);
    return gpt;
}

int mha_gpt_manifest_load(const char *dir, MhaGptManifest *m, char *err, size_t n) {
    memset(m, 0, sizeof *m);
    m->eos_id = -1;
    char path[4096];
    unsigned char *text;
    size_t len;
    int rc = read_manifest_text(dir, path, sizeof path, &text, &len, err, n);
    if (rc) return rc;
    snprintf(m->files.path, sizeof m->files.path, "%s", path);
    char why[256], at[4200];
    JsonValue *root = json_parse((const char *)text, len, why, sizeof why);
    free(text);
    if (!root) {
        say(err, n, "%s: expected JSON, got a parse error (%s)", path, why);
        return MHA_ERROR;
    }
    rc = MHA_ERROR;
    const JsonValue *kind = json_get(root, "kind"), *format = json_get(root, "format");
    if (root->type != JSON_OBJECT || !kind || kind->type != JSON_STRING || strcmp(kind->str, MHA_GPT_KIND) != 0 ||
        !format || format->type != JSON_NUMBER || !format->is_integer || format->integer != MHA_GPT_FORMAT) {
        say(err, n, "%s: expected a GPT manifest (kind \"%s\", format %d) (export GPT folders with `mha export "
                 "--gpt`)", path, MHA_GPT_KIND, MHA_GPT_FORMAT);
        goto done;
    }
    snprintf(at, sizeof at, "%s: config", path);
    if (gpt_config_from(json_get(root, "config"), at, &m->config, err, n)) goto done;
    const JsonValue *eos = json_get(root, "eos_id");
    if (eos && eos->type != JSON_NULL) {
        if (int_field(root, "eos_id", 0, m->config.vocab_size - 1, path, &m->eos_id, err, n)) goto done;
    }
    const JsonValue *artifacts = json_get(root, "artifacts");
    if (!artifacts || artifacts->type != JSON_OBJECT || !json_get(artifacts, MHA_GPT_INPLACE)) {
        say(err, n, "%s: expected %s among the manifest's artifacts (export with the 'inplace' variant), found "
                 "none", path, MHA_GPT_INPLACE);
        goto done;
    }
    const JsonValue *contract = json_get(json_get(root, "contract"), "inplace");
    const JsonValue *file = json_get(contract, "file");
    if (!contract || contract->type != JSON_OBJECT || !file || file->type != JSON_STRING ||
        strcmp(file->str, MHA_GPT_INPLACE) != 0) {
        say(err, n, "%s: expected contract.inplace.file \"%s\"", path, MHA_GPT_INPLACE);
        goto done;
    }
    m->nforms = 1;
    snprintf(m->forms[0], sizeof m->forms[0], "%s", MHA_GPT_INPLACE);
    snprintf(m->generations[0], sizeof m->generations[0], "%s", MHA_GPT_GENERATIONS);
    static const char *const lossy[] = {"gpt.inplace.int8.onnx", "gpt.inplace.int4.onnx"};
    for (size_t i = 0; i < sizeof lossy / sizeof *lossy; i++) {
        const JsonValue *entry = json_get(artifacts, lossy[i]);
        if (!entry) continue;
        const JsonValue *gen = json_get(entry, "generations");
        if (!gen || gen->type != JSON_STRING || gen->str_len == 0 || gen->str_len >= sizeof m->generations[0] ||
            strlen(gen->str) != gen->str_len || !mha_plain_name(gen->str)) {
            say(err, n, "%s: artifacts.%s: expected 'generations' the file name of its own golden generations",
                path, lossy[i]);
            goto done;
        }
        snprintf(m->forms[m->nforms], sizeof m->forms[0], "%s", lossy[i]);
        snprintf(m->generations[m->nforms], sizeof m->generations[0], "%s", gen->str);
        m->nforms++;
    }
    if (mha_manifest_files(json_get(root, "files"), path, &m->files, err, n)) goto done;
    rc = MHA_OK;
done:
    json_free(root);
    if (rc != MHA_OK) mha_gpt_manifest_free(m);
    return rc;
}

void mha_gpt_manifest_free(MhaGptManifest *m) { mha_manifest_free(&m->files); }

/* --- numpy's PCG64 and SeedSequence ----------------------------------------------------------------------- */

#define SS_INIT_A 0x43b0d7e5u
#define SS_MULT_A 0x931e8875u
#define SS_INIT_B 0x8b51f9ddu
#define SS_MULT_B 0x58f38dedu
#define SS_MIX_MULT_L 0xca01f9ddu
#define SS_MIX_MULT_R 0x4973f715u
#define SS_XSHIFT 16
#define SS_POOL 4

static uint32_t ss_hashmix(uint32_t value, uint32_t *hash_const) {
    value ^= *hash_const;
    *hash_const *= SS_MULT_A;
    value *= *hash_const;
    value ^= value >> SS_XSHIFT;
    return value;
}

static uint32_t ss_mix(uint32_t x, uint32_t y) {
    uint32_t result = SS_MIX_MULT_L * x - SS_MIX_MULT_R * y;
    return result ^ (result >> SS_XSHIFT);
}

void mha_pcg64_seed(MhaPcg64 *rng, uint64_t seed) {
    /* SeedSequence(seed): the entropy as 32-bit words, least significant first ([0] for 0) */
    uint32_t entropy[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    size_t words = seed >> 32 ? 2 : 1;
    uint32_t pool[SS_POOL], hash_const = SS_INIT_A;
    for (size_t i = 0; i < SS_POOL; i++) pool[i] = ss_hashmix(i < words ? entropy[i] : 0, &hash_const);
    for (size_t src = 0; src < SS_POOL; src++)
        for (size_t dst = 0; dst < SS_POOL; dst++)
            if (src != dst) pool[dst] = ss_mix(pool[dst], ss_hashmix(pool[src], &hash_const));
    /* generate_state(4, uint64): 8 words cycling the pool, paired little-endian */
    uint32_t state32[8];
    hash_const = SS_INIT_B;
    for (size_t i = 0; i < 8; i++) {
        uint32_t v = pool[i % SS_POOL];
        v ^= hash_const;
        hash_const *= SS_MULT_B;
        v *= hash_const;
        v ^= v >> SS_XSHIFT;
        state32[i] = v;
    }
    uint64_t val[4];
    for (size_t i = 0; i < 4; i++) val[i] = (uint64_t)state32[2 * i] | (uint64_t)state32[2 * i + 1] << 32;
    /* pcg64_set_seed(val[0:2], val[2:4]): pcg_setseq_128_srandom_r */
    unsigned __int128 init = (unsigned __int128)val[0] << 64 | val[1], seq = (unsigned __int128)val[2] << 64 | val[3];
    rng->state = 0;
    rng->inc = seq << 1 | 1;
    mha_pcg64_next(rng);
    rng->state += init;
    mha_pcg64_next(rng);
}

uint64_t mha_pcg64_next(MhaPcg64 *rng) {
    const unsigned __int128 mult = (unsigned __int128)0x2360ED051FC65DA4ULL << 64 | 0x4385DF649FCCF645ULL;
    rng->state = rng->state * mult + rng->inc;
    uint64_t value = (uint64_t)(rng->state >> 64) ^ (uint64_t)rng->state;
    unsigned rot = (unsigned)(rng->state >> 122);
    return (value >> rot) | (value << ((64 - rot) & 63));
}

double mha_pcg64_random(MhaPcg64 *rng) { return (double)(mha_pcg64_next(rng) >> 11) * (1.0 / 9007199254740992.0); }

/* --- the sampling rule ------------------------------------------------------------------------------------ */

size_t mha_gpt_scratch_bytes(long long vocab) { return (size_t)vocab * (2 * sizeof(float) + sizeof(double)); }

/* numpy's float32 add.reduce over a contiguous row (pairwise, blocks of 128, 8 accumulators). */
static float pairwise_sum(const float *a, size_t n) {
    if (n < 8) {
        float res = -0.0f;
        for (size_t i = 0; i < n; i++) res += a[i];
        return res;
    }
    if (n <= 128) {
        float r[8];
        for (int j = 0; j < 8; j++) r[j] = a[j];
        size_t i;
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + (size_t)j];
        float res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    size_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

/* The k-th largest of a[0:n] (1 <= k <= n), reordering a (quickselect). */
static float kth_largest(float *a, long n, long k) {
    long lo = 0, hi = n - 1, t = k - 1;
    while (lo < hi) {
        float p = a[lo + (hi - lo) / 2];
        long i = lo, j = hi;
        while (i <= j) {
            while (a[i] > p) i++;
            while (a[j] < p) j--;
            if (i <= j) {
                float tmp = a[i];
                a[i++] = a[j];
                a[j--] = tmp;
            }
        }
        if (t <= j) hi = j;
        else if (t >= i) lo = i;
        else break;
    }
    return a[t];
}

long long mha_gpt_next_id(const float *logits, long long vocab, double temperature, long long top_k, MhaPcg64 *rng,
                          void *scratch) {
    size_t V = (size_t)vocab;
    if (temperature == 0.0) {  /* argmax of the top-k filtered logits is the first maximum of them all */
        size_t best = 0;
        for (size_t i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        return (long long)best;
    }
    float *x = scratch, *work = x + V;
    double *cdf = (double *)(void *)(work + V);
    float kth = -INFINITY;
    if (top_k > 0 && top_k < vocab) {
        memcpy(work, logits, V * sizeof(float));
        kth = kth_largest(work, (long)V, (long)top_k);
    }
    float t = (float)temperature, top = -INFINITY;
    for (size_t i = 0; i < V; i++) {
        x[i] = logits[i] < kth ? -INFINITY : logits[i] / t;
        if (x[i] > top) top = x[i];
    }
    for (size_t i = 0; i < V; i++) x[i] = expf(x[i] - top);
    float total = pairwise_sum(x, V);
    double acc = 0;
    for (size_t i = 0; i < V; i++) {
        acc += (double)(x[i] / total);
        cdf[i] = acc;
    }
    double target = mha_pcg64_random(rng) * cdf[V - 1];
    size_t lo = 0, hi = V;  /* searchsorted(cdf, target, side="right"): the first cdf[i] > target */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cdf[mid] <= target) lo = mid + 1;
        else hi = mid;
    }
    return (long long)(lo < V ? lo : V - 1);
}

/* --- the in-place decoder through IO binding -------------------------------------------------------------- */

typedef struct {
    OrtSession *session;
    OrtIoBinding *bind;
    MhaGptConfig cfg;
    size_t nbuf;          /* 2 * n_layers: key 0, value 0, key 1, ... */
    float **buf;          /* each [1, H, C, D], bound as past_key_values.{i}.* and present.{i}.* */
    OrtValue **bufv;
    size_t cache_count;   /* H * C * D */
    float *logits;        /* [1, V], bound as next_token_logits */
    OrtValue *logits_v;
    int64_t *ids;         /* [1, T] for T <= C */
    OrtValue *ids_v;
    int32_t past_tokens;
    OrtValue *past_v;
    int checked;          /* the first run's bound outputs were checked to be our buffers */
} GptRun;

typedef struct { char name[64]; ONNXTensorElementDataType type; size_t rank; int64_t dims[4]; } Port;

/* The contract's inputs (out = 0) or outputs (out = 1) of gpt.inplace.onnx: -1 for a symbolic axis. */
static size_t contract_ports(const MhaGptConfig *c, int out, Port *ports) {
    size_t k = 0;
    int64_t H = c->n_heads, C = c->context_length, D = c->emb_dim / c->n_heads;
    if (!out) {
        ports[k++] = (Port){"input_ids", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, 2, {-1, -1, 0, 0}};
        ports[k++] = (Port){"past_tokens", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, 1, {-1, 0, 0, 0}};
    } else {
        ports[k++] = (Port){"next_token_logits", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, 2, {-1, c->vocab_size, 0, 0}};
    }
    for (long long i = 0; i < c->n_layers; i++)
        for (int v = 0; v < 2; v++) {
            Port *p = &ports[k++];
            snprintf(p->name, sizeof p->name, out ? "present.%lld.%s" : "past_key_values.%lld.%s", i, v ? "value" : "key");
            p->type = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
            p->rank = 4;
            p->dims[0] = -1;
            p->dims[1] = H;
            p->dims[2] = C;
            p->dims[3] = D;
        }
    return k;
}

/* Every input and output of the session is the contract's: the same names, element types, ranks and fixed axes. */
static int check_contract(OrtSession *s, const MhaGptConfig *c, const char *path, char *why, size_t n) {
    size_t most = 2 + 2 * (size_t)c->n_layers;
    Port *ports = calloc(most, sizeof *ports);
    OrtAllocator *alloc = NULL;
    if (!ports) { say(why, n, "out of memory"); return 1; }
    int bad = failed(ort->GetAllocatorWithDefaultOptions(&alloc), "allocator", why, n);
    for (int out = 0; !bad && out < 2; out++) {
        size_t want = contract_ports(c, out, ports), count = 0;
        bad = failed(out ? ort->SessionGetOutputCount(s, &count) : ort->SessionGetInputCount(s, &count), path, why, n);
        if (!bad && count != want) {
            say(why, n, "%s: expected the in-place GPT contract's %zu %s (n_layers=%lld), the model has %zu", path,
                     want, out ? "outputs" : "inputs", c->n_layers, count);
            bad = 1;
        }
        for (size_t i = 0; !bad && i < count; i++) {
            char *name = NULL;
            OrtTypeInfo *info = NULL;
            const OrtTensorTypeAndShapeInfo *tensor = NULL;
            bad = failed(out ? ort->SessionGetOutputName(s, i, alloc, &name) : ort->SessionGetInputName(s, i, alloc, &name),
                         path, why, n) ||
                  failed(out ? ort->SessionGetOutputTypeInfo(s, i, &info) : ort->SessionGetInputTypeInfo(s, i, &info),
                         path, why, n) ||
                  failed(ort->CastTypeInfoToTensorInfo(info, &tensor), path, why, n);
            const Port *p = NULL;
            for (size_t j = 0; !bad && j < want && !p; j++)
                if (strcmp(ports[j].name, name) == 0) p = &ports[j];
            if (!bad && !p) {
                say(why, n, "%s: %s '%.80s' is not in the in-place GPT contract (gpt/contract.py)", path,
                         out ? "output" : "input", name);
                bad = 1;
            }
            ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
            size_t rank = 0;
            int64_t dims[4] = {0, 0, 0, 0};
            if (!bad && !tensor) {
                say(why, n, "%s: '%s' is not a tensor", path, p->name);
                bad = 1;
            }
            if (!bad) bad = failed(ort->GetTensorElementType(tensor, &type), path, why, n) ||
                            failed(ort->GetDimensionsCount(tensor, &rank), path, why, n);
            if (!bad && (type != p->type || rank != p->rank)) {
                say(why, n, "%s: '%s': expected element type %d of rank %zu, got type %d of rank %zu", path, p->name,
                         (int)p->type, p->rank, (int)type, rank);
                bad = 1;
            }
            if (!bad) bad = failed(ort->GetDimensions(tensor, dims, rank), path, why, n);
            for (size_t a = 0; !bad && a < rank; a++)
                if (p->dims[a] >= 0 && dims[a] >= 0 && dims[a] != p->dims[a]) {
                    say(why, n, "%s: '%s': expected axis %zu of size %lld (the manifest's config), got %lld", path,
                             p->name, a, (long long)p->dims[a], (long long)dims[a]);
                    bad = 1;
                }
            if (info) ort->ReleaseTypeInfo(info);
            if (name) alloc->Free(alloc, name);
        }
    }
    free(ports);
    return bad;
}

/* The model's "mha_export.gpt_config" metadata equals the manifest's config; "mha_export.gpt_contract" is
 * "inplace". */
static int check_metadata(OrtSession *s, const MhaGptConfig *c, const char *path, char *why, size_t n) {
    OrtModelMetadata *meta = NULL;
    OrtAllocator *alloc = NULL;
    char *config = NULL, *contract = NULL, what[4200];
    say(what, sizeof what, "%s: metadata", path);
    int bad = failed(ort->GetAllocatorWithDefaultOptions(&alloc), what, why, n) ||
              failed(ort->SessionGetModelMetadata(s, &meta), what, why, n) ||
              failed(ort->ModelMetadataLookupCustomMetadataMap(meta, alloc, "mha_export.gpt_config", &config), what,
                     why, n) ||
              failed(ort->ModelMetadataLookupCustomMetadataMap(meta, alloc, "mha_export.gpt_contract", &contract), what,
                     why, n);
    if (!bad && (!config || !contract || strcmp(contract, "inplace") != 0)) {
        say(why, n, "%s: expected metadata 'mha_export.gpt_config' and 'mha_export.gpt_contract' \"inplace\", got "
                 "%s", path, !config ? "no config" : !contract ? "no contract" : "another contract");
        bad = 1;
    }
    if (!bad) {
        char err[512];
        JsonValue *root = json_parse(config, strlen(config), err, sizeof err);
        MhaGptConfig own;
        say(what, sizeof what, "%s: metadata 'mha_export.gpt_config'", path);
        if (!root) {
            say(why, n, "%s: expected JSON (%s)", what, err);
            bad = 1;
        } else if (gpt_config_from(root, what, &own, why, n)) {
            bad = 1;
        } else if (memcmp(&own, c, sizeof own) != 0) {
            say(why, n, "%s says vocab_size=%lld context_length=%lld emb_dim=%lld n_heads=%lld n_layers=%lld, the "
                     "manifest says %lld %lld %lld %lld %lld; the model does not belong to this folder", what,
                     own.vocab_size, own.context_length, own.emb_dim, own.n_heads, own.n_layers, c->vocab_size,
                     c->context_length, c->emb_dim, c->n_heads, c->n_layers);
            bad = 1;
        }
        json_free(root);
    }
    if (config) alloc->Free(alloc, config);
    if (contract) alloc->Free(alloc, contract);
    if (meta) ort->ReleaseModelMetadata(meta);
    return bad;
}

static void run_close(GptRun *r) {
    if (r->bind) ort->ReleaseIoBinding(r->bind);
    for (size_t i = 0; r->bufv && i < r->nbuf; i++)
        if (r->bufv[i]) ort->ReleaseValue(r->bufv[i]);
    for (size_t i = 0; r->buf && i < r->nbuf; i++) free(r->buf[i]);
    free(r->buf);
    free(r->bufv);
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
static int run_open(GptRun *r, const unsigned char *bytes, size_t len, const char *path, const MhaGptConfig *cfg,
                    long long threads, char *why, size_t n) {
    memset(r, 0, sizeof *r);
    r->cfg = *cfg;
    OrtSessionOptions *opts = NULL;
    char what[4200];
    say(what, sizeof what, "%s: ONNX Runtime cannot load it", path);
    int bad = failed(ort->CreateSessionOptions(&opts), what, why, n) ||
              (threads > 0 && failed(ort->SetIntraOpNumThreads(opts, (int)threads), what, why, n)) ||
              failed(ort->CreateSessionFromArray(env, bytes, len, opts, &r->session), what, why, n);
    if (opts) ort->ReleaseSessionOptions(opts);
    if (!bad) bad = check_metadata(r->session, cfg, path, why, n) || check_contract(r->session, cfg, path, why, n);
    if (bad) { run_close(r); return 1; }
    long long H = cfg->n_heads, C = cfg->context_length, D = cfg->emb_dim / cfg->n_heads;
    r->nbuf = 2 * (size_t)cfg->n_layers;
    r->cache_count = (size_t)(H * C * D);  /* <= 256 * 4096 * 65536: fits */
    r->buf = calloc(r->nbuf, sizeof *r->buf);
    r->bufv = calloc(r->nbuf, sizeof *r->bufv);
    r->logits = calloc((size_t)cfg->vocab_size, sizeof(float));
    r->ids = calloc((size_t)C, sizeof(int64_t));
    if (!r->buf || !r->bufv || !r->logits || !r->ids) { say(why, n, "out of memory"); run_close(r); return 1; }
    int64_t cache_shape[4] = {1, H, C, D}, logits_shape[2] = {1, cfg->vocab_size}, past_shape[1] = {1};
    bad = failed(ort->CreateIoBinding(r->session, &r->bind), "IO binding", why, n);
    for (size_t i = 0; !bad && i < r->nbuf; i++) {
        char past[64], present[64];
        snprintf(past, sizeof past, "past_key_values.%zu.%s", i / 2, i % 2 ? "value" : "key");
        snprintf(present, sizeof present, "present.%zu.%s", i / 2, i % 2 ? "value" : "key");
        if (!(r->buf[i] = calloc(r->cache_count, sizeof(float)))) { say(why, n, "out of memory for the cache"); bad = 1; break; }
        /* one OrtValue over one buffer, bound as both: ONNX Runtime writes the new rows into it in place */
        bad = !(r->bufv[i] = float_tensor(r->buf[i], cache_shape, 4, r->cache_count, "cache tensor", why, n)) ||
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

typedef struct {
    long long max_new, top_k, eos;  /* top_k 0: none; eos -1: none */
    double temperature;
    uint64_t seed;
} Request;

typedef struct {
    int64_t *ids;
    long long count;
    const char *stop;  /* "max_new_tokens" | "eos" */
    double ttft, seconds;
} Result;

/* Prefill the prompt, then one token per step until max_new (or eos). first (when given) gets the prefill's
 * logits. out->ids holds max_new ids. */
static int generate_ids(GptRun *r, const int64_t *prompt, long long T, const Request *q, void *scratch, float *first,
                        Result *out, char *why, size_t n) {
    MhaPcg64 rng;
    mha_pcg64_seed(&rng, q->seed);
    out->count = 0;
    out->stop = "max_new_tokens";
    for (size_t i = 0; i < r->nbuf; i++) memset(r->buf[i], 0, r->cache_count * sizeof(float));
    double start = now_s();
    if (run_forward(r, prompt, T, 0, why, n)) return 1;
    if (first) memcpy(first, r->logits, (size_t)r->cfg.vocab_size * sizeof(float));
    for (;;) {
        int64_t token = mha_gpt_next_id(r->logits, r->cfg.vocab_size, q->temperature, q->top_k, &rng, scratch);
        if (out->count == 0) out->ttft = now_s() - start;
        if (q->eos >= 0 && token == q->eos) { out->stop = "eos"; break; }
        out->ids[out->count++] = token;
        if (out->count >= q->max_new) break;
        if (run_forward(r, &token, 1, T + out->count - 1, why, n)) return 1;
    }
    out->seconds = now_s() - start;
    return 0;
}

/* DIR/FORM (gpt.inplace.onnx or a lossy form of it), verified against the manifest, opened and bound. */
static int open_verified(GptRun *r, const MhaGptManifest *m, const char *dir, const char *form, long long threads,
                         char *why, size_t n) {
    unsigned char *bytes;
    size_t len;
    char path[4400];
    if (mha_read_verified(&m->files, dir, form, &bytes, &len, why, n)) return 1;
    say(path, sizeof path, "%s/%s", dir, form);
    int bad = run_open(r, bytes, len, path, &m->config, threads, why, n);
    free(bytes);
    return bad;
}

/* --- generate --------------------------------------------------------------------------------------------- */

/* A whole decimal integer in [lo, hi]. */
static int arg_int(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    if (!*s || !(*s == '-' || (*s >= '0' && *s <= '9'))) return 0;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

/* A JSON number (read in the "C" locale, whatever setlocale chose). */
static int arg_number(const char *s, double *out) {
    char err[128];
    JsonValue *v = json_parse(s, strlen(s), err, sizeof err);
    int ok = v && v->type == JSON_NUMBER;
    if (ok) *out = v->number;
    json_free(v);
    return ok;
}

/* "1,2,3" -> ids (at most cap of them; *count set); 0 with one line in why. */
static int parse_ids(const char *text, int64_t *ids, size_t cap, size_t *count, char *why, size_t n) {
    *count = 0;
    const char *p = text;
    if (!*p) { say(why, n, "--prompt-ids: expected comma-separated token ids, got an empty prompt"); return 0; }
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char piece[32];
        while (len && (*p == ' ' || *p == '\t')) { p++; len--; }
        while (len && (p[len - 1] == ' ' || p[len - 1] == '\t')) len--;
        long long v;
        if (len == 0 || len >= sizeof piece) {
            say(why, n, "--prompt-ids: expected comma-separated integers, got '%.*s'", (int)(len > 30 ? 30 : len), p);
            return 0;
        }
        memcpy(piece, p, len);
        piece[len] = '\0';
        if (!arg_int(piece, -(1LL << 62), 1LL << 62, &v)) {
            say(why, n, "--prompt-ids: expected comma-separated integers, got '%s'", piece);
            return 0;
        }
        if (*count == cap) {
            say(why, n, "prompt: more than %zu tokens, longer than context_length %zu", cap - 1, cap - 1);
            return 0;
        }
        ids[(*count)++] = v;
        if (!comma) return 1;
        p = comma + 1;
    }
}

static void put_ids(char *buf, size_t size, const int64_t *ids, long long count) {
    size_t used = 0;
    buf[0] = '\0';
    for (long long i = 0; i < count && used < size; i++) {
        int w = snprintf(buf + used, size - used, "%s%lld", i ? "," : "", (long long)ids[i]);
        if (w < 0) break;
        used += (size_t)w;
    }
}

int mha_gpt_generate(const OrtApi *api, OrtEnv *e, OrtMemoryInfo *mem, int argc, char **argv) {
    ort = api;
    env = e;
    cpu = mem;
    const char *dir = NULL, *ids_text = NULL;
    long long max_new = 32, top_k = 0, seed = -1, threads = 0, warmup = 0;
    double temperature = 0.0;
    int as_json = 0, eos = 1;
    char why[2048] = "";
    for (int i = 2; i < argc && !why[0]; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = strcmp(a, "--prompt-ids") == 0 || strcmp(a, "--max-new-tokens") == 0 ||
                    strcmp(a, "--temperature") == 0 || strcmp(a, "--top-k") == 0 || strcmp(a, "--seed") == 0 ||
                    strcmp(a, "--threads") == 0 || strcmp(a, "--warmup") == 0;
        if (takes && !v) say(why, sizeof why, "%s: expected a value after it", a);
        else if (strcmp(a, "--prompt-ids") == 0) { if (ids_text) say(why, sizeof why, "--prompt-ids: given twice (the C runner runs one prompt)"); ids_text = v; i++; }
        else if (strcmp(a, "--max-new-tokens") == 0) {
            if (!arg_int(v, 1, MAX_NEW_TOKENS_ARG, &max_new))
                say(why, sizeof why, "--max-new-tokens: expected an integer >= 1, got '%.40s'", v);
            i++;
        } else if (strcmp(a, "--temperature") == 0) {
            if (!arg_number(v, &temperature) || !mha_gpt_temperature_ok(temperature))
                say(why, sizeof why, "--temperature: expected " MHA_GPT_TEMPERATURE_RULE ", got '%.40s'", v);
            i++;
        } else if (strcmp(a, "--top-k") == 0) {
            if (!arg_int(v, 1, MHA_GPT_MAX_VOCAB, &top_k))
                say(why, sizeof why, "--top-k: expected an integer >= 1, got '%.40s'", v);
            i++;
        } else if (strcmp(a, "--seed") == 0) {
            if (!arg_int(v, 0, 0x7fffffffffffffffLL, &seed))
                say(why, sizeof why, "--seed: expected an integer >= 0, got '%.40s'", v);
            i++;
        } else if (strcmp(a, "--threads") == 0) {
            if (!arg_int(v, 1, 1024, &threads))
                say(why, sizeof why, "--threads: expected an integer from 1 to 1024, got '%.40s'", v);
            i++;
        } else if (strcmp(a, "--warmup") == 0) {
            if (!arg_int(v, 0, 100, &warmup))
                say(why, sizeof why, "--warmup: expected an integer from 0 to 100, got '%.40s'", v);
            i++;
        } else if (strcmp(a, "--json") == 0) as_json = 1;
        else if (strcmp(a, "--no-eos") == 0) eos = 0;
        else if (strncmp(a, "--", 2) == 0 || dir) say(why, sizeof why, "unexpected argument '%.60s' (usage: mha_check generate DIR --prompt-ids 1,2,3 [--max-new-tokens N] [--temperature T] [--top-k K] [--seed S] [--no-eos] [--threads N] [--warmup N] [--json])", a);
        else dir = a;
    }
    if (!why[0] && !dir) say(why, sizeof why, "expected a GPT folder: mha_check generate DIR --prompt-ids 1,2,3");
    if (!why[0] && !ids_text) say(why, sizeof why, "expected the prompt as --prompt-ids 1,2,3");
    if (why[0]) { fprintf(stderr, "error: %s\n", why); return 1; }

    MhaGptManifest m;
    if (mha_gpt_manifest_load(dir, &m, why, sizeof why)) { fprintf(stderr, "error: %s\n", why); return 1; }
    const MhaGptConfig *c = &m.config;
    long long C = c->context_length;
    int64_t *prompt = calloc((size_t)C + 1, sizeof *prompt);
    size_t T = 0;
    if (!prompt) say(why, sizeof why, "out of memory");
    else if (parse_ids(ids_text, prompt, (size_t)C + 1, &T, why, sizeof why)) {
        for (size_t i = 0; i < T && !why[0]; i++)
            if (prompt[i] < 0 || prompt[i] >= c->vocab_size)
                say(why, sizeof why, "prompt: token id %lld is outside the vocabulary (0..%lld)", (long long)prompt[i],
                         c->vocab_size - 1);
        if (!why[0] && (long long)T > C)
            say(why, sizeof why, "prompt: %zu tokens, longer than context_length %lld", T, C);
        if (!why[0] && (long long)T + max_new > C)
            say(why, sizeof why, "--max-new-tokens %lld: the prompt's %zu tokens + %lld new pass context_length %lld "
                     "(at most %lld new)", max_new, T, max_new, C, C - (long long)T);
    }
    if (!why[0] && top_k > c->vocab_size)
        say(why, sizeof why, "--top-k: expected an integer in 1..%lld, got %lld", c->vocab_size, top_k);
    Request q = {max_new, top_k, eos ? m.eos_id : -1, temperature, 0};
    if (seed < 0) {  /* as Python: a fresh seed when none is given (reported in --json) */
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        seed = (long long)(((uint64_t)t.tv_sec * 1000000007ULL ^ (uint64_t)t.tv_nsec) & 0x7fffffffffffffffULL);
    }
    q.seed = (uint64_t)seed;
    GptRun r;
    memset(&r, 0, sizeof r);
    Result out = {calloc((size_t)max_new, sizeof(int64_t)), 0, "", 0, 0};
    void *scratch = malloc(mha_gpt_scratch_bytes(c->vocab_size));
    if (!why[0] && (!out.ids || !scratch)) say(why, sizeof why, "out of memory");
    int rc = 1;
    /* the model's size and sha256 are checked before a session is made from it; --warmup N generations of the
     * same request run untimed first, and the last one is reported */
    int failed_run = !why[0] ? open_verified(&r, &m, dir, MHA_GPT_INPLACE, threads, why, sizeof why) : 1;
    for (long long w = 0; w <= warmup && !failed_run; w++)
        failed_run = generate_ids(&r, prompt, (long long)T, &q, scratch, NULL, &out, why, sizeof why);
    if (!why[0] && !failed_run) {
        size_t size = (size_t)out.count * 22 + 2;
        char *line = malloc(size);
        if (!line) say(why, sizeof why, "out of memory");
        else {
            put_ids(line, size, out.ids, out.count);
            if (as_json) {
                char ttft[40], tps[40], prompt_line[4096 * 22];
                long long later = out.count > 1 ? out.count - 1 : 0;
                double rest = out.seconds - out.ttft;
                json_format_number(out.ttft, ttft, sizeof ttft);
                json_format_number(later && rest > 0 ? later / rest : 0.0, tps, sizeof tps);
                put_ids(prompt_line, sizeof prompt_line, prompt, (long long)T);
                printf("{\"ids\": [%s], \"prompt_ids\": [%s], \"time_to_first_token_s\": %s, \"tokens_per_s\": %s, "
                       "\"stop\": \"%s\", \"seed\": %lld}\n", line, prompt_line, ttft, tps, out.stop, seed);
            } else {
                printf("%s\n", line);
            }
            free(line);
            rc = 0;
        }
    }
    if (rc) fprintf(stderr, "error: %s\n", why);
    run_close(&r);
    free(out.ids);
    free(scratch);
    free(prompt);
    mha_gpt_manifest_free(&m);
    return rc;
}

/* --- check: the golden generations ------------------------------------------------------------------------ */

typedef struct {
    char name[128], logits_bin[256];
    int64_t *prompt, *ids;
    long long tokens, max_new, top_k, seed;
    double temperature;
} Golden;

static void golden_free(Golden *g) {
    free(g->prompt);
    free(g->ids);
    g->prompt = g->ids = NULL;
}

/* v: an array of 1..most token ids in 0..vocab-1, into a new array. */
static int id_array(const JsonValue *v, long long most, long long vocab, const char *what, int64_t **out,
                    long long *count, char *why, size_t n) {
    *out = NULL;
    *count = 0;
    if (!v || v->type != JSON_ARRAY || !v->child) {
        say(why, n, "%s: expected a non-empty list of token ids, got %s", what, json_type_name(v));
        return 1;
    }
    long long len = 0;
    for (const JsonValue *e = v->child; e; e = e->next) len++;
    if (len > most) {
        say(why, n, "%s: expected at most %lld ids, got %lld", what, most, len);
        return 1;
    }
    *out = calloc((size_t)len, sizeof **out);
    if (!*out) { say(why, n, "out of memory"); return 1; }
    for (const JsonValue *e = v->child; e; e = e->next) {
        if (e->type != JSON_NUMBER || !e->is_integer || e->integer < 0 || e->integer >= vocab) {
            say(why, n, "%s: expected token ids in 0..%lld, got %s at index %lld", what, vocab - 1,
                     e->type == JSON_NUMBER ? "another number" : json_type_name(e), *count);
            free(*out);
            *out = NULL;
            return 1;
        }
        (*out)[(*count)++] = e->integer;
    }
    return 0;
}

/* cases[i] validated against the config; g->name is set as soon as it is known (for the FAIL line). */
static int golden_get(const JsonValue *k, size_t index, const MhaGptConfig *c, Golden *g, char *why, size_t n) {
    memset(g, 0, sizeof *g);
    snprintf(g->name, sizeof g->name, "cases[%zu]", index);
    if (!k || k->type != JSON_OBJECT) { say(why, n, "expected an object, got %s", json_type_name(k)); return 1; }
    const JsonValue *name = json_get(k, "name"), *bin = json_get(k, "first_logits_bin");
    if (!name || name->type != JSON_STRING || name->str_len == 0 || name->str_len >= sizeof g->name ||
        strcspn(name->str, "\x01\x02\x03\x04\x05\x06\x07\x08\t\n\x0b\x0c\r\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18"
                           "\x19\x1a\x1b\x1c\x1d\x1e\x1f\x7f") != name->str_len) {
        say(why, n, "expected 'name' a string of 1 to %zu characters without control characters", sizeof g->name - 1);
        return 1;
    }
    snprintf(g->name, sizeof g->name, "%s", name->str);
    if (!bin || bin->type != JSON_STRING || bin->str_len == 0 || bin->str_len >= sizeof g->logits_bin - 8 ||
        strlen(bin->str) != bin->str_len || !mha_plain_name(bin->str)) {
        say(why, n, "expected 'first_logits_bin' a file name inside golden/");
        return 1;
    }
    snprintf(g->logits_bin, sizeof g->logits_bin, "golden/%s", bin->str);
    const JsonValue *shape = json_get(k, "first_logits_shape");
    if (shape && (shape->type != JSON_ARRAY || !shape->child || shape->child->next || shape->child->type != JSON_NUMBER ||
                  !shape->child->is_integer || shape->child->integer != c->vocab_size)) {
        say(why, n, "expected first_logits_shape [%lld] (vocab_size)", c->vocab_size);
        return 1;
    }
    if (int_field(k, "max_new_tokens", 1, c->context_length, "case", &g->max_new, why, n)) return 1;
    if (id_array(json_get(k, "prompt_ids"), c->context_length, c->vocab_size, "prompt_ids", &g->prompt, &g->tokens, why, n))
        return 1;
    if (g->tokens + g->max_new > c->context_length) {
        say(why, n, "prompt of %lld tokens + max_new_tokens %lld pass context_length %lld", g->tokens, g->max_new,
                 c->context_length);
        return 1;
    }
    long long count;
    if (id_array(json_get(k, "ids"), g->max_new, c->vocab_size, "ids", &g->ids, &count, why, n)) return 1;
    if (count != g->max_new) {  /* eos is not applied in golden cases: always max_new_tokens ids */
        say(why, n, "expected max_new_tokens=%lld golden ids, got %lld", g->max_new, count);
        return 1;
    }
    const JsonValue *t = json_get(k, "temperature"), *top = json_get(k, "top_k"), *seed = json_get(k, "seed");
    if (!t || t->type != JSON_NUMBER) {
        say(why, n, "expected 'temperature' a number, got %s", json_type_name(t));
        return 1;
    }
    if (!mha_gpt_temperature_ok(t->number)) {
        say(why, n, "expected 'temperature' " MHA_GPT_TEMPERATURE_RULE ", got %g", t->number);
        return 1;
    }
    g->temperature = t->number;
    if (top && top->type != JSON_NULL && int_field(k, "top_k", 1, c->vocab_size, "case", &g->top_k, why, n)) return 1;
    if (seed && seed->type != JSON_NULL && int_field(k, "seed", 0, 0x7fffffffffffffffLL, "case", &g->seed, why, n))
        return 1;
    if (g->temperature > 0 && (!seed || seed->type == JSON_NULL)) {
        say(why, n, "a sampled case (temperature %g) needs a seed", g->temperature);
        return 1;
    }
    return 0;
}

/* One golden generation: 1 passed, 0 failed (its line printed and reported either way). */
static int check_golden(GptRun *r, const MhaGptManifest *m, const char *dir, const char *form, const Golden *g,
                        double atol, double rtol, int has_rel_l2, double rel_l2, void *scratch, MhaReport *report) {
    char why[2048] = "";
    long long V = m->config.vocab_size;
    float *first = malloc((size_t)V * sizeof(float)), *want = NULL;
    Result out = {calloc((size_t)g->max_new, sizeof(int64_t)), 0, "", 0, 0};
    MhaCompare cmp = {0, 0, 0};
    unsigned char *bytes = NULL;
    size_t len = 0;
    char path[4400];
    say(path, sizeof path, "%s/%s", dir, g->logits_bin);
    if (!first || !out.ids) say(why, sizeof why, "out of memory");
    if (!why[0] && !mha_read_verified(&m->files, dir, g->logits_bin, &bytes, &len, why, sizeof why))
        mha_floats(bytes, len, (size_t)V, path, &want, why, sizeof why);
    free(bytes);
    Request q = {g->max_new, g->top_k, -1, g->temperature, (uint64_t)g->seed};
    if (!why[0]) generate_ids(r, g->prompt, g->tokens, &q, scratch, first, &out, why, sizeof why);
    if (!why[0]) cmp = mha_compare(first, want, (size_t)V, atol, rtol, has_rel_l2, rel_l2);
    if (!why[0]) {
        long long at = 0;
        while (at < out.count && at < g->max_new && out.ids[at] == g->ids[at]) at++;
        if (at < g->max_new || out.count != g->max_new) {
            char got[128], golden[128];
            long long show_got = out.count - at < 4 ? out.count - at : 4, show_want = g->max_new - at < 4 ? g->max_new - at : 4;
            put_ids(got, sizeof got, out.ids + at, show_got);
            put_ids(golden, sizeof golden, g->ids + at, show_want);
            say(why, sizeof why, "ids differ from token %lld: got [%s], golden [%s]", at, got, golden);
        } else if (!cmp.ok) {
            json_snprintf_c(why, sizeof why, "first-step logits beyond tolerance (max abs %.3g, atol=%g rtol=%g)",
                            cmp.max_abs, atol, rtol);
        }
    }
    int compared = !why[0] || strncmp(why, "ids differ", 10) == 0 || strncmp(why, "first-step", 10) == 0;
    if (!why[0])
        print_c(stdout, "ok   %-20s %-16s max_abs=%.3g rel_l2=%.3g\n", form, g->name, cmp.max_abs, cmp.rel_l2);
    else
        print_c(stdout, "FAIL %-20s %-16s %s\n", form, g->name, why);
    if (compared) {
        MhaCompare shown = cmp;
        shown.ok = !why[0];
        mha_report_case(report, g->name, &shown, why[0] ? why : NULL);
    } else {
        mha_report_case(report, g->name, NULL, why);
    }
    free(first);
    free(want);
    free(out.ids);
    return !why[0];
}

static int stop(const char *dir, const char *json_path, const char *why) {
    fprintf(stderr, "error: %s\n", why);
    char err[1024];
    if (json_path && mha_report_write_error("c", dir, why, json_path, err, sizeof err)) fprintf(stderr, "error: %s\n", err);
    return 1;
}

static int tolerance_number(const JsonValue *v) { return v && v->type == JSON_NUMBER && v->number >= 0; }

/* One form's golden generations (m->generations[f]): cases run and counted into the report; 1 with err set when the
 * file itself is refused (the check stops: a tampered golden file checks nothing). */
static int check_form(const MhaGptManifest *m, const char *dir, size_t f, void *scratch, MhaReport *report,
                      int *passed, int *failures, char *err, size_t errn) {
    const char *form = m->forms[f], *file = m->generations[f];
    char path[4400];
    say(path, sizeof path, "%s/%s", dir, file);
    unsigned char *bytes;
    size_t len;
    JsonValue *root = NULL;
    /* verified against the manifest's size and sha256 before a byte of it is parsed */
    if (!mha_manifest_find(&m->files, file)) {
        say(err, errn, "%s: the manifest lists no golden generations (re-export with this version)", path);
        return 1;
    }
    if (mha_read_verified(&m->files, dir, file, &bytes, &len, err, errn)) return 1;
    if (len > MAX_GENERATIONS_FILE) {
        free(bytes);
        say(err, errn, "%s: expected at most %zu bytes, got %zu", path, MAX_GENERATIONS_FILE, len);
        return 1;
    }
    char why[512];
    root = json_parse((const char *)bytes, len, why, sizeof why);
    free(bytes);
    if (!root) {
        say(err, errn, "%s: expected JSON, got a parse error (%s)", path, why);
        return 1;
    }
    int refused = 1;
    const JsonValue *kind = json_get(root, "kind"), *format = json_get(root, "format"), *cases = json_get(root, "cases");
    const JsonValue *tol = json_get(root, "tolerance"), *vocab = json_get(root, "vocab_size");
    const JsonValue *context = json_get(root, "context_length");
    const JsonValue *atol = json_get(tol, "atol"), *rtol = json_get(tol, "rtol"), *rel_l2 = json_get(tol, "rel_l2");
    if (!kind || kind->type != JSON_STRING || strcmp(kind->str, "gpt-generations") != 0 || !format ||
        format->type != JSON_NUMBER || !format->is_integer || format->integer != 1) {
        say(err, errn, "%s: expected kind \"gpt-generations\" format 1", path);
        goto done;
    }
    if ((vocab && (vocab->type != JSON_NUMBER || !vocab->is_integer || vocab->integer != m->config.vocab_size)) ||
        (context && (context->type != JSON_NUMBER || !context->is_integer ||
                     context->integer != m->config.context_length))) {
        say(err, errn, "%s: expected vocab_size %lld and context_length %lld (the manifest's); the golden "
                 "generations do not belong to this folder", path, m->config.vocab_size, m->config.context_length);
        goto done;
    }
    int has_rel_l2 = rel_l2 && rel_l2->type != JSON_NULL;
    if (!tol || tol->type != JSON_OBJECT || !tolerance_number(atol) || !tolerance_number(rtol) ||
        (has_rel_l2 && !tolerance_number(rel_l2))) {
        say(err, errn, "%s: expected tolerance {atol, rtol >= 0, rel_l2 null or >= 0}", path);
        goto done;
    }
    size_t ncases = 0;
    for (const JsonValue *k = cases && cases->type == JSON_ARRAY ? cases->child : NULL; k; k = k->next) ncases++;
    if (!cases || cases->type != JSON_ARRAY || ncases == 0 || ncases > MAX_CASES) {
        say(err, errn, "%s: expected 1 to %d cases, got %s", path, MAX_CASES,
                 cases && cases->type == JSON_ARRAY ? "another count" : json_type_name(cases));
        goto done;
    }
    refused = 0;
    GptRun r;
    mha_report_artifact(report, f, form, ARTIFACT_RUNTIME);
    char model_error[2048] = "";
    if (open_verified(&r, m, dir, form, 0, model_error, sizeof model_error)) {
        mha_report_artifact_error(report, model_error);  /* every case fails with the reason */
        memset(&r, 0, sizeof r);
    }
    size_t index = 0;
    for (const JsonValue *k = cases->child; k; k = k->next, index++) {
        Golden g;
        char line[2048];
        if (golden_get(k, index, &m->config, &g, line, sizeof line)) {
            print_c(stdout, "FAIL %-20s %-16s %s\n", form, g.name, line);
            mha_report_case(report, g.name, NULL, line);
            (*failures)++;
        } else if (model_error[0]) {
            print_c(stdout, "FAIL %-20s %-16s %s\n", form, g.name, model_error);
            mha_report_case(report, g.name, NULL, model_error);
            (*failures)++;
        } else {
            check_golden(&r, m, dir, form, &g, atol->number, rtol->number, has_rel_l2,
                         has_rel_l2 ? rel_l2->number : 0, scratch, report) ? (*passed)++ : (*failures)++;
        }
        golden_free(&g);
    }
    run_close(&r);
done:
    json_free(root);
    return refused;
}

int mha_gpt_check(const OrtApi *api, OrtEnv *e, OrtMemoryInfo *mem, const char *dir, const char *json_path) {
    ort = api;
    env = e;
    cpu = mem;
    MhaGptManifest m;
    char err[2048];
    if (mha_gpt_manifest_load(dir, &m, err, sizeof err)) return stop(dir, json_path, err);
    void *scratch = malloc(mha_gpt_scratch_bytes(m.config.vocab_size));
    if (!scratch) {
        mha_gpt_manifest_free(&m);
        return stop(dir, json_path, "out of memory");
    }
    MhaReport report;
    mha_report_init(&report, "c", dir);
    mha_report_version(&report, "onnxruntime", OrtGetApiBase()->GetVersionString());
    int passed = 0, failures = 0, refused = 0;
    for (size_t f = 0; f < m.nforms && !refused; f++)
        refused = check_form(&m, dir, f, scratch, &report, &passed, &failures, err, sizeof err);
    free(scratch);
    if (refused) {
        mha_report_free(&report);
        mha_gpt_manifest_free(&m);
        return stop(dir, json_path, err);
    }
    printf("%d passed, %d failed\n", passed, failures);
    int rc = failures > 0 || passed == 0;
    if (json_path) {
        fflush(stdout);
        if (report.passed != passed || report.failed != failures) {
            fprintf(stderr, "error: %s: the results kept (%d passed, %d failed) differ from the count; not written\n",
                    json_path, report.passed, report.failed);
            rc = 1;
        } else if (mha_report_write(&report, json_path, err, sizeof err)) {
            fprintf(stderr, "error: %s\n", err);
            rc = 1;
        }
    }
    mha_report_free(&report);
    mha_gpt_manifest_free(&m);
    return rc;
}
