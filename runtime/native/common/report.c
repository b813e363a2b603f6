/* See report.h. */
#define _POSIX_C_SOURCE 200809L
#include "report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

static char *copy(MhaReport *r, const char *text) {
    if (!text) return NULL;
    char *out = strdup(text);
    if (!out) r->out_of_memory = 1;
    return out;
}

/* Room for one more element of an array of size-byte elements. */
static int grow(void **items, size_t count, size_t *cap, size_t size) {
    if (count < *cap) return 1;
    size_t more = *cap ? *cap * 2 : 8;
    void *bigger = realloc(*items, more * size);
    if (!bigger) return 0;
    *items = bigger;
    *cap = more;
    return 1;
}

void mha_report_init(MhaReport *r, const char *runner, const char *dir) {
    memset(r, 0, sizeof *r);
    snprintf(r->runner, sizeof r->runner, "%s", runner);
    r->dir = copy(r, dir);
}

void mha_report_version(MhaReport *r, const char *key, const char *value) {
    free(r->version_key);
    free(r->version);
    r->version_key = copy(r, key);
    r->version = copy(r, value);
}

static MhaArtifactResult *current(MhaReport *r) { return r->nartifacts ? &r->artifacts[r->nartifacts - 1] : NULL; }

void mha_report_artifact(MhaReport *r, size_t index, const char *file, const char *runtime) {
    MhaArtifactResult *a = current(r);
    if (a && a->index == index) return;
    if (!grow((void **)&r->artifacts, r->nartifacts, &r->cap, sizeof *r->artifacts)) { r->out_of_memory = 1; return; }
    a = &r->artifacts[r->nartifacts++];
    memset(a, 0, sizeof *a);
    a->index = index;
    a->file = copy(r, file);
    a->runtime = copy(r, runtime);
}

void mha_report_not_loadable(MhaReport *r, const char *reason) {
    MhaArtifactResult *a = current(r);
    if (!a || a->not_loadable) return;
    a->not_loadable = copy(r, reason);
}

void mha_report_artifact_error(MhaReport *r, const char *error) {
    MhaArtifactResult *a = current(r);
    if (!a || a->error) return;
    a->error = copy(r, error);
}

void mha_report_case(MhaReport *r, const char *name, const MhaCompare *cmp, const char *error) {
    MhaArtifactResult *a = current(r);
    int ok = cmp && !error && cmp->ok;
    ok ? r->passed++ : r->failed++;
    if (!a) { r->out_of_memory = 1; return; }  /* no artifact to put it under: never write a partial result */
    ok ? a->passed++ : a->failed++;
    if (!grow((void **)&a->cases, a->ncases, &a->cap, sizeof *a->cases)) { r->out_of_memory = 1; return; }
    MhaCaseResult *c = &a->cases[a->ncases++];
    memset(c, 0, sizeof *c);
    c->name = copy(r, name);
    c->ok = ok;
    c->compared = cmp && !error;
    c->max_abs = c->compared ? cmp->max_abs : NAN;
    c->rel_l2 = c->compared ? cmp->rel_l2 : NAN;
    c->error = copy(r, error);
}

void mha_report_error(MhaReport *r, const char *error) {
    r->failed++;
    if (!grow((void **)&r->errors, r->nerrors, &r->errors_cap, sizeof *r->errors)) { r->out_of_memory = 1; return; }
    r->errors[r->nerrors++] = copy(r, error);
}

void mha_report_free(MhaReport *r) {
    for (size_t i = 0; i < r->nartifacts; i++) {
        MhaArtifactResult *a = &r->artifacts[i];
        for (size_t j = 0; j < a->ncases; j++) {
            free(a->cases[j].name);
            free(a->cases[j].error);
        }
        free(a->cases);
        free(a->file);
        free(a->runtime);
        free(a->not_loadable);
        free(a->error);
    }
    for (size_t i = 0; i < r->nerrors; i++) free(r->errors[i]);
    free(r->errors);
    free(r->artifacts);
    free(r->dir);
    free(r->version_key);
    free(r->version);
    memset(r, 0, sizeof *r);
}

/* --- the JSON text ---------------------------------------------------------------------------------------- */

typedef struct {
    char *text;
    size_t len, cap;
    int failed;
} Out;

static void put_bytes(Out *o, const char *s, size_t len) {
    if (o->failed) return;
    if (o->len + len + 1 > o->cap) {
        size_t more = o->cap ? o->cap : 4096;
        while (more < o->len + len + 1) more *= 2;
        char *bigger = realloc(o->text, more);
        if (!bigger) { o->failed = 1; return; }
        o->text = bigger;
        o->cap = more;
    }
    memcpy(o->text + o->len, s, len);
    o->len += len;
    o->text[o->len] = '\0';
}

static void put(Out *o, const char *s) { put_bytes(o, s, strlen(s)); }

/* The length of the well-formed UTF-8 sequence at s (1 to 4), or 0 when it is not one (RFC 3629: no overlong
 * forms, no surrogates, nothing past U+10FFFF). */
static size_t utf8_length(const unsigned char *s) {
    if (s[0] < 0x80) return 1;
    size_t len = s[0] >= 0xC2 && s[0] <= 0xDF ? 2 : s[0] >= 0xE0 && s[0] <= 0xEF ? 3 : s[0] >= 0xF0 && s[0] <= 0xF4 ? 4 : 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;  /* also stops at the terminating NUL */
    if ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] > 0x9F) || (s[0] == 0xF0 && s[1] < 0x90) ||
        (s[0] == 0xF4 && s[1] > 0x8F))
        return 0;
    return len;
}

