"""Real Caffe's answer for a net's shapes, from a child pycaffe process: the estimator's fallback and yardstick.

`core.net.build_net` takes a `ShapeOracle` for layer types it has no rule for; `pycaffe_oracle` is that oracle.
It writes the net to a temporary file and runs ``python -m digits_memplugin.estimate.pycaffe_shapes NET PHASE``, which
builds `caffe.Net` in CPU mode and prints every layer's top and param shapes as JSON. Caffe aborts the whole
process on a failed CHECK, so it never runs in the caller's process; a glog ``F...`` line becomes a `NetError`
naming the layer the log was setting up.

Caffe's layers open what their parameters name as they are set up, and the nets come from anyone who can ask for
an estimate. So a net reaches the child only through `core.sanitize.check_net` (no layer that opens a file or
imports code, such as HDF5Output, a data layer or a Python layer; no path-bearing field), and the child builds it
confined (`digits_memplugin.estimate.sandbox`: it may read but not create, truncate, change or delete any file, open a
socket or start a program) in its own empty folder, reporting on a pipe.

A child costs ~100 MB and a second or two of a core, so a process runs at most `MAX_CHILDREN` at once
(`CHILDREN`); a net waits for its turn at most `DEFAULT_TIMEOUT` (then a NetError says pycaffe was busy). The web
server sends every estimate that needs pycaffe to its estimate workers (estimate_pool.py), so those children are at
most one per worker, behind the workers' bounded queue; the job manager's own (a job submitted with such a layer)
wait here (issue 23, item 7: thirty estimates started thirty-one children at once).

The core must not start processes (it is imported by the web server), which is why this lives outside it.
`caffe_net` gives the whole picture (blob names and shapes, split layers included, loss weights, the layers that
need backward, Caffe's "Memory required for data"), which the golden tests compare with `core.net.Net`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..core.errors import NetError, ShapeError, UnsupportedLayerError
from ..core.layers import Shape
from ..core.net import Net
from ..core.sanitize import check_net

DEFAULT_TIMEOUT = 120.0
"""Seconds a child may take: building a VGG-sized net fills ~140M weights, a few seconds on one core."""
MAX_CHILDREN = 2
"""pycaffe children one process runs at once."""


class ChildSlots:
    """At most `limit` children at once in this process; `slot` waits for one (through gevent's hub when gevent has
    patched threading: the server goes on meanwhile) at most `timeout` seconds."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._lock = threading.Condition()
        self.alive = 0
        self.most_alive = 0
        """The most children alive at once since the start (tests and benchmarks read it)."""

    @contextlib.contextmanager
    def slot(self, timeout: float) -> Iterator[None]:
        deadline = time.monotonic() + timeout
        with self._lock:
            while self.alive >= self.limit:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NetError(
                        f"pycaffe was busy: {self.alive} nets were being built for {timeout:g} s and this one "
                        "waited its turn as long; try again"
                    )
                self._lock.wait(left)
            self.alive += 1
            self.most_alive = max(self.most_alive, self.alive)
        try:
            yield
        finally:
            with self._lock:
                self.alive -= 1
                self._lock.notify()


CHILDREN = ChildSlots(MAX_CHILDREN)

_FATAL = re.compile(r"^F\d{4,8} [\d:.]+\s+\d+ (?P<where>[^\]]+)\] (?P<message>.*)$")
_CREATING = re.compile(r"\] Creating Layer (?P<name>.*)$")
_MEMORY = re.compile(r"\] Memory required for data: (?P<bytes>\d+)$")
_BACKWARD = re.compile(r"\] (?P<name>.*) (?P<need>needs|does not need) backward computation\.$")
_UNKNOWN_TYPE = re.compile(r"Unknown layer type: (?P<type>\S+)")
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")
_LAYER_IN_MESSAGE = re.compile(r"layer '?(?P<name>[^'\s,)]+)'?")


