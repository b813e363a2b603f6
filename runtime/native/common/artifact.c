/* See artifact.h. */
#define _POSIX_C_SOURCE 200809L
#include "artifact.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sha256.h"

#define MAX_MANIFEST ((size_t)16 << 20)

static const char *const CONFIG_KEYS[4] = {"d_in", "d_out", "num_heads", "context_length"};

static long long *config_slot(MhaConfig *c, int i) {
    long long *slots[4] = {&c->d_in, &c->d_out, &c->num_heads, &c->context_length};
    return slots[i];
}

int mha_config_from(const JsonValue *config, const char *where, MhaConfig *c, char *err, size_t n) {
    if (!config || config->type != JSON_OBJECT) {
        snprintf(err, n, "%s: expected a config object, got %s", where, json_type_name(config));
        return MHA_ERROR;
    }
    for (int i = 0; i < 4; i++) {
        const JsonValue *v = json_get(config, CONFIG_KEYS[i]);
        if (!v) {
            snprintf(err, n, "%s: expected an integer field '%s', found none", where, CONFIG_KEYS[i]);
            return MHA_ERROR;
        }
        if (v->type != JSON_NUMBER || !v->is_integer || v->integer < 1 || v->integer > MHA_MAX_DIM) {
            if (v->type == JSON_NUMBER)
                snprintf(err, n, "%s: expected '%s' an integer from 1 to %lld, got %.17g", where, CONFIG_KEYS[i],
                         MHA_MAX_DIM, v->number);
            else
                snprintf(err, n, "%s: expected '%s' an integer from 1 to %lld, got %s", where, CONFIG_KEYS[i],
                         MHA_MAX_DIM, json_type_name(v));
            return MHA_ERROR;
        }
        *config_slot(c, i) = v->integer;
    }
    if (c->num_heads * c->d_out > MHA_MAX_DIM) {
        snprintf(err, n, "%s: expected num_heads * d_out <= %lld, got %lld", where, MHA_MAX_DIM, c->num_heads * c->d_out);
        return MHA_ERROR;
    }
    return MHA_OK;
}

int mha_config_parse(const char *text, size_t len, const char *where, MhaConfig *c, char *err, size_t n) {
    char why[256];
    JsonValue *root = json_parse(text, len, why, sizeof why);
    if (!root) {
        snprintf(err, n, "%s: expected JSON, got a parse error (%s)", where, why);
        return MHA_ERROR;
    }
    int rc = mha_config_from(root, where, c, err, n);
    json_free(root);
    return rc;
}

int mha_config_same(const MhaConfig *model, const char *model_where, const MhaConfig *manifest,
                    const char *manifest_where, char *err, size_t n) {
    for (int i = 0; i < 4; i++) {
        long long a = *config_slot((MhaConfig *)model, i), b = *config_slot((MhaConfig *)manifest, i);
        if (a != b) {
            snprintf(err, n, "%s says %s=%lld, %s says %lld; the model does not belong to this folder", model_where,
                     CONFIG_KEYS[i], a, manifest_where, b);
            return MHA_ERROR;
        }
    }
    return MHA_OK;
}

/* A file name inside the artifact folder: no absolute path, no '.', '..' or empty part, no backslash. */
int mha_plain_name(const char *name) {
    if (!name[0] || name[0] == '/' || strchr(name, '\\')) return 0;
    for (const char *part = name; part;) {
        const char *slash = strchr(part, '/');
        size_t len = slash ? (size_t)(slash - part) : strlen(part);
        if (len == 0 || (len == 1 && part[0] == '.') || (len == 2 && part[0] == '.' && part[1] == '.')) return 0;
        part = slash ? slash + 1 : NULL;
    }
    return 1;
}

