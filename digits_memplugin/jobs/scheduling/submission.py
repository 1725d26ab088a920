"""A submission made a job: its folder written (the net and solver as submitted), its definition loaded and checked
against the dataset folders (jobs.definition.loading), and the definitions of the data folder's jobs kept once loaded."""

from __future__ import annotations

import dataclasses
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ...core.errors import NetError
from ...core.net import ShapeOracle
from ...core.planning.apart import TesterDevice
from ...core.planning.fit import Decision
from ...devices.reader import Device
from ..config import ManagerConfig
from ..definition.data_sources import DataSourceError
from ..definition.definition import SOLVER_SOURCE, JobDefinition
from ..definition.loading import Trainer, load_definition
from ..definition.request import JobRequest
from ..errors import DiskFull, InvalidDefinition, JobValidationError
from ..store.disk import disk_full, free_note, remove_folder
from ..store.records import QUEUED, Job
from .attempt_loop import stacks
from .planning import Planner
from .scheduler import limit_for, memory_cap

NET_FILE = "net.prototxt"
REQUEST_LENGTH_FIELDS = ("epochs", "test_interval", "test_iter")
"""Request fields whose value the datasets must support (their sizes): their errors are theirs, not the net's."""


class Definitions:
    """The jobs' definitions, loaded from their folders once and kept (by job id) until the job is deleted."""

    def __init__(
        self, roots: tuple[Path, ...], oracle: ShapeOracle | None, jobs_root: Path, trainer: Trainer | None = None,
        planner: Planner | None = None,
    ) -> None:
        self.roots = roots
        self.oracle = oracle
        self.planner = planner or Planner(oracle)
        """Where a definition's nets are built and planned (a costly one in an estimate worker: jobs.scheduling.planning)."""
        self.jobs_root = jobs_root
        self.trainer = trainer or Trainer()
        """The Caffe that trains, as definitions need it: NVcaffe nets are accepted only when it is NVcaffe."""
        self._loaded: dict[str, JobDefinition] = {}
        self._lock = threading.Lock()

    def get(self, job: Job) -> JobDefinition:
        with self._lock:
            definition = self._loaded.get(job.id)
        if definition is None:
            definition = self.load(self.jobs_root / job.folder, job.spec)
            self.keep(job.id, definition)
        return definition

    def load(self, folder: Path, spec: dict[str, Any]) -> JobDefinition:
        return load_definition(
            (folder / NET_FILE).read_text(encoding="utf-8"),
            (folder / SOLVER_SOURCE).read_text(encoding="utf-8"),
            folder=folder,
            roots=self.roots,
            data=spec.get("data") or {},
            data_shapes={key: tuple(value) for key, value in (spec.get("data_shapes") or {}).items()},
            classes=spec.get("classes"),
            max_iter=spec.get("max_iter"),
            oracle=self.oracle,
            trainer=self.trainer,
            epochs=spec.get("epochs"),
            test_interval=spec.get("test_interval"),
            test_iter=spec.get("test_iter"),
            facts=self.planner.facts,
        )

    def keep(self, job_id: str, definition: JobDefinition) -> None:
        with self._lock:
            self._loaded[job_id] = definition

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._loaded.pop(job_id, None)


def write_job(request: JobRequest, device: str, definitions: Definitions) -> tuple[Job, JobDefinition]:
    """A new queued job (not stored yet) for the request on the (admitted) device, with its folder written under
    `definitions.jobs_root`; JobValidationError for a net, solver or data that cannot be used, DiskFull when the
    disk has no room. Nothing is left behind when it raises."""
    job_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    folder = definitions.jobs_root / job_id
    spec = request.spec(device)
    try:
        definition = _load_in(folder, request, spec, definitions, create=True)
    except BaseException:
        remove_folder(folder)
        raise
    now = time.time()
    name = request.name or (definition.training.train.param.name or "job")
    job = Job(
        id=job_id, name=name, status=QUEUED, created_at=now, updated_at=now, folder=job_id, spec=spec,
        max_iter=planned_length(request.batch, definition), message="waiting for a device",
    )
    return job, definition


