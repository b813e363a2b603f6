/* A strict JSON reader (RFC 8259) for the machine-written manifest.json, golden/cases.json and the model's config:
 * cJSON (Debian's libcjson1) parses and json.c walks its tree into JsonValue. The text is (pointer, length), never
 * read past its end and never assumed NUL-terminated; depth, size and number length are bounded; duplicate keys,
 * \u0000, control characters and trailing text are refused. Numbers are read in the "C" locale (thread-local
 * uselocale around cJSON), so a program that called setlocale(LC_ALL, "") under a decimal-comma locale (de_DE) still
 * reads 0.005 as 0.005. cJSON records a failed parse in a global of its own as well (unread here): json_parse from
 * two threads at once races on it. */
#ifndef MHA_JSON_H
#define MHA_JSON_H

#include <stdarg.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } JsonType;

typedef struct JsonValue {
    JsonType type;
    char *key;               /* the member name when inside an object (decoded, NUL-terminated) */
    char *str;               /* JSON_STRING: decoded UTF-8, NUL-terminated */
    size_t str_len;
    double number;           /* JSON_NUMBER */
    int is_integer;          /* written without fraction or exponent, and within long long */
    long long integer;
    int boolean;             /* JSON_BOOL */
    struct JsonValue *child; /* first element or member */
    struct JsonValue *next;  /* next sibling */
} JsonValue;

/* The parsed document, or NULL with one line in err ("expected ..., got ...", and "at byte N" where known). */
JsonValue *json_parse(const char *text, size_t len, char *err, size_t errlen);
void json_free(JsonValue *value);
/* obj[key], or NULL when obj is not an object or has no such member. */
const JsonValue *json_get(const JsonValue *obj, const char *key);
/* Whether two parsed values are the same JSON: numbers by value (1 and 1.0 alike), strings by their bytes, arrays
 * element by element, objects member by member whatever their order. */
int json_equal(const JsonValue *a, const JsonValue *b);
/* snprintf in the "C" locale ('.' as the decimal point, whatever setlocale chose), for JSON output and for
 * lines other programs parse; -1 (and "") when that locale cannot be had. Thread-safe (uselocale). */
int json_snprintf_c(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int json_vsnprintf_c(char *buf, size_t n, const char *fmt, va_list ap) __attribute__((format(printf, 3, 0)));
/* v as a JSON number in the "C" locale, the shortest of %.15g..%.17g that reads back as v; "null" when v is
 * not finite (JSON has no inf or nan). snprintf's value, or -1 (and "") when the locale cannot be had. */
int json_format_number(double v, char *buf, size_t n);
/* "an object", "a string", ... for error messages. */
const char *json_type_name(const JsonValue *value);

#ifdef __cplusplus
}
#endif
#endif
