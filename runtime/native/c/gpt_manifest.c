/* The GPT manifest (DIR/manifest.json of kind "gpt"): mha_is_gpt_folder, mha_gpt_manifest_load, and the config
 * reader the model's metadata is checked with too (gpt_config_from). */
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

int gpt_config_from(const JsonValue *c, const char *where, MhaGptConfig *cfg, char *err, size_t n) {
    if (!c || c->type != JSON_OBJECT) {
        say(err, n, "%s: expected a config object, got %s", where, json_type_name(c));
        return MHA_ERROR;
    }
    if (int_field(c, "vocab_size", 1, MHA_GPT_MAX_VOCAB, where, &cfg->vocab_size, err, n) ||
        int_field(c, "context_length", 1, MHA_GPT_MAX_CONTEXT, where, &cfg->context_length, err, n) ||
        int_field(c, "emb_dim", 1, MHA_GPT_MAX_EMB, where, &cfg->emb_dim, err, n) ||
        int_field(c, "n_heads", 1, MHA_GPT_MAX_HEADS, where, &cfg->n_heads, err, n) ||
        int_field(c, "n_layers", 1, MHA_GPT_MAX_LAYERS, where, &cfg->n_layers, err, n))
        return MHA_ERROR;
    if (cfg->emb_dim % cfg->n_heads) {
        say(err, n, "%s: emb_dim %lld is not divisible by n_heads %lld", where, cfg->emb_dim, cfg->n_heads);
        return MHA_ERROR;
    }
    return MHA_OK;
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
    const JsonValue *kind = json_get(root, "kind");
    int gpt = kind && kind->type == JSON_STRING && strcmp(kind->str, MHA_GPT_KIND) == 0;
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
    rc = MHA_ERROR;
    const JsonValue *kind = json_get(root, "kind"), *format = json_get(root, "format");
    if (root->type != JSON_OBJECT || !kind || kind->type != JSON_STRING || strcmp(kind->str, MHA_GPT_KIND) != 0 ||
        !format || format->type != JSON_NUMBER || !format->is_integer || format->integer != MHA_GPT_FORMAT) {
        say(err, n, "%s: expected a GPT manifest (kind \"%s\", format %d) (export GPT folders with `mha export "
                 "--gpt`)", path, MHA_GPT_KIND, MHA_GPT_FORMAT);
        goto done;
    }
    snprintf(at, sizeof at, "%s: config", path);
    if (gpt_config_from(json_get(root, "config"), at, &m->config, err, n)) goto done;
    const JsonValue *eos = json_get(root, "eos_id");
    if (eos && eos->type != JSON_NULL) {
        if (int_field(root, "eos_id", 0, m->config.vocab_size - 1, path, &m->eos_id, err, n)) goto done;
    }
    const JsonValue *listed = json_get(root, "eos_ids");
    if (listed && listed->type != JSON_NULL) {
        int ok = listed->type == JSON_ARRAY;
        for (const JsonValue *v = ok ? listed->child : NULL; v && ok; v = v->next) {
            ok = m->neos < MHA_GPT_MAX_EOS && v->type == JSON_NUMBER && v->is_integer && v->integer >= 0 &&
                 v->integer < m->config.vocab_size;
            if (ok) m->eos_ids[m->neos++] = v->integer;
        }
        if (!ok) {
            say(err, n, "%s: expected 'eos_ids' a list of at most %d token ids from 0 to %lld", path, MHA_GPT_MAX_EOS,
                m->config.vocab_size - 1);
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
    json_free(root);
    if (rc != MHA_OK) mha_gpt_manifest_free(m);
    return rc;
}

void mha_gpt_manifest_free(MhaGptManifest *m) { mha_manifest_free(&m->files); }