static int hex64(const char *s, size_t len) {
    if (len != 64) return 0;
    for (size_t i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

int mha_manifest_files(const JsonValue *files, const char *where, MhaManifest *m, char *err, size_t n) {
    if (!files || files->type != JSON_OBJECT) {
        snprintf(err, n, "%s: expected a 'files' object, got %s", where, json_type_name(files));
        return MHA_ERROR;
    }
    size_t count = 0;
    for (const JsonValue *f = files->child; f; f = f->next) count++;
    m->files = calloc(count ? count : 1, sizeof *m->files);
    if (!m->files) { snprintf(err, n, "%s: out of memory", where); return MHA_ERROR; }
    for (const JsonValue *f = files->child; f; f = f->next) {
        const JsonValue *size = json_get(f, "size"), *sha = json_get(f, "sha256");
        if (!mha_plain_name(f->key)) {
            snprintf(err, n, "%s: files: expected a file name inside the artifact folder, got '%.100s'", where, f->key);
            return MHA_ERROR;
        }
        if (!size || size->type != JSON_NUMBER || !size->is_integer || size->integer < 0 ||
            (unsigned long long)size->integer > MHA_MAX_FILE) {
            snprintf(err, n, "%s: files.%.100s: expected 'size' an integer from 0 to %zu, got %s", where, f->key,
                     MHA_MAX_FILE, size && size->type == JSON_NUMBER ? "another number" : json_type_name(size));
            return MHA_ERROR;
        }
        if (!sha || sha->type != JSON_STRING || !hex64(sha->str, sha->str_len)) {
            snprintf(err, n, "%s: files.%.100s: expected 'sha256' of 64 lowercase hex digits, got %s", where, f->key,
                     sha && sha->type == JSON_STRING ? "another string" : json_type_name(sha));
            return MHA_ERROR;
        }
        MhaFile *out = &m->files[m->nfiles];
        if (!(out->name = strdup(f->key))) { snprintf(err, n, "%s: out of memory", where); return MHA_ERROR; }
        out->size = size->integer;
        memcpy(out->sha256, sha->str, 65);
        m->nfiles++;
    }
    return MHA_OK;
}

int mha_manifest_parse(const char *text, size_t len, const char *where, MhaManifest *m, char *err, size_t n) {
    memset(m, 0, sizeof *m);
    snprintf(m->path, sizeof m->path, "%s", where);
    char why[256], at[512];
    JsonValue *root = json_parse(text, len, why, sizeof why);
    if (!root) {
        snprintf(err, n, "%s: expected JSON, got a parse error (%s)", where, why);
        return MHA_ERROR;
    }
    int rc = MHA_ERROR;
    const JsonValue *format = json_get(root, "format"), *files = json_get(root, "files");
    if (root->type != JSON_OBJECT) {
        snprintf(err, n, "%s: expected a JSON object, got %s", where, json_type_name(root));
        goto done;
    }
    if (!format || format->type != JSON_NUMBER || !format->is_integer || format->integer != MHA_MANIFEST_FORMAT) {
        snprintf(err, n, "%s: expected manifest format %d, got %s (re-export the folder with this version's `mha export`)",
                 where, MHA_MANIFEST_FORMAT, format && format->type == JSON_NUMBER ? "another number" : json_type_name(format));
        goto done;
    }
    snprintf(at, sizeof at, "%s: config", where);
    if (mha_config_from(json_get(root, "config"), at, &m->config, err, n)) goto done;
    if (mha_manifest_files(files, where, m, err, n)) goto done;
    rc = MHA_OK;
done:
    json_free(root);
    if (rc != MHA_OK) mha_manifest_free(m);
    return rc;
}

int mha_join(char *out, size_t size, const char *a, const char *b, char *err, size_t n) {
    int w = snprintf(out, size, "%s/%s", a, b);
    if (w < 0 || (size_t)w >= size) {
        snprintf(err, n, "%.100s/%.100s...: expected a path shorter than %zu bytes", a, b, size);
        return MHA_ERROR;
    }
    return MHA_OK;
}

/* Every byte of data to fd; -1 (errno set) when a write fails. */
static int write_all(int fd, const void *data, size_t len) {
    for (size_t done = 0; done < len;) {
        ssize_t w = write(fd, (const char *)data + done, len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        done += (size_t)w;
    }
    return 0;
}

int mha_write_atomically(const char *path, const void *data, size_t len, char *err, size_t n) {
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
        /* A FIFO or a device (/dev/stdout, /dev/full): written through, never replaced, as the Python and Node runners
         * write it (the rename made a regular file of the device, for a user who may write in /dev) */
        int fd = open(path, O_WRONLY);
        int bad = fd < 0 || write_all(fd, data, len) != 0;
        int saved = errno;
        if (fd >= 0 && close(fd) != 0 && !bad) {
            bad = 1;
            saved = errno;
        }
        if (bad) snprintf(err, n, "%s: cannot write it (%s)", path, strerror(saved));
        return bad ? MHA_ERROR : MHA_OK;
    }
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.XXXXXX", path) >= (int)sizeof tmp) {
        snprintf(err, n, "%.200s...: expected a shorter output path", path);
        return MHA_ERROR;
    }
    int fd = mkstemp(tmp);
    if (fd < 0) {
        snprintf(err, n, "%s: cannot create a temporary file beside it (%s)", path, strerror(errno));
        return MHA_ERROR;
    }
    mode_t mask = umask(0);  /* mkstemp makes 0600; give the file the mode a plain fopen would */
    umask(mask);
    int bad = fchmod(fd, 0666 & ~mask) != 0 || write_all(fd, data, len) != 0;
    bad = close(fd) != 0 || bad;
    if (!bad) bad = rename(tmp, path) != 0;
    if (bad) {
        snprintf(err, n, "%s: cannot write it (%s)", path, strerror(errno));
        remove(tmp);
    }
    return bad ? MHA_ERROR : MHA_OK;
}

int mha_make_parents(const char *path, char *err, size_t n) {
    char dir[4096];
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir) {
        snprintf(err, n, "%.200s...: expected a path shorter than %zu bytes", path, sizeof dir);
        return MHA_ERROR;
    }
    for (char *p = dir + 1; *p; p++) {  /* each folder on the way; the last part is the file itself */
        if (*p != '/') continue;
        *p = '\0';
        struct stat st;
        if (mkdir(dir, 0777) != 0 && errno != EEXIST && !(stat(dir, &st) == 0 && S_ISDIR(st.st_mode))) {
            snprintf(err, n, "%s: cannot make the folder (%s)", dir, strerror(errno));
            return MHA_ERROR;
        }
        *p = '/';
    }
    return MHA_OK;
}

