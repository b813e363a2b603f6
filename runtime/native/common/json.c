/* See json.h. cJSON parses; a short walk over its tree copies it into JsonValue and enforces what cJSON lets through:
 * duplicate member names, nesting depth, members per container, and the number text (cJSON keeps only a double), read
 * from the source by a scan that also refuses control characters and \u0000. cJSON 1.7.18 (Debian trixie's libcjson1,
 * fetched by runtime/native/c/fetch_debs.sh) accepts, and this file refuses: leading zeros, "1.", "-.5", numbers past
 * the double range (it makes them inf), duplicate names, \u0000 (it cuts the string there), control characters in a
 * string or between tokens (it skips every byte <= 0x20 as white space), a leading UTF-8 byte order mark, and text
 * after the value. It refuses by itself +1, .5, NaN, Infinity, comments, trailing commas, bad escapes and lone
 * surrogates; invalid UTF-8 in a string passes, as it did before cJSON. */
#define _POSIX_C_SOURCE 200809L  /* newlocale, uselocale, freelocale, strdup */
#include "json.h"

#include <cjson/cJSON.h>
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
    const char *start, *p, *end;  /* the text, and how far the scan for the next number has read it */
    char *err;
    size_t errlen;
    int failed;
} Walk;

static void fail(Walk *w, const char *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(Walk *w, const char *at, const char *fmt, ...) {  /* at: where in the text, or NULL */
    if (w->failed) return;
    w->failed = 1;
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (at) snprintf(w->err, w->errlen, "%s at byte %zu", what, (size_t)(at - w->start));
    else snprintf(w->err, w->errlen, "%s", what);
}

/* What the text holds at q, for "expected X, got Y". */
static const char *found(const Walk *w, const char *q) {
    if (q >= w->end) return "the end of the text";
    unsigned char c = (unsigned char)*q;
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

static int digit(const char *q, const char *end) { return q < end && *q >= '0' && *q <= '9'; }
static int hex_digit(char c) { return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'); }

/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? is all of [q, end); *integer: no fraction and no exponent. */
static int json_number(const char *q, const char *end, int *integer) {
    *integer = 1;
    if (q < end && *q == '-') q++;
    if (!digit(q, end)) return 0;
    if (*q == '0') q++;
    else while (digit(q, end)) q++;
    if (q < end && *q == '.') {
        *integer = 0;
        if (!digit(++q, end)) return 0;
        while (digit(q, end)) q++;
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
        *integer = 0;
        if (++q < end && (*q == '+' || *q == '-')) q++;
        if (!digit(q, end)) return 0;
        while (digit(q, end)) q++;
    }
    return q == end;
}

/* The text of the next number after w->p: numbers come in the order of cJSON's tree. On the way, no control character
 * in a string, no \u0000 and nothing outside a string that JSON's grammar lacks (cJSON skips it as white space). 1 and
 * [*num, *num + *len), 0 at the end of the text, -1 on an error. The text is one cJSON accepted: strings end. */
static int next_number(Walk *w, const char **num, size_t *len) {
    for (; w->p < w->end; w->p++) {
        unsigned char c = (unsigned char)*w->p;
        if (c == '"') {
            for (w->p++; w->p < w->end && *w->p != '"'; w->p++) {
                if ((unsigned char)*w->p < 0x20) {
                    fail(w, w->p, "expected a string character, got a control character");
                    return -1;
                }
                if (*w->p != '\\') continue;
                if (++w->p == w->end || *w->p != 'u') continue;  /* the escaped character: cJSON checked it */
                /* cJSON reads \u0000, and \u with a non-hex digit, as a '\0' that cuts the string */
                int hex = 0;
                while (hex < 4 && w->p + 1 + hex < w->end && hex_digit(w->p[1 + hex])) hex++;
                if (hex < 4) { fail(w, w->p - 1, "expected 4 hex digits after \\u"); return -1; }
                if (memcmp(w->p + 1, "0000", 4) == 0) { fail(w, w->p - 1, "expected a string without \\u0000"); return -1; }
            }
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            const char *q = w->p;
            while (q < w->end && (digit(q, w->end) || *q == '.' || *q == 'e' || *q == 'E' || *q == '+' || *q == '-')) q++;
            *num = w->p;
            *len = (size_t)(q - w->p);
            w->p = q;
            return 1;
        } else if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c >= 0x80) {
            fail(w, w->p, "expected a value, got %s", found(w, w->p));
            return -1;
        }
    }
    return 0;
}

static JsonValue *convert(Walk *w, const cJSON *item, int depth);

/* A number's JsonValue from its text: cJSON's double, and the integer when the text is one. */
static int number(Walk *w, const cJSON *item, JsonValue *v) {
    const char *text;
    size_t n;
    int integer;
    if (next_number(w, &text, &n) != 1) { fail(w, NULL, "expected a number in the text, found none"); return 0; }
    if (n > MAX_NUMBER) { fail(w, text, "expected a number of at most %d characters, got %zu", MAX_NUMBER, n); return 0; }
    if (!json_number(text, text + n, &integer)) { fail(w, text, "expected a JSON number, got %.*s", (int)n, text); return 0; }
    if (!isfinite(item->valuedouble)) { fail(w, text, "expected a finite number, got %.*s", (int)n, text); return 0; }
    v->type = JSON_NUMBER;
    v->number = item->valuedouble;
    if (integer) {
        char copy[MAX_NUMBER + 1];
        memcpy(copy, text, n);
        copy[n] = '\0';
        errno = 0;
        long long i = strtoll(copy, NULL, 10);
        v->is_integer = errno != ERANGE;
        v->integer = v->is_integer ? i : 0;
    }
    return 1;
}

/* The elements or members of a container, with unique names. */
static int children(Walk *w, const cJSON *item, JsonValue *v, int depth) {
    JsonValue **tail = &v->child;
    size_t count = 0;
    for (const cJSON *c = item->child; c; c = c->next) {
        if (++count > MAX_MEMBERS) { fail(w, NULL, "expected at most %d members or elements", MAX_MEMBERS); return 0; }
        if (v->type == JSON_OBJECT)
            for (const JsonValue *m = v->child; m; m = m->next)
                if (strcmp(m->key, c->string) == 0) {
                    fail(w, NULL, "expected unique member names, got '%.60s' twice", c->string);
                    return 0;
                }
        JsonValue *e = convert(w, c, depth + 1);
        if (!e) return 0;
        *tail = e;
        tail = &e->next;
        if (v->type == JSON_OBJECT && !(e->key = strdup(c->string))) { fail(w, NULL, "out of memory"); return 0; }
    }
    return 1;
}

static JsonValue *convert(Walk *w, const cJSON *item, int depth) {
    if (depth > MAX_DEPTH) { fail(w, NULL, "expected at most %d nested arrays and objects", MAX_DEPTH); return NULL; }
    JsonValue *v = calloc(1, sizeof *v);
    if (!v) { fail(w, NULL, "out of memory"); return NULL; }
    int ok = 1;
    if (cJSON_IsObject(item) || cJSON_IsArray(item)) {
        v->type = cJSON_IsObject(item) ? JSON_OBJECT : JSON_ARRAY;
        ok = children(w, item, v, depth);
    } else if (cJSON_IsString(item)) {
        v->type = JSON_STRING;
        if (!(v->str = strdup(item->valuestring))) { fail(w, NULL, "out of memory"); ok = 0; }
        else v->str_len = strlen(v->str);  /* whole: the scan refuses \u0000 */
    } else if (cJSON_IsNumber(item)) {
        ok = number(w, item, v);
    } else if (cJSON_IsBool(item)) {
        v->type = JSON_BOOL;
        v->boolean = cJSON_IsTrue(item);
    }  /* else null (cJSON_Raw and cJSON_Invalid are not parsed) */
    if (!ok) { json_free(v); return NULL; }
    return v;
}

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

JsonValue *json_parse(const char *text, size_t len, char *err, size_t errlen) {
    Walk w = {text, text, text + len, err, errlen, 0};
    if (errlen) err[0] = '\0';
    size_t values = 0;  /* cJSON builds the whole tree first: bound it by the commas and brackets (in strings too) */
    for (size_t i = 0; i < len; i++) values += text[i] == ',' || text[i] == '[' || text[i] == '{';
    if (values >= MAX_VALUES) { fail(&w, NULL, "expected at most %d values", MAX_VALUES); return NULL; }
    locale_t c, old;  /* cJSON's strtod, and strtoll here, in the "C" locale */
    if (!c_locale_enter(&c, &old)) { fail(&w, NULL, "out of memory (the \"C\" locale for numbers)"); return NULL; }
    const char *end = NULL;  /* bounded by len: no read past it (measured with the text against a guard page) */
    cJSON *tree = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    JsonValue *root = NULL;
    if (!tree) {  /* cJSON says where it stopped, not why: at the byte, or one past it in a string or member name */
        fail(&w, NULL, "expected JSON, got a syntax error near byte %zu", end ? (size_t)(end - text) : 0);
    } else {
        const char *rest = end;  /* the text after the value: white space only */
        while (rest < w.end && (*rest == ' ' || *rest == '\t' || *rest == '\n' || *rest == '\r')) rest++;
        if (rest < w.end) fail(&w, rest, "expected the end of the text, got %s", found(&w, rest));
        else root = convert(&w, tree, 0);
        const char *num;  /* the rest of the text, after the last number */
        size_t n;
        int more = root ? next_number(&w, &num, &n) : 0;
        if (more == 1) fail(&w, num, "expected no number that cJSON did not read, got %.*s", (int)n, num);
        if (more) { json_free(root); root = NULL; }
        cJSON_Delete(tree);
    }
    c_locale_leave(c, old);
    return root;
}

static size_t json_count(const JsonValue *v) {
    size_t k = 0;
    for (const JsonValue *c = v->child; c; c = c->next) k++;
    return k;
}

int json_equal(const JsonValue *a, const JsonValue *b) {
    if (!a || !b || a->type != b->type) return a == b;
    switch (a->type) {
    case JSON_NULL: return 1;
    case JSON_BOOL: return !a->boolean == !b->boolean;
    case JSON_NUMBER: return a->is_integer && b->is_integer ? a->integer == b->integer : a->number == b->number;
    case JSON_STRING: return a->str_len == b->str_len && memcmp(a->str, b->str, a->str_len) == 0;
    case JSON_ARRAY: {
        const JsonValue *x = a->child, *y = b->child;
        for (; x && y; x = x->next, y = y->next)
            if (!json_equal(x, y)) return 0;
        return !x && !y;
    }
    case JSON_OBJECT:  /* keys are unique (json_parse refuses duplicates): same count, each found equal */
        if (json_count(a) != json_count(b)) return 0;
        for (const JsonValue *x = a->child; x; x = x->next)
            if (!json_equal(x, json_get(b, x->key))) return 0;
        return 1;
    }
    return 0;
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
