"""The jobs list a page at a time (GET /jobs, the jobs page, subscribe_jobs): newest first as pages go, each page
found from the job it lists before, so that a page stays the same while new jobs are queued."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..core.fields import is_whole
from .errors import JobPageError
from .events.reporter import Reporter
from .store.database import JobStore
from .store.records import JOB_STATES, Job

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
"""Jobs in one page of the list (GET /jobs, the jobs page, subscribe_jobs): by default, and at most."""


@dataclasses.dataclass(frozen=True)
class JobPage:
    """One page of the jobs list, newest first as pages go: `jobs` oldest first within the page (as the whole
    list was), `older` the id to give as `before` for the next page (None: this page reaches the oldest job)."""

    jobs: list[Job]
    total: int
    limit: int
    before: str | None
    older: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "jobs": [job.to_json() for job in self.jobs], "total": self.total, "limit": self.limit,
            "before": self.before, "older": self.older,
        }


def check_page(limit: object, before: object) -> None:
    """JobPageError for a `limit` or a `before` no page can have (a request's, unchecked)."""
    if not is_whole(limit) or not 1 <= limit <= MAX_PAGE_SIZE:
        raise JobPageError(f"limit must be a whole number from 1 to {MAX_PAGE_SIZE}")
    if before is not None and not isinstance(before, str):
        raise JobPageError("before must be a job id")


def gone_before(before: str) -> JobPageError:
    """The error of a page asked before a job that does not exist."""
    return JobPageError(
        f"no job {before[:100]!r} to list the jobs before (deleted meanwhile?); ask again without before"
    )


def read_page(store: JobStore, reporter: Reporter, limit: int, before: str | None, position: int | None) -> JobPage:
    """The `limit` newest jobs queued before `position` (the queue position of the job `before`; None: the
    newest), each as its task knows it (Reporter.view)."""
    jobs = store.page_jobs(limit + 1, position)
    older = jobs[limit - 1].id if len(jobs) > limit else None
    page = [reporter.view(job) for job in reversed(jobs[:limit])]
    return JobPage(page, store.count_jobs(JOB_STATES), limit, before, older)


__all__ = ["DEFAULT_PAGE_SIZE", "MAX_PAGE_SIZE", "JobPage", "check_page", "gone_before", "read_page"]