int mha_manifest_load(const char *dir, MhaManifest *m, char *err, size_t n) {
    char path[4096];
    memset(m, 0, sizeof *m);
    if (mha_join(path, sizeof path, dir, "manifest.json", err, n)) return MHA_ERROR;
    struct stat st;
    if (stat(path, &st) != 0 && errno == ENOENT) {
        snprintf(err, n, "%s: expected a manifest (made by `mha export`), found none", path);
        return MHA_MISSING;
    }
    unsigned char *text;
    size_t len;
    if (mha_read_file(path, &text, &len, err, n)) return MHA_ERROR;
    if (len > MAX_MANIFEST) {
        snprintf(err, n, "%s: expected a manifest of at most %zu bytes, got %zu", path, MAX_MANIFEST, len);
        free(text);
        return MHA_ERROR;
    }
    int rc = mha_manifest_parse((const char *)text, len, path, m, err, n);
    free(text);
    return rc;
}

void mha_manifest_free(MhaManifest *m) {
    for (size_t i = 0; i < m->nfiles; i++) free(m->files[i].name);
    free(m->files);
    m->files = NULL;
    m->nfiles = 0;
}

const MhaFile *mha_manifest_find(const MhaManifest *m, const char *name) {
    for (size_t i = 0; i < m->nfiles; i++)
        if (strcmp(m->files[i].name, name) == 0) return &m->files[i];
    return NULL;
}

int mha_read_file(const char *path, unsigned char **data, size_t *len, char *err, size_t n) {
    *data = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_NONBLOCK);  /* a FIFO is refused below, not waited on for a writer */
    if (fd < 0) {
        int why = errno;
        snprintf(err, n, "%s: expected a readable file, got: %s", path, strerror(why));
        return why == ENOENT ? MHA_MISSING : MHA_ERROR;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, n, "%s: expected a regular file", path);
        close(fd);
        return MHA_ERROR;
    }
    if ((unsigned long long)st.st_size > MHA_MAX_FILE) {
        snprintf(err, n, "%s: expected at most %zu bytes, found %lld", path, MHA_MAX_FILE, (long long)st.st_size);
        close(fd);
        return MHA_ERROR;
    }
    size_t size = (size_t)st.st_size, got = 0;
    unsigned char *buf = malloc(size ? size : 1);
    if (!buf) { snprintf(err, n, "%s: out of memory for %zu bytes", path, size); close(fd); return MHA_ERROR; }
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    unsigned char extra;
    ssize_t more = got == size ? read(fd, &extra, 1) : 0;
    close(fd);
    if (got != size || more != 0) {  /* changed while we read it */
        snprintf(err, n, "%s: expected %zu bytes, read %s while reading", path, size, got != size ? "fewer" : "more");
        free(buf);
        return MHA_ERROR;
    }
    *data = buf;
    *len = size;
    return MHA_OK;
}

