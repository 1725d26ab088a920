"""A training job and its attempts as stored rows and as the JSON the REST API and the socketio events carry.

Times are seconds since the epoch (floats); memory is in bytes; unknown is null, never 0. A number that is not
finite (a diverged loss) is one of core.nonfinite's strings, "NaN", "Infinity", "-Infinity": in the documents and
in the database's JSON text alike.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from ...core import nonfinite
from ...core.divergence import DEFAULT_POLICY

# Job states. A job waits in QUEUED until a device has room for it, RUNNING covers all its attempts.
QUEUED: Final = "queued"
RUNNING: Final = "running"
DONE: Final = "done"
FAILED: Final = "failed"
CANCELLED: Final = "cancelled"
INTERRUPTED: Final = "interrupted"
"""The server stopped (or was killed) while the job was queued or running; it resumes from its last snapshot."""

JOB_STATES = (QUEUED, RUNNING, DONE, FAILED, CANCELLED, INTERRUPTED)
ACTIVE_STATES = frozenset({QUEUED, RUNNING})
FINAL_STATES = frozenset({DONE, FAILED, CANCELLED})


@dataclasses.dataclass
class Job:
    """One training job: what was asked (`spec`), where it stands, and where its files are."""

    id: str
    name: str
    status: str
    created_at: float
    updated_at: float
    folder: str
    """The job's folder, relative to the jobs root (``<id>``): prototxts, attempts' logs, snapshots."""
    spec: dict[str, Any]
    """The request as validated (device, batch, fallback, data, ...), without the prototxt texts (in the folder)."""
    started_at: float | None = None
    finished_at: float | None = None
    device: str | None = None
    """Key of the device of the latest attempt ("cpu" or a GPU UUID)."""
    batch_size: int | None = None
    iter_size: int | None = None
    test_batch_size: int | None = None
    test_iter: int | None = None
    effective_batch: int | None = None
    """Items per weight update, kept across attempts once training has started."""
    iteration: int = 0
    max_iter: int | None = None
    snapshot: dict[str, Any] | None = None
    """The latest snapshot: {"iteration", "model", "state"} with paths relative to the job's folder."""
    progress: dict[str, Any] | None = None
    """{"train": the latest iteration record, "test": the latest record of each test net}."""
    message: str | None = None
    position: int = 0
    """Queue order: jobs are placed first come, first served."""
    attempt_count: int = 0
    cancel_requested_at: float | None = None
    """When a server that does not run the job (a follower: docs/scale-out.md) asked to cancel it; the leader,
    which runs it, applies the request. Not in the API: the message says "cancelling"."""

    @property
    def resumable(self) -> bool:
        return self.status in (INTERRUPTED, CANCELLED, FAILED) and self.snapshot is not None

    def pace(self) -> dict[str, float | None]:
        """{"iterations_per_second", "seconds_left"} of the running attempt, from its latest records (pace.py, as
        jobs.events.reporter keeps them in `progress["pace"]`); null while unknown, and once the job is not running."""
        measured = (self.progress or {}).get("pace")
        if not isinstance(measured, dict) or self.status != RUNNING or measured.get("attempt") != self.attempt_count:
            measured = {}
        return {key: measured.get(key) for key in ("iterations_per_second", "seconds_left")}

    def to_json(self) -> dict[str, Any]:
        """The job as GET /jobs lists it and the `job` event carries it."""
        spec = self.spec
        return {
            "id": self.id,
            "name": self.name,
            "status": self.status,
            "message": self.message,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "device": {"requested": spec.get("device", "auto"), "assigned": self.device},
            "batch": {
                "requested": spec.get("batch"),
                "effective": self.effective_batch,
                "batch_size": self.batch_size,
                "iter_size": self.iter_size,
                "test_batch_size": self.test_batch_size,
                "test_iter": self.test_iter,
            },
            "iteration": self.iteration,
            "max_iter": self.max_iter,
            "epochs": spec.get("epochs"),
            "iterations_per_epoch": self.max_iter // spec["epochs"] if spec.get("epochs") and self.max_iter else None,
            **self.pace(),
            "snapshot": self.snapshot,
            "progress": nonfinite.encode(self.progress),
            "attempt_count": self.attempt_count,
            "resumable": self.resumable,
            "fallback": spec.get("fallback"),
            "memory_cap": spec.get("memory_cap"),
            "divergence": spec.get("divergence") or DEFAULT_POLICY,
        }


@dataclasses.dataclass
class Attempt:
    """One child process training the job, from its start to its end, with how it ended."""

    job_id: str
    number: int
    """1, 2, ... in the order the attempts ran."""
    status: str
    """running, then success, out_of_memory, diverged, failed, cancelled or interrupted (core.oom's outcomes)."""
    device: str
    batch_size: int
    iter_size: int
    started_at: float
    log: str
    """Caffe's log of this attempt, relative to the job's folder."""
    test_batch_size: int | None = None
    test_iter: int | None = None
    resumed_from: str | None = None
    """The solverstate it resumed from (relative to the job's folder), None when it started from scratch."""
    start_iteration: int = 0
    end_iteration: int | None = None
    limit_bytes: int | None = None
    """Memory the attempt could use: the memory cap, or the device's free memory when it started."""
    estimated_bytes: int | None = None
    """The estimate for its batch, raised by the fallback's correction."""
    correction: float | None = None
    peak_bytes: int | None = None
    """The process's memory at its largest (CPU: its data segment's growth since the baseline, which the cap
    limits: Caffe's buffers plus what Python and the libraries map meanwhile; GPU: NVML's figure for the process)."""
    allocated_bytes: int | None = None
    """Caffe's own allocation at its largest, the figure the estimate predicts (CPU: malloc's growth since the
    baseline); None on a GPU, where NVML's peak_bytes is Caffe's."""
    finished_at: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    message: str | None = None
    out_of_memory: dict[str, Any] | None = None
    """core.oom.OutOfMemory as JSON when it ran out of memory."""
    handle: str | None = None
    """Where the attempt runs, as its backend names it (jobs.backends.local): "pid:N" locally, "ray:<submission id>"."""
    test_net: str | None = None
    """Where its test nets were (core.test_net_modes): "shared" or "apart"; None for an attempt stored before
    the choice existed (shared)."""
    tester: dict[str, Any] | None = None
    """With the test nets apart, what its tester did: its device, estimated and peak bytes, the snapshots tested,
    the stop-and-resume cost measured on a shared device (jobs.scheduling.apart_run.TesterReport)."""

    @property
    def pid(self) -> int | None:
        """The local child's process id, from a "pid:N" handle; None under another backend."""
        kind, _, value = (self.handle or "").partition(":")
        return int(value) if kind == "pid" and value.isdigit() else None

    @property
    def duration(self) -> float | None:
        return None if self.finished_at is None else max(0.0, self.finished_at - self.started_at)

    def to_json(self) -> dict[str, Any]:
        """The attempt as GET /jobs/<id> lists it and the `job_attempt` event carries it."""
        document = dataclasses.asdict(self)
        document.pop("handle")
        document["effective_batch"] = self.batch_size * self.iter_size
        document["duration"] = self.duration
        return document


def dumps(value: Any) -> str | None:
    """A column's JSON text: strict JSON, non-finite numbers as core.nonfinite's strings."""
    return None if value is None else nonfinite.dumps(value, sort_keys=True)


def loads(text: str | None) -> Any:
    return None if text is None else nonfinite.loads(text)
