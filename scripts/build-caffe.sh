#!/usr/bin/env bash
# Builds the bundled Caffe (the brocolli-caffe sdist's BVLC tree, as scripts/build-pycaffe.sh does) with Caffe's own
# Makefile, as a Caffe root laid out as DIGITS expects one, and installs it into a virtual environment:
#
#   <venv>/share/digits-memplugin/caffe/cpu/    build/tools/caffe, build/lib/libcaffe.so.1.0.0, build-info.json
#                                               (no python/: the CPU pycaffe is the environment's own `caffe` wheel)
#   <venv>/share/digits-memplugin/caffe/cuda/   the same built with CUDA and cuDNN, plus python/caffe/ (the CUDA
#                                               pycaffe) and cuda-libs/ (the registry's CUDA runtime, cuBLAS, cuRAND
#                                               and cuDNN packages the binaries load)
#
# Every binary finds its libraries through RUNPATH (never RPATH), relative to $ORIGIN, so LD_LIBRARY_PATH can put
# other copies in their place; the CUDA runtime is linked as a shared library (libcudart.so.13). build-info.json
# says what was built and what it links (docs/pycaffe.md).
#
# Cached: a built root lives under $CACHE_ROOT/caffe/<variant>-<key>/, where <key> hashes everything the build
# depends on (this recipe, the patches, the sdist, the Python ABI, the Debian libraries and tools, and for CUDA the
# toolkit, the library packages and the GPU architectures). Installing a cached root hard-links it into the
# environment (a copy across file systems) and takes about a second; so does a second run.
#
# Usage: scripts/build-caffe.sh PYTHON cpu|cuda   (PYTHON: the target environment's interpreter, e.g. .venv/bin/python)
# Environment:
#   DIGITS_MEMPLUGIN_CACHE  the cache (default ~/.cache/digits-memplugin), shared with build-pycaffe.sh
#   BUILD_JOBS              parallel compile jobs (default: number of cores)
#   CAFFE_CUDA_ARCH         compute capabilities to build for, e.g. "90" or "8.0 9.0" (default: those of the GPUs
#                           nvidia-smi lists; without a GPU 90, the H100/H200)
#   CAFFE_ROOTS_DIR         where to install the root (default <venv>/share/digits-memplugin/caffe): <dir>/<variant>
#   CUDA_HOME               a CUDA 13 toolkit to build with (default: /usr/local/cuda or the nvcc on PATH, where
#                           either is CUDA 13; else, or with CUDA_HOME=registry, the registry's nvidia-cuda-nvcc
#                           packages, cached)
set -euo pipefail

PYTHON=${1:?usage: build-caffe.sh PYTHON cpu|cuda}
VARIANT=${2:?usage: build-caffe.sh PYTHON cpu|cuda}
[[ "$VARIANT" == cpu || "$VARIANT" == cuda ]] || { echo "build-caffe: variant must be cpu or cuda, not $VARIANT" >&2; exit 2; }
SDIST_NAME=brocolli-caffe
SDIST_VERSION=9.0.2
SDIST_SHA256=c6410cc60bdd6db685d441b66be7df05410f8850ac88d6b75d48ef9b2315c08a
CAFFE_COMMIT=9b89154
CAFFE_VERSION=1.0.0
# The registry's CUDA 13.0 packages: the toolkit (only where the machine has none) and the libraries the CUDA
# build links and loads. 13.0 is what the machine's toolkit is, and what driver 580 (the H200 machines') runs.
CUDA_TOOLKIT_PACKAGES=(nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-cuda-cccl==13.0.85
                       nvidia-nvvm==13.0.88 nvidia-cuda-runtime==13.0.96)
CUDA_LIBRARY_PACKAGES=(nvidia-cuda-runtime==13.0.96 nvidia-cublas==13.0.2.14 nvidia-curand==10.4.0.35
                       nvidia-cudnn-cu13==9.13.0.50)
