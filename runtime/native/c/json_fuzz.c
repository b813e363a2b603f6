/* json_fuzz: feed the manifest/config reader and the golden/cases.json reader (common/json.c's walk over cJSON's
 * tree, common/artifact.c) hostile variants of a real manifest.json and of the cases.json beside it, in process,
 * for the AddressSanitizer/UBSan build:
 *
 *   json_fuzz_asan MANIFEST.json [ITERATIONS] [SEED]
 *
 * For the manifest, then for DIR/golden/cases.json (when the folder has one; each variant parsed against the
 * manifest's config, then every (artifact, case) pair read with mha_case_get, as the runners do): every prefix
 * of the file (truncations), then ITERATIONS random edits (bytes flipped, ranges deleted or repeated, JSON
 * tokens inserted: huge numbers, lone surrogates, brackets, bad shapes and schedules), then deep nesting. Each
 * input sits in a buffer of exactly its size (no terminator), so a read past its end is a sanitizer report.
 * Checks: each input is either accepted or refused with a non-empty one-line message; an accepted pair holds
 * what its checks promise (counts that match its shape, a schedule adding up to tokens). Exit 1 otherwise.
 * libcjson.so itself is Debian's, not instrumented: what this run checks is json.c's scan of the text and walk, and
 * artifact.c (a shape3 without its rank check, say, is a stack-buffer-overflow in the test's 3000-edit run).
 * stdout is one line about the manifest (four counts, which tests/native/test_native.py reads); the cases.json
 * summary goes to stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "artifact.h"
#include "json.h"

static unsigned long long state;
static unsigned long long next_random(void) {  /* xorshift64*: reproducible from the seed */
    state ^= state >> 12; state ^= state << 25; state ^= state >> 27;
    return state * 2685821657736338717ULL;
}

static size_t inputs, accepted, refused, violations;
static size_t cases_inputs, cases_accepted, pairs_accepted, pairs_refused, cases_violations;
static MhaConfig manifest_config;

static size_t *counter = &violations;  /* where a violation is counted: the manifest's, then cases.json's */

static void one_line(const char *what, const char *err) {
    if (!err[0] || strchr(err, '\n')) {
        if ((*counter)++ < 5) fprintf(stderr, "json_fuzz: %s refused an input with %s\n", what, err[0] ? "a multi-line message" : "no message");
    }
}

static void feed(const char *text, size_t len) {
    char *exact = malloc(len ? len : 1);
    if (!exact) { fprintf(stderr, "json_fuzz: out of memory\n"); exit(1); }
    memcpy(exact, text, len);
    char err[1024];
    inputs++;
    JsonValue *v = json_parse(exact, len, err, sizeof err);
    if (v) json_free(v); else one_line("json_parse", err);
    MhaManifest m;
    if (mha_manifest_parse(exact, len, "manifest.json", &m, err, sizeof err) == MHA_OK) {
        accepted++;
        for (size_t i = 0; i < m.nfiles; i++)
            if (strlen(m.files[i].sha256) != 64 || m.files[i].size < 0) { fprintf(stderr, "json_fuzz: bad entry kept\n"); violations++; }
        mha_manifest_free(&m);
    } else {
        refused++;
        one_line("mha_manifest_parse", err);
    }
    MhaConfig c;
    if (mha_config_parse(exact, len, "config", &c, err, sizeof err) != MHA_OK) one_line("mha_config_parse", err);
    free(exact);
}

/* An accepted pair must hold what mha_case_get promises before a runner sizes a buffer from it. */
static void check_pair(const MhaCase *c) {
    int bad = c->batch < 1 || c->tokens < 1 || c->tokens > manifest_config.context_length ||
              c->d_in != manifest_config.d_in || c->width != manifest_config.num_heads * manifest_config.d_out ||
              c->input_count != (size_t)c->batch * (size_t)c->tokens * (size_t)c->d_in ||
              c->output_count != (size_t)c->batch * (size_t)c->tokens * (size_t)c->width || !(c->atol >= 0) || !(c->rtol >= 0) ||
              (c->has_rel_l2 && !(c->rel_l2 >= 0)) || !c->file[0] || !c->name[0] || !c->runtime[0];
    long long total = 0;
    for (size_t i = 0; i < c->chunks; i++) {
        if (c->schedule[i] < 1 || c->schedule[i] > c->tokens) bad = 1;
        total += c->schedule[i];
    }
    if (c->schedule && total != c->tokens) bad = 1;
    if (bad && cases_violations++ < 5) fprintf(stderr, "json_fuzz: mha_case_get accepted a pair that breaks its checks\n");
}

