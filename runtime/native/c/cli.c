/* See cli.h. */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

const OrtApi *ort;
OrtEnv *env;
OrtMemoryInfo *cpu;

int failed(OrtStatus *status, const char *what, char *why, size_t n) {
    if (status == NULL) return 0;
    const char *msg = ort->GetErrorMessage(status);
    size_t len = strcspn(msg, "\n");
    say(why, n, "%s: %.*s", what, (int)(len > 300 ? 300 : len), msg);
    ort->ReleaseStatus(status);
    return 1;
}

void say(char *buf, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
}

/* Lines of 4095 bytes at most: longer ones are cut short (the GPT check's longest is about 2300). */
void print_c(const char *fmt, ...) {
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    int w = json_vsnprintf_c(line, sizeof line, fmt, ap);
    va_end(ap);
    if (w < 0) { fputs("error: cannot format a line in the \"C\" locale\n", stdout); return; }
    fputs(line, stdout);
    if ((size_t)w >= sizeof line) fputc('\n', stdout);  /* cut short: still one line */
}

int arg_int(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    if (!*s || !(*s == '-' || (*s >= '0' && *s <= '9'))) return 0;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

int stop(const char *dir, const char *json_path, const char *why) {
    fprintf(stderr, "error: %s\n", why);
    char err[1024];
    if (json_path && mha_report_write_error("c", dir, why, json_path, err, sizeof err))
        fprintf(stderr, "error: %s\n", err);
    return 1;
}

int finish(const MhaReport *report, int passed, int failures, const char *json_path, char *err, size_t n) {
    int rc = failures > 0 || passed == 0;
    if (json_path) {
        fflush(stdout);
        if (report->passed != passed || report->failed != failures) {
            fprintf(stderr, "error: %s: the results kept (%d passed, %d failed) differ from the count; not written\n",
                    json_path, report->passed, report->failed);
            rc = 1;
        } else if (mha_report_write(report, json_path, err, n)) {
            fprintf(stderr, "error: %s\n", err);
            rc = 1;
        }
    }
    return rc;
}
