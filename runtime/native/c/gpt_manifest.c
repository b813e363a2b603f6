/* The decoder manifest (DIR/manifest.json of kind "decoder", or "gpt" before it was named so): mha_decoder_kind,
 * mha_is_gpt_folder, mha_gpt_manifest_load. Its shapes are contract.shapes, every size checked before any buffer is
 * sized from it (shapes_from); a folder exported before them is read by legacy_shapes alone. Its config is kept as
 * parsed JSON, for the comparison with each model's metadata (gpt_contract.c). */
#define _POSIX_C_SOURCE 200809L
#include "gpt_private.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_GPT_MANIFEST ((size_t)4 << 20)         /* the Python reader's bound */

int int_field(const JsonValue *obj, const char *key, long long lo, long long hi, const char *where, long long *out,
              char *err, size_t n) {
    const JsonValue *v = json_get(obj, key);
    if (!v || v->type != JSON_NUMBER || !v->is_integer || v->integer < lo || v->integer > hi) {
        if (v && v->type == JSON_NUMBER)
            say(err, n, "%s: expected '%s' an integer from %lld to %lld, got %.17g", where, key, lo, hi, v->number);
        else
            say(err, n, "%s: expected '%s' an integer from %lld to %lld, got %s", where, key, lo, hi,
                     v ? json_type_name(v) : "nothing");
        return MHA_ERROR;
    }
    *out = v->integer;
    return MHA_OK;
}

/* What every shape must satisfy, whoever read it: a head size within its bound (legacy_shapes derives it), kv_heads
 * divides n_heads, one layer's cache fits the bound. */
static int shapes_fit(const MhaGptShapes *s, const char *where, char *err, size_t n) {
    if (s->head_dim > MHA_GPT_MAX_HEAD_DIM) {
        say(err, n, "%s: head size %lld is over the runner's bound of %lld", where, s->head_dim, MHA_GPT_MAX_HEAD_DIM);
        return MHA_ERROR;
    }
    if (s->n_heads % s->kv_heads) {
        say(err, n, "%s: n_heads %lld is not a multiple of kv_heads %lld", where, s->n_heads, s->kv_heads);
        return MHA_ERROR;
    }
    if (s->kv_heads * s->context_length > MHA_GPT_MAX_CACHE_FLOATS / s->head_dim) {  /* each factor is bounded */
        say(err, n, "%s: a cache of [1, %lld, %lld, %lld] floats per layer is over the runner's bound of %lld", where,
            s->kv_heads, s->context_length, s->head_dim, MHA_GPT_MAX_CACHE_FLOATS);
        return MHA_ERROR;
    }
    return MHA_OK;
}

/* contract.shapes.cache_lengths into s->cache_length: absent, every layer's is context_length; else one integer from
 * 1 to context_length per layer (the Python reader's rule). */
static int cache_lengths(const JsonValue *a, const char *where, MhaGptShapes *s, char *err, size_t n) {
    long long k = 0;
    int ok = !a || a->type == JSON_ARRAY;
    for (const JsonValue *v = ok && a ? a->child : NULL; v; v = v->next, k++) {
        if (k >= s->n_layers || v->type != JSON_NUMBER || !v->is_integer || v->integer < 1 ||
            v->integer > s->context_length) {
            ok = 0;
            break;
        }
        s->cache_length[k] = v->integer;
    }
    if (a && (!ok || k != s->n_layers)) {
        say(err, n, "%s: 'cache_lengths': expected %lld integers from 1 to context_length %lld (one per layer)", where,
            s->n_layers, s->context_length);
        return MHA_ERROR;
    }
    for (k = 0; !a && k < s->n_layers; k++) s->cache_length[k] = s->context_length;
    return MHA_OK;
}

/* contract.shapes into s, every field checked (the Python reader's rules, DecoderShapes.from_dict). */
static int shapes_from(const JsonValue *c, const char *where, MhaGptShapes *s, char *err, size_t n) {
    const JsonValue *arch = json_get(c, "arch");
    if (!c || c->type != JSON_OBJECT) {
        say(err, n, "%s: expected an object of arch and the shapes, got %s", where, json_type_name(c));
        return MHA_ERROR;
    }
    if (!arch || arch->type != JSON_STRING || arch->str_len == 0 || arch->str_len >= sizeof s->arch ||
        strlen(arch->str) != arch->str_len) {
        say(err, n, "%s: expected 'arch' an architecture name of 1 to %zu bytes", where, sizeof s->arch - 1);
        return MHA_ERROR;
    }
    snprintf(s->arch, sizeof s->arch, "%s", arch->str);
    if (int_field(c, "n_layers", 1, MHA_GPT_MAX_LAYERS, where, &s->n_layers, err, n) ||
        int_field(c, "n_heads", 1, MHA_GPT_MAX_HEADS, where, &s->n_heads, err, n) ||
        int_field(c, "kv_heads", 1, MHA_GPT_MAX_HEADS, where, &s->kv_heads, err, n) ||
        int_field(c, "head_dim", 1, MHA_GPT_MAX_HEAD_DIM, where, &s->head_dim, err, n) ||
        int_field(c, "vocab_size", 1, MHA_GPT_MAX_VOCAB, where, &s->vocab_size, err, n) ||
        int_field(c, "context_length", 1, MHA_GPT_MAX_CONTEXT, where, &s->context_length, err, n))
        return MHA_ERROR;
    const JsonValue *lengths = json_get(c, "cache_lengths");  /* null: absent, as the Python and JS readers take it */
    return shapes_fit(s, where, err, n) ||
           cache_lengths(lengths && lengths->type != JSON_NULL ? lengths : NULL, where, s, err, n);
}