static void feed_cases(const char *text, size_t len) {
    char *exact = malloc(len ? len : 1);
    if (!exact) { fprintf(stderr, "json_fuzz: out of memory\n"); exit(1); }
    memcpy(exact, text, len);
    char err[1024];
    cases_inputs++;
    MhaCases doc;
    if (mha_cases_parse(exact, len, "cases.json", &manifest_config, &doc, err, sizeof err) == MHA_OK) {
        cases_accepted++;
        for (size_t a = 0; a < doc.nartifacts; a++)
            for (size_t i = 0; i < doc.ncases; i++) {
                MhaCase c;
                if (mha_case_get(&doc, a, i, &manifest_config, &c, err, sizeof err) == MHA_OK) {
                    pairs_accepted++;
                    check_pair(&c);
                } else {
                    pairs_refused++;
                    one_line("mha_case_get", err);
                }
                mha_case_free(&c);
            }
        mha_cases_free(&doc);
    } else {
        one_line("mha_cases_parse", err);
    }
    free(exact);
}

static const char *const tokens[] = {"{", "}", "[", "]", ",", ":", "\"", "\\", "\\u", "\\ud800", "\\udc00",
                                     "\\u0000", "1e999", "-1e999", "99999999999999999999", "-0", "0.", "1e",
                                     "-", "null", "true", "fals", "\"size\": -1", "\"sha256\": 7",
                                     "\"d_in\": 0", "\"d_in\": 16777217", "\t", "\x01", "\xff",
                                     /* cases.json: shapes, tolerances, schedules, names */
                                     "[1, 1, 3]", "[4611686018427387904, 1, 3]", "[-1, 6, 3]", "[1, 1099511627776, 3]",
                                     "\"atol\": -1", "\"rel_l2\": \"x\"", "[9, -3]", "[3, 0, 3]", "[1, 1, 1, 1, 1, 1, 1]",
                                     "\"../../etc/passwd\"", "\"\\n\"", "\"onnxruntime-decode-inplace\"",
                                     "\"schedules\": {}", "2.5", "0.005",
                                     /* what cJSON accepts and the walk refuses */
                                     "01", "1.", "-.5", "\\uzzzz", "\\u00", "\xef\xbb\xbf", "\"d_in\": 3, \"d_in\": 3"};

/* What a number is swapped for: the edits that keep the text JSON, so the checks after parsing see them. */
static const char *const values[] = {"0", "1", "-1", "2", "3", "6", "7", "48", "49", "1e999", "2.5", "0.5", "-0",
                                     "4611686018427387904", "1099511627776", "99999999999999999999", "null", "true",
                                     "\"x\"", "\"\"", "[]", "{}", "[1]", "[1, 1, 3]", "[1, 2]"};

