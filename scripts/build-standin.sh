#!/usr/bin/env bash
# Builds the stand-in CUDA libraries (bench/standin/: libcudart.so.13, libcublas.so.13, libcurand.so.10,
# libcudnn.so.9) that let the bundled CUDA Caffe run its GPU path on a machine without a GPU, counting every device
# allocation (bench/standin/README.md), and beside them the memory probe for a real GPU
# (libdigits_memplugin_probe.so, LD_PRELOAD, bench/device_check.py). For measurement only: the benchmarks and tests
# put the folder this script prints in front of LD_LIBRARY_PATH; nothing in the package loads it.
#
# Each library has the real one's soname and symbol version, and is compiled against the real headers the CUDA root
# carries (cuda-libs/), so that their types are the ones Caffe was built with. Then every CUDA entry point the root's
# binaries import (caffe, libcaffe, pycaffe's _caffe.so: `nm -D --undefined-only`, by symbol version) must be one the
# stand-in defines, or the script fails naming the missing ones.
#
# Cached: the libraries live under $CACHE_ROOT/standin/<key>/lib, where <key> hashes the sources, this script, the
# compiler and the CUDA root's build key; a second run prints the folder at once.
#
# Usage: scripts/build-standin.sh CUDA_ROOT     (e.g. .venv/share/digits-memplugin/caffe/cuda); prints the folder
# Environment: DIGITS_MEMPLUGIN_CACHE (default ~/.cache/digits-memplugin), CC (default cc), CUDA_HOME (the toolkit
#   whose include/crt the CUDA headers need; default: the toolkit the root was built with, else /usr/local/cuda)
set -euo pipefail

ROOT=${1:?usage: build-standin.sh CUDA_ROOT}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SOURCES="$HERE/../bench/standin"
CACHE_ROOT=${DIGITS_MEMPLUGIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/digits-memplugin}
CC=${CC:-cc}
# soname -> source file; each soname is also the library's symbol version (as the real libraries' are).
LIBRARIES=(libcudart.so.13:cudart libcublas.so.13:cublas libcurand.so.10:curand libcudnn.so.9:cudnn)

log() { echo "build-standin: $*" >&2; }
die() { log "$*"; exit 1; }

[[ -f "$ROOT/build-info.json" ]] || die "$ROOT is not a Caffe root (no build-info.json): run make install CAFFE_CUDA=1"
# build-info.json (written by build-caffe.sh, one field a line): the variant, the build key, the toolkit.
info_field() { sed -n "s/^ *\"$1\": \"\([^\"]*\)\".*/\1/p" "$ROOT/build-info.json" | head -1; }
[[ "$(info_field variant)" == cuda ]] || die "$ROOT is not the CUDA Caffe root (variant $(info_field variant))"
BUILD_KEY=$(info_field build_key)
TOOLKIT=$(info_field toolkit)
[[ -n "$BUILD_KEY" ]] || die "$ROOT/build-info.json has no build_key"
LIBS="$ROOT/cuda-libs/nvidia"
[[ -f "$LIBS/cu13/include/cuda_runtime_api.h" && -f "$LIBS/cudnn/include/cudnn.h" ]] \
  || die "$ROOT/cuda-libs lacks the CUDA and cuDNN headers"

# The toolkit's include/ holds crt/, which cuda_runtime.h (through curand.h) needs and the library packages lack.
crt_dir=""
for candidate in "${CUDA_HOME:-}" "$TOOLKIT" /usr/local/cuda "$CACHE_ROOT"/caffe/cuda-toolkit-*/nvidia/cu13; do
  [[ -n "$candidate" && -f "$candidate/include/crt/host_config.h" ]] && { crt_dir="$candidate/include"; break; }
done
[[ -n "$crt_dir" ]] || die "no CUDA toolkit with include/crt/host_config.h (set CUDA_HOME)"

key=$( { cat "$HERE/build-standin.sh" "$SOURCES"/*.c "$SOURCES"/*.h "$SOURCES"/*.map; echo "$BUILD_KEY";
         "$CC" --version | head -1; } | sha256sum | cut -c1-12)
OUT="$CACHE_ROOT/standin/$key"
mkdir -p "$CACHE_ROOT/standin"

build() {
  [[ -f "$OUT/lib/.complete" ]] && return 0
  log "building the stand-in CUDA libraries (key $key) into $OUT/lib"
  local tmp
  tmp=$(mktemp -d "$CACHE_ROOT/standin/build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  local flags=(-O2 -g -Wall -Wextra -Werror -Wno-deprecated-declarations -std=gnu11 -fPIC -shared
               -fvisibility=hidden -I"$SOURCES" -I"$LIBS/cudnn/include" -I"$LIBS/cu13/include" -I"$crt_dir")
  local entry soname name
  for entry in "${LIBRARIES[@]}"; do
    soname=${entry%%:*}
    name=${entry#*:}
    local link=()
    # cuDNN's stand-in writes its section into the runtime's report.
    [[ "$name" == cudnn ]] && link=(-L"$tmp" -l:libcudart.so.13)
    nice "$CC" "${flags[@]}" -Wl,-soname,"$soname" -Wl,--version-script="$SOURCES/$name.map" \
      -o "$tmp/$soname" "$SOURCES/$name.c" "${link[@]}" -ldl -lpthread
  done
  # The probe counts the same way on a real runtime; its symbols carry the runtime's version so that they come first.
  nice "$CC" "${flags[@]}" -Wl,-soname,libdigits_memplugin_probe.so -Wl,--version-script="$SOURCES/probe.map" \
    -o "$tmp/libdigits_memplugin_probe.so" "$SOURCES/probe.c" -ldl -lpthread
  rm -rf "$OUT"
  mkdir -p "$OUT"
  mv "$tmp" "$OUT/lib"
  trap - EXIT
  touch "$OUT/lib/.complete"
}

exec {lock_fd}>"$CACHE_ROOT/standin/.lock"
flock -w 600 "$lock_fd" || die "waited 600 s for another build of the stand-in"
build

# Every CUDA entry point the root's binaries import, by symbol version, must be defined by the stand-in.
missing=()
for entry in "${LIBRARIES[@]}"; do
  soname=${entry%%:*}
  defined=$(nm -D --defined-only "$OUT/lib/$soname" | awk '{print $3}' | sed 's/@.*//' | sort -u)
  for binary in "$ROOT/build/tools/caffe" "$ROOT/build/lib/libcaffe.so.1.0.0" "$ROOT/python/caffe/_caffe.so"; do
    [[ -e "$binary" ]] || continue
    while read -r symbol; do
      grep -qx -- "$symbol" <<<"$defined" || missing+=("$symbol@$soname (${binary#"$ROOT/"})")
    done < <(nm -D --undefined-only "$binary" | awk '{print $2}' | grep "@$soname\$" | sed 's/@.*//' | sort -u)
  done
done
if ((${#missing[@]})); then
  printf '  %s\n' "${missing[@]}" >&2
  die "the stand-in lacks ${#missing[@]} entry points the CUDA Caffe calls (above): add them to bench/standin/"
fi
echo "$OUT/lib"
