"""Run a net's training in a child pycaffe process on synthetic data of the right shapes, and read what it used.

The net's data layers keep their type (so their prefetch and reader queues are real) but read small synthetic
LMDB and HDF5 files written here with the item shapes the caller gives; mean files are synthesised too. The
solver runs one step: the test pass at start, then one training iteration.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import text_format

from ..core.errors import NetError
from ..core.layers.data import DataSpec
from ..core.proto import caffe_pb2
from ..core.training import TrainingDefinition

SYNTHETIC_RECORDS = 8
_MEMORY_LINE = re.compile(r"Memory required for data: (\d+)")


@dataclasses.dataclass
class Measurement:
    allocated: int
    """Bytes in use after one step minus before the solver was built (mallinfo2 uordblks + hblkhd)."""
    constructed: int
    """Bytes in use right after construction, minus before."""
    memory_required_for_data: list[int]
    """Caffe's own log line, one per net in construction order (train net first)."""
    seconds: float
    log: str


def _spec(data_shapes: Mapping[str, Any], layer: str, top: str) -> DataSpec:
    value = data_shapes.get(f"{layer}/{top}") or data_shapes.get(top)
    if value is None:
        raise NetError(f"no item shape given for data top {top!r}", layer=layer)
    return value if isinstance(value, DataSpec) else DataSpec(tuple(value))


def _write_lmdb(path: Path, spec: DataSpec) -> None:
    import lmdb

    rng = np.random.default_rng(0)
    env = lmdb.open(str(path), map_size=1 << 34)
    with env.begin(write=True) as txn:
        for index in range(SYNTHETIC_RECORDS):
            datum = caffe_pb2.Datum(label=index % 2)
            if len(spec.shape) == 3:
                datum.channels, datum.height, datum.width = spec.shape
            else:
                datum.channels, datum.height, datum.width = int(np.prod(spec.shape)), 1, 1
            if spec.stored_itemsize == 1:
                datum.data = rng.integers(0, 255, size=int(np.prod(spec.shape)), dtype=np.uint8).tobytes()
            else:
                datum.float_data.extend(rng.random(int(np.prod(spec.shape)), dtype=np.float32).tolist())
            txn.put(f"{index:08d}".encode(), datum.SerializeToString())
    env.close()


def _write_mean(path: Path, shape: tuple[int, ...]) -> None:
    blob = caffe_pb2.BlobProto()
    blob.shape.dim.extend([1, *shape])
    blob.data.extend([100.0] * int(np.prod(shape)))
    path.write_bytes(blob.SerializeToString())


def _write_hdf5(folder: Path, layer: Any, data_shapes: Mapping[str, Any]) -> Path:
    import h5py

    rows = max(
        (_spec(data_shapes, layer.name, top).rows or SYNTHETIC_RECORDS) for top in layer.top
    )
    file = folder / f"{layer.name}.h5"
    with h5py.File(file, "w") as h5:
        for top in layer.top:
            spec = _spec(data_shapes, layer.name, top)
            h5[top] = np.random.default_rng(0).random((rows, *spec.shape), dtype=np.float32)
    listing = folder / f"{layer.name}.txt"
    listing.write_text(f"{file}\n")
    return listing


def prepare_net(net: Any, folder: Path, data_shapes: Mapping[str, Any]) -> Any:
    """A copy of `net` whose data layers read synthetic files under `folder`."""
    net = _copy(net)
    for index, layer in enumerate(net.layer):
        sub = folder / f"{index:03d}_{re.sub(r'[^A-Za-z0-9_]', '_', layer.name)}"
        if layer.type == "Data":
            sub.mkdir(parents=True, exist_ok=True)
            spec = _spec(data_shapes, layer.name, layer.top[0])
            _write_lmdb(sub / "lmdb", spec)
            layer.data_param.source = str(sub / "lmdb")
            layer.data_param.backend = caffe_pb2.DataParameter.LMDB
            if layer.transform_param.mean_file:
                _write_mean(sub / "mean.binaryproto", spec.shape)
                layer.transform_param.mean_file = str(sub / "mean.binaryproto")
        elif layer.type == "HDF5Data":
            sub.mkdir(parents=True, exist_ok=True)
            layer.hdf5_data_param.source = str(_write_hdf5(sub, layer, data_shapes))
        elif layer.type in ("ImageData", "WindowData"):
            raise NetError("needs OpenCV, which this pycaffe build leaves out", layer=layer.name, layer_type=layer.type)
    return net


def _copy(message: Any) -> Any:
    copy = type(message)()
    copy.CopyFrom(message)
    return copy