/* The one place the C runner reads an architecture's config keys: a folder exported before issue 57 has no
 * contract.shapes, and then only the book's GPT-2 (vocab_size, context_length, emb_dim, n_heads, n_layers; one
 * key/value head per query head). */
static int legacy_shapes(const JsonValue *c, const char *where, MhaGptShapes *s, char *err, size_t n) {
    long long emb = 0;
    if (!c || c->type != JSON_OBJECT) {
        say(err, n, "%s: expected a config object, got %s", where, json_type_name(c));
        return MHA_ERROR;
    }
    snprintf(s->arch, sizeof s->arch, "gpt2");
    if (int_field(c, "vocab_size", 1, MHA_GPT_MAX_VOCAB, where, &s->vocab_size, err, n) ||
        int_field(c, "context_length", 1, MHA_GPT_MAX_CONTEXT, where, &s->context_length, err, n) ||
        int_field(c, "emb_dim", 1, MHA_GPT_MAX_HEADS * MHA_GPT_MAX_HEAD_DIM, where, &emb, err, n) ||
        int_field(c, "n_heads", 1, MHA_GPT_MAX_HEADS, where, &s->n_heads, err, n) ||
        int_field(c, "n_layers", 1, MHA_GPT_MAX_LAYERS, where, &s->n_layers, err, n))
        return MHA_ERROR;
    if (emb % s->n_heads) {
        say(err, n, "%s: emb_dim %lld is not divisible by n_heads %lld", where, emb, s->n_heads);
        return MHA_ERROR;
    }
    s->kv_heads = s->n_heads;
    s->head_dim = emb / s->n_heads;
    return shapes_fit(s, where, err, n) || cache_lengths(NULL, where, s, err, n);
}

int mha_decoder_kind(const JsonValue *kind) {
    return kind && kind->type == JSON_STRING &&
           (strcmp(kind->str, MHA_DECODER_KIND) == 0 || strcmp(kind->str, MHA_DECODER_KIND_OLD) == 0);
}

/* The manifest's text (bounded), or MHA_MISSING. */
static int read_manifest_text(const char *dir, char *path, size_t path_size, unsigned char **text, size_t *len,
                              char *err, size_t n) {
    *text = NULL;
    if (mha_join(path, path_size, dir, "manifest.json", err, n)) return MHA_ERROR;
    struct stat st;
    if (stat(path, &st) != 0 && errno == ENOENT) {
        say(err, n, "%s: expected a manifest (made by `mha export --gpt`), found none", path);
        return MHA_MISSING;
    }
    if (mha_read_file(path, text, len, err, n)) return MHA_ERROR;
    if (*len > MAX_GPT_MANIFEST) {
        say(err, n, "%s: expected a manifest of at most %zu bytes, got %zu", path, MAX_GPT_MANIFEST, *len);
        free(*text);
        *text = NULL;
        return MHA_ERROR;
    }
    return MHA_OK;
}

int mha_is_gpt_folder(const char *dir) {
    char path[4096], err[512];
    unsigned char *text;
    size_t len;
    if (read_manifest_text(dir, path, sizeof path, &text, &len, err, sizeof err)) return 0;
    JsonValue *root = json_parse((const char *)text, len, err, sizeof err);
    free(text);
    int gpt = mha_decoder_kind(json_get(root, "kind"));
    json_free(root);
    return gpt;
}

