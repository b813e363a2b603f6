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
static int plain_name(const char *name) {
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
    if (!files || files->type != JSON_OBJECT) {
        snprintf(err, n, "%s: expected a 'files' object, got %s", where, json_type_name(files));
        goto done;
    }
    size_t count = 0;
    for (const JsonValue *f = files->child; f; f = f->next) count++;
    m->files = calloc(count ? count : 1, sizeof *m->files);
    if (!m->files) { snprintf(err, n, "%s: out of memory", where); goto done; }
    for (const JsonValue *f = files->child; f; f = f->next) {
        const JsonValue *size = json_get(f, "size"), *sha = json_get(f, "sha256");
        if (!plain_name(f->key)) {
            snprintf(err, n, "%s: files: expected a file name inside the artifact folder, got '%.100s'", where, f->key);
            goto done;
        }
        if (!size || size->type != JSON_NUMBER || !size->is_integer || size->integer < 0 ||
            (unsigned long long)size->integer > MHA_MAX_FILE) {
            snprintf(err, n, "%s: files.%.100s: expected 'size' an integer from 0 to %zu, got %s", where, f->key,
                     MHA_MAX_FILE, size && size->type == JSON_NUMBER ? "another number" : json_type_name(size));
            goto done;
        }
        if (!sha || sha->type != JSON_STRING || !hex64(sha->str, sha->str_len)) {
            snprintf(err, n, "%s: files.%.100s: expected 'sha256' of 64 lowercase hex digits, got %s", where, f->key,
                     sha && sha->type == JSON_STRING ? "another string" : json_type_name(sha));
            goto done;
        }
        MhaFile *out = &m->files[m->nfiles];
        if (!(out->name = strdup(f->key))) { snprintf(err, n, "%s: out of memory", where); goto done; }
        out->size = size->integer;
        memcpy(out->sha256, sha->str, 65);
        m->nfiles++;
    }
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
    int fd = open(path, O_RDONLY);
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

/* A whole field as an integer in [lo, hi]; no sign but '-', no spaces, no trailing text. */
static int parse_int(const char *s, long long lo, long long hi, long long *out) {
    if (!*s || !(*s == '-' || (*s >= '0' && *s <= '9'))) return 0;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno == ERANGE || *end || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

static int parse_tolerance(const char *s, double *out) {
    if (!*s || !((*s >= '0' && *s <= '9') || *s == '.')) return 0;
    char *end;
    double v = strtod(s, &end);
    if (*end || !isfinite(v) || v < 0) return 0;
    *out = v;
    return 1;
}

static int copy_field(char *dst, size_t size, const char *src) {
    size_t len = strlen(src);
    if (len == 0 || len >= size) return 0;
    memcpy(dst, src, len + 1);
    return 1;
}

static int parse_schedule(char *text, MhaCase *c, char *err, size_t n) {
    char shown[48];
    snprintf(shown, sizeof shown, "%.40s%s", text, strlen(text) > 40 ? "..." : "");
    size_t commas = 0;
    for (const char *p = text; *p; p++) commas += *p == ',';
    if (commas + 1 > (size_t)c->tokens) {
        snprintf(err, n, "schedule %s: expected at most tokens=%lld chunks, got %zu", shown, c->tokens, commas + 1);
        return MHA_ERROR;
    }
    c->schedule = calloc(commas + 1, sizeof *c->schedule);
    if (!c->schedule) { snprintf(err, n, "schedule: out of memory"); return MHA_ERROR; }
    long long total = 0;  /* at most tokens chunks of at most tokens each: no overflow */
    for (char *chunk = text; chunk;) {
        char *comma = strchr(chunk, ',');
        if (comma) *comma = '\0';
        long long v;
        if (!parse_int(chunk, 1, c->tokens, &v)) {
            snprintf(err, n, "schedule %s: expected chunks of 1 to tokens=%lld tokens, got '%.20s'", shown, c->tokens,
                     chunk);
            return MHA_ERROR;
        }
        c->schedule[c->chunks++] = v;
        total += v;
        chunk = comma ? comma + 1 : NULL;
    }
    if (total != c->tokens) {
        snprintf(err, n, "schedule %s adds up to %lld, expected tokens=%lld", shown, total, c->tokens);
        return MHA_ERROR;
    }
    return MHA_OK;
}

int mha_case_parse(char *line, const MhaConfig *cfg, MhaCase *c, char *err, size_t n) {
    static const char *const NAMES[14] = {"file", "kind", "runtime", "atol", "rtol", "rel_l2", "case", "batch",
                                          "tokens", "d_in", "d_model", "input_bin", "output_bin", "schedule"};
    memset(c, 0, sizeof *c);
    char *field[14];
    size_t count = 0;
    for (char *p = line;;) {
        char *tab = strchr(p, '\t');
        if (count < 14) field[count] = p;
        count++;
        if (!tab) break;
        *tab = '\0';
        p = tab + 1;
    }
    if (count != 14) {
        snprintf(err, n, "expected 14 tab-separated fields (%s ... schedule), got %zu", NAMES[0], count);
        return MHA_ERROR;
    }
    char *sizes[6] = {c->file, c->kind, c->runtime, c->name, c->input_bin, c->output_bin};
    size_t caps[6] = {sizeof c->file, sizeof c->kind, sizeof c->runtime, sizeof c->name, sizeof c->input_bin,
                      sizeof c->output_bin};
    int which[6] = {0, 1, 2, 6, 11, 12};
    for (int i = 0; i < 6; i++) {
        if (!copy_field(sizes[i], caps[i], field[which[i]])) {
            snprintf(err, n, "%s: expected 1 to %zu characters, got %zu", NAMES[which[i]], caps[i] - 1,
                     strlen(field[which[i]]));
            return MHA_ERROR;
        }
    }
    c->split = 1;
    const char *names[3] = {c->file, c->input_bin, c->output_bin};
    for (int i = 0; i < 3; i++)
        if (!plain_name(names[i])) {
            snprintf(err, n, "%s: expected a file name inside the artifact folder, got '%s'", i ? "golden file" : "file",
                     names[i]);
            return MHA_ERROR;
        }
    if (!parse_tolerance(field[3], &c->atol) || !parse_tolerance(field[4], &c->rtol)) {
        snprintf(err, n, "tolerance: expected atol and rtol numbers >= 0, got '%.30s' and '%.30s'", field[3], field[4]);
        return MHA_ERROR;
    }
    c->has_rel_l2 = strcmp(field[5], "-") != 0;
    if (c->has_rel_l2 && !parse_tolerance(field[5], &c->rel_l2)) {
        snprintf(err, n, "rel_l2: expected '-' or a number >= 0, got '%.30s'", field[5]);
        return MHA_ERROR;
    }
    long long *ints[4] = {&c->batch, &c->tokens, &c->d_in, &c->width};
    for (int i = 0; i < 4; i++)
        if (!parse_int(field[7 + i], LLONG_MIN, LLONG_MAX, ints[i])) {
            snprintf(err, n, "%s: expected an integer, got '%.30s'", NAMES[7 + i], field[7 + i]);
            return MHA_ERROR;
        }
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
    if (!decode) {
        if (strcmp(field[13], "-") != 0) {
            snprintf(err, n, "schedule: expected '-' for runtime %s, got '%.30s'", c->runtime, field[13]);
            return MHA_ERROR;
        }
        return MHA_OK;
    }
    char shown[48];  /* parse_schedule cuts the field at its commas */
    snprintf(shown, sizeof shown, "%.40s%s", field[13], strlen(field[13]) > 40 ? "..." : "");
    if (parse_schedule(field[13], c, err, n)) return MHA_ERROR;
    long long past = c->schedule[0];
    for (size_t i = 1; c->inplace && c->batch > 1 && i < c->chunks; past += c->schedule[i++])
        if (c->schedule[i] > 1) {
            snprintf(err, n, "schedule %s: a chunk of %lld tokens after a past of %lld needs batch 1 (ONNX Runtime's "
                     "GroupQueryAttention), got batch %lld: feed single tokens", shown, c->schedule[i], past, c->batch);
            return MHA_ERROR;
        }
    return MHA_OK;
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
