/* The results of a runner's `check`, kept as it goes and written as JSON by `check DIR --json FILE`, in the
 * format of runtime/native/web/check.mjs --json:
 *
 *   {"runtime": "c" | "cpp", "artifact_dir": DIR, "onnxruntime" | "libtorch": VERSION, "passed": N, "failed": N,
 *    "not_loadable": [{"file", "reason"}], "errors": [TEXT],
 *    "artifacts": [{"file", "runtime", "not_loadable": null | REASON, "error": null | TEXT, "passed", "failed",
 *                   "cases": [{"name", "ok", "max_abs", "rel_l2", "error"}]}]}
 *
 * Only the artifacts the runner runs are listed. An artifact its runtime cannot load keeps its failed cases (the
 * console's FAIL lines) and names the runtime's reason in not_loadable; "error" says why an artifact was refused
 * before that (a sha256 that differs from the manifest, a config that is not the manifest's). max_abs and rel_l2
 * are null when the case was never compared (or the error is not finite). "errors" holds failures tied to no
 * artifact (a pair of cases.json without a usable file, runtime or name); passed and failed count the same
 * lines as the console's last line. A check that stops before any case writes {"runtime", "artifact_dir",
 * "error"} instead. The file is written through a temporary file beside it, renamed into place. */
#ifndef MHA_REPORT_H
#define MHA_REPORT_H

#include <stddef.h>

#include "artifact.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char *name, *error;      /* error: NULL when the case was compared */
    int ok, compared;
    double max_abs, rel_l2;
} MhaCaseResult;

typedef struct {
    size_t index;            /* artifacts[index] of cases.json */
    char *file, *runtime, *not_loadable, *error;
    int passed, failed;
    MhaCaseResult *cases;
    size_t ncases, cap;
} MhaArtifactResult;

typedef struct {
    char runner[16];         /* "c", "cpp": the top-level "runtime" */
    char *dir, *version_key, *version;
    MhaArtifactResult *artifacts;
    size_t nartifacts, cap;
    char **errors;
    size_t nerrors, errors_cap;
    int passed, failed;
    int out_of_memory;       /* a record was lost: mha_report_write refuses to write a partial result */
} MhaReport;

void mha_report_init(MhaReport *r, const char *runner, const char *dir);
/* A top-level "KEY": "VALUE" naming the runtime's version ("onnxruntime": "1.32.0"). */
void mha_report_version(MhaReport *r, const char *key, const char *value);
/* Make artifacts[index] of cases.json the current artifact (appended when it is not the last one listed). */
void mha_report_artifact(MhaReport *r, size_t index, const char *file, const char *runtime);
/* The current artifact's runtime reason for not loading it / why it was refused before loading. */
void mha_report_not_loadable(MhaReport *r, const char *reason);
void mha_report_artifact_error(MhaReport *r, const char *error);
/* One case of the current artifact: compared (cmp, error NULL) or not (cmp NULL, error set). */
void mha_report_case(MhaReport *r, const char *name, const MhaCompare *cmp, const char *error);
/* A failure tied to no artifact. */
void mha_report_error(MhaReport *r, const char *error);
int mha_report_write(const MhaReport *r, const char *path, char *err, size_t n);
void mha_report_free(MhaReport *r);

/* {"runtime": runner, "artifact_dir": dir, "error": error}: what a check that stopped early writes. */
int mha_report_write_error(const char *runner, const char *dir, const char *error, const char *path, char *err,
                           size_t n);

#ifdef __cplusplus
}
#endif
#endif
