"""What the manager tells a tester child about one snapshot to evaluate: a small JSON file read by
jobs.child.tester, typed and checked like attempt.json (jobs.child.attempt_spec), so that a spec that is not what
the manager writes is refused with a message naming the field. Standard library and the core's constants only."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from .attempt_spec import AttemptDevice, AttemptSpecError, _field, _paths, known_object, read_json

WEIGHTS_SUFFIXES = (".caffemodel", ".caffemodel.h5")


class TesterSpecError(AttemptSpecError):
    """A tester spec that is not one the manager writes; the message names the field."""


@dataclasses.dataclass(frozen=True)
class TestNet:
    """One of the solver's test nets: its prototxt, its test_iter, and the NetState Solver::InitTestNets builds it
    with (phase TEST; pycaffe's Net adds `stages` to the file's own and sets `level`)."""

    net: str
    test_iter: int
    stages: tuple[str, ...] = ()
    level: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"net": self.net, "test_iter": self.test_iter, "stages": list(self.stages), "level": self.level}

    @classmethod
    def from_json(cls, data: Any, label: str) -> TestNet:
        data = known_object(data, label, {"net", "test_iter", "stages", "level"}, f"{label}: ")
        test_iter = _field(data, "test_iter", int, f"{label}.test_iter")
        if test_iter <= 0:
            raise AttemptSpecError(f"{label}.test_iter must be a positive whole number, not {test_iter}")
        stages = _field(data, "stages", list, f"{label}.stages") if "stages" in data else []
        if not all(isinstance(stage, str) for stage in stages):
            raise AttemptSpecError(f"{label}.stages must be a list of strings, not {stages!r:.80}")
        level = _field(data, "level", int, f"{label}.level") if "level" in data else 0
        return cls(_field(data, "net", str, f"{label}.net"), test_iter, tuple(stages), level)


@dataclasses.dataclass(frozen=True)
class TesterSpec:
    """One snapshot to test. Paths are relative to the job's folder (the child's working directory)."""

    weights: str
    """The snapshot's weights (.caffemodel or .caffemodel.h5)."""
    iteration: int
    """The iteration the snapshot is of: the test records' iteration."""
    nets: tuple[TestNet, ...]
    device: AttemptDevice
    memory_cap: int | None
    """RLIMIT_DATA above the child's baseline, in bytes (None: no cap)."""
    log: str
    """Caffe's log, which the child's stderr appends to."""
    progress: str
    """The records, one JSON object a line (also sent on stdout)."""
    nice: int = 0
    read_paths: tuple[str, ...] = ()
    """The dataset paths the tester may read besides the job's folder (jobs.child.confinement)."""
    write_paths: tuple[str, ...] = ()
    """The folders beneath the job's folder it may write in (its own, and the LMDB folders Caffe locks)."""

    def to_json(self) -> dict[str, Any]:
        document = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        document.update(
            nets=[net.to_json() for net in self.nets], device=self.device.to_json(),
            read_paths=list(self.read_paths), write_paths=list(self.write_paths),
        )
        return document

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1), encoding="utf-8")

    @classmethod
    def read(cls, path: Path) -> TesterSpec:
        """The spec in the file; TesterSpecError when it is not JSON or not a spec."""
        return cls.from_json(read_json(path, TesterSpecError))

    @classmethod
    def from_json(cls, data: Any) -> TesterSpec:
        """The spec in `data`; TesterSpecError naming the first field that is missing or wrong."""
        try:
            return cls._parse(data)
        except TesterSpecError:
            raise
        except AttemptSpecError as error:
            raise TesterSpecError(str(error)) from None

    @classmethod
    def _parse(cls, data: Any) -> TesterSpec:
        data = known_object(data, "a tester spec", {field.name for field in dataclasses.fields(cls)})
        weights = _field(data, "weights", str)
        if not weights.endswith(WEIGHTS_SUFFIXES):
            raise AttemptSpecError(f"weights must name a {' or '.join(WEIGHTS_SUFFIXES)} file, not {weights!r:.80}")
        iteration = _field(data, "iteration", int)
        if iteration < 0:
            raise AttemptSpecError(f"iteration must not be negative, not {iteration}")
        nets = _field(data, "nets", list)
        if not nets:
            raise AttemptSpecError("nets must name at least one test net")
        return cls(
            weights=weights,
            iteration=iteration,
            nets=tuple(TestNet.from_json(net, f"nets[{index}]") for index, net in enumerate(nets)),
            device=AttemptDevice.from_json(data.get("device")),
            memory_cap=_field(data, "memory_cap", int, nullable=True),
            log=_field(data, "log", str),
            progress=_field(data, "progress", str),
            nice=_field(data, "nice", int) if "nice" in data else 0,
            read_paths=_paths(data, "read_paths"),
            write_paths=_paths(data, "write_paths"),
        )


__all__ = ["WEIGHTS_SUFFIXES", "TestNet", "TesterSpec", "TesterSpecError"]
