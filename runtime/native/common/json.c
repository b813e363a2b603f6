/* See json.h. Recursive descent over (text, len) with an explicit end pointer. */
#define _POSIX_C_SOURCE 200809L  /* newlocale, uselocale, freelocale */
#include "json.h"

#include <errno.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64
#define MAX_VALUES 1000000
#define MAX_MEMBERS 10000  /* per object or array: the duplicate-name check is quadratic */
#define MAX_NUMBER 64  /* characters in one number; Python's repr of a float needs at most 24 */

typedef struct {
    const char *start, *p, *end;
    char *err;
    size_t errlen;
    size_t values;
    int failed;
} Parser;

static void fail(Parser *ps, const char *fmt, ...) {
    if (ps->failed) return;
    ps->failed = 1;
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(ps->err, ps->errlen, "%s at byte %zu", what, (size_t)(ps->p - ps->start));
}

/* What the parser found, for "expected X, got Y". */
static const char *found(const Parser *ps) {
    if (ps->p >= ps->end) return "the end of the text";
    unsigned char c = (unsigned char)*ps->p;
    if (c == '"') return "a string";
    if (c == '{') return "'{'";
    if (c == '[') return "'['";
    if (c == '-' || (c >= '0' && c <= '9')) return "a number";
    if (c < 0x20) return "a control character";
    static char one[2][16];  /* the message is copied before the next call: two slots are plenty */
    static int slot;
    slot ^= 1;
    snprintf(one[slot], sizeof one[slot], c < 0x80 ? "'%c'" : "byte 0x%02x", c);
    return one[slot];
}

static void skip_space(Parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')) ps->p++;
}

static int literal(Parser *ps, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0) return 0;
    ps->p += n;
    return 1;
}

static int hex4(Parser *ps, unsigned *out) {
    if (ps->end - ps->p < 4) { fail(ps, "expected 4 hex digits after \\u, got the end of the text"); return 0; }
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = ps->p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else { fail(ps, "expected 4 hex digits after \\u"); return 0; }
    }
    ps->p += 4;
    *out = v;
    return 1;
}

/* A string at ps->p (the opening quote), decoded into a new NUL-terminated buffer. */
static char *parse_string(Parser *ps, size_t *len_out) {
    ps->p++;  /* the opening quote */
    const char *q = ps->p;
    size_t raw = 0;  /* the decoded text is never longer than the raw one */
    while (q < ps->end && *q != '"') { if (*q == '\\') { q++; raw++; } if (q < ps->end) { q++; raw++; } }
    if (q >= ps->end) { fail(ps, "expected a closing '\"', got the end of the text"); return NULL; }
    char *out = malloc(raw + 1), *w = out;
    if (!out) { fail(ps, "out of memory"); return NULL; }
    while (*ps->p != '"') {
        unsigned char c = (unsigned char)*ps->p;
        if (c < 0x20) { fail(ps, "expected a string character, got a control character"); free(out); return NULL; }
        if (c != '\\') { *w++ = (char)c; ps->p++; continue; }
        ps->p++;
        char e = *ps->p++;  /* in bounds: the scan above saw the closing quote after it */
        switch (e) {
            case '"': *w++ = '"'; break;
            case '\\': *w++ = '\\'; break;
            case '/': *w++ = '/'; break;
            case 'b': *w++ = '\b'; break;
            case 'f': *w++ = '\f'; break;
            case 'n': *w++ = '\n'; break;
            case 'r': *w++ = '\r'; break;
            case 't': *w++ = '\t'; break;
            case 'u': {
                unsigned cp;
                if (!hex4(ps, &cp)) { free(out); return NULL; }
                if (cp >= 0xD800 && cp <= 0xDBFF) {  /* a surrogate pair: \uD8xx\uDCxx */
                    unsigned lo;
                    if (!(ps->end - ps->p >= 2 && ps->p[0] == '\\' && ps->p[1] == 'u')) {
                        fail(ps, "expected a low surrogate after \\u%04X", cp); free(out); return NULL;
                    }
                    ps->p += 2;
                    if (!hex4(ps, &lo)) { free(out); return NULL; }
                    if (lo < 0xDC00 || lo > 0xDFFF) { fail(ps, "expected a low surrogate, got \\u%04X", lo); free(out); return NULL; }
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    fail(ps, "expected a character, got a lone low surrogate \\u%04X", cp); free(out); return NULL;
                } else if (cp == 0) {
                    fail(ps, "expected a string without \\u0000"); free(out); return NULL;
                }
                /* UTF-8; never longer than the 6 or 12 raw characters it came from */
                if (cp < 0x80) *w++ = (char)cp;
                else if (cp < 0x800) { *w++ = (char)(0xC0 | cp >> 6); *w++ = (char)(0x80 | (cp & 0x3F)); }
                else if (cp < 0x10000) {
                    *w++ = (char)(0xE0 | cp >> 12); *w++ = (char)(0x80 | ((cp >> 6) & 0x3F)); *w++ = (char)(0x80 | (cp & 0x3F));
                } else {
                    *w++ = (char)(0xF0 | cp >> 18); *w++ = (char)(0x80 | ((cp >> 12) & 0x3F));
                    *w++ = (char)(0x80 | ((cp >> 6) & 0x3F)); *w++ = (char)(0x80 | (cp & 0x3F));
                }
                break;
            }
            default:
                ps->p--;
                fail(ps, "expected an escape (one of \"\\/bfnrtu), got %s", found(ps));
                free(out);
                return NULL;
        }
    }
    ps->p++;  /* the closing quote */
    *w = '\0';
    *len_out = (size_t)(w - out);
    return out;
}

