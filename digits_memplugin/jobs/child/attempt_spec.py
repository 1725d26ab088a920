"""What the manager tells the training child about one attempt: `attempts/N/attempt.json`, written by the manager
(jobs.scheduling.attempt_loop) and read by the runner (jobs.child.runner).

One typed record for both sides, so that a field renamed or retyped on one side is a type error on the other,
and a file that is not what the manager writes (hand-edited, truncated, from another version) is refused by the
runner with a message naming the field, instead of a KeyError in the middle of training. Standard library and
the core's constants only: the child loads this before anything else.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...core.device_kinds import CPU, GPU
from ...core.divergence import DEFAULT_POLICY, POLICIES
from ...core.test_net_modes import TEST_NET_APART, TEST_NET_SHARED

SNAPSHOT_FORMATS = ("HDF5", "BINARYPROTO")
PYCAFFE_RUNNER, BINARY_RUNNER = "pycaffe", "binary"
RUNNERS = (PYCAFFE_RUNNER, BINARY_RUNNER)


class AttemptSpecError(ValueError):
    """An attempt.json that is not a spec the manager writes; the message names the field."""


@dataclasses.dataclass(frozen=True)
class AttemptDevice:
    """Where the child trains: the CPU, or a GPU by its UUID and its index among the child's visible devices."""

    kind: str
    uuid: str | None = None
    cuda_index: int | None = None

    def to_json(self) -> dict[str, Any]:
        if self.kind == CPU:
            return {"kind": CPU}
        return {"kind": self.kind, "uuid": self.uuid, "cuda_index": self.cuda_index}

    @classmethod
    def from_json(cls, data: Any) -> AttemptDevice:
        if not isinstance(data, Mapping):
            raise AttemptSpecError(f"device must be an object, not {_kind(data)}")
        kind = data.get("kind")
        if kind == CPU:
            return cls(CPU)
        if kind != GPU:
            raise AttemptSpecError(f"device.kind must be {CPU!r} or {GPU!r}, not {kind!r}")
        return cls(GPU, _field(data, "uuid", str, "device.uuid"), _field(data, "cuda_index", int, "device.cuda_index"))


