#!/usr/bin/env bash
# The C++ floor under reading a prototxt: protobuf's own TextFormat parser (the one Caffe uses) timed on the nets
# bench/latency.py times, median of 51 parses each. Any estimator that reads the prototxt pays at least this.
#
#     bench/textformat_floor.sh [PYTHON]      (default: .venv/bin/python; needs protoc, g++ and libprotobuf-dev,
#                                               which scripts/system-deps.sh installs for the pycaffe build)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
python=${1:-$repo/.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# caffe.proto as installed with pycaffe: the same schema caffe_pb2 was generated from.
proto_dir=$("$python" -c 'import importlib.util, pathlib
spec = importlib.util.find_spec("caffe")
print(pathlib.Path(next(iter(spec.submodule_search_locations))) / "proto")')
protoc --cpp_out="$work" -I"$proto_dir" "$proto_dir/caffe.proto"
g++ -O2 -o "$work/parse" "$here/textformat_floor.cc" "$work/caffe.pb.cc" -I"$work" -lprotobuf -lpthread

"$python" - "$work" "$here" "$repo/tests" <<'PY'
import pathlib, sys
work, bench, tests = sys.argv[1:]
sys.path[:0] = [bench, tests]
from latency import benchmark_nets
for index, (name, text) in enumerate(benchmark_nets().items()):
    (pathlib.Path(work) / f"{index}.prototxt").write_text(text)
    (pathlib.Path(work) / f"{index}.name").write_text(name)
PY
for text in "$work"/*.prototxt; do
  printf '%s: ' "$(cat "${text%.prototxt}.name")"
  "$work/parse" "$text"
done
