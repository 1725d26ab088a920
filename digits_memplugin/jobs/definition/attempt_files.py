"""One attempt's generated files, written just before its child starts (`write_attempt`): the nets at the attempt's
batch_size and test batch, the solver with its iter_size, length and device, and the solver's own paths replaced
(its nets, its snapshot prefix in the job's folder), each path the job reads checked again first
(jobs.definition.recheck). The files say what the child may then open (`AttemptFiles.reads`, `.writes`), which
its confinement (jobs.child.confinement) holds it to."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from google.protobuf import text_format

from ...core.layers.base import PHASE_TEST, PHASE_TRAIN
from ...core.net import filter_layers, net_state
from .definition import JobDefinition
from .job_folder import LMDB_FOLDER, OUTPUTS
from .recheck import confirm_data, confirm_outputs


@dataclasses.dataclass(frozen=True)
class TestNetFile:
    """One test net written for a tester (the test nets apart): its file, test_iter, and the NetState the solver
    would have built it with (phase TEST, its test_state's stages and level)."""

    net: str
    test_iter: int
    stages: tuple[str, ...] = ()
    level: int = 0


@dataclasses.dataclass(frozen=True)
class AttemptFiles:
    """The generated files of one attempt, relative to the job's folder."""

    solver: str
    nets: list[str]
    snapshot_prefix: str
    reads: tuple[str, ...] = ()
    """The dataset paths the child may read (`ConfirmedData.reads`)."""
    writes: tuple[str, ...] = ()
    """The folders the child may write beneath, relative to the job's folder (ATTEMPT_WRITES and its own)."""
    tests_apart: tuple[TestNetFile, ...] = ()
    """With the test nets apart, the test nets the solver no longer has, for the tester; else none."""


TESTER_FOLDER = "tester"
"""With the test nets apart, the testers' files in their attempt's folder (jobs.scheduling.apart_run): a spec per
snapshot, their log, and their progress records, whose "test" records are the attempt's own."""
ATTEMPT_WRITES = (OUTPUTS, "snapshots", LMDB_FOLDER)
"""What every attempt's child may write beneath, besides its own attempts/N folder (its log and records): layers'
outputs, snapshots, and the LMDB folders where Caffe's LMDB writes its lock table. Never data/ (the list files),
never the datasets."""


def write_attempt(
    definition: JobDefinition,
    folder: Path,
    attempt_dir: str,
    *,
    batch_size: int,
    iter_size: int,
    test_batch: int | None,
    gpu: int | None,
    caffe_runs: bool = False,
    max_iter: int | None = None,
    test_interval: int | None = None,
    tests_apart: bool = False,
) -> AttemptFiles:
    """Write the attempt's nets and solver under ``<folder>/<attempt_dir>``: the train net at `batch_size`, the test
    nets at `test_batch` (None: their own), the solver with `iter_size`, the snapshot prefix in the job's folder,
    CPU or GPU `gpu` (CUDA's number in the child). Caffe's own testing and snapshots are off (the pycaffe runner
    does both), or, with `caffe_runs` (`caffe train` trains: the binary runner), on as the job's solver has them,
    with `display: 1`, so that its log says every test, update and snapshot; `max_iter` and `test_interval` are the
    attempt's (JobDefinition.length; None: the definition's). With `tests_apart` the test nets are written for a
    tester (at their own batch, `AttemptFiles.tests_apart`) and the solver has none. Each message is written with its own
    schema (NVcaffe's for an NVcaffe net). The job's data and outputs are checked again first (`confirm_data`,
    `confirm_outputs`): a NetError then, and nothing is written."""
    confirm_outputs(definition, folder)
    confirmed = confirm_data(definition, folder)
    (folder / attempt_dir).mkdir(parents=True, exist_ok=True)
    (folder / "snapshots").mkdir(exist_ok=True)
    writer = _NetWriter(folder, attempt_dir, confirmed.lmdb)
    solver = _solver_with_nets(definition, writer, batch_size, test_batch)
    apart = _tests_apart(solver, definition) if tests_apart else ()
    solver.iter_size = iter_size
    solver.max_iter = max_iter if max_iter is not None else definition.max_iter
    _set_testing_and_snapshots(solver, definition, caffe_runs, test_interval)
    prefix = snapshot_prefix(definition.solver)
    solver.snapshot_prefix = prefix
    _set_device(solver, gpu)
    relative = f"{attempt_dir}/solver.prototxt"
    (folder / relative).write_text(text_format.MessageToString(solver), encoding="utf-8")
    return AttemptFiles(relative, writer.nets, prefix, confirmed.reads, (*ATTEMPT_WRITES, attempt_dir), apart)


def _tests_apart(solver: Any, definition: JobDefinition) -> tuple[TestNetFile, ...]:
    """The solver's test nets taken out of it (Solver::InitTestNets then builds none), as a tester builds them."""
    tests = tuple(
        TestNetFile(net, int(test_iter), tuple(state.stage), int(state.level))
        for net, test_iter, state in zip(solver.test_net, solver.test_iter, solver.test_state, strict=True)
    )
    for field in ("test_net", "test_iter", "test_state"):
        solver.ClearField(field)
    if not tests and definition.training.tests:
        raise ValueError("the test nets apart need the solver's test nets written first")
    return tests


class _NetWriter:
    """Writes an attempt's nets into its folder, each handed the job's own LMDB folders (`ConfirmedData.lmdb`)."""

    def __init__(self, folder: Path, attempt_dir: str, handed: Mapping[str, str]) -> None:
        self.folder = folder
        self.attempt_dir = attempt_dir
        self.handed = handed
        self.nets: list[str] = []
        """The nets written, relative to the job's folder, in the order written."""

    def write(self, net: Any, phase: str, state: Any, batch: int | None, name: str) -> str:
        """`net` at `batch` (None: its own) as ``<attempt_dir>/<name>``; the path relative to the job's folder."""
        copy = type(net.param)()
        copy.CopyFrom(net.param)
        for layer in copy.layer:
            if layer.HasField("data_param") and layer.data_param.source in self.handed:
                layer.data_param.source = self.handed[layer.data_param.source]
        if batch is not None:
            set_batch(copy, net_state(copy, phase, state), net.source, batch)
        relative = f"{self.attempt_dir}/{name}"
        (self.folder / relative).write_text(text_format.MessageToString(copy), encoding="utf-8")
        self.nets.append(relative)
        return relative


def _solver_with_nets(definition: JobDefinition, writer: _NetWriter, batch_size: int, test_batch: int | None) -> Any:
    """A copy of the job's solver whose nets are the attempt's, written by `writer`: the train net at `batch_size`,
    each test net at `test_batch` with the test_iter that still covers as many items (`test_iters`)."""
    training = definition.training
    solver = type(definition.solver)()  # training_definition always has the solver of a job
    solver.CopyFrom(definition.solver)
    for field in ("net", "net_param", "train_net", "train_net_param", "test_net", "test_net_param", "test_state"):
        solver.ClearField(field)
    solver.train_net = writer.write(training.train, PHASE_TRAIN, training.train.state, batch_size, "train.prototxt")
    if training.train.state is not None:
        solver.train_state.CopyFrom(training.train.state)
    solver.ClearField("test_iter")
    for index, test in enumerate(training.tests):
        solver.test_net.append(writer.write(test, PHASE_TEST, test.state, test_batch, f"test{index}.prototxt"))
        solver.test_iter.append(test_iters(definition, test_batch)[index])
        if test.state is not None:
            solver.test_state.add().CopyFrom(test.state)
        else:
            solver.test_state.add()  # an empty state merges nothing, as if none were given
    return solver


def _set_testing_and_snapshots(
    solver: Any, definition: JobDefinition, caffe_runs: bool, test_interval: int | None
) -> None:
    """Caffe's own testing and snapshots: as the job's solver has them when `caffe train` trains (`caffe_runs`),
    with every update displayed; off when the pycaffe runner tests and snapshots."""
    if caffe_runs:  # as the job's solver says, and every update displayed: the log is what the records are read from
        solver.display = 1
        if definition.training.tests and test_interval:
            solver.test_interval = test_interval
        if definition.training.tests and not (test_interval or definition.solver.test_interval):
            solver.test_interval = 2**31 - 1  # test nets and no interval: Caffe needs one, the runner never tests
            solver.test_initialization = False
    else:
        solver.test_interval = 2**31 - 1  # never: the runner tests, so results are reported (Caffe needs > 0)
        solver.test_initialization = False
        solver.snapshot = 0  # the runner snapshots, so that each one is reported
        solver.snapshot_after_train = False


def _set_device(solver: Any, gpu: int | None) -> None:
    """CPU mode, or GPU mode on CUDA's device `gpu` in the child."""
    if gpu is None:
        solver.solver_mode = solver.CPU
        solver.ClearField("device_id")
    else:
        solver.solver_mode = solver.GPU
        solver.device_id = gpu


def set_batch(net: Any, state: Any, source: str, batch: int) -> None:
    """The batch of every data layer `state` includes: what the estimator's batch override models."""
    for _, layer in filter_layers(net, state, source, []):
        for field in ("data_param", "hdf5_data_param", "image_data_param", "memory_data_param", "window_data_param"):
            if layer.HasField(field):
                getattr(layer, field).batch_size = batch
        if layer.type == "Input":
            for shape in layer.input_param.shape:
                if len(shape.dim):
                    shape.dim[0] = batch
        if layer.type == "DummyData":
            param = layer.dummy_data_param
            for shape in param.shape:
                if len(shape.dim):
                    shape.dim[0] = batch
            for index in range(len(param.num)):
                param.num[index] = batch


def test_iters(definition: JobDefinition, test_batch: int | None) -> list[int]:
    """Each test net's test_iter at `test_batch`: raised so that a test pass still covers as many items."""
    iters = []
    for index, own in enumerate(definition.test_batches):
        base = definition.training.test_iters[index] if index < len(definition.training.test_iters) else 1
        if test_batch is None or own is None or test_batch >= own:
            iters.append(base)
        else:
            iters.append(math.ceil(base * own / test_batch))
    return iters


def snapshot_prefix(solver: Any) -> str:
    """Snapshots go to ``snapshots/<name>`` in the job's folder, named after the solver's own prefix."""
    name = Path(solver.snapshot_prefix).name if solver.snapshot_prefix else ""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", name).strip(".") or "snapshot"
    return f"snapshots/{name}"