@dataclasses.dataclass(frozen=True)
class AttemptSpec:
    """One attempt of a job. Paths are relative to the job's folder (the child's working directory)."""

    job_id: str
    attempt: int
    solver: str
    """The attempt's generated solver.prototxt (testing and snapshots off: the runner does both)."""
    log: str
    """Caffe's log, which the child's stderr appends to."""
    progress: str
    """The records, one JSON object a line (also sent on stdout)."""
    device: AttemptDevice
    batch_size: int
    iter_size: int
    resume: str | None
    """The solver state to restore before training, or None to start from iteration 0."""
    memory_cap: int | None
    """RLIMIT_DATA above the child's baseline, in bytes (None: no cap)."""
    max_iter: int
    test_interval: int
    """0: no testing."""
    test_iter: tuple[int, ...]
    """Forward passes per test net (with the attempt's test batch)."""
    test_initialization: bool
    snapshot: int
    """Snapshot every this many iterations (0: only after training, if snapshot_after_train)."""
    snapshot_after_train: bool
    snapshot_prefix: str
    snapshot_format: str
    """"HDF5" or "BINARYPROTO", as the solver's snapshot_format."""
    schedule: Mapping[str, Any]
    """core.schedule.LearningRate's fields (LearningRate.to_dict): the learning rate the records report."""
    nice: int = 0
    """The child's nice value (0: the server's own)."""
    divergence: str = DEFAULT_POLICY
    """What a non-finite net output does (core.divergence): "stop" the attempt (jobs.backends.attempt_process watches the records),
    or "continue" training."""
    runner: str = PYCAFFE_RUNNER
    """"pycaffe": the runner drives pycaffe's solver; "binary": it runs `caffe train` and reads its log
    (jobs/child/binary_runner.py; the generated solver then has Caffe's own testing, snapshots and display on)."""
    caffe: str | None = None
    """The `caffe` binary the binary runner runs."""
    preload: str | None = None
    """The capped-start library the binary runner preloads into caffe (jobs/child/preload.py); None: built by the child."""
    read_paths: tuple[str, ...] = ()
    """The dataset paths the attempt may read (real absolute paths of files and folders, checked when the attempt
    was written), besides the job's folder: what the child's confinement grants (jobs.child.confinement)."""
    write_paths: tuple[str, ...] = ()
    """The folders, relative to the job's folder, the attempt may write beneath (its outputs, snapshots, its own
    folder, its LMDB lock folders); nothing else is writable."""
    test_net: str = TEST_NET_SHARED
    """Where the test nets are (core.test_nets): "shared", the runner tests them beside the train net; "apart",
    the generated solver has none, and at each test interval the runner snapshots and says the snapshot is due a
    test ("test_due"), for a tester child (jobs.child.tester) to test it."""
    pause_at_tests: bool = False
    """With "apart" on the trainer's own device: after a test_due the runner stops ("paused") and the manager
    starts it again from that snapshot once the tester has ended, so that the two never hold the device at once."""
    tests_from: int = 0
    """The first iteration a test may be due at: a trainer started again after a pause at iteration N is given N + 1
    (N's test is the tester's), and so is an attempt resuming from a snapshot of N an earlier attempt's tester
    tested already (after a replan)."""
    skip_forwards: int = 0
    """Forward passes of the train net's data layers alone after the restore: a trainer started again after a pause
    reads its training data where the one before it stopped (Caffe's data layers start over at their first item when
    a solver is restored), so that the test nets apart change nothing of what training sees."""
    seconds_before: float = 0.0
    """Seconds of the attempt before this process started (a trainer started again after a pause): its records'
    "seconds" go on from there, so that one attempt's speed is measured across its pauses."""

    def to_json(self) -> dict[str, Any]:
        document = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        document.update(
            device=self.device.to_json(), test_iter=list(self.test_iter), schedule=dict(self.schedule),
            read_paths=list(self.read_paths), write_paths=list(self.write_paths),
        )
        return document

    @classmethod
    def from_json(cls, data: Any) -> AttemptSpec:
        """The spec in `data` (json.loads of attempt.json); AttemptSpecError naming the first field that is missing
        or of the wrong type."""
        known_object(data, "an attempt spec", {field.name for field in dataclasses.fields(cls)})
        test_iter = _field(data, "test_iter", list)
        if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in test_iter):
            raise AttemptSpecError(f"test_iter must be a list of positive whole numbers, not {test_iter!r}")
        snapshot_format = _field(data, "snapshot_format", str)
        if snapshot_format not in SNAPSHOT_FORMATS:
            raise AttemptSpecError(f"snapshot_format must be one of {SNAPSHOT_FORMATS}, not {snapshot_format!r}")
        runner = _field(data, "runner", str) if "runner" in data else PYCAFFE_RUNNER
        if runner not in RUNNERS:
            raise AttemptSpecError(f"runner must be one of {RUNNERS}, not {runner!r}")
        caffe = _field(data, "caffe", str, nullable=True) if "caffe" in data else None
        if runner == BINARY_RUNNER and not caffe:
            raise AttemptSpecError("caffe is missing: the binary runner needs the caffe binary to run")
        test_net = _field(data, "test_net", str) if "test_net" in data else TEST_NET_SHARED
        if test_net not in (TEST_NET_SHARED, TEST_NET_APART):
            raise AttemptSpecError(f"test_net must be {TEST_NET_SHARED!r} or {TEST_NET_APART!r}, not {test_net!r:.80}")
        if test_net == TEST_NET_APART and runner == BINARY_RUNNER:
            raise AttemptSpecError("test_net 'apart' needs the pycaffe runner (the binary runner tests as caffe does)")
        seconds_before = data.get("seconds_before", 0.0)
        if isinstance(seconds_before, bool) or not isinstance(seconds_before, (int, float)) or not (
            0 <= seconds_before < float("inf")
        ):
            raise AttemptSpecError(f"seconds_before must be a number of seconds, not {seconds_before!r:.80}")
        return cls(
            job_id=_field(data, "job_id", str),
            attempt=_field(data, "attempt", int),
            solver=_field(data, "solver", str),
            log=_field(data, "log", str),
            progress=_field(data, "progress", str),
            device=AttemptDevice.from_json(data.get("device")),
            batch_size=_field(data, "batch_size", int),
            iter_size=_field(data, "iter_size", int),
            resume=_field(data, "resume", str, nullable=True),
            memory_cap=_field(data, "memory_cap", int, nullable=True),
            max_iter=_field(data, "max_iter", int),
            test_interval=_field(data, "test_interval", int),
            test_iter=tuple(test_iter),
            test_initialization=_field(data, "test_initialization", bool),
            snapshot=_field(data, "snapshot", int),
            snapshot_after_train=_field(data, "snapshot_after_train", bool),
            snapshot_prefix=_field(data, "snapshot_prefix", str),
            snapshot_format=snapshot_format,
            schedule=_field(data, "schedule", dict),
            nice=_field(data, "nice", int) if "nice" in data else 0,
            divergence=_divergence(data),
            runner=runner,
            caffe=caffe,
            preload=_field(data, "preload", str, nullable=True) if "preload" in data else None,
            read_paths=_paths(data, "read_paths"),
            write_paths=_paths(data, "write_paths"),
            test_net=test_net,
            pause_at_tests=_field(data, "pause_at_tests", bool) if "pause_at_tests" in data else False,
            tests_from=_count(data, "tests_from"),
            skip_forwards=_count(data, "skip_forwards"),
            seconds_before=float(seconds_before),
        )

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1), encoding="utf-8")

    @classmethod
    def read(cls, path: Path) -> AttemptSpec:
        """The spec in the file; AttemptSpecError when it is not JSON or not a spec."""
        return cls.from_json(read_json(path, AttemptSpecError))