/* A JSON string (null for NULL): control characters escaped, bytes that are not UTF-8 (a path can hold any)
 * written as U+FFFD, so the file is always valid JSON in UTF-8. */
static void put_string(Out *o, const char *s) {
    if (!s) { put(o, "null"); return; }
    put(o, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        char esc[8];
        size_t len = utf8_length(p);
        if (*p == '"' || *p == '\\') { esc[0] = '\\'; esc[1] = (char)*p; put_bytes(o, esc, 2); p++; }
        else if (*p < 0x20 || *p == 0x7f) { snprintf(esc, sizeof esc, "\\u%04x", *p); put(o, esc); p++; }
        else if (len == 0) { put(o, "\\ufffd"); p++; }
        else { put_bytes(o, (const char *)p, len); p += len; }
    }
    put(o, "\"");
}

static void put_number(Out *o, double v) {
    char buf[40];
    if (json_format_number(v, buf, sizeof buf) < 0) { o->failed = 1; return; }
    put(o, buf);
}

static void put_int(Out *o, long long v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", v);
    put(o, buf);
}

static void put_key(Out *o, const char *indent, const char *key) {
    put(o, indent);
    put_string(o, key);
    put(o, ": ");
}

static void put_head(Out *o, const char *runner, const char *dir) {
    put(o, "{\n");
    put_key(o, " ", "runtime");
    put_string(o, runner);
    put(o, ",\n");
    put_key(o, " ", "artifact_dir");
    put_string(o, dir);
    put(o, ",\n");
}

static int finish(Out *o, const char *path, char *err, size_t n) {
    if (o->failed) {
        free(o->text);
        snprintf(err, n, "%s: out of memory for the JSON results", path);
        return MHA_ERROR;
    }
    int rc = mha_make_parents(path, err, n);
    if (!rc) rc = mha_write_atomically(path, o->text, o->len, err, n);
    free(o->text);
    return rc;
}

int mha_report_write(const MhaReport *r, const char *path, char *err, size_t n) {
    if (r->out_of_memory) {
        snprintf(err, n, "%s: out of memory while keeping the results; not written", path);
        return MHA_ERROR;
    }
    Out o = {NULL, 0, 0, 0};
    put_head(&o, r->runner, r->dir);
    if (r->version_key) {
        put_key(&o, " ", r->version_key);
        put_string(&o, r->version);
        put(&o, ",\n");
    }
    put_key(&o, " ", "passed");
    put_int(&o, r->passed);
    put(&o, ",\n");
    put_key(&o, " ", "failed");
    put_int(&o, r->failed);
    put(&o, ",\n");
    put_key(&o, " ", "not_loadable");
    put(&o, "[");
    int first = 1;
    for (size_t i = 0; i < r->nartifacts; i++) {
        const MhaArtifactResult *a = &r->artifacts[i];
        if (!a->not_loadable) continue;
        put(&o, first ? "{" : ", {");
        first = 0;
        put_key(&o, "", "file");
        put_string(&o, a->file);
        put(&o, ", ");
        put_key(&o, "", "reason");
        put_string(&o, a->not_loadable);
        put(&o, "}");
    }
    put(&o, "],\n");
    put_key(&o, " ", "errors");
    put(&o, "[");
    for (size_t i = 0; i < r->nerrors; i++) {
        put(&o, i ? ",\n  " : "\n  ");
        put_string(&o, r->errors[i]);
    }
    put(&o, r->nerrors ? "\n ],\n" : "],\n");
    put_key(&o, " ", "artifacts");
    put(&o, "[");
    for (size_t i = 0; i < r->nartifacts; i++) {
        const MhaArtifactResult *a = &r->artifacts[i];
        put(&o, i ? ",\n  {\n" : "\n  {\n");
        put_key(&o, "   ", "file");
        put_string(&o, a->file);
        put(&o, ",\n");
        put_key(&o, "   ", "runtime");
        put_string(&o, a->runtime);
        put(&o, ",\n");
        put_key(&o, "   ", "not_loadable");
        put_string(&o, a->not_loadable);
        put(&o, ",\n");
        put_key(&o, "   ", "error");
        put_string(&o, a->error);
        put(&o, ",\n");
        put_key(&o, "   ", "passed");
        put_int(&o, a->passed);
        put(&o, ",\n");
        put_key(&o, "   ", "failed");
        put_int(&o, a->failed);
        put(&o, ",\n");
        put_key(&o, "   ", "cases");
        put(&o, "[");
        for (size_t j = 0; j < a->ncases; j++) {
            const MhaCaseResult *c = &a->cases[j];
            put(&o, j ? ",\n    {" : "\n    {");
            put_key(&o, "", "name");
            put_string(&o, c->name);
            put(&o, ", ");
            put_key(&o, "", "ok");
            put(&o, c->ok ? "true" : "false");
            put(&o, ", ");
            put_key(&o, "", "max_abs");
            put_number(&o, c->max_abs);  /* null when not compared or not finite */
            put(&o, ", ");
            put_key(&o, "", "rel_l2");
            put_number(&o, c->rel_l2);
            put(&o, ", ");
            put_key(&o, "", "error");
            put_string(&o, c->error);
            put(&o, "}");
        }
        put(&o, a->ncases ? "\n   ]\n  }" : "]\n  }");
    }
    put(&o, r->nartifacts ? "\n ]\n}\n" : "]\n}\n");
    return finish(&o, path, err, n);
}

int mha_report_write_error(const char *runner, const char *dir, const char *error, const char *path, char *err,
                           size_t n) {
    Out o = {NULL, 0, 0, 0};
    put_head(&o, runner, dir);
    put_key(&o, " ", "error");
    put_string(&o, error);
    put(&o, "\n}\n");
    return finish(&o, path, err, n);
}