/* Every prefix of text, then iterations random edits of it, then deep nesting, each fed to feed. */
static void mutate(const char *text, size_t len, long iterations, void (*feed_one)(const char *, size_t)) {
    for (size_t cut = 0; cut < len; cut++) feed_one(text, cut);
    char *buf = malloc(len * 2 + 256);
    if (!buf) { fprintf(stderr, "json_fuzz: out of memory\n"); exit(1); }
    for (long i = 0; i < iterations; i++) {
        size_t n = len;
        memcpy(buf, text, len);
        int edits = 1 + (int)(next_random() % 3);
        for (int e = 0; e < edits && n > 0; e++) {
            size_t at = (size_t)(next_random() % n);
            switch (next_random() % 5) {
                case 0: buf[at] = (char)(next_random() & 0xff); break;
                case 4: {  /* swap the next number for another value */
                    while (at < n && !(buf[at] >= '0' && buf[at] <= '9')) at++;
                    if (at == n) break;
                    if (at > 0 && buf[at - 1] == '-') at--;
                    size_t end = at + 1;
                    while (end < n && strchr("0123456789.eE+-", buf[end])) end++;
                    const char *v = values[next_random() % (sizeof values / sizeof *values)];
                    size_t vl = strlen(v);
                    if (n - (end - at) + vl > len * 2 + 200) break;
                    memmove(buf + at + vl, buf + end, n - end);
                    memcpy(buf + at, v, vl);
                    n = n - (end - at) + vl;
                    break;
                }
                case 1: {  /* delete a range */
                    size_t span = 1 + (size_t)(next_random() % 64);
                    if (span > n - at) span = n - at;
                    memmove(buf + at, buf + at + span, n - at - span);
                    n -= span;
                    break;
                }
                case 2: {  /* repeat a range */
                    size_t span = 1 + (size_t)(next_random() % 64);
                    if (span > n - at) span = n - at;
                    if (n + span > len * 2 + 200) break;
                    memmove(buf + at + span, buf + at, n - at);
                    n += span;
                    break;
                }
                default: {  /* insert a token */
                    const char *t = tokens[next_random() % (sizeof tokens / sizeof *tokens)];
                    size_t tl = strlen(t);
                    if (n + tl > len * 2 + 200) break;
                    memmove(buf + at + tl, buf + at, n - at);
                    memcpy(buf + at, t, tl);
                    n += tl;
                }
            }
        }
        feed_one(buf, n);
    }
    free(buf);
    size_t deep = 100000;  /* nesting far past the depth limit */
    char *nest = malloc(deep * 2);
    if (!nest) { fprintf(stderr, "json_fuzz: out of memory\n"); exit(1); }
    memset(nest, '[', deep);
    memset(nest + deep, ']', deep);
    feed_one(nest, deep * 2);
    feed_one(nest, deep);
    free(nest);
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: json_fuzz MANIFEST.json [ITERATIONS] [SEED]\n"); return 2; }
    unsigned char *bytes;
    size_t len;
    char err[1024];
    if (mha_read_file(argv[1], &bytes, &len, err, sizeof err)) { fprintf(stderr, "error: %s\n", err); return 1; }
    long iterations = argc > 2 ? strtol(argv[2], NULL, 10) : 20000;
    state = argc > 3 ? strtoull(argv[3], NULL, 10) | 1 : 0x9E3779B97F4A7C15ULL;
    const char *text = (const char *)bytes;
    feed(text, len);
    if (accepted != 1) { fprintf(stderr, "json_fuzz: %s itself is not accepted\n", argv[1]); return 1; }
    MhaManifest m;
    if (mha_manifest_parse(text, len, argv[1], &m, err, sizeof err) != MHA_OK) { fprintf(stderr, "error: %s\n", err); return 1; }
    manifest_config = m.config;
    mha_manifest_free(&m);
    mutate(text, len, iterations, feed);
    free(bytes);
    /* DIR/golden/cases.json beside the manifest, when there is one */
    const char *slash = strrchr(argv[1], '/');
    char cases_path[4200];
    snprintf(cases_path, sizeof cases_path, "%.*s%sgolden/cases.json", slash ? (int)(slash - argv[1]) : 0, argv[1],
             slash ? "/" : "");
    counter = &cases_violations;
    if (mha_read_file(cases_path, &bytes, &len, err, sizeof err) == MHA_OK) {
        text = (const char *)bytes;
        feed_cases(text, len);
        if (cases_accepted != 1 || pairs_refused != 0) {
            fprintf(stderr, "json_fuzz: %s itself is not accepted (%zu pairs refused)\n", cases_path, pairs_refused);
            return 1;
        }
        mutate(text, len, iterations, feed_cases);
        free(bytes);
        fprintf(stderr, "json_fuzz: cases.json: %zu inputs, %zu parsed, %zu (artifact, case) pairs accepted, %zu refused, "
                "%zu violations\n", cases_inputs, cases_accepted, pairs_accepted, pairs_refused, cases_violations);
    } else {
        fprintf(stderr, "json_fuzz: no golden/cases.json beside the manifest: only the manifest fuzzed\n");
    }
    printf("json_fuzz: %zu inputs, %zu accepted as a manifest, %zu refused, %zu without a one-line message\n", inputs,
           accepted, refused, violations);
    return violations || cases_violations ? 1 : 0;
}
