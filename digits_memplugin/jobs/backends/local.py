"""Where an attempt runs: the seam between the attempt loop (jobs.scheduling.attempt_loop) and what starts the child.

A backend launches one attempt (its spec already written in the job's folder) and hands back a handle the loop
follows, cancels, kills and waits on, the same whatever runs it: `LocalBackend` starts the runner as a child of
this process (jobs.backends.attempt_process); `jobs.backends.ray.RayBackend` submits it as a Ray job to a node of a cluster. The
store keeps each attempt's handle as a string ("pid:N", "ray:<submission id>") so that the next start can reap
what a previous server left running, whichever backend started it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from ...devices.reader import DeviceReader
from ..child.attempt_spec import AttemptSpec
from ..store.datafolder import kill_leftover
from ..store.records import Attempt
from . import LOCAL, RAY
from .attempt_process import AttemptProcess, AttemptResult, LogCallback, RecordCallback


class AttemptHandle(Protocol):
    """One launched attempt. `wait` blocks (run it in the job's task) and calls the launch's callbacks; `cancel`
    (snapshot and stop, then for good after `cancel_seconds` and the grace period) and `kill` (at once) may come
    from any task."""

    @property
    def handle(self) -> str:
        """What the store keeps: "pid:N", "ray:<submission id>"."""

    @property
    def pid(self) -> int | None:
        """The child's pid on this host (NVML's process list says its GPU memory), None when it runs elsewhere."""

    def cancel(self) -> None: ...

    def kill(self) -> None: ...

    def wait(self) -> AttemptResult: ...


@dataclasses.dataclass(frozen=True)
class Launch:
    """What a backend needs to start one attempt."""

    folder: Path
    """The job's folder (the child's working directory)."""
    spec_file: str
    """The attempt's attempt.json, relative to `folder`."""
    spec: AttemptSpec
    device: str
    """The device key the scheduler placed the job on (a GPU's UUID, "cpu", "cpu@host")."""
    environment: Mapping[str, str]
    """The child's CUDA environment (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER)."""
    on_record: RecordCallback
    on_log: LogCallback
    grace_seconds: float
    stall_seconds: float | None
    cancel_seconds: float = 60.0
    """How long a cancelled attempt may take to snapshot and stop before it is stopped without one."""


class Backend(Protocol):
    """Starts attempts and knows the devices they may run on."""

    name: str

    def launch(self, launch: Launch) -> AttemptHandle:
        """Start the attempt; raises (the job fails with the message) when it cannot be started at all."""

    def reap(self, attempts: Sequence[Attempt], jobs_root: Path) -> None:
        """End what a previous server left running of these attempts (never adopt it: the store says interrupted)."""

    def device_reader(self, local: DeviceReader) -> DeviceReader:
        """The devices jobs may be placed on, given this host's own reader."""

    def close(self) -> None: ...


class LocalBackend:
    """Attempts as children of this process, on this host's devices: the plugin's one-machine setup."""

    name = LOCAL

    def launch(self, launch: Launch) -> AttemptProcess:
        process = AttemptProcess(
            launch.folder, launch.spec_file, launch.spec.log, environment=launch.environment,
            on_record=launch.on_record, on_log=launch.on_log,
            grace_seconds=launch.grace_seconds, stall_seconds=launch.stall_seconds,
            divergence=launch.spec.divergence, cancel_seconds=launch.cancel_seconds,
        )
        process.start()
        return process

    def reap(self, attempts: Sequence[Attempt], jobs_root: Path) -> None:
        for attempt in attempts:
            kill_leftover(attempt, jobs_root)

    def device_reader(self, local: DeviceReader) -> DeviceReader:
        return local

    def close(self) -> None:
        pass


__all__ = ["LOCAL", "RAY", "AttemptHandle", "Backend", "Launch", "LocalBackend"]
