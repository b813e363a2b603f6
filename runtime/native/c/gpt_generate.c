/* `mha_check generate DIR --prompt-ids 1,2,3 ...` (usage in gpt.h): the arguments, one generation of the
 * in-place form, and its ids (or a JSON line with --json). */
#define _POSIX_C_SOURCE 200809L
#include "gpt_private.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_NEW_TOKENS_ARG 1000000

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

void put_ids(char *buf, size_t size, const int64_t *ids, long long count) {
    size_t used = 0;
    buf[0] = '\0';
    for (long long i = 0; i < count && used < size; i++) {
        int w = snprintf(buf + used, size - used, "%s%lld", i ? "," : "", (long long)ids[i]);
        if (w < 0) break;
        used += (size_t)w;
    }
}

int mha_gpt_generate(int argc, char **argv) {
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
    if (!why[0] && !dir) say(why, sizeof why, "expected a decoder folder: mha_check generate DIR --prompt-ids 1,2,3");
    if (!why[0] && !ids_text) say(why, sizeof why, "expected the prompt as --prompt-ids 1,2,3");
    if (why[0]) { fprintf(stderr, "error: %s\n", why); return 1; }

    MhaGptManifest m;
    if (mha_gpt_manifest_load(dir, &m, why, sizeof why)) { fprintf(stderr, "error: %s\n", why); return 1; }
    const MhaGptShapes *c = &m.shapes;
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
        /* 1 <= prompt + new tokens <= context_length, as `mha inspect` says and every runner refuses it */
        if (!why[0] && (long long)T == C)
            say(why, sizeof why, "prompt: %zu tokens fill context_length %lld, leaving no room for a new token; give "
                     "at most %lld", T, C, C - 1);
        if (!why[0] && (long long)T + max_new > C)
            say(why, sizeof why, "--max-new-tokens %lld: the prompt's %zu tokens + %lld new pass context_length %lld "
                     "(at most %lld new)", max_new, T, max_new, C, C - (long long)T);
    }
    if (!why[0] && top_k > c->vocab_size)
        say(why, sizeof why, "--top-k: expected an integer in 1..%lld, got %lld", c->vocab_size, top_k);
    Request q = {max_new, top_k, m.eos_ids, eos ? m.neos : 0, temperature, 0};
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
        /* at most 21 bytes per id and its comma; the prompt's line on the heap (context_length may be 1 << 20) */
        size_t size = (size_t)out.count * 22 + 2, prompt_size = T * 22 + 2;
        char *line = malloc(size), *prompt_line = malloc(prompt_size);
        if (!line || !prompt_line) say(why, sizeof why, "out of memory");
        else {
            put_ids(line, size, out.ids, out.count);
            if (as_json) {
                char ttft[40], tps[40];
                long long later = out.count > 1 ? out.count - 1 : 0;
                double rest = out.seconds - out.ttft;
                json_format_number(out.ttft, ttft, sizeof ttft);
                json_format_number(later && rest > 0 ? later / rest : 0.0, tps, sizeof tps);
                put_ids(prompt_line, prompt_size, prompt, (long long)T);
                printf("{\"ids\": [%s], \"prompt_ids\": [%s], \"time_to_first_token_s\": %s, \"tokens_per_s\": %s, "
                       "\"stop\": \"%s\", \"seed\": %lld}\n", line, prompt_line, ttft, tps, out.stop, seed);
            } else {
                printf("%s\n", line);
            }
            rc = 0;
        }
        free(line);
        free(prompt_line);
    }
    if (rc) fprintf(stderr, "error: %s\n", why);
    run_close(&r);
    free(out.ids);
    free(scratch);
    free(prompt);
    mha_gpt_manifest_free(&m);
    return rc;
}