CACHE_ROOT=${DIGITS_MEMPLUGIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/digits-memplugin}
BUILD_JOBS=${BUILD_JOBS:-$(nproc)}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The source edits: those in caffe-patches/ for both builds, those in caffe-patches/cuda/ for the CUDA build only
# (they change CUDA code alone, or code only a CUDA build links), so that editing them leaves the CPU root's key be.
PATCHES=("$HERE"/caffe-patches/*.patch)
[[ "$VARIANT" == cuda ]] && PATCHES+=("$HERE"/caffe-patches/cuda/*.patch)
LOCK_WAIT=7200   # seconds to wait for another build of the same key (a cold CUDA build takes tens of minutes)

log() { echo "build-caffe[$VARIANT]: $*" >&2; }
die() { log "$*"; exit 1; }

read -r PY_TAG PY_INCLUDE NP_INCLUDE NP_VERSION PY_LIBDIR PY_LDVERSION VENV < <("$PYTHON" - <<'PY'
import sys, sysconfig
import numpy
print(f"cp{sys.version_info[0]}{sys.version_info[1]}", sysconfig.get_paths()["include"], numpy.get_include(),
      numpy.__version__, sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("LDVERSION"), sys.prefix)
PY
)
[[ -n "${VENV:-}" ]] || die "$PYTHON did not say its ABI, headers and numpy (is numpy installed?)"
PY_NODOT=${PY_TAG#cp}
[[ -e "$PY_LIBDIR/libpython$PY_LDVERSION.so" ]] \
  || die "the Python layer links libpython$PY_LDVERSION.so, which $PY_LIBDIR lacks (a Python built with --enable-shared has it)"
DEST="${CAFFE_ROOTS_DIR:-$VENV/share/digits-memplugin/caffe}/$VARIANT"
mkdir -p "$CACHE_ROOT/caffe"

# Runs "$@" holding an exclusive lock named $1 under the cache, so that two set-ups sharing the cache build once.
locked() {
  local name=$1; shift
  exec {lock_fd}>"$CACHE_ROOT/caffe/.lock-$name"
  flock -w "$LOCK_WAIT" "$lock_fd" || die "waited ${LOCK_WAIT}s for another build of $name"
  "$@"
  exec {lock_fd}>&-
}

# pip-installs the given packages into a folder of the cache named after them, once.
pip_folder() {
  local folder=$1; shift
  [[ -f "$folder/.complete" ]] && return 0
  log "installing ${*} from the registry into $folder"
  rm -rf "$folder.tmp"
  "$PYTHON" -m pip install --quiet --no-deps --no-compile --disable-pip-version-check --target "$folder.tmp" "$@"
  rm -rf "$folder"
  mv "$folder.tmp" "$folder"
  touch "$folder/.complete"
}

nvcc_release() { "$1/bin/nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9.]*\),.*/\1/p'; }

# --- CUDA: the toolkit, the library packages, the architectures (only for the cuda variant)
CUDA_KEY=""
if [[ "$VARIANT" == cuda ]]; then
  toolkit=""
  candidates=("${CUDA_HOME:-}" /usr/local/cuda "$(dirname "$(dirname "$(command -v nvcc || echo /none/bin/nvcc)")")")
  [[ "${CUDA_HOME:-}" == registry ]] && candidates=()
  for candidate in "${candidates[@]}"; do
    [[ -n "$candidate" && -x "$candidate/bin/nvcc" ]] || continue
    release=$(nvcc_release "$candidate")
    if [[ "$release" == 13.* ]]; then toolkit=$candidate; break; fi
    [[ "$candidate" == "${CUDA_HOME:-}" ]] && die "CUDA_HOME=$CUDA_HOME is CUDA ${release:-?}; this build needs CUDA 13"
    log "ignoring the CUDA ${release:-?} toolkit at $candidate: this build needs CUDA 13"
  done
  if [[ -z "$toolkit" ]]; then
    tk_key=$(printf '%s\n' "${CUDA_TOOLKIT_PACKAGES[@]}" | sha256sum | cut -c1-12)
    tk_folder="$CACHE_ROOT/caffe/cuda-toolkit-$tk_key"
    locked "toolkit-$tk_key" pip_folder "$tk_folder" "${CUDA_TOOLKIT_PACKAGES[@]}"
    toolkit="$tk_folder/nvidia/cu13"
    # nvcc.profile looks for headers and libraries under targets/<arch>-linux, as in NVIDIA's own layout.
    mkdir -p "$toolkit/targets/$(uname -m)-linux"
    ln -sfn ../../include "$toolkit/targets/$(uname -m)-linux/include"
    ln -sfn ../../lib "$toolkit/targets/$(uname -m)-linux/lib"
    [[ "$(nvcc_release "$toolkit")" == 13.* ]] || die "the registry's nvcc in $toolkit does not run"
    TOOLKIT_SOURCE="registry: ${CUDA_TOOLKIT_PACKAGES[*]}"
  else
    TOOLKIT_SOURCE="$toolkit"
  fi
  CUDA_RELEASE=$(nvcc_release "$toolkit")
  lib_key=$(printf '%s\n' "${CUDA_LIBRARY_PACKAGES[@]}" | sha256sum | cut -c1-12)
  CUDA_LIBS="$CACHE_ROOT/caffe/cuda-libs-$lib_key"
  locked "libs-$lib_key" pip_folder "$CUDA_LIBS" "${CUDA_LIBRARY_PACKAGES[@]}"

  if [[ -n "${CAFFE_CUDA_ARCH:-}" ]]; then
    archs=$CAFFE_CUDA_ARCH
  elif command -v nvidia-smi >/dev/null && caps=$(timeout 30 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null) && [[ -n "$caps" ]]; then
    archs=$caps
  else
    archs=90
  fi
  ARCHS=$(echo "$archs" | tr -s ' ,\n' '\n' | tr -d '.' | grep -E '^[0-9]+$' | sort -un | tr '\n' ' ')
  [[ -n "$ARCHS" ]] || die "CAFFE_CUDA_ARCH=$archs names no compute capability (e.g. 90 or 8.6)"
  CUDA_ARCH_FLAGS=""
  for arch in $ARCHS; do CUDA_ARCH_FLAGS+="-gencode arch=compute_$arch,code=sm_$arch "; done
  CUDA_KEY="$(nvcc_release "$toolkit") $("$toolkit/bin/nvcc" --version | tail -1) ${CUDA_LIBRARY_PACKAGES[*]} $ARCHS"
fi

# Everything that changes the binaries goes into the build key: the recipe (the lines between the BUILD RECIPE
# markers), the patches, the sdist, the Python ABI and numpy's headers, the Debian libraries and tools, CUDA.
lib_versions=$(dpkg-query -W -f='${Package}=${Version}\n' libboost-python-dev libgoogle-glog-dev libgflags-dev \
  libprotobuf-dev libopenblas-dev libhdf5-dev liblmdb-dev 2>/dev/null | sort)
recipe=$(sed -n '/^# --- BUILD RECIPE BEGIN/,/^# --- BUILD RECIPE END/p' "$HERE/build-caffe.sh")
key=$( { echo "$VARIANT"; echo "$recipe"; cat "${PATCHES[@]}"; echo "$SDIST_SHA256 $PY_TAG $NP_VERSION $PY_LIBDIR";
         echo "$lib_versions"; protoc --version; g++ -dumpfullversion; echo "$CUDA_KEY"; } | sha256sum | cut -c1-12)
BUILD_DIR="$CACHE_ROOT/caffe/$VARIANT-$key"
ROOT="$BUILD_DIR/root"            # the built Caffe root, cached

installed_key=$("$PYTHON" -c 'import json, sys
try: print(json.load(open(sys.argv[1]))["build_key"])
except (OSError, ValueError, KeyError): print("")' "$DEST/build-info.json")
if [[ "$installed_key" == "$key" && ( "$VARIANT" == cpu || -f "$DEST/cuda-libs/.complete" ) ]]; then
  log "Caffe root $key already installed in $DEST"
  exit 0
fi

# --- BUILD RECIPE BEGIN
build_root() {
  [[ -f "$ROOT/build-info.json" ]] && return 0
  log "building Caffe's $VARIANT root (build key $key; takes many minutes; cached afterwards in $BUILD_DIR)"
  mkdir -p "$CACHE_ROOT/sdist"
  local sdist="$CACHE_ROOT/sdist/$SDIST_NAME-$SDIST_VERSION.tar.gz"
  if [[ ! -f "$sdist" ]] || ! echo "$SDIST_SHA256  $sdist" | sha256sum -c --status; then
    local tmp_dl
    tmp_dl=$(mktemp -d)
    "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: --dest "$tmp_dl" "$SDIST_NAME==$SDIST_VERSION"
    mv "$tmp_dl/$SDIST_NAME-$SDIST_VERSION.tar.gz" "$sdist"
    rm -rf "$tmp_dl"
  fi
  echo "$SDIST_SHA256  $sdist" | sha256sum -c --status || die "checksum mismatch for $sdist"

  work=$(mktemp -d "$CACHE_ROOT/caffe/build.XXXXXX")
  # Keep the build folder when something fails, so its logs can be read; remove it once the root is staged.
  trap 'status=$?; if ((status == 0)); then rm -rf "$work"; else log "failed; logs kept in $work"; fi' EXIT
  tar -xzf "$sdist" -C "$work"
  local src="$work/$SDIST_NAME-$SDIST_VERSION"

  # The edits this tree needs, each a patch that must apply exactly (no fuzz) or the build stops: see the head
  # of each file in scripts/caffe-patches/ (and cuda/) for what it changes and why.
  local patch_file
  for patch_file in "${PATCHES[@]}"; do
    patch -d "$src" -p1 --forward --fuzz=0 --batch --no-backup-if-mismatch --quiet <"$patch_file" \
      || die "patch ${patch_file#"$HERE/caffe-patches/"} no longer applies to $SDIST_NAME $SDIST_VERSION"
  done

  # Caffe's Makefile.config: Debian's libraries (serial HDF5, OpenBLAS, LMDB, boost_python<XY>), the environment's
  # Python and numpy headers, the Python layer; no OpenCV or LevelDB (docs/pycaffe.md). Every binary gets RUNPATH
  # entries (--enable-new-dtags), relative to its own folder for what the root holds; --as-needed drops libraries
  # a binary does not use.
  local link_dirs="$PY_LIBDIR /usr/lib/$(uname -m)-linux-gnu/hdf5/serial"
  local include_dirs="$PY_INCLUDE $NP_INCLUDE /usr/include/hdf5/serial"
  local runpath="-Wl,--enable-new-dtags -Wl,--as-needed -Wl,-rpath,$PY_LIBDIR"
  {
    echo "BLAS := open"
    echo "USE_OPENCV := 0"
    echo "USE_LEVELDB := 0"
    echo "USE_LMDB := 1"
    echo "WITH_PYTHON_LAYER := 1"
    echo "PYTHON_LIBRARIES := boost_python$PY_NODOT python$PY_LDVERSION"
    echo "BUILD_DIR := build"
    echo "DISTRIBUTE_DIR := distribute"
    echo "Q := @"
  } >"$src/Makefile.config"
  local targets=(lib .build_release/tools/caffe.bin)   # the Makefile builds into .build_release, linked as build
  if [[ "$VARIANT" == cpu ]]; then
    echo "CPU_ONLY := 1" >>"$src/Makefile.config"
  else
    # Link against the library packages the root will carry: the packages ship only versioned names
    # (libcublas.so.13), so a folder of unversioned links serves the link step.
    local farm="$work/link"
    mkdir -p "$farm"
    ln -s "$CUDA_LIBS/nvidia/cu13/lib/libcudart.so.13" "$farm/libcudart.so"
    ln -s "$CUDA_LIBS/nvidia/cu13/lib/libcublas.so.13" "$farm/libcublas.so"
    ln -s "$CUDA_LIBS/nvidia/cu13/lib/libcurand.so.10" "$farm/libcurand.so"
    ln -s "$CUDA_LIBS/nvidia/cudnn/lib/libcudnn.so.9" "$farm/libcudnn.so"
    link_dirs="$farm $link_dirs"
    # CUDA 13 keeps thrust and cub under include/cccl, which nvcc finds by itself and g++ does not.
    include_dirs="$include_dirs $toolkit/include $toolkit/include/cccl $CUDA_LIBS/nvidia/cu13/include $CUDA_LIBS/nvidia/cudnn/include"
    runpath="$runpath -Wl,-rpath,\\\$\$ORIGIN/../../cuda-libs/nvidia/cu13/lib -Wl,-rpath,\\\$\$ORIGIN/../../cuda-libs/nvidia/cudnn/lib"
    # Where the linker finds what those libraries load in turn (libcublasLt for libcublas): link time only.
    runpath="$runpath -Wl,-rpath-link,$CUDA_LIBS/nvidia/cu13/lib:$CUDA_LIBS/nvidia/cudnn/lib"
    {
      echo "USE_CUDNN := 1"
      echo "CUDA_DIR := $toolkit"
      echo "CUDA_ARCH := $CUDA_ARCH_FLAGS"
      # The CUDA runtime as a shared library, also where nvcc links.
      echo "NVCCFLAGS += -cudart shared"
    } >>"$src/Makefile.config"
    targets+=(py)
  fi
  {
    echo "INCLUDE_DIRS := $include_dirs"
    echo "LIBRARY_DIRS := $link_dirs"
    echo "LINKFLAGS += $runpath"
  } >>"$src/Makefile.config"

  nice make -C "$src" -j "$BUILD_JOBS" "${targets[@]}" >"$work/build.log" 2>&1 \
    || { grep -E "error|Error" "$work/build.log" | head -40 >&2; tail -20 "$work/build.log" >&2; exit 1; }

  # Stage the root: the binary, libcaffe, and for CUDA the pycaffe package (as build-pycaffe.sh stages it).
  local stage="$work/root"
  mkdir -p "$stage/build/tools" "$stage/build/lib"
  cp "$src/build/tools/caffe.bin" "$stage/build/tools/caffe"
  cp "$src/build/lib/libcaffe.so.$CAFFE_VERSION" "$stage/build/lib/"
  ln -s "libcaffe.so.$CAFFE_VERSION" "$stage/build/lib/libcaffe.so"
  strip --strip-unneeded "$stage/build/tools/caffe" "$stage/build/lib/libcaffe.so.$CAFFE_VERSION"
  if [[ "$VARIANT" == cuda ]]; then
    mkdir -p "$stage/python"
    cp -r "$src/python/caffe" "$stage/python/caffe"
    rm -rf "$stage/python/caffe/test" "$stage/python/caffe/_caffe.cpp"
    find "$stage/python" -name __pycache__ -prune -exec rm -rf {} +
    strip --strip-unneeded "$stage/python/caffe/_caffe.so"
  fi
  cp "$src/LICENSE" "$stage/LICENSE"

  # The binaries must load the CUDA runtime as a shared library and search RUNPATH only (LD_LIBRARY_PATH first).
  local binary
  for binary in "$stage/build/tools/caffe" "$stage/build/lib/libcaffe.so.$CAFFE_VERSION" "$stage/python/caffe/_caffe.so"; do
    [[ -e "$binary" ]] || continue
    readelf -d "$binary" | grep -q '(RPATH)' && die "$binary has an RPATH: LD_LIBRARY_PATH could not override it"
    readelf -d "$binary" | grep -q '(RUNPATH)' || die "$binary has no RUNPATH"
  done
  if [[ "$VARIANT" == cuda ]]; then
    readelf -d "$stage/build/lib/libcaffe.so.$CAFFE_VERSION" | grep -q 'NEEDED.*\[libcudart\.so\.13\]' \
      || die "libcaffe does not load the CUDA runtime as libcudart.so.13"
    nm -D "$stage/build/lib/libcaffe.so.$CAFFE_VERSION" | grep -q ' T cudaMalloc$' \
      && die "libcaffe carries a static CUDA runtime"
  fi

  local cudnn_version=""
  if [[ "$VARIANT" == cuda ]]; then
    cudnn_version=$(awk '/#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) /{v = v (v ? "." : "") $3} END {print v}' \
      "$CUDA_LIBS/nvidia/cudnn/include/cudnn_version.h")
  fi
  "$PYTHON" - "$stage/build-info.json" <<PY
import json, sys
cuda = "$VARIANT" == "cuda"
libraries = {
    "libcudart.so.13": "cuda-libs/nvidia/cu13/lib/libcudart.so.13",
    "libcublas.so.13": "cuda-libs/nvidia/cu13/lib/libcublas.so.13",
    "libcublasLt.so.13": "cuda-libs/nvidia/cu13/lib/libcublasLt.so.13",
    "libcurand.so.10": "cuda-libs/nvidia/cu13/lib/libcurand.so.10",
    "libcudnn.so.9": "cuda-libs/nvidia/cudnn/lib/libcudnn.so.9",
} if cuda else {}
info = {
    "variant": "$VARIANT",
    "flavour": "BVLC",
    "caffe_version": "$CAFFE_VERSION",
    "source": "$SDIST_NAME $SDIST_VERSION (BVLC caffe $CAFFE_COMMIT), patched: scripts/caffe-patches",
    "patches": "$(for p in "${PATCHES[@]}"; do echo "${p#"$HERE/caffe-patches/"}"; done | tr '\n' ' ')".split(),
    "build_key": "$key",
    "binary": "build/tools/caffe",
    "library": "build/lib/libcaffe.so.$CAFFE_VERSION",
    "pycaffe": "python" if cuda else None,
    "python": "$PY_TAG",
    "cuda": {
        "version": "${CUDA_RELEASE:-}",
        "toolkit": "${TOOLKIT_SOURCE:-}",
        "packages": "${CUDA_LIBRARY_PACKAGES[*]}".split(),
        "cuda_arch_flags": "${CUDA_ARCH_FLAGS:-}".strip(),
    } if cuda else None,
    "cudnn": "$cudnn_version" or None,
    "compute_capabilities": [f"{int(a) // 10}.{int(a) % 10}" for a in "${ARCHS:-}".split()],
    "libraries": libraries,
    "note": "paths are relative to this Caffe root; the binaries find them through RUNPATH (\$ORIGIN-relative), "
            "which LD_LIBRARY_PATH overrides",
}
with open(sys.argv[1], "w") as out:
    json.dump(info, out, indent=2)
    out.write("\n")
PY

  rm -rf "$ROOT"
  mkdir -p "$BUILD_DIR"
  mv "$stage" "$ROOT"
  log "built $ROOT"
}
# --- BUILD RECIPE END

locked "$VARIANT-$key" build_root

# Install: hard links into the environment (a plain copy where the cache is on another file system), swapped in
# whole so that a Caffe root is never seen half written.
mkdir -p "$(dirname "$DEST")"
rm -rf "$DEST.new"
cp -al "$ROOT" "$DEST.new" 2>/dev/null || { rm -rf "$DEST.new"; cp -a "$ROOT" "$DEST.new"; }
if [[ "$VARIANT" == cuda ]]; then
  cp -al "$CUDA_LIBS" "$DEST.new/cuda-libs" 2>/dev/null || { rm -rf "$DEST.new/cuda-libs"; cp -a "$CUDA_LIBS" "$DEST.new/cuda-libs"; }
fi
# The binary must start and find every library it needs inside the root or the system.
if ldd "$DEST.new/build/tools/caffe" | grep -q 'not found'; then
  ldd "$DEST.new/build/tools/caffe" | grep 'not found' >&2
  die "the installed caffe binary misses libraries"
fi
version=$(timeout 60 "$DEST.new/build/tools/caffe" --version 2>&1 | head -1) \
  || die "the installed caffe binary does not start: $version"
[[ "$version" == *"$CAFFE_VERSION"* ]] || die "the installed caffe binary says '$version', not version $CAFFE_VERSION"
rm -rf "$DEST"
mv "$DEST.new" "$DEST"
log "installed Caffe root $key in $DEST ($version)"
