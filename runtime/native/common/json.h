/* A small, strict JSON reader (RFC 8259) for the machine-written manifest.json and the model's config:
 * the text is (pointer, length), never read past its end and never assumed NUL-terminated; depth, size and
 * number length are bounded; duplicate keys, \u0000 and trailing text are refused. */
#ifndef MHA_JSON_H
#define MHA_JSON_H

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

/* The parsed document, or NULL with one line in err ("expected ..., got ... at byte N"). */
JsonValue *json_parse(const char *text, size_t len, char *err, size_t errlen);
void json_free(JsonValue *value);
/* obj[key], or NULL when obj is not an object or has no such member. */
const JsonValue *json_get(const JsonValue *obj, const char *key);
/* "an object", "a string", ... for error messages. */
const char *json_type_name(const JsonValue *value);

#ifdef __cplusplus
}
#endif
#endif