def prepare_solver(
    definition: TrainingDefinition,
    folder: Path,
    data_shapes: Mapping[str, Any],
    batch: int | None = None,
    test_batch: int | None = None,
    gpu: bool = False,
) -> Path:
    """Write the solver and nets of one measured step under `folder`: the nets' data layers read synthetic files of
    the given shapes, the solver tests once at start (one iteration per test net) and trains; `gpu` sets solver_mode
    GPU (the stand-in measurement, bench/gpu_standin.py). Returns the solver's path."""
    folder.mkdir(parents=True, exist_ok=True)
    train = prepare_net(definition.train.param, folder / "train", data_shapes)
    _set_batch(train, batch, caffe_pb2.TRAIN)
    solver = caffe_pb2.SolverParameter()
    if definition.solver is not None:
        solver.CopyFrom(definition.solver)
    for field in ("net", "net_param", "train_net", "train_net_param", "test_net", "test_net_param", "test_state"):
        solver.ClearField(field)
    # The nets go to files the solver names, as DIGITS writes them: Caffe then keeps only the layers' own copies
    # of their parameters, not a whole inline NetParameter inside the solver's.
    (folder / "train.prototxt").write_text(text_format.MessageToString(train))
    solver.train_net = str(folder / "train.prototxt")
    if definition.train.state is not None:
        solver.train_state.CopyFrom(definition.train.state)
    solver.ClearField("test_iter")
    for index, test in enumerate(definition.tests):
        prepared = prepare_net(test.param, folder / f"test{index}", data_shapes)
        _set_batch(prepared, test_batch, caffe_pb2.TEST)
        (folder / f"test{index}.prototxt").write_text(text_format.MessageToString(prepared))
        solver.test_net.append(str(folder / f"test{index}.prototxt"))
        solver.test_iter.append(1)
        if test.state is not None:
            solver.test_state.add().CopyFrom(test.state)
    if definition.tests:
        solver.test_interval = max(solver.test_interval, 1)
        solver.test_initialization = True
    solver.max_iter = max(solver.max_iter, 10)
    solver.display = 0
    solver.snapshot = 0
    solver.snapshot_after_train = False
    solver.snapshot_prefix = str(folder / "snapshot")
    solver.solver_mode = caffe_pb2.SolverParameter.GPU if gpu else caffe_pb2.SolverParameter.CPU
    if not solver.HasField("base_lr"):
        solver.base_lr = 0.01
    if not solver.HasField("lr_policy"):
        solver.lr_policy = "fixed"
    solver_path = folder / "solver.prototxt"
    solver_path.write_text(text_format.MessageToString(solver))
    return solver_path


def measure(
    definition: TrainingDefinition,
    folder: Path,
    data_shapes: Mapping[str, Any],
    batch: int | None = None,
    test_batch: int | None = None,
    timeout: float = 900.0,
) -> Measurement:
    """Train `definition` for one step in a child pycaffe process and measure the bytes it allocated."""
    solver_path = prepare_solver(definition, folder, data_shapes, batch, test_batch)
    env = {**os.environ, "GLOG_logtostderr": "1", "GLOG_minloglevel": "0", "OPENBLAS_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "digits_memplugin.measure.child", str(solver_path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=folder,
    )
    if result.returncode != 0:
        tail = "\n".join(result.stderr.splitlines()[-15:])
        raise RuntimeError(f"pycaffe failed (exit {result.returncode}):\n{tail}")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    return Measurement(
        allocated=report["allocated"],
        constructed=report["constructed"] - report["before"],
        memory_required_for_data=memory_lines(result.stderr),
        seconds=report["seconds"],
        log=result.stderr,
    )


def memory_lines(log: str) -> list[int]:
    """The last "Memory required for data" of each net (the line is logged after every layer, cumulatively)."""
    totals, current = [], None
    for line in log.splitlines():
        match = _MEMORY_LINE.search(line)
        if match:
            current = int(match.group(1))
        elif "Network initialization done" in line and current is not None:
            totals.append(current)
            current = None
    return totals


def _set_batch(net: Any, batch: int | None, phase: int) -> None:
    if batch is None:
        return
    for layer in net.layer:
        for field in ("data_param", "hdf5_data_param", "image_data_param", "memory_data_param"):
            if layer.HasField(field):
                getattr(layer, field).batch_size = batch
        if layer.type in ("Input", "DummyData"):
            param = layer.input_param if layer.type == "Input" else layer.dummy_data_param
            for shape in param.shape:
                if len(shape.dim):
                    shape.dim[0] = batch
