/* The decoder side of mha_check: a decoder folder (manifest.json of kind "decoder", "gpt" in folders exported before
 * it was named so; made by `mha export --gpt`) driven through its in-place decoder gpt.inplace.onnx with the ONNX
 * Runtime C API and IO binding, token ids in and out. It knows no architecture: every shape it allocates or checks
 * is the manifest's contract.shapes (MhaGptShapes), and the manifest's config is compared with the model's own
 * metadata as parsed JSON, whatever its keys.
 *
 *   mha_check generate DIR --prompt-ids 1,2,3 [--max-new-tokens N] [--temperature T] [--top-k K] [--seed S]
 *                          [--no-eos] [--threads N] [--warmup N] [--json]
 *   mha_check check DIR [--json FILE]       (on a GPT folder: every golden generation of golden/generations.json)
 *
 * The contract (runtime/mha_runtime/decoder/contract.py, also manifest["contract"]): input_ids int64 [B, T],
 * past_tokens int32 [B], per layer past_key_values.{i}.key/.value float32 [B, KV, C, D] in; next_token_logits
 * float32 [B, V] and present.{i}.key/.value [B, KV, C, D] out (KV: kv_heads, fewer than the query heads under
 * grouped-query attention; C: context_length, or a layer's window where it keeps only that, contract.shapes.cache_lengths). One preallocated buffer per layer and per key/value
 * is bound as both past_key_values.{i}.* and present.{i}.* (the same OrtValue over the same memory), so ONNX
 * Runtime writes each step's rows into it; the prompt is prefilled at batch 1, then one token per step.
 *
 * Sampling (temperature > 0) follows runtime/mha_runtime/decoder/sampling.py exactly: top-k keeps the logits >= the
 * k-th largest, divide by the temperature (float32), softmax in float32 (numpy's pairwise sum), then
 * u = numpy's PCG64(SeedSequence(seed)).random() per token and the first id whose float64 cumulative probability
 * exceeds u * total. Greedy (temperature 0) is the first maximum.
 *
 * Its files (gpt_manifest.c, gpt_sample.c, gpt_contract.c, gpt_session.c, gpt_generate.c, gpt_check.c) share
 * gpt_private.h; what they share with mha_check.c is in cli.h. */
#ifndef MHA_GPT_H
#define MHA_GPT_H

#include <stddef.h>
#include <stdint.h>

#include "artifact.h"
#include "json.h"

#define MHA_DECODER_KIND "decoder"
#define MHA_DECODER_KIND_OLD "gpt"  /* its name in folders exported before issue 57: read, never written */
#define MHA_GPT_FORMAT 1
#define MHA_GPT_INPLACE "gpt.inplace.onnx"
#define MHA_GPT_GENERATIONS "golden/generations.json"
/* The contract's tolerance row of every form this runner checks (gpt.inplace.onnx and its lossy forms: one row,
 * runtime/mha_runtime/decoder/contract.py FORMS; tests/decoder/test_gpt_check_honest.py compares these lines with it). A golden
 * file's own "tolerance" is a record in a file anyone can re-seal: one that differs is a failed line, and the cases
 * are compared with this row. */
#define MHA_GPT_ATOL 1e-3
#define MHA_GPT_RTOL 1e-4
/* The forms `check` runs: gpt.inplace.onnx, then the lossy forms the folder lists, each with its own golden
 * generations (the manifest entry's "generations"). */
#define MHA_GPT_MAX_FORMS 3
#define MHA_GPT_MAX_CONTEXT (1LL << 20)  /* contract.shapes' bounds (runtime/mha_runtime/decoder/shapes.py) */
#define MHA_GPT_MAX_HEADS 256
#define MHA_GPT_MAX_LAYERS 1024
#define MHA_GPT_MAX_VOCAB (1LL << 22)
#define MHA_GPT_MAX_HEAD_DIM (1LL << 16)
#define MHA_GPT_MAX_CACHE_FLOATS (1LL << 36)  /* one layer's keys [1, KV, C, D]: 256 GiB, refused before calloc */
#define MHA_GPT_MAX_EOS 64          /* eos ids a folder holds (runtime/mha_runtime/decoder/manifest.py MAX_EOS_IDS) */

