#!/usr/bin/env bash
# Build mha_ts with CMake against the libtorch inside the torch wheel of the project's environment, and cJSON.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py="${PYTHON:-$here/../../../.venv/bin/python}"
command -v cmake >/dev/null || { echo "error: cmake not found (apt-get install cmake)" >&2; exit 1; }
command -v g++ >/dev/null || { echo "error: g++ not found (apt-get install g++)" >&2; exit 1; }
"$here/../c/fetch_debs.sh"  # cJSON (Debian trixie's libcjson-dev, libcjson1), shared with the C runner's build
prefix="$("$py" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
cmake -S "$here" -B "$here/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$here/build" -j 2 >/dev/null
echo "built $here/build/mha_ts"
