/* What every file of mha_check shares (mha_check.c, the attention side, and gpt_*.c, the GPT side): the ONNX
 * Runtime handles main() makes, ORT's failures as one line, one-line messages, lines printed in the "C" locale,
 * whole-integer arguments, and the two ends of a `check` (stopped before any case, or with its results).
 *
 * Here rather than in common/: these need the ONNX Runtime C API and print the C runner's lines ("runtime": "c");
 * common/ is what the C and the C++ (libtorch) runners both compile. */
#ifndef MHA_CLI_H
#define MHA_CLI_H

#include <stddef.h>

#include <onnxruntime_c_api.h>

#include "report.h"

/* Made once by main() before any command runs; released by it after. */
extern const OrtApi *ort;
extern OrtEnv *env;
extern OrtMemoryInfo *cpu;

/* ORT's message for a failed call, as one line in why; 1 when the call failed. */
int failed(OrtStatus *status, const char *what, char *why, size_t n);

/* snprintf into a message buffer: a message cut short is still one line (what the messages are for). */
void say(char *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* printf to stdout with the "C" locale's '.' whatever setlocale chose: the lines are parsed by other programs. */
void print_c(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A whole decimal integer in [lo, hi]: 1 with *out set, else 0. */
int arg_int(const char *s, long long lo, long long hi, long long *out);

/* A check that stops before any case: one line on stderr, and (with --json) the error as the result. Returns 1. */
int stop(const char *dir, const char *json_path, const char *why);

/* The end of a check that ran its cases (its "N passed, N failed" line printed): the exit status, 0 when a case
 * passed and none failed; with json_path the report is written, unless what it kept differs from the count
 * (then nothing is written and the status is 1). err (n bytes) is the caller's message buffer. */
int finish(const MhaReport *report, int passed, int failures, const char *json_path, char *err, size_t n);

#endif
