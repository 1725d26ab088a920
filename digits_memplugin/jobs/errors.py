"""What the job manager refuses, and why: the exceptions its requests raise (the web layer maps each to a status)."""

from __future__ import annotations

from typing import Any

from ..core.errors import FieldErrors, MemPluginError, NetError
from ..core.inputs import shown
from ..core.sizes import format_size
from .store.records import Job


class JobError(MemPluginError):
    """A request about a job that cannot be done; the message says why."""


class JobNotFound(JobError):
    def __init__(self, job_id: Any) -> None:
        super().__init__(f"no job {shown(job_id)!r}")


class JobStateError(JobError):
    """The job is not in a state that allows this (delete while running, resume a finished job...)."""


class JobValidationError(JobError, FieldErrors):
    """A submission that cannot become a job: `errors` maps fields to messages (the API's 400 body). A JobError
    for the manager's callers, FieldErrors for the front ends that answer with its fields."""


class InvalidDefinition(JobValidationError):
    """The net, the solver or the data they read cannot make a job: `errors` holds the error as the API gives it
    under the request's field, `error` the definition error itself (its file, line, layer and field, and the data
    shape to ask for), so that each front end can say it in its own terms (the command line names its flags and
    the user's own file names, not the job folder's net.prototxt)."""

    def __init__(self, field: str, error: NetError) -> None:
        super().__init__({field: error.to_dict()})
        self.error = error


class QueueFull(JobValidationError):
    """The queue already holds `max_queued_jobs` waiting jobs: a submission is refused before anything is written."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            {
                "queue": f"{limit} jobs are already waiting, the most this server queues (MEMPLUGIN_MAX_QUEUED_JOBS); "
                "submit again once some have started, or cancel some"
            }
        )
        self.limit = limit


class DiskFull(JobError):
    """The disk holding the data folder has no room left for a job's files."""


class StoredJobsFull(JobValidationError):
    """`max_stored_jobs` jobs are kept already (whatever their state): a submission is refused, saying what to
    delete, before anything is written."""

    def __init__(self, count: int, limit: int, oldest: list[Job]) -> None:
        super().__init__(
            {
                "stored_jobs": f"{count} jobs are stored, the most this server keeps (MEMPLUGIN_MAX_STORED_JOBS): "
                "delete jobs you no longer need (DELETE .../api/jobs/<id>, or Delete on the job's page), then submit "
                "again" + candidates("the oldest that are not running", oldest)
            }
        )


class StoredBytesFull(DiskFull):
    """The jobs' folders hold `max_stored_bytes` or more: the 507 a submission gets, saying what to delete."""

    def __init__(self, used: int, incoming: int, limit: int, largest: list[Job], sizes: dict[str, int]) -> None:
        super().__init__(
            f"the jobs' folders hold {format_size(used)} and this job brings {format_size(incoming)}; this "
            f"server keeps at most {format_size(limit)} of them "
            "(MEMPLUGIN_MAX_STORED_BYTES): delete jobs you no longer need (DELETE .../api/jobs/<id>, or Delete "
            "on the job's page), then submit again"
            + candidates("the largest that are not running", largest, sizes)
        )


class JobPageError(JobError):
    """A page of the jobs list that cannot be given (a limit out of range, `before` naming no job)."""


class DataFolderInUse(JobError):
    """Another manager (a server, a `train` command) holds the data folder."""


def candidates(what: str, jobs: list[Job], sizes: dict[str, int] | None = None) -> str:
    """"; the oldest that are not running: <id> (name, failed), ..." for a refusal's message."""
    if not jobs:
        return ""
    listed = [
        f"{job.id} ({job.name[:80]!r}, {job.status}" + (f", {format_size(sizes.get(job.id, 0))})" if sizes else ")")
        for job in jobs
    ]
    return f"; {what}: " + ", ".join(listed)


__all__ = [
    "DataFolderInUse",
    "DiskFull",
    "JobError",
    "JobNotFound",
    "JobPageError",
    "JobStateError",
    "JobValidationError",
    "QueueFull",
    "StoredBytesFull",
    "StoredJobsFull",
]
