/* Linked into the sanitizer builds only (build/mha_check_asan, build/json_fuzz_asan): a sanitizer report
 * aborts the process (SIGABRT), so it can never pass for an ordinary "error: ..." exit 1. */
const char *__asan_default_options(void);
const char *__ubsan_default_options(void);

const char *__asan_default_options(void) { return "abort_on_error=1:detect_leaks=1:strict_string_checks=1"; }
const char *__ubsan_default_options(void) { return "abort_on_error=1:halt_on_error=1:print_stacktrace=1"; }