int mha_read_verified(const MhaManifest *m, const char *dir, const char *name, unsigned char **data, size_t *len,
                      char *err, size_t n) {
    char path[4096];
    *data = NULL;
    *len = 0;
    const MhaFile *entry = mha_manifest_find(m, name);
    if (!entry) {
        snprintf(err, n, "%s: expected it listed in %s, found no entry", name, m->path);
        return MHA_ERROR;
    }
    if (mha_join(path, sizeof path, dir, name, err, n)) return MHA_ERROR;
    int rc = mha_read_file(path, data, len, err, n);
    if (rc == MHA_MISSING) snprintf(err, n, "%s: listed in the manifest but missing", path);
    if (rc) return MHA_ERROR;
    char hex[65];
    if ((unsigned long long)*len != (unsigned long long)entry->size) {
        snprintf(err, n, "%s: expected %lld bytes (manifest), found %zu; file truncated or replaced: re-export it with "
                 "`mha export`", path, entry->size, *len);
    } else {
        sha256_hex(*data, *len, hex);
        if (strcmp(hex, entry->sha256) == 0) return MHA_OK;
        snprintf(err, n, "%s: sha256 %.12s... differs from the manifest's %.12s...; the file was altered: re-export it "
                 "with `mha export`", path, hex, entry->sha256);
    }
    free(*data);
    *data = NULL;
    *len = 0;
    return MHA_ERROR;
}

int mha_floats(const unsigned char *bytes, size_t len, size_t count, const char *where, float **out, char *err,
               size_t n) {
    *out = NULL;
    if (count > SIZE_MAX / 4 || len != count * 4) {
        snprintf(err, n, "%s: expected %zu float32 values (%zu bytes), found %zu bytes", where, count,
                 count > SIZE_MAX / 4 ? SIZE_MAX : count * 4, len);
        return MHA_ERROR;
    }
    float *values = malloc(count ? count * sizeof(float) : 1);
    if (!values) { snprintf(err, n, "%s: out of memory for %zu values", where, count); return MHA_ERROR; }
    for (size_t i = 0; i < count; i++) {  /* little-endian on disk, whatever the host */
        const unsigned char *b = bytes + 4 * i;
        uint32_t bits = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
        memcpy(&values[i], &bits, 4);
        if (!isfinite(values[i])) {
            snprintf(err, n, "%s: expected finite float32 values, found %s at index %zu", where,
                     isnan(values[i]) ? "nan" : values[i] > 0 ? "inf" : "-inf", i);
            free(values);
            return MHA_ERROR;
        }
    }
    *out = values;
    return MHA_OK;
}

/* --- golden/cases.json ------------------------------------------------------------------------------------ */

/* A short rendering of a JSON value for messages: 3, 0.5, "text", null, an array. */
static const char *shown_value(const JsonValue *v, char *buf, size_t size) {
    if (!v) snprintf(buf, size, "nothing");
    else if (v->type == JSON_NUMBER && v->is_integer) snprintf(buf, size, "%lld", v->integer);
    else if (v->type == JSON_NUMBER) json_format_number(v->number, buf, size);
    else if (v->type == JSON_STRING) {
        size_t len = strcspn(v->str, "\n\r");  /* one line */
        snprintf(buf, size, "\"%.*s%s\"", (int)(len > 30 ? 30 : len), v->str, len > 30 || v->str[len] ? "..." : "");
    } else if (v->type == JSON_BOOL) snprintf(buf, size, "%s", v->boolean ? "true" : "false");
    else snprintf(buf, size, "%s", json_type_name(v));
    return buf;
}

