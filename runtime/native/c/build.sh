#!/usr/bin/env bash
# Build mha_check: fetch Debian trixie's libonnxruntime-dev headers and cJSON (libcjson-dev, libcjson1) with a
# private apt configuration (fetch_debs.sh: own sources, lists and cache under build/; the system's apt state
# untouched), then link against the libonnxruntime.so.1.* inside the onnxruntime wheel of the project's environment
# and against that libcjson.so.1 (Debian ships no static libcjson.a), both found through an rpath to build/lib.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
py="${PYTHON:-$repo/.venv/bin/python}"
build="$here/build"
apt_dir="$build/apt"
command -v gcc >/dev/null || { echo "error: gcc not found (apt-get install gcc)" >&2; exit 1; }

"$here/fetch_debs.sh"  # libonnxruntime-dev and libcjson-dev + libcjson1 from Debian trixie, into build/apt/root
include="$apt_dir/root/usr/include/onnxruntime"

ort_lib="$("$py" -c 'import glob, os, onnxruntime; print(sorted(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so.1*")))[-1])')"
mkdir -p "$build/lib"
ln -sf "$ort_lib" "$build/lib/libonnxruntime.so.1"  # the library's SONAME
ln -sf "$ort_lib" "$build/lib/libonnxruntime.so"
cjson_lib="$(ls "$apt_dir"/root/usr/lib/*/libcjson.so.1.* | head -1)"
ln -sf "$cjson_lib" "$build/lib/libcjson.so.1"  # the library's SONAME
ln -sf "$cjson_lib" "$build/lib/libcjson.so"
common="$here/../common"
# mha_check: the attention side (mha_check.c), the GPT side (gpt_*.c) and what both share (cli.c)
sources=("$here/mha_check.c" "$here/cli.c" "$here/gpt_manifest.c" "$here/gpt_sample.c" "$here/gpt_contract.c"
         "$here/gpt_session.c" "$here/gpt_generate.c" "$here/gpt_check.c"
         "$common/artifact.c" "$common/json.c" "$common/report.c" "$common/sha256.c")
warn=(-std=c11 -Wall -Wextra -Werror -Wshadow -Wformat=2)
cjson="$apt_dir/root/usr/include"  # <cjson/cJSON.h>, for common/json.c
gcc "${warn[@]}" -O2 -I"$include" -I"$common" -I"$cjson" "${sources[@]}" -o "$build/mha_check" \
  -L"$build/lib" -lonnxruntime -lcjson -Wl,-rpath,"$build/lib" -lm
gcc -std=c11 -O2 -Wall -Wextra -Werror -I"$include" "$here/example.c" -o "$build/example" \
  -L"$build/lib" -lonnxruntime -Wl,-rpath,"$build/lib"
# The README's GPT snippet: the generation loop with IO binding (load, bind, prefill, step, argmax).
gcc -std=c11 -O2 -Wall -Wextra -Werror -I"$include" "$here/gpt_example.c" -o "$build/gpt_example" \
  -L"$build/lib" -lonnxruntime -Wl,-rpath,"$build/lib"
# The same runner under AddressSanitizer and UBSan (a report aborts: sanitizer_options.c), and the
# in-process fuzzer of the manifest and cases.json readers; `make native-test` and tests/native/test_native.py run both.
asan=(-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all)
gcc "${warn[@]}" "${asan[@]}" -I"$include" -I"$common" -I"$cjson" "${sources[@]}" "$here/sanitizer_options.c" \
  -o "$build/mha_check_asan" -L"$build/lib" -lonnxruntime -lcjson -Wl,-rpath,"$build/lib" -lm
gcc "${warn[@]}" "${asan[@]}" -I"$common" -I"$cjson" "$here/json_fuzz.c" "$common/artifact.c" "$common/json.c" \
  "$common/sha256.c" "$here/sanitizer_options.c" -o "$build/json_fuzz_asan" -L"$build/lib" -lcjson -Wl,-rpath,"$build/lib" -lm
echo "built $build/mha_check, mha_check_asan, json_fuzz_asan, example, gpt_example (headers: ORT_API_VERSION $(grep -m1 -o 'ORT_API_VERSION [0-9]*' "$include/onnxruntime_c_api.h" | cut -d' ' -f2), library: $(basename "$ort_lib"), $(basename "$cjson_lib"))"
