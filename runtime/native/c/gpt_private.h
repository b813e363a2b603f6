/* What the files of the GPT side of mha_check share among themselves (gpt.h is what mha_check.c sees):
 *
 *   gpt_manifest.c   the decoder manifest: its contract.shapes, its config kept as JSON, its eos ids
 *   gpt_sample.c     numpy's PCG64 and SeedSequence, and the sampling rule (mha_gpt_next_id)
 *   gpt_contract.c   the model against the in-place contract: inputs, outputs and metadata
 *   gpt_session.c    the in-place decoder through IO binding, and the generation loop
 *   gpt_generate.c   `mha_check generate`
 *   gpt_check.c      `mha_check check` on a GPT folder: the golden generations */
#ifndef MHA_GPT_PRIVATE_H
#define MHA_GPT_PRIVATE_H

#include <stddef.h>
#include <stdint.h>

#include <onnxruntime_c_api.h>

#include "cli.h"
#include "gpt.h"
#include "json.h"

/* --- gpt_manifest.c ---------------------------------------------------------------------------------------- */

/* obj[key] an integer in lo..hi. */
int int_field(const JsonValue *obj, const char *key, long long lo, long long hi, const char *where, long long *out,
              char *err, size_t n);

/* --- gpt_contract.c ---------------------------------------------------------------------------------------- */

/* Every input and output of the session is the contract's: the same names, element types, ranks and fixed axes. */
int check_contract(OrtSession *s, const MhaGptShapes *c, const char *path, char *why, size_t n);
/* The model's "mha_export.gpt_config" metadata is the manifest's config (`config`) as parsed JSON;
 * "mha_export.gpt_contract" is "inplace". */
int check_metadata(OrtSession *s, const JsonValue *config, const char *path, char *why, size_t n);

/* --- gpt_session.c ----------------------------------------------------------------------------------------- */

typedef struct {
    OrtSession *session;
    OrtIoBinding *bind;
    MhaGptShapes cfg;     /* the manifest's contract.shapes */
    size_t nbuf;          /* 2 * n_layers: key 0, value 0, key 1, ... */
    float **buf;          /* each [1, KV, C_i, D], bound as past_key_values.{i}.* and present.{i}.* */
    OrtValue **bufv;
    size_t *counts;       /* floats of each buffer: KV * C_i * D (C_i: cfg.cache_length[i]) */
    float *logits;        /* [1, V], bound as next_token_logits */
    OrtValue *logits_v;
    int64_t *ids;         /* [1, T] for T <= C */
    OrtValue *ids_v;
    int32_t past_tokens;
    OrtValue *past_v;
    int checked;          /* the first run's bound outputs were checked to be our buffers */
} GptRun;

typedef struct {
    long long max_new, top_k;  /* top_k 0: none */
    const long long *eos;      /* the ids generation stops at (neos of them; 0: none) */
    size_t neos;
    double temperature;
    uint64_t seed;
} Request;

typedef struct {
    int64_t *ids;
    long long count;
    const char *stop;  /* "max_new_tokens" | "eos" */
    double ttft, seconds;
} Result;

/* DIR/FORM (gpt.inplace.onnx or a lossy form of it), verified against the manifest, opened and bound. */
int open_verified(GptRun *r, const MhaGptManifest *m, const char *dir, const char *form, long long threads,
                  char *why, size_t n);
/* Releases what r holds and zeroes it (a zeroed r too). */
void run_close(GptRun *r);
/* Prefill the prompt, then one token per step until max_new (or eos). first (when given) gets the prefill's
 * logits. out->ids holds max_new ids. */
int generate_ids(GptRun *r, const int64_t *prompt, long long T, const Request *q, void *scratch, float *first,
                 Result *out, char *why, size_t n);

/* --- gpt_generate.c ---------------------------------------------------------------------------------------- */

/* ids[0:count] as "1,2,3" into buf (cut short at size). */
void put_ids(char *buf, size_t size, const int64_t *ids, long long count);

#endif