/* The elements of an array (or NULL), counted in *count. */
static const JsonValue **elements(const JsonValue *array, size_t *count) {
    *count = 0;
    for (const JsonValue *e = array->child; e; e = e->next) (*count)++;
    const JsonValue **out = calloc(*count ? *count : 1, sizeof *out);
    if (!out) return NULL;
    size_t i = 0;
    for (const JsonValue *e = array->child; e; e = e->next) out[i++] = e;
    return out;
}

/* obj[key] when it is the string want, or absent. */
static int absent_or(const JsonValue *obj, const char *key, const char *want, const char *where, char *err, size_t n) {
    const JsonValue *v = json_get(obj, key);
    char shown[64];
    if (!v || (v->type == JSON_STRING && strcmp(v->str, want) == 0)) return MHA_OK;
    snprintf(err, n, "%s: expected '%s' \"%s\", got %s", where, key, want, shown_value(v, shown, sizeof shown));
    return MHA_ERROR;
}

int mha_cases_parse(const char *text, size_t len, const char *where, const MhaConfig *cfg, MhaCases *doc, char *err,
                    size_t n) {
    memset(doc, 0, sizeof *doc);
    snprintf(doc->path, sizeof doc->path, "%s", where);
    if (len > MHA_MAX_CASES_FILE) {
        snprintf(err, n, "%s: expected at most %zu bytes, got %zu", where, MHA_MAX_CASES_FILE, len);
        return MHA_ERROR;
    }
    char why[256], at[512];
    JsonValue *root = json_parse(text, len, why, sizeof why);
    if (!root) {
        snprintf(err, n, "%s: expected JSON, got a parse error (%s)", where, why);
        return MHA_ERROR;
    }
    doc->root = root;
    const JsonValue *format = json_get(root, "format"), *cases = json_get(root, "cases");
    const JsonValue *artifacts = json_get(root, "artifacts"), *config = json_get(root, "config");
    if (root->type != JSON_OBJECT) {
        snprintf(err, n, "%s: expected a JSON object, got %s", where, json_type_name(root));
        goto fail;
    }
    if (!format || format->type != JSON_NUMBER || !format->is_integer || format->integer != MHA_CASES_FORMAT) {
        snprintf(err, n, "%s: expected 'format' %d, got %s (re-export the folder with this version's `mha export`)",
                 where, MHA_CASES_FORMAT, format && format->type == JSON_NUMBER ? "another number" : json_type_name(format));
        goto fail;
    }
    if (!cases || cases->type != JSON_ARRAY || !artifacts || artifacts->type != JSON_ARRAY) {
        snprintf(err, n, "%s: expected an object with 'cases' and 'artifacts' arrays, got %s and %s", where,
                 json_type_name(cases), json_type_name(artifacts));
        goto fail;
    }
    if (absent_or(root, "dtype", "float32", where, err, n) || absent_or(root, "byte_order", "little", where, err, n) ||
        absent_or(root, "input", "x", where, err, n) || absent_or(root, "output", "context", where, err, n))
        goto fail;
    if (config) {  /* the fixtures' own record of the config: the manifest's, or they belong elsewhere */
        MhaConfig own;
        snprintf(at, sizeof at, "%s: config", where);
        if (mha_config_from(config, at, &own, err, n)) goto fail;
        for (int i = 0; i < 4; i++)
            if (*config_slot(&own, i) != *config_slot((MhaConfig *)cfg, i)) {
                snprintf(err, n, "%s says %s=%lld, the manifest says %lld; the fixtures do not belong to this folder", at,
                         CONFIG_KEYS[i], *config_slot(&own, i), *config_slot((MhaConfig *)cfg, i));
                goto fail;
            }
    }
    if (!(doc->cases = elements(cases, &doc->ncases)) || !(doc->artifacts = elements(artifacts, &doc->nartifacts))) {
        snprintf(err, n, "%s: out of memory", where);
        goto fail;
    }
    if (doc->ncases && doc->nartifacts > MHA_MAX_PAIRS / doc->ncases) {
        snprintf(err, n, "%s: expected at most %d (artifact, case) pairs, got %zu artifacts * %zu cases", where,
                 MHA_MAX_PAIRS, doc->nartifacts, doc->ncases);
        goto fail;
    }
    return MHA_OK;
fail:
    mha_cases_free(doc);
    return MHA_ERROR;
}

