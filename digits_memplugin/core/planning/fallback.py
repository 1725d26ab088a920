"""The out-of-memory fallback: which (batch_size, iter_size) the next attempt trains with after a failure.

Pure: it takes the estimator's footprint function, the memory the attempt may use and what earlier failures told,
and returns a decision; the job manager runs the attempts (Lightning keeps its batch-size search apart from the
trainer the same way). A job's first plan is not made here but by core.planning.fit, on the estimate as it stands,
under the server's policy (core.planning.job_plan: its margin for the engine, 3% on the CPU and 5% on GPUs).

Why better than halving the batch (Accelerate's old rule), x0.9 steps (its current one) or doubling up from 2
(Lightning's "power" mode): those rules know nothing of the net, so they need several failures to find the edge and
then stop well below it. Here the first attempt is already the planner's batch for the device's memory, and a
failure is not just "too big" but a measurement:

* the attempt could use `limit_bytes` and still failed, so the real footprint at that batch is above it;
* when the message gives the allocation that failed and the free memory then (NVcaffe does), the job had used
  ``limit - free`` and still wanted ``requested`` more, a higher floor;
* when the runner saw its own memory in use before the failure, ``used + requested`` is a floor too.

The largest floor divided by the estimate at the failed batch is how much the estimate was low (a correction
factor, never below 1); the next plan is made on the corrected curve, with `growth` on top for what the failed
attempt had not allocated yet, and below every batch that failed. The effective batch per update is kept by raising
iter_size (Caffe divides the accumulated gradient by iter_size, so the learning rate and schedule stay valid). After
`max_attempts` attempts the job stops with a message that says what was tried.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ..fields import is_whole
from ..test_nets import TEST_NET_SHARED
from .fit import (
    DEFAULT_SAFETY_MARGIN,
    Bounds,
    Decision,
    Footprint,
    Found,
    check_wanted,
    conclude,
    corrected,
    largest_within,
    search,
    shrink_test_batch,
    shrunk_test_plan,
)
from .planner import MemoryCurve, usable_bytes

DEFAULT_GROWTH = 0.10
DEFAULT_MAX_ATTEMPTS = 5


@dataclasses.dataclass(frozen=True)
class Policy:
    """How much memory each attempt keeps back, how much a failure adds, and how many attempts a job gets."""

    safety_margin: float = DEFAULT_SAFETY_MARGIN
    """Fraction of the usable memory kept back from every plan (fragmentation, what the model omits)."""
    growth: float = DEFAULT_GROWTH
    """Added to the correction a failure proves: the failed attempt had not allocated everything yet."""
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    """Attempts per job, the first included; out-of-memory after the last one ends the job."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.safety_margin < 1.0:
            raise ValueError(f"safety_margin must be in [0, 1), got {self.safety_margin!r}")
        if not 0.0 <= self.growth <= 1.0:
            raise ValueError(f"growth must be in [0, 1], got {self.growth!r}")
        if not is_whole(self.max_attempts) or self.max_attempts < 1:
            raise ValueError(f"max_attempts must be a positive integer, got {self.max_attempts!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Failure:
    """One attempt that ran out of memory, with what it tells."""

    batch_size: int
    test_batch_size: int | None
    """The test nets' batch in that attempt (None: the net's own)."""
    limit_bytes: int
    """Memory the attempt could use: the cap, or the device's free memory at its start, lowered to what was free
    once it ended when other processes took memory meanwhile."""
    requested_bytes: int | None = None
    """The allocation that failed, from the message."""
    free_bytes: int | None = None
    """Free memory on the device when it failed, from the message."""
    used_bytes: int | None = None
    """The attempt's own memory in use, last seen before the failure."""
    test_net: str = TEST_NET_SHARED
    """Where the attempt's test nets were (core.test_nets): a failure tells only about plans of the same placement
    (a trainer with its test nets apart holds less than one with them beside it at the same batch)."""

    def floor(self) -> int:
        """Bytes the attempt's footprint is proven to exceed."""
        floors = [self.limit_bytes]
        if self.requested_bytes is not None and self.free_bytes is not None:
            floors.append(self.limit_bytes - self.free_bytes + self.requested_bytes)
        if self.requested_bytes is not None and self.used_bytes is not None:
            floors.append(self.used_bytes + self.requested_bytes)
        return max(floors)


def correction(footprint: Footprint, failures: Sequence[Failure], growth: float) -> float:
    """How much the estimate must be raised to account for every failure seen (1.0 without failures)."""
    factor = 1.0
    for failure in failures:
        estimated = footprint(failure.batch_size, failure.test_batch_size)
        if estimated > 0:
            factor = max(factor, failure.floor() / estimated * (1.0 + growth))
    return factor


def decide(
    policy: Policy,
    footprint: Footprint,
    wanted: int | None,
    limit_bytes: int,
    failures: Sequence[Failure] = (),
    *,
    attempts_made: int = 0,
    test_batch: int | None = None,
    test_iter: int = 1,
    max_batch: int | None = None,
    known: Mapping[int, int] | None = None,
) -> Decision:
    """The plan of the next attempt after `failures` (with none it is the first plan, core.planning.fit's).

    `wanted` is the effective batch to keep (None: the largest batch that fits, iter_size 1), `limit_bytes` the
    memory the next attempt may use, `failures` every out-of-memory attempt of the job so far, `attempts_made` how
    many attempts ran already, `test_batch`/`test_iter` the test nets' own batch and iterations (the test batch
    only shrinks when not even train batch 1 fits beside it), `max_batch` the largest batch worth a pass (the
    training set's size and a ceiling, for "auto": planner.auto_cap), `known` footprints already computed at `test_batch`
    (the search starts from them; only before any failure, when the estimate is not corrected).
    """
    check_wanted(wanted)
    factor = correction(footprint, failures, policy.growth)
    budget = usable_bytes(max(0, limit_bytes), policy.safety_margin)
    if attempts_made >= policy.max_attempts:
        tried = ", ".join(str(failure.batch_size) for failure in failures) or "none"
        return Decision(
            None, None, factor, budget, None,
            f"gave up after {attempts_made} attempts (the retry budget); batches that ran out of memory: {tried}",
            safety_margin=policy.safety_margin,
        )
    bounds = failure_bounds(footprint, failures, factor, test_batch, max_batch, known)
    found = search(bounds, budget, test_batch, test_iter)
    if found.largest == 0 and failures:
        found = _last_resort(footprint, failures, bounds, limit_bytes, test_batch, test_iter) or found
    return conclude(
        found, bounds, wanted, budget, test_batch=test_batch, safety_margin=policy.safety_margin, correction=factor,
        note=after_failures(factor, failures) if failures else None,
    )


def failure_bounds(
    footprint: Footprint, failures: Sequence[Failure], factor: float, test_batch: int | None, max_batch: int | None,
    known: Mapping[int, int] | None,
) -> Bounds:
    """The search's bounds after `failures`: the estimate raised by `factor` (seeded with `known` only when the
    failures left it as it stands), no train batch as large as one that failed beside the same or a smaller test
    batch, no test batch as large as one beside which batch 1 failed."""

    def curve_at(tb: int | None) -> MemoryCurve:
        seeded = known if known and factor == 1.0 and tb == test_batch else None
        return MemoryCurve(corrected(footprint, factor, tb), seeded)

    def ceiling_at(tb: int | None) -> int | None:
        ceiling = _failed_ceiling(failures, tb)
        return ceiling if max_batch is None else min(max_batch, ceiling if ceiling is not None else max_batch)

    return Bounds(curve_at, ceiling_at, _test_limit(failures, test_batch), max_batch)


def _last_resort(
    footprint: Footprint, failures: Sequence[Failure], bounds: Bounds, limit_bytes: int, test_batch: int | None,
    test_iter: int,
) -> Found | None:
    """When nothing fits the margin and growth: the margin and growth are guesses, so stop only once failures prove
    batch 1 cannot fit. Until then the last resort is batch 1 beside the largest test batch not proven too big."""
    proven = correction(footprint, failures, 0.0)

    def proven_at(tb: int | None) -> MemoryCurve:
        return MemoryCurve(corrected(footprint, proven, tb))

    if largest_within(proven_at(test_batch), limit_bytes, bounds.ceiling_at(test_batch)):
        return Found(bounds.curve_at(test_batch), 1)
    if test_batch is not None and test_batch > 1:
        limit = test_batch if bounds.test_limit is None else bounds.test_limit
        shrunk = shrink_test_batch(proven_at, limit_bytes, limit)
        if shrunk and largest_within(proven_at(shrunk), limit_bytes, bounds.ceiling_at(shrunk)):
            return Found(bounds.curve_at(shrunk), 1, shrunk_test_plan(shrunk, test_batch, test_iter))
    return None


def after_failures(factor: float, failures: Sequence[Failure]) -> str:
    """What the failures changed, in words: "batch 512 ran out of memory: the estimate is raised by 23%"; a factor
    of 1 (the failure told nothing the estimate did not) is said so, never "raised x1.00"."""
    batches = sorted({failure.batch_size for failure in failures}, reverse=True)
    names = ", ".join(map(str, batches[:-1])) + (" and " if len(batches) > 1 else "") + str(batches[-1])
    one = len(failures) == 1
    which = f"{'batch' if len(batches) == 1 else 'batches'} {names} ran out of memory"
    if factor < 1.005:
        return f"{which}; the estimate stands: it was not below what {'that attempt' if one else 'those attempts'} used"
    return f"{which}: the estimate is raised by {round((factor - 1) * 100)}% to what {'it' if one else 'they'} used"


def _failed_ceiling(failures: Sequence[Failure], test_batch: int | None) -> int | None:
    """The largest train batch still worth trying beside `test_batch`: below every batch that failed beside the
    same or a smaller test batch (None: no such failure)."""
    failed = [
        f.batch_size
        for f in failures
        if f.test_batch_size is None or test_batch is None or f.test_batch_size <= test_batch
    ]
    return min(failed) - 1 if failed else None


def _test_limit(failures: Sequence[Failure], test_batch: int | None) -> int | None:
    """The largest test batch worth shrinking to: below any beside which batch 1 failed (None: no test nets)."""
    if test_batch is None:
        return None
    failed = [f.test_batch_size for f in failures if f.batch_size == 1 and f.test_batch_size is not None]
    return min([test_batch, *failed]) - (1 if failed else 0)
