#!/usr/bin/env bash
# Builds pycaffe (BVLC caffe, CPU-only) from the registry's brocolli-caffe sdist against Debian's libraries,
# packs it as a wheel named `pycaffe`, and installs that wheel into the given Python environment.
#
# Why a script and not `pip install brocolli-caffe`: that sdist's setup.py needs conda and Python <= 3.9. Its
# CMake tree builds fine on Python 3.11 once pointed at Debian's boost_python311, serial HDF5 and LMDB.
#
# Cached: the built package and its wheel live under $CACHE_ROOT/pycaffe/<key>/, where <key> hashes everything the
# build depends on (the build recipe below, the sdist, the Python ABI, numpy's headers, the Debian library
# versions). When the key has not changed and the environment already holds that wheel, the script returns in
# about a second.
#
# Usage: scripts/build-pycaffe.sh PYTHON     (PYTHON: the interpreter of the target environment, e.g. .venv/bin/python)
# Environment: DIGITS_MEMPLUGIN_CACHE (default ~/.cache/digits-memplugin), BUILD_JOBS (default: number of cores).
set -euo pipefail

PYTHON=${1:?usage: build-pycaffe.sh PYTHON}
SDIST_NAME=brocolli-caffe
SDIST_VERSION=9.0.2
SDIST_SHA256=c6410cc60bdd6db685d441b66be7df05410f8850ac88d6b75d48ef9b2315c08a
CAFFE_COMMIT=9b89154          # the BVLC commit the sdist carries
WHEEL_VERSION_BASE=1.0.0      # Caffe's own version (CAFFE_TARGET_VERSION)
CACHE_ROOT=${DIGITS_MEMPLUGIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/digits-memplugin}
BUILD_JOBS=${BUILD_JOBS:-$(nproc)}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

log() { echo "build-pycaffe: $*" >&2; }