@dataclasses.dataclass(frozen=True)
class CaffeLayer:
    """One layer of the net Caffe built (split layers included), as pycaffe reports it."""

    name: str
    type: str
    bottoms: list[str]
    tops: list[str]
    top_shapes: list[Shape]
    param_shapes: list[Shape]
    need_backward: bool | None
    """From the log's "needs backward computation" lines; None when the log did not say."""


@dataclasses.dataclass(frozen=True)
class CaffeNet:
    """The net Caffe built for one phase."""

    layers: list[CaffeLayer]
    blobs: list[tuple[str, Shape]]
    """(name, shape) of every blob in Caffe's order (pycaffe's `net.blobs`, anonymous tops included)."""
    loss_weights: list[tuple[str, float]]
    memory_required_for_data: int | None
    """The last "Memory required for data" line Caffe logged while building the net (bytes)."""
    log: str


def caffe_net(net_param: Any, phase: str, *, timeout: float = DEFAULT_TIMEOUT) -> CaffeNet:
    """Build `net_param` (a caffe_pb2.NetParameter, data layers already replaced by Input layers) with pycaffe in
    a confined child process for `phase` ("TRAIN" or "TEST"). Raises NetError when Caffe rejects the net, and
    before any child starts when the net holds a layer that opens a file or imports code, or names a path."""
    if phase not in ("TRAIN", "TEST"):
        raise ValueError(f"phase must be TRAIN or TEST, got {phase!r}")
    check_net(net_param)
    from google.protobuf import text_format

    with tempfile.TemporaryDirectory(prefix="memplugin-shapes-") as folder:
        net_path = Path(folder) / "net.prototxt"
        net_path.write_text(text_format.MessageToString(net_param))
        work = Path(folder) / "work"
        work.mkdir()  # the child's own empty folder: a relative path it is given names nothing
        env = {
            **os.environ,
            "GLOG_logtostderr": "1",
            "GLOG_minloglevel": "0",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        try:
            with CHILDREN.slot(timeout):
                result = subprocess.run(
                    [sys.executable, "-m", "digits_memplugin.estimate.pycaffe_shapes", str(net_path), phase],
                    check=False,
                    stdin=subprocess.DEVNULL,
                    capture_output=True,  # pipes: the confined child may not write to a file
                    text=True,
                    errors="replace",
                    timeout=timeout,
                    env=env,
                    cwd=work,
                )
        except subprocess.TimeoutExpired:
            raise NetError(f"pycaffe did not build the net within {timeout:g} s") from None
    try:
        report = json.loads(result.stdout) if result.returncode == 0 else None
    except ValueError:
        report = None
    if not isinstance(report, dict):
        raise caffe_error(result.stderr, net_param, result.returncode)
    return _caffe_net(report, result.stderr)


def _caffe_net(report: Mapping[str, Any], log: str) -> CaffeNet:
    backward: list[tuple[str, bool | None]] = []
    memory: int | None = None
    for line in log.splitlines():
        if match := _MEMORY.search(line):
            memory = int(match.group("bytes"))
        elif match := _BACKWARD.search(line):
            backward.append((match.group("name"), match.group("need") == "needs"))
    # Net::Init logs one backward line per layer, last layer first, after every layer is set up (so after the
    # internal nets of LSTM/RNN layers log theirs); names may repeat, so they are matched by position.
    names = [layer["name"] for layer in report["layers"]]
    backward = backward[len(backward) - len(names) :][::-1] if len(backward) >= len(names) else []
    if [name for name, _ in backward] != names:
        backward = [(name, None) for name in names]
    layers = [
        CaffeLayer(
            name=layer["name"],
            type=layer["type"],
            bottoms=list(layer["bottoms"]),
            tops=list(layer["tops"]),
            top_shapes=[tuple(shape) for shape in layer["top_shapes"]],
            param_shapes=[tuple(shape) for shape in layer["param_shapes"]],
            need_backward=need,
        )
        for layer, (_, need) in zip(report["layers"], backward)
    ]
    return CaffeNet(
        layers=layers,
        blobs=[(name, tuple(shape)) for name, shape in report["blobs"]],
        loss_weights=[(name, float(weight)) for name, weight in report["loss_weights"]],
        memory_required_for_data=memory,
        log=log,
    )


def caffe_error(log: str, net_param: Any, returncode: int) -> NetError:
    """The NetError for a child that failed: the glog fatal line (or the Python exception) and the layer Caffe
    was creating or setting up when it failed."""
    lines = log.splitlines()
    created: list[str] = []
    fatal: re.Match[str] | None = None
    for line in lines:
        if match := _CREATING.search(line):
            created.append(match.group("name"))
        elif match := _FATAL.match(line):
            fatal = match
            break
    types = {layer.name: layer.type for layer in net_param.layer}
    # Layers of internal nets (LSTM, RNN) log "Creating Layer" too: only the net's own layers, and the split
    # layers Caffe inserts after them (InsertSplits names them "<top>_<layer>_<index>_split"), are named.
    splits = {f"{top}_{layer.name}_{index}_split" for layer in net_param.layer for index, top in enumerate(layer.top)}
    created = [name for name in created if name in types or name in splits]
    if fatal is None:
        # A Python exception (pycaffe's, or the child's own, such as not being able to confine itself): the first
        # exception line is the cause; else the last line says what.
        exceptions = [line for line in lines if _EXCEPTION.match(line)]
        last = next((line for line in reversed(lines) if line.strip() and not line.startswith((" ", "\t"))), "")
        message = exceptions[0] if exceptions else last
        layer = created[-1] if created else None
        detail = message or f"pycaffe exited with status {returncode} and no message"
        return NetError(f"pycaffe rejected the net: {detail}", layer=layer, layer_type=types.get(layer or ""))
    message = fatal.group("message").strip()
    unknown = _UNKNOWN_TYPE.search(message)
    if unknown:
        layer_type = unknown.group("type")
        layer = next((item.name for item in net_param.layer if item.type == layer_type and item.name not in created), None)
        return UnsupportedLayerError(
            f"this Caffe has no layer type {layer_type!r}", layer=layer, layer_type=layer_type, field="type"
        )
    layer = None
    where = fatal.group("where")
    if created and not where.startswith(("net.cpp", "insert_splits.cpp", "upgrade_proto.cpp")):
        layer = created[-1]
    elif named := _LAYER_IN_MESSAGE.search(message):
        layer = named.group("name") if named.group("name") in types else None
    if layer is None and created and where.startswith("net.cpp"):
        layer = created[-1]
    return ShapeError(f"Caffe rejects it: {message} ({where})", layer=layer, layer_type=types.get(layer or ""))


def pycaffe_oracle(net_param: Any, phase: str) -> dict[str, tuple[list[Shape], list[Shape]]]:
    """The `ShapeOracle` for `core.net.build_net`: layer name -> (top shapes, param shapes), from pycaffe."""
    built = caffe_net(net_param, phase)
    return {layer.name: (list(layer.top_shapes), list(layer.param_shapes)) for layer in built.layers}


def differences(net: Net, built: CaffeNet) -> list[str]:
    """Where the estimator's `net` differs from what Caffe built (`caffe_net(input_net(net), net.phase)`), as
    readable lines; empty when layers, tops, blob and param shapes, loss weights, the layers that need backward
    and "Memory required for data" all agree. Data layers are Input layers on Caffe's side, so their types are
    not compared."""
    found: list[str] = []
    ours_layers = [(layer.name, layer.type) for layer in net.layers]
    theirs_layers = [(layer.name, layer.type) for layer in built.layers]
    if [name for name, _ in ours_layers] != [name for name, _ in theirs_layers]:
        return [f"layers differ:\n  ours:  {ours_layers}\n  caffe: {theirs_layers}"]
    for layer, theirs in zip(net.layers, built.layers):
        where = f"layer {layer.name!r} ({layer.type})"
        is_data = layer.rule is not None and layer.rule.is_data
        if layer.type != theirs.type and not (is_data and theirs.type == "Input"):
            found.append(f"{where}: Caffe's type is {theirs.type}")
        bottoms = [net.blobs[i].name for i in layer.bottoms]
        if bottoms != theirs.bottoms:
            found.append(f"{where}: bottoms {bottoms}, Caffe's {theirs.bottoms}")
        tops = [net.blobs[i].name for i in layer.tops]
        if tops != theirs.tops:
            found.append(f"{where}: tops {tops}, Caffe's {theirs.tops}")
        top_shapes = [net.blobs[i].shape for i in layer.tops]
        if top_shapes != theirs.top_shapes:
            found.append(f"{where}: top shapes {top_shapes}, Caffe's {theirs.top_shapes}")
        param_shapes = [net.params[i].shape for i in layer.params]
        if param_shapes != theirs.param_shapes:
            found.append(f"{where}: param shapes {param_shapes}, Caffe's {theirs.param_shapes}")
        # Caffe logs need-backward before force_backward sets every layer's, so only nets without it compare.
        if not net.force_backward and theirs.need_backward is not None and layer.need_backward != theirs.need_backward:
            found.append(f"{where}: need_backward {layer.need_backward}, Caffe's {theirs.need_backward}")
    blobs = [(blob.name, blob.shape) for blob in net.blobs]
    if blobs != built.blobs:
        found.append(f"blobs differ:\n  ours:  {blobs}\n  caffe: {built.blobs}")
    weights = [(blob.name, blob.loss_weight) for blob in net.blobs]
    if weights != built.loss_weights:
        found.append(f"loss weights differ:\n  ours:  {weights}\n  caffe: {built.loss_weights}")
    if built.memory_required_for_data is None:
        found.append("Caffe's log has no 'Memory required for data' line")
    elif net.memory_required_for_data != built.memory_required_for_data:
        found.append(
            f"Memory required for data: ours {net.memory_required_for_data}, Caffe's {built.memory_required_for_data}"
        )
    return found


# ---------------------------------------------------------------------------------------------- the child


def main(argv: list[str]) -> int:
    """Child: build the net with pycaffe in CPU mode, confined, and print its layers and blobs as JSON."""
    if len(argv) != 2:
        print("usage: python -m digits_memplugin.estimate.pycaffe_shapes NET_PROTOTXT TRAIN|TEST", file=sys.stderr)
        return 2
    net_path, phase = argv
    # stdout carries the report only: whatever Caffe or a library prints goes to stderr, with the log.
    report = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    import caffe

    from .sandbox import ConfinementError, confine

    caffe.set_mode_cpu()
    try:
        confine()
    except ConfinementError as error:
        print(f"RuntimeError: the pycaffe child could not confine itself, so it builds no net: {error}",
              file=sys.stderr)
        return 3
    net = caffe.Net(net_path, caffe.TRAIN if phase == "TRAIN" else caffe.TEST)
    blob_names = list(net._blob_names)
    layers = []
    for index, (name, layer) in enumerate(zip(net._layer_names, net.layers)):
        tops = [blob_names[i] for i in net._top_ids(index)]
        layers.append(
            {
                "name": name,
                "type": layer.type,
                "bottoms": [blob_names[i] for i in net._bottom_ids(index)],
                "tops": tops,
                "top_shapes": [list(net._blobs[i].shape) for i in net._top_ids(index)],
                "param_shapes": [list(blob.shape) for blob in layer.blobs],
            }
        )
    result = {
        "layers": layers,
        # Lists, not pycaffe's dicts: anonymous loss tops are all named "(automatic)".
        "blobs": [[name, list(blob.shape)] for name, blob in zip(blob_names, net._blobs)],
        "loss_weights": [[name, weight] for name, weight in zip(blob_names, net._blob_loss_weights)],
    }
    with report:
        report.write(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