def planned_length(batch: int | str | None, definition: JobDefinition) -> int | None:
    """The job's max_iter before its first attempt: as given, or by epochs at the wanted batch (the net's own when
    none is asked); None for epochs at batch "auto", known once the first attempt is planned."""
    if definition.epochs is None:
        return definition.max_iter
    wanted = batch if isinstance(batch, int) else definition.net_batch if batch is None else None
    return definition.length(wanted).max_iter if wanted else None


def preview_definition(request: JobRequest, device: str, definitions: Definitions) -> JobDefinition:
    """The definition a job for `request` would have, loaded and checked as `write_job` does but in a throwaway
    folder (list files are written under a job's folder) that is gone when this returns; JobValidationError as
    `write_job` gives."""
    definitions.jobs_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".preview-", dir=definitions.jobs_root) as folder:
        return _load_in(Path(folder), request, request.spec(device), definitions)


def _load_in(
    folder: Path, request: JobRequest, spec: dict[str, Any], definitions: Definitions, *, create: bool = False
) -> JobDefinition:
    """The request's net and solver written into `folder` (made first with `create`) and its definition loaded from
    there, its planned length checked; a definition error is the request field's JobValidationError, a full disk
    DiskFull."""
    try:
        if create:
            folder.mkdir(parents=True)
        (folder / NET_FILE).write_text(request.net, encoding="utf-8")
        (folder / SOLVER_SOURCE).write_text(request.solver, encoding="utf-8")
        definition = definitions.load(folder, spec)
        planned_length(request.batch, definition)  # a length by epochs Caffe cannot count is refused here
        return definition
    except NetError as error:
        raise InvalidDefinition(error_field(error, request.data), error) from None
    except OSError as error:
        if disk_full(error):
            raise DiskFull(
                f"no space left on the disk holding the data folder: {free_note(definitions.jobs_root)}"
            ) from None
        raise


@dataclasses.dataclass(frozen=True)
class JobPreview:
    """The plan a job would get on a device before it exists (JobManager.preview)."""

    device: str
    engine: str
    limit_bytes: int
    """The memory the job may use there (free memory less what running jobs reserved, or its cap)."""
    decision: Decision
    definition: JobDefinition


def preview(
    request: JobRequest, device: Device, reserved_bytes: int, definitions: Definitions, config: ManagerConfig,
    testers: Callable[[dict[str, Any], JobDefinition], Sequence[TesterDevice]] | None = None,
) -> JobPreview:
    """The plan of a job for `request` on `device` as its first attempt would get it: the limit the scheduler
    gives (`reserved_bytes`: what running jobs planned there and have not allocated yet; the CPU's cap less Caffe's
    thread stacks) and the planning function the attempts use; with its test nets apart, its tester on one of
    `testers(spec, definition)` (the other devices with room for it, as the attempt loop finds them)."""
    definition = preview_definition(request, device.key, definitions)
    limit = limit_for(
        device, reserved=reserved_bytes, cap=memory_cap(request.memory_cap, config.cpu_memory_cap),
        cap_overhead=stacks(definition),
    )
    if limit is None:
        raise JobValidationError({"device": f"the free memory of {device.key!r} is unknown: {device.error or 'n/a'}"})
    engine = config.policy.engine(device.kind)
    spec = request.spec(device.key)
    decision = definitions.planner.plan(spec, definition, engine=engine, limit_bytes=limit.limit_bytes,
                                        policy=config.policy, testers=testers(spec, definition) if testers else ())
    return JobPreview(device.key, engine, limit.limit_bytes, decision, definition)


def error_field(error: NetError, data: dict[str, str]) -> str:
    """The request field an error belongs to: a source the request's `data` gave is the data's fault."""
    if isinstance(error, DataSourceError) or error.field == "data" or (error.field or "").startswith("data_shapes"):
        return "data"
    if error.source is None and error.field in REQUEST_LENGTH_FIELDS:
        return str(error.field)
    if error.source == SOLVER_SOURCE or (error.source or "").startswith(SOLVER_SOURCE):
        return "solver"
    return "net"