read -r PY_TAG PY_INCLUDE NP_INCLUDE NP_VERSION < <("$PYTHON" - <<'PY'
import sys, sysconfig
import numpy
print(f"cp{sys.version_info[0]}{sys.version_info[1]}", sysconfig.get_paths()["include"], numpy.get_include(),
      numpy.__version__)
PY
)
PY_NODOT=${PY_TAG#cp}

# Everything that changes the binary goes into the build key: the recipe (the lines between the BUILD RECIPE
# markers), the sdist, the Python ABI, numpy's headers, the Debian libraries and tools. The wheel's metadata has
# a key of its own, so editing it repacks the wheel without rebuilding.
lib_versions=$(dpkg-query -W -f='${Package}=${Version}\n' libboost-python-dev libgoogle-glog-dev libprotobuf-dev \
  libopenblas-dev libhdf5-dev liblmdb-dev 2>/dev/null | sort)
recipe=$(sed -n '/^# --- BUILD RECIPE BEGIN/,/^# --- BUILD RECIPE END/p' "$HERE/build-pycaffe.sh")
packing=$(sed -n '/^# --- PACKING BEGIN/,/^# --- PACKING END/p' "$HERE/build-pycaffe.sh")
key=$( { echo "$recipe"; echo "$SDIST_SHA256 $PY_TAG $NP_VERSION"; echo "$lib_versions";
         protoc --version; g++ -dumpfullversion; } | sha256sum | cut -c1-12)
pack_key=$(echo "$packing" | sha256sum | cut -c1-6)
WHEEL_VERSION="${WHEEL_VERSION_BASE}+bvlc${CAFFE_COMMIT}.cpu.${key}.${pack_key}"
BUILD_DIR="$CACHE_ROOT/pycaffe/$key"
STAGE="$BUILD_DIR/stage"            # the built `caffe` package, cached
WHEEL_FILE="$BUILD_DIR/pycaffe-${WHEEL_VERSION}-${PY_TAG}-${PY_TAG}-linux_$(uname -m).whl"

installed=$("$PYTHON" -c 'import importlib.metadata as m
try: print(m.version("pycaffe"))
except m.PackageNotFoundError: print("")')
if [[ "$installed" == "$WHEEL_VERSION" ]]; then
  log "pycaffe $WHEEL_VERSION already installed"
  exit 0
fi

# --- BUILD RECIPE BEGIN
if [[ ! -f "$STAGE/caffe/_caffe.so" ]]; then
  log "building pycaffe (build key $key; takes several minutes; cached afterwards in $BUILD_DIR)"
  mkdir -p "$CACHE_ROOT/sdist"
  sdist="$CACHE_ROOT/sdist/$SDIST_NAME-$SDIST_VERSION.tar.gz"
  if [[ ! -f "$sdist" ]] || ! echo "$SDIST_SHA256  $sdist" | sha256sum -c --status; then
    tmp_dl=$(mktemp -d)
    "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: --dest "$tmp_dl" "$SDIST_NAME==$SDIST_VERSION"
    mv "$tmp_dl/$SDIST_NAME-$SDIST_VERSION.tar.gz" "$sdist"
    rm -rf "$tmp_dl"
  fi
  echo "$SDIST_SHA256  $sdist" | sha256sum -c --status || { log "checksum mismatch for $sdist"; exit 1; }

  work=$(mktemp -d "$CACHE_ROOT/build.XXXXXX")
  # Keep the build folder when something fails, so its logs can be read; remove it once the wheel is made.
  trap 'status=$?; if ((status == 0)); then rm -rf "$work"; else log "failed; logs kept in $work"; fi' EXIT
  tar -xzf "$sdist" -C "$work"
  src="$work/$SDIST_NAME-$SDIST_VERSION"

  # Point the link line at Debian's names: boost_python<XY>, the serial HDF5 flavour, and LMDB.
  sed -i \
    -e "s/-lboost_python /-lboost_python${PY_NODOT} /" \
    -e "s/-lhdf5_hl -lhdf5 /-lhdf5_serial_hl -lhdf5_serial -llmdb /" \
    "$src/python/CMakeLists.txt"
  grep -q -- "-lboost_python${PY_NODOT} .*-llmdb" "$src/python/CMakeLists.txt" \
    || { log "could not adapt python/CMakeLists.txt link line"; exit 1; }

  # Restore upstream BVLC's construction log (this tree demoted it to debug-only): "Top shape", "Memory required
  # for data" and "needs backward computation" lines are what the estimator is cross-checked against, and what
  # users of upstream Caffe see in their logs.
  sed -i '/void Net<Dtype>::Init/,/Network initialization done/ {
    s/DLOG_IF(INFO, Caffe::root_solver())/LOG_IF(INFO, Caffe::root_solver())/
    s/DLOG(INFO)/LOG(INFO)/
  }' "$src/src/caffe/net.cpp"
  grep -q 'LOG_IF(INFO, Caffe::root_solver())$' "$src/src/caffe/net.cpp" \
    && ! sed -n '/void Net<Dtype>::Init/,/Network initialization done/p' "$src/src/caffe/net.cpp" | grep -q DLOG \
    || { log "could not restore the net construction log in net.cpp"; exit 1; }

  # The tree hard-codes include paths under ANACONDA_HOME: give it the environment's prefix (numpy lives there)
  # and pass the interpreter's own headers, Debian's serial HDF5 headers and the feature defines as flags.
  env_prefix=$("$PYTHON" -c 'import sys; print(sys.prefix)')
  cxx_flags="-I$PY_INCLUDE -I$NP_INCLUDE -I/usr/include/hdf5/serial -DUSE_LMDB -DWITH_PYTHON_LAYER"
  cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
    -DANACONDA_HOME="$env_prefix" -DPYTHON_VERSION="python${PY_NODOT:0:1}.${PY_NODOT:1}" \
    -DCMAKE_CXX_FLAGS="$cxx_flags" >"$work/cmake.log" 2>&1 \
    || { tail -50 "$work/cmake.log" >&2; exit 1; }
  cmake --build "$work/build" --target pycaffe -j "$BUILD_JOBS" >"$work/build.log" 2>&1 \
    || { grep -E "error|Error" "$work/build.log" | head -40 >&2; tail -20 "$work/build.log" >&2; exit 1; }

  # Stage the package: python sources, the extension, the generated caffe_pb2.py.
  stage="$work/stage"
  mkdir -p "$stage"
  cp -r "$src/python/caffe" "$stage/caffe"
  rm -rf "$stage/caffe/test" "$stage/caffe/_caffe.so" "$stage/caffe/_caffe.cpp" "$stage/caffe/__pycache__"
  find "$stage" -name __pycache__ -prune -exec rm -rf {} +
  cp "$work/build/lib/_caffe.so" "$stage/caffe/_caffe.so"
  mkdir -p "$stage/caffe/proto"
  touch "$stage/caffe/proto/__init__.py"
  cp "$work/build/include/caffe/proto/caffe_pb2.py" "$stage/caffe/proto/caffe_pb2.py"
  strip --strip-unneeded "$stage/caffe/_caffe.so"
  # The caffe.proto that defines caffe_pb2, kept beside it for reference.
  cp "$src/src/caffe/proto/caffe.proto" "$stage/caffe/proto/caffe.proto"

  mkdir -p "$BUILD_DIR"
  rm -rf "$STAGE"
  mv "$stage" "$STAGE"
  cp "$src/LICENSE" "$STAGE.LICENSE"
  log "built $STAGE"
fi
# --- BUILD RECIPE END

# --- PACKING BEGIN
if [[ ! -f "$WHEEL_FILE" ]]; then
  pack=$(mktemp -d "$CACHE_ROOT/pack.XXXXXX")
  cp -r "$STAGE/caffe" "$pack/caffe"
  distinfo="$pack/pycaffe-${WHEEL_VERSION}.dist-info"
  mkdir -p "$distinfo"
  cat >"$distinfo/METADATA" <<META
Metadata-Version: 2.1
Name: pycaffe
Version: $WHEEL_VERSION
Summary: BVLC Caffe $CAFFE_COMMIT Python bindings, CPU-only, built from $SDIST_NAME $SDIST_VERSION against Debian libraries
License: BSD-2-Clause
Requires-Python: ==${PY_NODOT:0:1}.${PY_NODOT:1}.*
Requires-Dist: numpy<2
Requires-Dist: protobuf<3.21,>=3.20
Requires-Dist: scikit-image
Requires-Dist: six
META
  cat >"$distinfo/WHEEL" <<META
Wheel-Version: 1.0
Generator: digits-memplugin build-pycaffe.sh
Root-Is-Purelib: false
Tag: ${PY_TAG}-${PY_TAG}-linux_$(uname -m)
META
  cp "$STAGE.LICENSE" "$distinfo/LICENSE"
  mkdir -p "$pack/dist"
  "$PYTHON" -m wheel pack --dest-dir "$pack/dist" "$pack" >/dev/null
  mv "$pack/dist/"*.whl "$WHEEL_FILE"
  rm -rf "$pack"
fi
# --- PACKING END

# Also installs the wheel's own dependencies (scikit-image, six); numpy and protobuf are already pinned.
"$PYTHON" -m pip install --quiet "$WHEEL_FILE"
log "installed pycaffe $WHEEL_VERSION"