int mha_gpt_manifest_load(const char *dir, MhaGptManifest *m, char *err, size_t n) {
    memset(m, 0, sizeof *m);
    m->eos_id = -1;
    char path[4096];
    unsigned char *text;
    size_t len;
    int rc = read_manifest_text(dir, path, sizeof path, &text, &len, err, n);
    if (rc) return rc;
    snprintf(m->files.path, sizeof m->files.path, "%s", path);
    char why[256], at[4200];
    JsonValue *root = json_parse((const char *)text, len, why, sizeof why);
    free(text);
    if (!root) {
        say(err, n, "%s: expected JSON, got a parse error (%s)", path, why);
        return MHA_ERROR;
    }
    m->doc = root;  /* freed with m: m->config points into it */
    rc = MHA_ERROR;
    const JsonValue *format = json_get(root, "format");
    if (root->type != JSON_OBJECT || !mha_decoder_kind(json_get(root, "kind")) ||
        !format || format->type != JSON_NUMBER || !format->is_integer || format->integer != MHA_GPT_FORMAT) {
        say(err, n, "%s: expected a decoder manifest (kind \"%s\", format %d) (export decoder folders with `mha "
                 "export --gpt`)", path, MHA_DECODER_KIND, MHA_GPT_FORMAT);
        goto done;
    }
    m->config = json_get(root, "config");
    if (!m->config || m->config->type != JSON_OBJECT) {
        say(err, n, "%s: expected 'config' an object, got %s", path, json_type_name(m->config));
        goto done;
    }
    const JsonValue *shapes = json_get(json_get(root, "contract"), "shapes");
    snprintf(at, sizeof at, "%s: %s", path, shapes ? "contract.shapes" : "config");
    if (shapes ? shapes_from(shapes, at, &m->shapes, err, n) : legacy_shapes(m->config, at, &m->shapes, err, n))
        goto done;
    const JsonValue *eos = json_get(root, "eos_id");
    if (eos && eos->type != JSON_NULL) {
        if (int_field(root, "eos_id", 0, m->shapes.vocab_size - 1, path, &m->eos_id, err, n)) goto done;
    }
    const JsonValue *listed = json_get(root, "eos_ids");
    if (listed && listed->type != JSON_NULL) {
        int ok = listed->type == JSON_ARRAY;
        for (const JsonValue *v = ok ? listed->child : NULL; v && ok; v = v->next) {
            ok = m->neos < MHA_GPT_MAX_EOS && v->type == JSON_NUMBER && v->is_integer && v->integer >= 0 &&
                 v->integer < m->shapes.vocab_size;
            if (ok) m->eos_ids[m->neos++] = v->integer;
        }
        if (!ok) {
            say(err, n, "%s: expected 'eos_ids' a list of at most %d token ids from 0 to %lld", path, MHA_GPT_MAX_EOS,
                m->shapes.vocab_size - 1);
            goto done;
        }
        if (m->eos_id != (m->neos ? m->eos_ids[0] : -1)) {
            say(err, n, "%s: 'eos_id' is not the first of 'eos_ids'", path);
            goto done;
        }
    } else if (m->eos_id >= 0) {  /* a folder made before eos_ids */
        m->eos_ids[m->neos++] = m->eos_id;
    }
    const JsonValue *artifacts = json_get(root, "artifacts");
    if (!artifacts || artifacts->type != JSON_OBJECT || !json_get(artifacts, MHA_GPT_INPLACE)) {
        say(err, n, "%s: expected %s among the manifest's artifacts (export with the 'inplace' variant), found "
                 "none", path, MHA_GPT_INPLACE);
        goto done;
    }
    const JsonValue *contract = json_get(json_get(root, "contract"), "inplace");
    const JsonValue *file = json_get(contract, "file");
    if (!contract || contract->type != JSON_OBJECT || !file || file->type != JSON_STRING ||
        strcmp(file->str, MHA_GPT_INPLACE) != 0) {
        say(err, n, "%s: expected contract.inplace.file \"%s\"", path, MHA_GPT_INPLACE);
        goto done;
    }
    m->nforms = 1;
    snprintf(m->forms[0], sizeof m->forms[0], "%s", MHA_GPT_INPLACE);
    snprintf(m->generations[0], sizeof m->generations[0], "%s", MHA_GPT_GENERATIONS);
    static const char *const lossy[] = {"gpt.inplace.int8.onnx", "gpt.inplace.int4.onnx"};
    for (size_t i = 0; i < sizeof lossy / sizeof *lossy; i++) {
        const JsonValue *entry = json_get(artifacts, lossy[i]);
        if (!entry) continue;
        const JsonValue *gen = json_get(entry, "generations");
        if (!gen || gen->type != JSON_STRING || gen->str_len == 0 || gen->str_len >= sizeof m->generations[0] ||
            strlen(gen->str) != gen->str_len || !mha_plain_name(gen->str)) {
            say(err, n, "%s: artifacts.%s: expected 'generations' the file name of its own golden generations",
                path, lossy[i]);
            goto done;
        }
        snprintf(m->forms[m->nforms], sizeof m->forms[0], "%s", lossy[i]);
        snprintf(m->generations[m->nforms], sizeof m->generations[0], "%s", gen->str);
        m->nforms++;
    }
    if (mha_manifest_files(json_get(root, "files"), path, &m->files, err, n)) goto done;
    rc = MHA_OK;
done:
    if (rc != MHA_OK) mha_gpt_manifest_free(m);
    return rc;
}

void mha_gpt_manifest_free(MhaGptManifest *m) {
    mha_manifest_free(&m->files);
    json_free(m->doc);
    m->doc = NULL;
    m->config = NULL;
}