def read_json(path: Path, error: type[AttemptSpecError]) -> Any:
    """The JSON document of a child's spec file; `error` when it cannot be read or is not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as reason:
        raise error(f"cannot read {path}: {reason}") from None


def known_object(data: Any, what: str, fields: set[str], label: str = "") -> Mapping[str, Any]:
    """`data` as a JSON object with none but `fields`; AttemptSpecError saying `what` it must be, or which field
    (after `label`) is unknown."""
    if not isinstance(data, Mapping):
        raise AttemptSpecError(f"{what} must be a JSON object, not {_kind(data)}")
    unknown = sorted(set(data) - fields)
    if unknown:
        raise AttemptSpecError(f"{label}unknown field(s): {', '.join(map(repr, unknown))}")
    return data


def _field(data: Mapping[str, Any], name: str, kind: type, label: str | None = None, nullable: bool = False) -> Any:
    label = label or name
    if name not in data:
        raise AttemptSpecError(f"{label} is missing")
    value = data[name]
    if value is None and nullable:
        return None
    # bool is an int to Python, never to the spec: a count written `true` is refused
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        wanted = kind.__name__ + (" or null" if nullable else "")
        raise AttemptSpecError(f"{label} must be {wanted}, not {_kind(value)} ({value!r:.80})")
    return value


def _divergence(data: Mapping[str, Any]) -> str:
    """The spec's divergence policy; a spec written before it had one stops, as the default does."""
    if "divergence" not in data:
        return DEFAULT_POLICY
    value = _field(data, "divergence", str)
    if value not in POLICIES:
        raise AttemptSpecError(f"divergence must be one of {POLICIES}, not {value!r:.80}")
    return str(value)


def _count(data: Mapping[str, Any], name: str) -> int:
    """A whole number, not negative, 0 when left out."""
    value = _field(data, name, int) if name in data else 0
    if value < 0:
        raise AttemptSpecError(f"{name} must not be negative, not {value}")
    return int(value)


def _paths(data: Mapping[str, Any], name: str) -> tuple[str, ...]:
    """A list of paths; required, so that a spec that does not say what the child may touch is refused rather than
    read as "nothing"."""
    paths = _field(data, name, list)
    if not all(isinstance(path, str) and path and "\0" not in path for path in paths):
        raise AttemptSpecError(f"{name} must be a list of paths, not {paths!r:.80}")
    return tuple(paths)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


__all__ = ["BINARY_RUNNER", "PYCAFFE_RUNNER", "RUNNERS", "AttemptDevice", "AttemptSpec", "AttemptSpecError"]
