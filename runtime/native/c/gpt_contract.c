/* The model against the in-place decoder contract (runtime/mha_runtime/decoder/contract.py, also
 * manifest["contract"]): each input and output of the session by name, element type, rank and fixed axes, sized by
 * the manifest's contract.shapes (check_contract), and its "mha_export.gpt_config" / "mha_export.gpt_contract"
 * metadata against the manifest (check_metadata: the config as parsed JSON, whatever the architecture's keys). */
#define _POSIX_C_SOURCE 200809L
#include "gpt_private.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { char name[64]; ONNXTensorElementDataType type; size_t rank; int64_t dims[4]; } Port;

/* The contract's inputs (out = 0) or outputs (out = 1) of gpt.inplace.onnx: -1 for a symbolic axis. */
static size_t contract_ports(const MhaGptShapes *c, int out, Port *ports) {
    size_t k = 0;
    int64_t KV = c->kv_heads, D = c->head_dim;
    if (!out) {
        ports[k++] = (Port){"input_ids", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, 2, {-1, -1, 0, 0}};
        ports[k++] = (Port){"past_tokens", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, 1, {-1, 0, 0, 0}};
    } else {
        ports[k++] = (Port){"next_token_logits", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, 2, {-1, c->vocab_size, 0, 0}};
    }
    for (long long i = 0; i < c->n_layers; i++)
        for (int v = 0; v < 2; v++) {
            Port *p = &ports[k++];
            snprintf(p->name, sizeof p->name, out ? "present.%lld.%s" : "past_key_values.%lld.%s", i, v ? "value" : "key");
            p->type = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
            p->rank = 4;
            p->dims[0] = -1;
            p->dims[1] = KV;
            p->dims[2] = c->cache_length[i];  /* context_length, or the layer's window */
            p->dims[3] = D;
        }
    return k;
}

int check_contract(OrtSession *s, const MhaGptShapes *c, const char *path, char *why, size_t n) {
    size_t most = 2 + 2 * (size_t)c->n_layers;
    Port *ports = calloc(most, sizeof *ports);
    OrtAllocator *alloc = NULL;
    if (!ports) { say(why, n, "out of memory"); return 1; }
    int bad = failed(ort->GetAllocatorWithDefaultOptions(&alloc), "allocator", why, n);
    for (int out = 0; !bad && out < 2; out++) {
        size_t want = contract_ports(c, out, ports), count = 0;
        bad = failed(out ? ort->SessionGetOutputCount(s, &count) : ort->SessionGetInputCount(s, &count), path, why, n);
        if (!bad && count != want) {
            say(why, n, "%s: expected the in-place contract's %zu %s (n_layers=%lld), the model has %zu", path,
                     want, out ? "outputs" : "inputs", c->n_layers, count);
            bad = 1;
        }
        for (size_t i = 0; !bad && i < count; i++) {
            char *name = NULL;
            OrtTypeInfo *info = NULL;
            const OrtTensorTypeAndShapeInfo *tensor = NULL;
            bad = failed(out ? ort->SessionGetOutputName(s, i, alloc, &name) : ort->SessionGetInputName(s, i, alloc, &name),
                         path, why, n) ||
                  failed(out ? ort->SessionGetOutputTypeInfo(s, i, &info) : ort->SessionGetInputTypeInfo(s, i, &info),
                         path, why, n) ||
                  failed(ort->CastTypeInfoToTensorInfo(info, &tensor), path, why, n);
            const Port *p = NULL;
            for (size_t j = 0; !bad && j < want && !p; j++)
                if (strcmp(ports[j].name, name) == 0) p = &ports[j];
            if (!bad && !p) {
                say(why, n, "%s: %s '%.80s' is not in the in-place contract (decoder/contract.py)", path,
                         out ? "output" : "input", name);
                bad = 1;
            }
            ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
            size_t rank = 0;
            int64_t dims[4] = {0, 0, 0, 0};
            if (!bad && !tensor) {
                say(why, n, "%s: '%s' is not a tensor", path, p->name);
                bad = 1;
            }
            if (!bad) bad = failed(ort->GetTensorElementType(tensor, &type), path, why, n) ||
                            failed(ort->GetDimensionsCount(tensor, &rank), path, why, n);
            if (!bad && (type != p->type || rank != p->rank)) {
                say(why, n, "%s: '%s': expected element type %d of rank %zu, got type %d of rank %zu", path, p->name,
                         (int)p->type, p->rank, (int)type, rank);
                bad = 1;
            }
            if (!bad) bad = failed(ort->GetDimensions(tensor, dims, rank), path, why, n);
            for (size_t a = 0; !bad && a < rank; a++)
                if (p->dims[a] >= 0 && dims[a] >= 0 && dims[a] != p->dims[a]) {
                    say(why, n, "%s: '%s': expected axis %zu of size %lld (the manifest's contract.shapes), got %lld", path,
                             p->name, a, (long long)p->dims[a], (long long)dims[a]);
                    bad = 1;
                }
            if (info) ort->ReleaseTypeInfo(info);
            if (name) alloc->Free(alloc, name);
        }
    }
    free(ports);
    return bad;
}

/* The first member of object a whose value b does not have (NULL: none, or a is no object). */
static const char *differing_key(const JsonValue *a, const JsonValue *b) {
    for (const JsonValue *x = a && a->type == JSON_OBJECT ? a->child : NULL; x; x = x->next)
        if (!json_equal(x, json_get(b, x->key))) return x->key;
    return NULL;
}

int check_metadata(OrtSession *s, const JsonValue *c, const char *path, char *why, size_t n) {
    OrtModelMetadata *meta = NULL;
    OrtAllocator *alloc = NULL;
    char *config = NULL, *contract = NULL, what[4200];
    say(what, sizeof what, "%s: metadata", path);
    int bad = failed(ort->GetAllocatorWithDefaultOptions(&alloc), what, why, n) ||
              failed(ort->SessionGetModelMetadata(s, &meta), what, why, n) ||
              failed(ort->ModelMetadataLookupCustomMetadataMap(meta, alloc, "mha_export.gpt_config", &config), what,
                     why, n) ||
              failed(ort->ModelMetadataLookupCustomMetadataMap(meta, alloc, "mha_export.gpt_contract", &contract), what,
                     why, n);
    if (!bad && (!config || !contract || strcmp(contract, "inplace") != 0)) {
        say(why, n, "%s: expected metadata 'mha_export.gpt_config' and 'mha_export.gpt_contract' \"inplace\", got "
                 "%s", path, !config ? "no config" : !contract ? "no contract" : "another contract");
        bad = 1;
    }
    if (!bad) {
        char err[512];
        JsonValue *root = json_parse(config, strlen(config), err, sizeof err);
        say(what, sizeof what, "%s: metadata 'mha_export.gpt_config'", path);
        if (!root) {
            say(why, n, "%s: expected JSON (%s)", what, err);
            bad = 1;
        } else if (!json_equal(root, c)) {
            const char *key = differing_key(root, c);
            if (!key) key = differing_key(c, root);
            say(why, n, "%s differs from the manifest's config at %s%.60s%s; the model does not belong to this folder",
                what, key ? "'" : "", key ? key : "its top level", key ? "'" : "");
            bad = 1;
        }
        json_free(root);
    }
    if (config) alloc->Free(alloc, config);
    if (contract) alloc->Free(alloc, contract);
    if (meta) ort->ReleaseModelMetadata(meta);
    return bad;
}
