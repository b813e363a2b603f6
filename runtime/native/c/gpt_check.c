/* `mha_check check DIR [--json FILE]` on a GPT folder: each form's golden generations (the manifest's forms, each
 * with its own golden file, verified before it is parsed), every case generated again and compared: the ids
 * exactly, the first step's logits within the file's tolerance. */
#define _POSIX_C_SOURCE 200809L
#include "gpt_private.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"

#define MAX_GENERATIONS_FILE ((size_t)16 << 20)
#define MAX_CASES 10000
#define ARTIFACT_RUNTIME "onnxruntime-decode-inplace"  /* the JSON's artifact "runtime": IO binding, in place */

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

/* cases[i] validated against the shapes; g->name is set as soon as it is known (for the FAIL line). */
static int golden_get(const JsonValue *k, size_t index, const MhaGptShapes *c, Golden *g, char *why, size_t n) {
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
    long long V = m->shapes.vocab_size;
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
    Request q = {g->max_new, g->top_k, NULL, 0, g->temperature, (uint64_t)g->seed};
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
        print_c("ok   %-20s %-16s max_abs=%.3g rel_l2=%.3g\n", form, g->name, cmp.max_abs, cmp.rel_l2);
    else
        print_c("FAIL %-20s %-16s %s\n", form, g->name, why);
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
    if ((vocab && (vocab->type != JSON_NUMBER || !vocab->is_integer || vocab->integer != m->shapes.vocab_size)) ||
        (context && (context->type != JSON_NUMBER || !context->is_integer ||
                     context->integer != m->shapes.context_length))) {
        say(err, errn, "%s: expected vocab_size %lld and context_length %lld (the manifest's); the golden "
                 "generations do not belong to this folder", path, m->shapes.vocab_size, m->shapes.context_length);
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
    if (atol->number != MHA_GPT_ATOL || rtol->number != MHA_GPT_RTOL || has_rel_l2) {
        char line[4800];
        say(line, sizeof line, "%s: expected the contract's tolerance atol=%g rtol=%g, got atol=%g rtol=%g%s", path,
            MHA_GPT_ATOL, MHA_GPT_RTOL, atol->number, rtol->number, has_rel_l2 ? " and a rel_l2" : "");
        print_c("FAIL %-20s %-16s %s\n", form, "tolerance", line);
        mha_report_case(report, "tolerance", NULL, line);
        (*failures)++;
    }
    size_t index = 0;
    for (const JsonValue *k = cases->child; k; k = k->next, index++) {
        Golden g;
        char line[2048];
        if (golden_get(k, index, &m->shapes, &g, line, sizeof line)) {
            print_c("FAIL %-20s %-16s %s\n", form, g.name, line);
            mha_report_case(report, g.name, NULL, line);
            (*failures)++;
        } else if (model_error[0]) {
            print_c("FAIL %-20s %-16s %s\n", form, g.name, model_error);
            mha_report_case(report, g.name, NULL, model_error);
            (*failures)++;
        } else {
            check_golden(&r, m, dir, form, &g, MHA_GPT_ATOL, MHA_GPT_RTOL, 0, 0, scratch, report)
                ? (*passed)++ : (*failures)++;
        }
        golden_free(&g);
    }
    run_close(&r);
done:
    json_free(root);
    return refused;
}

int mha_gpt_check(const char *dir, const char *json_path) {
    MhaGptManifest m;
    char err[2048];
    if (mha_gpt_manifest_load(dir, &m, err, sizeof err)) return stop(dir, json_path, err);
    void *scratch = malloc(mha_gpt_scratch_bytes(m.shapes.vocab_size));
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
    int rc = finish(&report, passed, failures, json_path, err, sizeof err);
    mha_report_free(&report);
    mha_gpt_manifest_free(&m);
    return rc;
}