void mha_cases_free(MhaCases *doc) {
    json_free(doc->root);
    free(doc->cases);
    free(doc->artifacts);
    doc->root = NULL;
    doc->cases = doc->artifacts = NULL;
    doc->ncases = doc->nartifacts = 0;
}

/* obj[key] as a string of 1 to size - 1 bytes without control characters, copied into dst. */
static int string_field(const JsonValue *obj, const char *key, const char *where, char *dst, size_t size, char *err,
                        size_t n) {
    const JsonValue *v = json_get(obj, key);
    if (!v || v->type != JSON_STRING) {
        snprintf(err, n, "%s: expected a string '%s', got %s", where, key, json_type_name(v));
        return 0;
    }
    if (v->str_len == 0 || v->str_len >= size) {
        snprintf(err, n, "%s: %s: expected 1 to %zu characters, got %zu", where, key, size - 1, v->str_len);
        return 0;
    }
    for (size_t i = 0; i < v->str_len; i++)  /* every FAIL line stays one line */
        if ((unsigned char)v->str[i] < 0x20 || v->str[i] == 0x7f) {
            snprintf(err, n, "%s: %s: expected no control characters, got one at byte %zu", where, key, i);
            return 0;
        }
    memcpy(dst, v->str, v->str_len + 1);
    return 1;
}

/* A number >= 0 (JSON numbers are finite: json.c refuses 1e999). */
static int tolerance_number(const JsonValue *v) { return v && v->type == JSON_NUMBER && v->number >= 0; }

/* [a, b, c] of integers. */
static int shape3(const JsonValue *v, long long out[3]) {
    if (!v || v->type != JSON_ARRAY) return 0;
    int i = 0;
    for (const JsonValue *e = v->child; e; e = e->next, i++) {
        if (i == 3 || e->type != JSON_NUMBER || !e->is_integer) return 0;
        out[i] = e->integer;
    }
    return i == 3;
}

static int parse_schedule(const JsonValue *s, MhaCase *c, char *err, size_t n) {
    char full[64] = "", shown[48], one[48];
    size_t used = 0, count = 0;
    for (const JsonValue *e = s && s->type == JSON_ARRAY ? s->child : NULL; e; e = e->next) {
        count++;
        if (used <= 40) {  /* enough for the first 40 characters, as the message shows them */
            int w = snprintf(full + used, sizeof full - used, "%s%s", used ? "," : "", shown_value(e, one, sizeof one));
            used = w < 0 || (size_t)w >= sizeof full - used ? sizeof full - 1 : used + (size_t)w;
        }
    }
    if (!s || s->type != JSON_ARRAY) shown_value(s, full, sizeof full);
    snprintf(shown, sizeof shown, "%.40s%s", full, strlen(full) > 40 ? "..." : "");
    if (!s || s->type != JSON_ARRAY || count == 0) {
        snprintf(err, n, "schedule %s: expected a list of chunks", shown);
        return MHA_ERROR;
    }
    if (count > (size_t)c->tokens) {
        snprintf(err, n, "schedule %s: expected at most tokens=%lld chunks, got %zu", shown, c->tokens, count);
        return MHA_ERROR;
    }
    c->schedule = calloc(count, sizeof *c->schedule);
    if (!c->schedule) { snprintf(err, n, "schedule: out of memory"); return MHA_ERROR; }
    long long total = 0;  /* at most tokens chunks of at most tokens each: no overflow */
    for (const JsonValue *e = s->child; e; e = e->next) {
        if (e->type != JSON_NUMBER || !e->is_integer || e->integer < 1 || e->integer > c->tokens) {
            snprintf(err, n, "schedule %s: expected chunks of 1 to tokens=%lld tokens, got '%s'", shown, c->tokens,
                     shown_value(e, one, sizeof one));
            return MHA_ERROR;
        }
        c->schedule[c->chunks++] = e->integer;
        total += e->integer;
    }
    if (total != c->tokens) {
        snprintf(err, n, "schedule %s adds up to %lld, expected tokens=%lld", shown, total, c->tokens);
        return MHA_ERROR;
    }
    long long past = c->schedule[0];
    for (size_t i = 1; c->inplace && c->batch > 1 && i < c->chunks; past += c->schedule[i++])
        if (c->schedule[i] > 1) {
            snprintf(err, n, "schedule %s: a chunk of %lld tokens after a past of %lld needs batch 1 (ONNX Runtime's "
                     "GroupQueryAttention), got batch %lld: feed single tokens", shown, c->schedule[i], past, c->batch);
            return MHA_ERROR;
        }
    return MHA_OK;
}

