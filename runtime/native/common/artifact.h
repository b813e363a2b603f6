/* What the C and C++ runners trust, and only after checking it: manifest.json (format 2: the config and
 * every file's size and sha256), each file read against it, each (artifact, case) pair of golden/cases.json
 * validated against the config before any buffer is sized from it, and the comparison with a tolerance.
 * Every failure is one line in err (no newline), naming what was expected and what came. */
#ifndef MHA_ARTIFACT_H
#define MHA_ARTIFACT_H

#include <stddef.h>

#include "json.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MHA_MANIFEST_FORMAT 2
#define MHA_MAX_DIM (1LL << 24)          /* any one of d_in, d_out, num_heads, context_length */
#define MHA_MAX_FILE ((size_t)1 << 34)   /* 16 GiB: far above any attention layer's file */

enum { MHA_OK = 0, MHA_ERROR = 1, MHA_MISSING = 2 };

typedef struct { long long d_in, d_out, num_heads, context_length; } MhaConfig;

typedef struct { char *name; long long size; char sha256[65]; } MhaFile;

typedef struct {
    char path[4096];  /* DIR/manifest.json, for messages */
    MhaConfig config;
    MhaFile *files;
    size_t nfiles;
} MhaManifest;

/* config{d_in, d_out, num_heads, context_length}: integers in 1..MHA_MAX_DIM. */
int mha_config_from(const JsonValue *config, const char *where, MhaConfig *c, char *err, size_t n);
int mha_config_parse(const char *text, size_t len, const char *where, MhaConfig *c, char *err, size_t n);
/* MHA_OK when the model's own config (metadata, embedded config.json) equals the manifest's. */
int mha_config_same(const MhaConfig *model, const char *model_where, const MhaConfig *manifest,
                    const char *manifest_where, char *err, size_t n);

/* A file name inside the artifact folder: no absolute path, no '.', '..' or empty part, no backslash. */
int mha_plain_name(const char *name);
/* The 'files' object of a manifest ({NAME: {size, sha256}}) into m->files (m zeroed by the caller; on failure
 * what was read stays in m: free it with mha_manifest_free). Shared by the attention and the GPT manifests. */
int mha_manifest_files(const JsonValue *files, const char *where, MhaManifest *m, char *err, size_t n);
int mha_manifest_parse(const char *text, size_t len, const char *where, MhaManifest *m, char *err, size_t n);
/* DIR/manifest.json; MHA_MISSING (with a message) when there is none. */
int mha_manifest_load(const char *dir, MhaManifest *m, char *err, size_t n);
void mha_manifest_free(MhaManifest *m);
const MhaFile *mha_manifest_find(const MhaManifest *m, const char *name);

/* The whole file (at most MHA_MAX_FILE bytes) in a new buffer (free it). */
int mha_read_file(const char *path, unsigned char **data, size_t *len, char *err, size_t n);
/* DIR/NAME, checked against the manifest's size and sha256 before it is returned. */
int mha_read_verified(const MhaManifest *m, const char *dir, const char *name, unsigned char **data, size_t *len,
                      char *err, size_t n);
/* count little-endian float32 values from bytes[0:len] (exactly 4 * count bytes); finite ones only. */
int mha_floats(const unsigned char *bytes, size_t len, size_t count, const char *where, float **out, char *err,
               size_t n);

/* golden/cases.json (format 1): the golden cases (shapes, .bin files) and the artifacts they run on (file,
 * runtime, tolerance, the decode runtimes' schedules per case). mha_cases_parse checks the document's shape;
 * every (artifact, case) pair is validated by mha_case_get when it is used. */
#define MHA_CASES_FORMAT 1
#define MHA_MAX_CASES_FILE ((size_t)16 << 20)  /* bytes of cases.json */
#define MHA_MAX_PAIRS 1000000                  /* artifacts * cases: one FAIL line each at worst */

typedef struct {
    char path[4096];                    /* DIR/golden/cases.json, for messages */
    JsonValue *root;
    const JsonValue **artifacts, **cases; /* the elements of the two arrays, by index */
    size_t nartifacts, ncases;
} MhaCases;

/* The document: an object of format 1 with 'cases' and 'artifacts' arrays; 'config' (when there) equal to the
 * manifest's cfg, 'dtype' float32, 'byte_order' little, 'input' x, 'output' context (each when there). */
int mha_cases_parse(const char *text, size_t len, const char *where, const MhaConfig *cfg, MhaCases *doc, char *err,
                    size_t n);
void mha_cases_free(MhaCases *doc);

/* One (artifact, case) pair of cases.json. */
typedef struct {
    int split;  /* file, kind, runtime, name and the .bin names were read: file, runtime and name are usable for a
                   FAIL line (and runtime says which runner the pair belongs to) */
    char file[256], kind[64], runtime[64], name[128], input_bin[256], output_bin[256];
    double atol, rtol, rel_l2;
    int has_rel_l2;
    long long batch, tokens, d_in, width;
    size_t input_count, output_count;  /* batch * tokens * d_in, batch * tokens * width */
    long long *schedule;               /* the decode runtimes: chunks adding up to tokens */
    size_t chunks;
    int inplace;                       /* onnxruntime-decode-inplace: one cache buffer, bound as past and present */
} MhaCase;

#define MHA_ONNX_RUNTIME "onnxruntime"
#define MHA_DECODE_RUNTIME "onnxruntime-decode"
/* The in-place form (GroupQueryAttention): a chunk of more than one token after a past only at batch 1, so a
 * schedule with one at batch > 1 is refused by mha_case_get. */
#define MHA_DECODE_INPLACE_RUNTIME "onnxruntime-decode-inplace"
#define MHA_TORCHSCRIPT_RUNTIME "torchscript"

/* artifacts[artifact] x cases[index], validated against the manifest's config before any size is computed:
 * names inside the artifact folder, tolerance {atol, rtol >= 0, rel_l2 null or >= 0}, input_shape
 * [batch, tokens, d_in] and output_shape [batch, tokens, num_heads * d_out] within the contract and of a size
 * that fits in memory; the decode runtimes need schedules[name], chunks of 1..tokens adding up to tokens,
 * every other runtime no 'schedules'. MHA_ERROR with one line in err (c->split says how far it got). */
int mha_case_get(const MhaCases *doc, size_t artifact, size_t index, const MhaConfig *cfg, MhaCase *c, char *err,
                 size_t n);
void mha_case_free(MhaCase *c);

typedef struct { int ok; double max_abs, rel_l2; } MhaCompare;
/* ok when every |got - want| <= atol + rtol * |want|, every value is finite, and (when has_rel_l2)
 * ||got - want|| / ||want|| <= rel_l2. */
MhaCompare mha_compare(const float *got, const float *want, size_t count, double atol, double rtol, int has_rel_l2,
                       double rel_l2);

/* snprintf that reports truncation: MHA_OK, or MHA_ERROR with "path too long" in err. */
int mha_join(char *out, size_t size, const char *a, const char *b, char *err, size_t n);

/* data[0:len] to path through a unique temporary file beside it (mode 0666 & ~umask), renamed into place, so a
 * reader never sees a half-written file; the temporary file is removed on failure. */
int mha_write_atomically(const char *path, const void *data, size_t len, char *err, size_t n);
/* The folders above path, made as `mkdir -p` would (0777 & ~umask). */
int mha_make_parents(const char *path, char *err, size_t n);

#ifdef __cplusplus
}
#endif
#endif