/* The manifest's contract.shapes: every shape this runner allocates or checks. */
typedef struct {
    char arch[64];  /* the architecture that made the folder: shown, never used */
    long long n_layers, n_heads, kv_heads, head_dim, vocab_size, context_length;
    /* per layer its in-place cache rows C: contract.shapes.cache_lengths where a layer keeps only its sliding window
     * (after P tokens rows 0 .. min(P, C) - 1 hold the last positions), else context_length */
    long long cache_length[MHA_GPT_MAX_LAYERS];
} MhaGptShapes;

typedef struct {
    MhaManifest files;  /* path and the files' sizes and sha256s (config unused) */
    MhaGptShapes shapes;
    JsonValue *doc;            /* the parsed manifest, kept for config */
    const JsonValue *config;   /* its "config": the architecture's own, compared with each model's metadata */
    long long eos_id;   /* -1: none; the first of eos_ids */
    /* Every id generation stops at: the manifest's eos_ids, or (a folder made before it) its one eos_id. The same
     * rule as Python's GPTManifest.stop_ids and Node's stop_ids. */
    long long eos_ids[MHA_GPT_MAX_EOS];
    size_t neos;
    size_t nforms;      /* forms[0] is gpt.inplace.onnx with golden/generations.json */
    char forms[MHA_GPT_MAX_FORMS][64], generations[MHA_GPT_MAX_FORMS][256];
} MhaGptManifest;

/* Whether a manifest's "kind" names the decoder kind ("decoder", or its older name "gpt"): the one place the C
 * runner reads the kind. */
int mha_decoder_kind(const JsonValue *kind);
/* Whether DIR/manifest.json is of the decoder kind (anything unreadable: no; the attention reader then names it). */
int mha_is_gpt_folder(const char *dir);
/* DIR/manifest.json as a GPT manifest, every field checked; MHA_MISSING when there is none. */
int mha_gpt_manifest_load(const char *dir, MhaGptManifest *m, char *err, size_t n);
void mha_gpt_manifest_free(MhaGptManifest *m);

/* numpy's PCG64 seeded with SeedSequence(seed): random() = (next 64-bit output >> 11) * 2**-53. */
typedef struct { unsigned __int128 state, inc; } MhaPcg64;
void mha_pcg64_seed(MhaPcg64 *rng, uint64_t seed);
uint64_t mha_pcg64_next(MhaPcg64 *rng);
double mha_pcg64_random(MhaPcg64 *rng);

/* Temperatures besides 0 (runtime/mha_runtime/decoder/sampling.py): float32 division overflows below the range and is
 * inf above it, either way NaN probabilities. */
#define MHA_GPT_TEMPERATURE_MIN 1e-4
#define MHA_GPT_TEMPERATURE_MAX 1e4
#define MHA_GPT_TEMPERATURE_RULE "0 (greedy) or a number in 0.0001..10000"
static inline int mha_gpt_temperature_ok(double t) {
    return t == 0.0 || (t >= MHA_GPT_TEMPERATURE_MIN && t <= MHA_GPT_TEMPERATURE_MAX);
}

/* The next id from logits[0:V] (finite): argmax (the first maximum) at temperature 0, else the sampling rule with
 * u from rng; scratch holds 2 * V floats and V doubles' worth of bytes (mha_gpt_scratch_bytes). */
size_t mha_gpt_scratch_bytes(long long vocab);
long long mha_gpt_next_id(const float *logits, long long vocab, double temperature, long long top_k, MhaPcg64 *rng,
                          void *scratch);

/* The two commands, run with the ONNX Runtime handles of cli.h (made by main()). Return the exit status. */
int mha_gpt_generate(int argc, char **argv);
int mha_gpt_check(const char *dir, const char *json_path);

#endif