int mha_case_get(const MhaCases *doc, size_t artifact, size_t index, const MhaConfig *cfg, MhaCase *c, char *err,
                 size_t n) {
    memset(c, 0, sizeof *c);
    char where[64], shown[64], shown2[64];
    if (artifact >= doc->nartifacts || index >= doc->ncases) {
        snprintf(err, n, "expected artifacts[%zu] and cases[%zu], found %zu artifacts and %zu cases", artifact, index,
                 doc->nartifacts, doc->ncases);
        return MHA_ERROR;
    }
    const JsonValue *a = doc->artifacts[artifact], *k = doc->cases[index];
    snprintf(where, sizeof where, "artifacts[%zu]", artifact);
    if (a->type != JSON_OBJECT) {
        snprintf(err, n, "%s: expected an object, got %s", where, json_type_name(a));
        return MHA_ERROR;
    }
    if (!string_field(a, "file", where, c->file, sizeof c->file, err, n) ||
        !string_field(a, "kind", where, c->kind, sizeof c->kind, err, n) ||
        !string_field(a, "runtime", where, c->runtime, sizeof c->runtime, err, n))
        return MHA_ERROR;
    snprintf(where, sizeof where, "cases[%zu]", index);
    if (k->type != JSON_OBJECT) {
        snprintf(err, n, "%s: expected an object, got %s", where, json_type_name(k));
        return MHA_ERROR;
    }
    if (!string_field(k, "name", where, c->name, sizeof c->name, err, n) ||
        !string_field(k, "input_bin", where, c->input_bin, sizeof c->input_bin, err, n) ||
        !string_field(k, "output_bin", where, c->output_bin, sizeof c->output_bin, err, n))
        return MHA_ERROR;
    c->split = 1;
    const char *names[3] = {c->file, c->input_bin, c->output_bin};
    for (int i = 0; i < 3; i++)
        if (!mha_plain_name(names[i])) {
            snprintf(err, n, "%s: expected a file name inside the artifact folder, got '%s'", i ? "golden file" : "file",
                     names[i]);
            return MHA_ERROR;
        }
    const JsonValue *tol = json_get(a, "tolerance");
    const JsonValue *atol = json_get(tol, "atol"), *rtol = json_get(tol, "rtol"), *rel_l2 = json_get(tol, "rel_l2");
    if (!tol || tol->type != JSON_OBJECT) {
        snprintf(err, n, "tolerance: expected an object {atol, rtol, rel_l2}, got %s", json_type_name(tol));
        return MHA_ERROR;
    }
    if (!tolerance_number(atol) || !tolerance_number(rtol)) {
        snprintf(err, n, "tolerance: expected atol and rtol numbers >= 0, got %s and %s",
                 shown_value(atol, shown, sizeof shown), shown_value(rtol, shown2, sizeof shown2));
        return MHA_ERROR;
    }
    c->atol = atol->number;
    c->rtol = rtol->number;
    c->has_rel_l2 = rel_l2 && rel_l2->type != JSON_NULL;
    if (c->has_rel_l2 && !tolerance_number(rel_l2)) {
        snprintf(err, n, "rel_l2: expected null or a number >= 0, got %s", shown_value(rel_l2, shown, sizeof shown));
        return MHA_ERROR;
    }
    if (c->has_rel_l2) c->rel_l2 = rel_l2->number;
    long long in[3], out[3];
    if (!shape3(json_get(k, "input_shape"), in) || !shape3(json_get(k, "output_shape"), out)) {
        snprintf(err, n, "expected input_shape and output_shape [batch, tokens, width] of integers, got %s and %s",
                 json_type_name(json_get(k, "input_shape")), json_type_name(json_get(k, "output_shape")));
        return MHA_ERROR;
    }
    c->batch = in[0];
    c->tokens = in[1];
    c->d_in = in[2];
    c->width = out[2];
    /* the contract, before any size is computed from these */
    if (c->d_in != cfg->d_in) {
        snprintf(err, n, "expected last axis d_in=%lld, got %lld", cfg->d_in, c->d_in);
        return MHA_ERROR;
    }
    if (c->batch < 1) {
        snprintf(err, n, "expected batch >= 1, got %lld", c->batch);
        return MHA_ERROR;
    }
    if (c->tokens < 1 || c->tokens > cfg->context_length) {
        snprintf(err, n, "expected 1 <= tokens <= context_length=%lld, got %lld", cfg->context_length, c->tokens);
        return MHA_ERROR;
    }
    if (c->width != cfg->num_heads * cfg->d_out) {
        snprintf(err, n, "expected output width num_heads*d_out=%lld, got %lld", cfg->num_heads * cfg->d_out, c->width);
        return MHA_ERROR;
    }
    if (out[0] != c->batch || out[1] != c->tokens) {
        snprintf(err, n, "expected output [batch, tokens] = [%lld, %lld], got [%lld, %lld]", c->batch, c->tokens, out[0],
                 out[1]);
        return MHA_ERROR;
    }
    size_t bt, in_count, out_count;
    if (__builtin_mul_overflow((size_t)c->batch, (size_t)c->tokens, &bt) ||
        __builtin_mul_overflow(bt, (size_t)c->d_in, &in_count) ||
        __builtin_mul_overflow(bt, (size_t)c->width, &out_count) || in_count > SIZE_MAX / 4 || out_count > SIZE_MAX / 4) {
        snprintf(err, n, "expected batch * tokens * width float32 values to fit in memory, got batch=%lld tokens=%lld",
                 c->batch, c->tokens);
        return MHA_ERROR;
    }
    c->input_count = in_count;
    c->output_count = out_count;
    c->inplace = strcmp(c->runtime, MHA_DECODE_INPLACE_RUNTIME) == 0;
    int decode = c->inplace || strcmp(c->runtime, MHA_DECODE_RUNTIME) == 0;
    const JsonValue *schedules = json_get(a, "schedules");
    if (!decode) {
        if (schedules && schedules->type != JSON_NULL) {
            snprintf(err, n, "schedules: expected none for runtime %s, got %s", c->runtime, json_type_name(schedules));
            return MHA_ERROR;
        }
        return MHA_OK;
    }
    if (!schedules || schedules->type != JSON_OBJECT) {
        snprintf(err, n, "schedules: expected an object of schedules per case for runtime %s, got %s", c->runtime,
                 json_type_name(schedules));
        return MHA_ERROR;
    }
    const JsonValue *schedule = json_get(schedules, c->name);
    if (!schedule) {
        snprintf(err, n, "schedules: expected a schedule for case '%s', found none", c->name);
        return MHA_ERROR;
    }
    return parse_schedule(schedule, c, err, n);
}

void mha_case_free(MhaCase *c) {
    free(c->schedule);
    c->schedule = NULL;
    c->chunks = 0;
}

MhaCompare mha_compare(const float *got, const float *want, size_t count, double atol, double rtol, int has_rel_l2,
                       double rel_l2) {
    MhaCompare r = {1, 0.0, 0.0};
    double diff2 = 0, ref2 = 0;
    for (size_t i = 0; i < count; i++) {
        double a = got[i], e = want[i], diff = fabs(a - e);
        if (!isfinite(a)) { r.ok = 0; r.max_abs = INFINITY; continue; }
        if (!(diff <= atol + rtol * fabs(e))) r.ok = 0;
        if (diff > r.max_abs) r.max_abs = diff;
        diff2 += diff * diff;
        ref2 += e * e;
    }
    r.rel_l2 = isinf(r.max_abs) ? INFINITY : ref2 > 0 ? sqrt(diff2 / ref2) : sqrt(diff2);
    if (has_rel_l2 && !(r.rel_l2 <= rel_l2)) r.ok = 0;
    return r;
}
