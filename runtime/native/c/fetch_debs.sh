#!/usr/bin/env bash
# Unpack the Debian trixie packages the native runners build against into runtime/native/c/build/apt/root, with a
# private apt configuration (own sources, lists and cache under build/apt; the system's apt state untouched, no
# sudo): libonnxruntime-dev (the ONNX Runtime C headers) and libcjson-dev + libcjson1 (cJSON 1.7.18, the JSON reader
# under common/json.c; the deb has no static libcjson.a, so the runners link its libcjson.so.1 with an rpath; it needs
# only glibc >= 2.14). Used by c/build.sh and cpp-libtorch/build.sh; does nothing when all three are there.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
apt_dir="$here/build/apt"
root="$apt_dir/root"
if [ -f "$root/usr/include/onnxruntime/onnxruntime_c_api.h" ] && [ -f "$root/usr/include/cjson/cJSON.h" ] &&
   compgen -G "$root/usr/lib/*/libcjson.so.1" >/dev/null; then
  exit 0
fi
command -v apt-get >/dev/null || { echo "error: apt-get not found: the ONNX Runtime headers and cJSON come from Debian" >&2; exit 1; }
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/parts" "$apt_dir/debs"
# the first stanza of this machine's Debian sources, with the suite set to trixie
awk 'BEGIN{RS="";ORS="\n\n"} /deb.debian.org\/debian$|deb.debian.org\/debian\n/ && !done {print; done=1}' \
  /etc/apt/sources.list.d/debian.sources 2>/dev/null | sed -e 's/^Suites:.*/Suites: trixie/' >"$apt_dir/parts/trixie.sources" || true
if [ ! -s "$apt_dir/parts/trixie.sources" ]; then
  echo "Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" >"$apt_dir/parts/trixie.sources"
fi
opts=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$apt_dir/parts"
      -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache" -o Debug::NoLocking=1
      -o APT::Sandbox::User=root)
apt-get -q "${opts[@]}" update >/dev/null
rm -f "$apt_dir"/debs/*.deb
(cd "$apt_dir/debs" && apt-get -q "${opts[@]}" download libonnxruntime-dev libcjson-dev libcjson1 >/dev/null)
for deb in "$apt_dir"/debs/*.deb; do dpkg -x "$deb" "$root"; done
