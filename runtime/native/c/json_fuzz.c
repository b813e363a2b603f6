/* json_fuzz: feed the manifest/config reader (common/json.c, common/artifact.c) hostile variants of a real
 * manifest.json, in process, for the AddressSanitizer/UBSan build:
 *
 *   json_fuzz_asan MANIFEST.json [ITERATIONS] [SEED]
 *
 * Every prefix of the file (truncations), then ITERATIONS random edits (bytes flipped, ranges deleted or
 * repeated, JSON tokens inserted: huge numbers, lone surrogates, brackets), then deep nesting. Each input
 * sits in a buffer of exactly its size (no terminator), so a read past its end is a sanitizer report.
 * Checks: each input is either accepted or refused with a non-empty one-line message. Exit 1 otherwise.
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

static void one_line(const char *what, const char *err) {
    if (!err[0] || strchr(err, '\n')) {
        if (violations++ < 5) fprintf(stderr, "json_fuzz: %s refused an input with %s\n", what, err[0] ? "a multi-line message" : "no message");
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
    for (size_t cut = 0; cut < len; cut++) feed(text, cut);
    static const char *const tokens[] = {"{", "}", "[", "]", ",", ":", "\"", "\\", "\\u", "\\ud800", "\\udc00",
                                         "\\u0000", "1e999", "-1e999", "99999999999999999999", "-0", "0.", "1e",
                                         "-", "null", "true", "fals", "\"size\": -1", "\"sha256\": 7",
                                         "\"d_in\": 0", "\"d_in\": 16777217", "\t", "\x01", "\xff"};
    char *buf = malloc(len * 2 + 256);
    if (!buf) return 1;
    for (long i = 0; i < iterations; i++) {
        size_t n = len;
        memcpy(buf, text, len);
        int edits = 1 + (int)(next_random() % 3);
        for (int e = 0; e < edits && n > 0; e++) {
            size_t at = (size_t)(next_random() % n);
            switch (next_random() % 4) {
                case 0: buf[at] = (char)(next_random() & 0xff); break;
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
        feed(buf, n);
    }
    free(buf);
    size_t deep = 100000;  /* nesting far past the depth limit */
    char *nest = malloc(deep * 2);
    if (!nest) return 1;
    memset(nest, '[', deep);
    memset(nest + deep, ']', deep);
    feed(nest, deep * 2);
    feed(nest, deep);
    free(nest);
    free(bytes);
    printf("json_fuzz: %zu inputs, %zu accepted as a manifest, %zu refused, %zu without a one-line message\n", inputs,
           accepted, refused, violations);
    return violations ? 1 : 0;
}