static int digit(const Parser *ps, const char *q) { return q < ps->end && *q >= '0' && *q <= '9'; }

/* The "C" locale made current for this thread only, so that strtod and printf use '.' as the decimal point
 * whatever setlocale() the embedding program called (a decimal comma would read "0.005" as 0). glibc hands out
 * its static "C" locale object here (no allocation, freelocale a no-op); other C libraries allocate a small one.
 * 0 when it cannot be had (out of memory). */
static int c_locale_enter(locale_t *c, locale_t *old) {
    *c = newlocale(LC_ALL_MASK, "C", (locale_t)0);
    if (*c == (locale_t)0) return 0;
    *old = uselocale(*c);
    return 1;
}

static void c_locale_leave(locale_t c, locale_t old) {
    uselocale(old);
    freelocale(c);
}

static int parse_number(Parser *ps, JsonValue *v) {
    const char *q = ps->p;
    int integer = 1;
    if (q < ps->end && *q == '-') q++;
    if (!digit(ps, q)) { ps->p = q; fail(ps, "expected a digit, got %s", found(ps)); return 0; }
    if (*q == '0') q++;
    else while (digit(ps, q)) q++;
    if (q < ps->end && *q == '.') {
        integer = 0;
        q++;
        if (!digit(ps, q)) { ps->p = q; fail(ps, "expected a digit after '.', got %s", found(ps)); return 0; }
        while (digit(ps, q)) q++;
    }
    if (q < ps->end && (*q == 'e' || *q == 'E')) {
        integer = 0;
        q++;
        if (q < ps->end && (*q == '+' || *q == '-')) q++;
        if (!digit(ps, q)) { ps->p = q; fail(ps, "expected an exponent digit, got %s", found(ps)); return 0; }
        while (digit(ps, q)) q++;
    }
    size_t n = (size_t)(q - ps->p);
    if (n > MAX_NUMBER) { fail(ps, "expected a number of at most %d characters, got %zu", MAX_NUMBER, n); return 0; }
    char text[MAX_NUMBER + 1];
    memcpy(text, ps->p, n);
    text[n] = '\0';
    v->type = JSON_NUMBER;
    locale_t c, old;  /* the text is the JSON grammar, checked above: strtod in the "C" locale reads all of it */
    if (!c_locale_enter(&c, &old)) { fail(ps, "out of memory (the \"C\" locale for numbers)"); return 0; }
    errno = 0;
    v->number = strtod(text, NULL);
    long long i = 0;
    int range = 0;
    if (integer) {
        errno = 0;
        i = strtoll(text, NULL, 10);
        range = errno == ERANGE;
    }
    c_locale_leave(c, old);
    if (!isfinite(v->number)) { fail(ps, "expected a finite number, got %s", text); return 0; }
    if (integer) {
        v->is_integer = !range;
        v->integer = v->is_integer ? i : 0;
    }
    ps->p = q;
    return 1;
}

static JsonValue *parse_value(Parser *ps, int depth);

static JsonValue *new_value(Parser *ps) {
    if (++ps->values > MAX_VALUES) { fail(ps, "expected at most %d values", MAX_VALUES); return NULL; }
    JsonValue *v = calloc(1, sizeof *v);
    if (!v) fail(ps, "out of memory");
    return v;
}

