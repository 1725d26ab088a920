"""What an ended attempt means for its job: done, failed, cancelled or interrupted, or tried again after an
out-of-memory (`job_end`); the story of its retries in the job's last message (`retry_summary`); what an earlier
out-of-memory attempt tells the fallback policy (`failure_of`); and a failure on a full disk told as such."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from ...core.oom import (
    OUTCOME_CANCELLED,
    OUTCOME_DIVERGED,
    OUTCOME_INTERRUPTED,
    OUTCOME_OUT_OF_MEMORY,
    OUTCOME_REPLANNED,
    OUTCOME_SUCCESS,
    Outcome,
)
from ...core.planning.fallback import Failure
from ...core.test_net_modes import TEST_NET_SHARED
from ..backends.attempt_process import AttemptResult
from ..child.runner import DISK_FULL
from ..store.disk import LOW_DISK_BYTES, free_bytes, free_note
from ..store.records import CANCELLED, DONE, FAILED, INTERRUPTED, Attempt

INTERRUPTED_MESSAGE = "the server stopped while the job was queued or running; resume it to continue"


def job_end(result: AttemptResult, attempts: Sequence[Attempt] = ()) -> tuple[str, str] | None:
    """The job's status and message once an attempt ended so; None when another attempt follows (after an out of
    memory, the fallback's; after a replan, the new plan's).
    `attempts`: the job's attempts, the one that ended last, for the story of its out-of-memory retries."""
    outcome = result.outcome
    if outcome.status == OUTCOME_SUCCESS:
        note = "" if outcome.divergence is None else f"; {outcome.divergence.trained_on_note}"
        retries = retry_summary(attempts)
        return DONE, f"training finished at iteration {result.last_iteration}{note}" + (f"; {retries}" if retries else "")
    if outcome.status == OUTCOME_DIVERGED:
        return FAILED, outcome.message
    if outcome.status == OUTCOME_INTERRUPTED:
        return INTERRUPTED, INTERRUPTED_MESSAGE
    if outcome.status == OUTCOME_CANCELLED:
        return CANCELLED, outcome.message or "cancelled"
    if outcome.status not in (OUTCOME_OUT_OF_MEMORY, OUTCOME_REPLANNED):
        return FAILED, outcome.message
    return None


def retry_summary(attempts: Sequence[Attempt]) -> str | None:
    """How the out-of-memory fallback got the job to the plan of its last attempt, in one sentence ("it ran out of
    memory at batch 512, and was retried at batch 171 x iter_size 3 (effective batch 513)"); None without a retry."""
    if len(attempts) < 2:
        return None
    *earlier, last = sorted(attempts, key=lambda attempt: attempt.number)
    failed = [attempt for attempt in earlier if attempt.status == OUTCOME_OUT_OF_MEMORY]
    if not failed:
        return None
    plans = [plan_words(attempt.batch_size, attempt.iter_size) for attempt in failed]
    listed = ", ".join(plans[:-1]) + (" and " if len(plans) > 1 else "") + plans[-1]
    tries = "" if len(failed) == 1 else f" ({len(failed)} attempts)"
    effective = last.batch_size * last.iter_size
    return (f"it ran out of memory at {listed}{tries}, and was retried at {plan_words(last.batch_size, last.iter_size)}"
            + (f" (effective batch {effective})" if last.iter_size > 1 else ""))


def plan_words(batch_size: int, iter_size: int) -> str:
    """"batch 512", "batch 171 x iter_size 3"."""
    return f"batch {batch_size}" + (f" x iter_size {iter_size}" if iter_size > 1 else "")


def failure_of(attempt: Attempt) -> Failure:
    """An earlier out-of-memory attempt (before a restart or a resume), as the policy reads it."""
    record = attempt.out_of_memory or {}
    return Failure(
        batch_size=attempt.batch_size,
        test_batch_size=attempt.test_batch_size,
        limit_bytes=int(attempt.limit_bytes or 0),
        requested_bytes=record.get("requested_bytes"),
        free_bytes=record.get("free_bytes"),
        used_bytes=attempt.peak_bytes,
        test_net=attempt.test_net or TEST_NET_SHARED,
    )


def note_full_disk(folder: Path, result: AttemptResult, outcome: Outcome) -> Outcome:
    """A failed attempt whose disk is full says so. Caffe aborts when a snapshot cannot be written and glog's
    own line about it cannot reach the full disk either, so the free space is what tells."""
    free = free_bytes(folder)
    reported = (result.error or {}).get("type") == DISK_FULL
    if not reported and (free is None or free >= LOW_DISK_BYTES):
        return outcome
    cause = (result.error or {}).get("message") if reported else outcome.message
    message = (
        f"no space left on the disk holding the job's folder ({free_note(folder)}): the attempt stopped at "
        f"iteration {result.last_iteration or 0} ({cause}); free some space, then resume the job (it continues "
        "from its last snapshot)"
    )
    return dataclasses.replace(outcome, message=message)


__all__ = ["INTERRUPTED_MESSAGE", "failure_of", "job_end", "note_full_disk", "plan_words", "retry_summary"]
