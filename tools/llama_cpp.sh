#!/usr/bin/env bash
# Build llama.cpp once into .cache/llama.cpp/ (git-ignored).
#   tools/llama_cpp.sh          libllama and mha-llama-golden (tools/llama_golden.c, against that libllama), with
#                               which the GPT export's gguf variant and `mha check` run gpt.gguf
#                               (runtime/mha_runtime/gguf/llama_cpp.py): what `make llama-cpp` (and so `make test`)
#                               builds.
#   tools/llama_cpp.sh --tools  also llama-bench, llama-quantize, llama-perplexity and llama-completion, for the
#                               bench's llama.cpp peer (benchmarks/llama_peer.py): `make llama-tools`.
# The tools link llama.cpp's `common` library, half of the whole build's CPU time (docs/gpt.md): the tests need
# none of them (they check our quantizers against ggml's own through libggml-base), so CI does not build them.
#
# Source: the PyPI source release of llama-cpp-python (pinned), which bundles the whole llama.cpp tree with
# convert_hf_to_gguf.py and gguf-py; llama.cpp itself has no wheel and no Debian package here.
# -DGGML_NATIVE=ON ties the binaries to this host's CPU: build them where they run. Without ggml's AMX kernels
# (x86 only): on a Sapphire Rapids VM that reports AMX, they died of SIGILL at their first `tilezero` in an OpenMP
# worker (docs/gpt.md; llama.cpp's open PR #26954 is about the same crash), so every GGUF test failed there.
# Idempotent: does nothing when the binaries exist (mha-llama-golden is rebuilt when its source is newer); always
# ends with one line saying where they are.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PIN="llama-cpp-python==0.3.36"
CACHE="$ROOT/.cache/llama.cpp"
SRC="$CACHE/src"            # the bundled vendor/llama.cpp tree
BUILD="$CACHE/build"
BIN="$BUILD/bin"
PY="$ROOT/.venv/bin/python"
LIBS=(libllama.so libggml.so libggml-base.so)
TOOLS=(llama-bench llama-quantize llama-perplexity llama-completion)
TARGETS=(llama)
WITH_TOOLS=0
if [[ $# -eq 1 && "$1" == "--tools" ]]; then
  WITH_TOOLS=1
  TARGETS+=("${TOOLS[@]}")
elif [[ $# -gt 0 ]]; then
  echo "usage: tools/llama_cpp.sh [--tools]; got: $*" >&2
  exit 2
fi
FLAGS=""
[[ "$(uname -m)" == "x86_64" ]] && FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
STAMP="$CACHE/build-flags"  # the flags the libraries were built with: a build with others is built again
GOLDEN_SRC="$ROOT/tools/llama_golden.c"
GOLDEN="$BIN/mha-llama-golden"

built() {
  local f
  [[ -f "$STAMP" && "$(cat "$STAMP")" == "$FLAGS" ]] || return 1
  for f in "${LIBS[@]}"; do [[ -f "$BIN/$f" ]] || return 1; done
  if [[ $WITH_TOOLS -eq 1 ]]; then
    for f in "${TOOLS[@]}"; do [[ -x "$BIN/$f" ]] || return 1; done
  fi
  return 0
}

# Debian packages only when the command is missing (root or sudo).
need_apt() {
  local cmd="$1" pkg="$2" sudo=""
  command -v "$cmd" >/dev/null 2>&1 && return 0
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  # One apt at a time: make test builds this beside `make chromium` (the same lock file).
  mkdir -p "$ROOT/.cache"
  flock "$ROOT/.cache/apt.lock" $sudo apt-get update -q
  flock "$ROOT/.cache/apt.lock" $sudo apt-get install -y -q "$pkg"
}

fetch_source() {
  [[ -f "$SRC/convert_hf_to_gguf.py" ]] && return 0
  local tmp="$CACHE/download"
  rm -rf "$tmp" && mkdir -p "$tmp"
  "$PY" -m pip download -q --disable-pip-version-check --no-binary :all: --no-deps "$PIN" -d "$tmp"
  tar -xzf "$tmp"/llama_cpp_python-*.tar.gz -C "$tmp"
  rm -rf "$SRC"
  # Its .git file names the sdist's absent submodule folder: git fails there ("fatal: not a git repository",
  # twice at configure), so llama.cpp records its build commit as "unknown" rather than this repository's.
  mv "$tmp"/llama_cpp_python-*/vendor/llama.cpp "$SRC"
  rm -rf "$tmp"
}

build() {
  local gen=(-G "Unix Makefiles")
  command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
  # LLAMA_CURL is deprecated and ignored by this tree (it warns); LLAMA_OPENSSL=OFF is what keeps networking out.
  # LLAMA_BUILD_APP=OFF: no unified binary; only the targets named are built.
  cmake -S "$SRC" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_OPENSSL=OFF \
    -DCMAKE_C_FLAGS="$FLAGS" -DCMAKE_CXX_FLAGS="$FLAGS" \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF >/dev/null
  cmake --build "$BUILD" --parallel "$(nproc)" --target "${TARGETS[@]}"
  rm -f "$GOLDEN"  # linked against the libraries built before
  printf '%s' "$FLAGS" > "$STAMP"
}

# The C program beside the libraries it links (libllama, libggml, libggml-base: shared, in $BIN), found there at
# run time through its rpath.
golden() {
  [[ -x "$GOLDEN" && "$GOLDEN" -nt "$GOLDEN_SRC" ]] && return 0
  cc -O2 -std=c11 -Wall -Wextra -Werror -I"$SRC/include" -I"$SRC/ggml/include" "$GOLDEN_SRC" \
    -L"$BIN" -lllama -lggml -lggml-base -Wl,-rpath,'$ORIGIN' -o "$GOLDEN"
}

# The converter's Python imports: torch, numpy, sentencepiece, transformers (the project venv has them) and the
# bundled gguf-py (put on sys.path by the converter itself) with its own tqdm, pyyaml and requests, which the venv
# also has through other packages. So nothing is installed; gguf-py's three are installed pinned only if the
# converter cannot start without them (another venv).
converter_deps() {
  if ! "$PY" "$SRC/convert_hf_to_gguf.py" --help >/dev/null 2>&1; then
    "$PY" -m pip install -q --disable-pip-version-check 'pyyaml==6.0.4' 'tqdm==4.70.1' 'requests==2.34.2'
    "$PY" "$SRC/convert_hf_to_gguf.py" --help >/dev/null
  fi
}

if ! built; then
  need_apt cmake cmake
  need_apt ninja ninja-build || echo "ninja-build not installed: building with make" >&2
  fetch_source
  build
fi
golden
if [[ $WITH_TOOLS -eq 1 ]]; then
  converter_deps
  echo "llama.cpp: libllama, ${TOOLS[*]} and mha-llama-golden in $BIN; converter $SRC/convert_hf_to_gguf.py"
else
  echo "llama.cpp: libllama and mha-llama-golden in $BIN (\`make llama-tools\` adds the bench's tools)"
fi