/* Members or elements up to the closing bracket; ps->p is just past the opening one. */
static int parse_container(Parser *ps, JsonValue *v, int depth) {
    int object = v->type == JSON_OBJECT;
    char close = object ? '}' : ']';
    JsonValue **tail = &v->child;
    size_t count = 0;
    skip_space(ps);
    if (ps->p < ps->end && *ps->p == close) { ps->p++; return 1; }
    for (;;) {
        char *key = NULL;
        if (++count > MAX_MEMBERS) { fail(ps, "expected at most %d members or elements", MAX_MEMBERS); return 0; }
        skip_space(ps);
        if (object) {
            size_t key_len;
            if (ps->p >= ps->end || *ps->p != '"') { fail(ps, "expected a member name, got %s", found(ps)); return 0; }
            if (!(key = parse_string(ps, &key_len))) return 0;
            for (JsonValue *m = v->child; m; m = m->next)
                if (strcmp(m->key, key) == 0) { fail(ps, "expected unique member names, got '%.60s' twice", key); free(key); return 0; }
            skip_space(ps);
            if (ps->p >= ps->end || *ps->p != ':') { fail(ps, "expected ':' after a member name, got %s", found(ps)); free(key); return 0; }
            ps->p++;
        }
        JsonValue *item = parse_value(ps, depth + 1);
        if (!item) { free(key); return 0; }
        item->key = key;
        *tail = item;
        tail = &item->next;
        skip_space(ps);
        if (ps->p < ps->end && *ps->p == ',') { ps->p++; continue; }
        if (ps->p < ps->end && *ps->p == close) { ps->p++; return 1; }
        fail(ps, "expected ',' or '%c', got %s", close, found(ps));
        return 0;
    }
}

static JsonValue *parse_value(Parser *ps, int depth) {
    if (depth > MAX_DEPTH) { fail(ps, "expected at most %d nested arrays and objects", MAX_DEPTH); return NULL; }
    skip_space(ps);
    if (ps->p >= ps->end) { fail(ps, "expected a value, got the end of the text"); return NULL; }
    JsonValue *v = new_value(ps);
    if (!v) return NULL;
    int ok = 1;
    char c = *ps->p;
    if (c == '{' || c == '[') {
        v->type = c == '{' ? JSON_OBJECT : JSON_ARRAY;
        ps->p++;
        ok = parse_container(ps, v, depth);
    } else if (c == '"') {
        v->type = JSON_STRING;
        ok = (v->str = parse_string(ps, &v->str_len)) != NULL;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
        ok = parse_number(ps, v);
    } else if (literal(ps, "true")) {
        v->type = JSON_BOOL;
        v->boolean = 1;
    } else if (literal(ps, "false")) {
        v->type = JSON_BOOL;
    } else if (literal(ps, "null")) {
        v->type = JSON_NULL;
    } else {
        fail(ps, "expected a value, got %s", found(ps));
        ok = 0;
    }
    if (!ok) { json_free(v); return NULL; }
    return v;
}

JsonValue *json_parse(const char *text, size_t len, char *err, size_t errlen) {
    Parser ps = {text, text, text + len, err, errlen, 0, 0};
    if (errlen) err[0] = '\0';
    JsonValue *root = parse_value(&ps, 0);
    if (root) {
        skip_space(&ps);
        if (ps.p != ps.end) { fail(&ps, "expected the end of the text, got %s", found(&ps)); json_free(root); root = NULL; }
    }
    return root;
}

void json_free(JsonValue *value) {
    while (value) {
        JsonValue *next = value->next;
        json_free(value->child);
        free(value->key);
        free(value->str);
        free(value);
        value = next;
    }
}

const JsonValue *json_get(const JsonValue *obj, const char *key) {
    if (!obj || obj->type != JSON_OBJECT) return NULL;
    for (const JsonValue *m = obj->child; m; m = m->next)
        if (strcmp(m->key, key) == 0) return m;
    return NULL;
}

int json_vsnprintf_c(char *buf, size_t n, const char *fmt, va_list ap) {
    locale_t c, old;
    if (!c_locale_enter(&c, &old)) {
        if (n) buf[0] = '\0';
        return -1;
    }
    int w = vsnprintf(buf, n, fmt, ap);
    c_locale_leave(c, old);
    return w;
}

int json_snprintf_c(char *buf, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int w = json_vsnprintf_c(buf, n, fmt, ap);
    va_end(ap);
    return w;
}

int json_format_number(double v, char *buf, size_t n) {
    if (!isfinite(v)) return snprintf(buf, n, "null");
    locale_t c, old;
    if (!c_locale_enter(&c, &old)) {
        if (n) buf[0] = '\0';
        return -1;
    }
    int w = 0;
    for (int digits = 15; digits <= 17; digits++) {  /* the shortest that reads back as v: 0.005, not 0.0050000000000000001 */
        w = snprintf(buf, n, "%.*g", digits, v);
        if (w < 0 || (size_t)w >= n || strtod(buf, NULL) == v) break;
    }
    c_locale_leave(c, old);
    return w;
}

const char *json_type_name(const JsonValue *value) {
    if (!value) return "nothing";
    switch (value->type) {
        case JSON_NULL: return "null";
        case JSON_BOOL: return "true or false";
        case JSON_NUMBER: return value->is_integer ? "an integer" : "a number";
        case JSON_STRING: return "a string";
        case JSON_ARRAY: return "an array";
        case JSON_OBJECT: return "an object";
    }
    return "a value";
}
