"""The out-of-memory fallback policy: which (batch_size, iter_size) the next attempt trains with.

Pure: it takes the estimator's footprint function, the memory the attempt may use and what earlier failures told,
and returns a decision; the job manager runs the attempts (Lightning keeps its batch-size search apart from the
trainer the same way).

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
attempt had not allocated yet. The effective batch per update is kept by raising iter_size (Caffe divides the
accumulated gradient by iter_size, so the learning rate and schedule stay valid). After `max_attempts` attempts
the job stops with a message that says what was tried.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import BlobLimitError
from ..sizes import format_size
from .planner import MAX_BATCH, BatchPlan, MemoryCurve, max_batch, plan_batch, usable_bytes

Footprint = Callable[[int, int | None], int]
"""Estimated bytes of a training job at (train batch, test batch); a test batch of None means the net's own."""

DEFAULT_SAFETY_MARGIN = 0.05
"""Jobs keep back less than the estimate form's 10%: an attempt that runs out of memory is retried, not lost."""
CPU_SAFETY_MARGIN = 0.03
"""On the CPU the estimate is held to what Caffe really allocates (bench/accuracy.py) and under a cap it was
within 3% of the largest batch that trains on every net of bench/fallback.py: a thinner margin suffices."""
GPU_SAFETY_MARGIN = DEFAULT_SAFETY_MARGIN
"""On GPUs the CUDA context and cuDNN's workspaces are per-machine constants the estimate only models."""
DEFAULT_GROWTH = 0.10
DEFAULT_MAX_ATTEMPTS = 5
LIMITED_BY_MEMORY = "memory"
LIMITED_BY_BLOB_LIMIT = "blob_limit"
"""One more item would make a blob over Caffe's INT_MAX elements."""
LIMITED_BY_UNROLL_LIMIT = "unroll_limit"
"""One more would unroll a recurrent layer past the estimator's bound."""
LIMITED_BY_MAX_BATCH = "max_batch"
"""The cap asked for: the training set's size for "auto", the estimate's max_batch, or the search's bound."""
LIMITED_BY_FAILURES = "failures"
"""A larger batch ran out of memory in an earlier attempt."""


@dataclasses.dataclass(frozen=True)
class Policy:
    """How careful the first attempt is, how much a failure adds, and how many attempts a job gets."""

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
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 1:
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

    def floor(self) -> int:
        """Bytes the attempt's footprint is proven to exceed."""
        floors = [self.limit_bytes]
        if self.requested_bytes is not None and self.free_bytes is not None:
            floors.append(self.limit_bytes - self.free_bytes + self.requested_bytes)
        if self.requested_bytes is not None and self.used_bytes is not None:
            floors.append(self.used_bytes + self.requested_bytes)
        return max(floors)


@dataclasses.dataclass(frozen=True)
class Decision:
    """The next attempt, or why there is none."""

    plan: BatchPlan | None
    """None when the job stops (`message` says why)."""
    test_plan: dict[str, int] | None
    """{"batch_size", "test_iter"} when the test nets must shrink too (not even batch 1 fits beside them)."""
    correction: float
    """Factor applied to the estimate (1.0 before any failure)."""
    budget: int
    """Bytes planned against: the limit less the safety margin."""
    estimated_bytes: int | None
    """The corrected estimate at the planned batch."""
    message: str
    largest: int = 0
    """The largest batch that fits in one pass (0: not even batch 1)."""
    limited_by: str = LIMITED_BY_MEMORY
    """Why `largest` is not larger: LIMITED_BY_MEMORY, _BLOB_LIMIT, _UNROLL_LIMIT, _MAX_BATCH or _FAILURES."""
    safety_margin: float = DEFAULT_SAFETY_MARGIN
    auto_cap: str | None = None
    """Why an "auto" plan stops where it does when the cap of "auto" chose it (planner.AutoCap.note): "capped at 71
    so that an epoch of the 1438 training items has 21 iterations ..."; None otherwise."""

    @property
    def stop(self) -> bool:
        return self.plan is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan": None if self.plan is None else self.plan.to_dict(),
            "test_plan": self.test_plan,
            "correction": self.correction,
            "budget": self.budget,
            "estimated_bytes": self.estimated_bytes,
            "message": self.message,
            "largest": self.largest,
            "limited_by": self.limited_by,
            "safety_margin": self.safety_margin,
            "auto_cap": self.auto_cap,
        }


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
    """The plan of the next attempt.

    `wanted` is the effective batch to keep (None: the largest batch that fits, iter_size 1), `limit_bytes` the
    memory the next attempt may use, `failures` every out-of-memory attempt of the job so far, `attempts_made` how
    many attempts ran already, `test_batch`/`test_iter` the test nets' own batch and iterations (the test batch
    only shrinks when not even train batch 1 fits beside it), `max_batch` the largest batch worth a pass (the
    training set's size and a ceiling, for "auto": planner.auto_cap), `known` footprints already computed at `test_batch`
    (the search starts from them; only before any failure, when the estimate is not corrected).
    """
    if wanted is not None and wanted <= 0:
        raise ValueError(f"the wanted batch must be positive, got {wanted}")
    factor = correction(footprint, failures, policy.growth)
    budget = usable_bytes(max(0, limit_bytes), policy.safety_margin)
    if attempts_made >= policy.max_attempts:
        tried = ", ".join(str(failure.batch_size) for failure in failures) or "none"
        return Decision(
            None, None, factor, budget, None,
            f"gave up after {attempts_made} attempts (the retry budget); batches that ran out of memory: {tried}",
            safety_margin=policy.safety_margin,
        )

    def curve_at(tb: int | None) -> MemoryCurve:
        seeded = known if known and factor == 1.0 and tb == test_batch else None
        return MemoryCurve(lambda batch: math.ceil(factor * footprint(batch, tb)), seeded)

    def ceiling_at(tb: int | None) -> int | None:
        ceiling = _failed_ceiling(failures, tb)
        return ceiling if max_batch is None else min(max_batch, ceiling if ceiling is not None else max_batch)

    curve = curve_at(test_batch)
    largest = _largest(curve, budget, ceiling_at(test_batch))
    test_plan = None
    if largest == 0 and test_batch is not None and test_batch > 1:
        shrunk = _shrink_test_batch(curve_at, budget, test_batch, failures)
        if shrunk:
            curve = curve_at(shrunk)
            largest = _largest(curve, budget, ceiling_at(shrunk))
            if largest:
                test_plan = {"batch_size": shrunk, "test_iter": math.ceil(test_iter * test_batch / shrunk)}
    if largest == 0 and failures:
        # The margin and growth are guesses; only stop once failures prove batch 1 cannot fit. Until then the
        # last resort is batch 1 beside the largest test batch not proven too big.
        proven = correction(footprint, failures, 0.0)

        def proven_at(tb: int | None) -> MemoryCurve:
            return MemoryCurve(lambda batch: math.ceil(proven * footprint(batch, tb)))

        if _largest(proven_at(test_batch), limit_bytes, ceiling_at(test_batch)):
            curve, largest = curve_at(test_batch), 1
        elif test_batch is not None and test_batch > 1:
            shrunk = _shrink_test_batch(proven_at, limit_bytes, test_batch, failures)
            if shrunk and _largest(proven_at(shrunk), limit_bytes, ceiling_at(shrunk)):
                curve, largest = curve_at(shrunk), 1
                test_plan = {"batch_size": shrunk, "test_iter": math.ceil(test_iter * test_batch / shrunk)}
    if largest == 0:
        cost = curve(1)
        estimated = int(cost) if math.isfinite(cost) else None
        return Decision(
            None, None, factor, budget, estimated,
            "does not fit even at batch 1"
            + (" with the test batch reduced to 1" if test_batch and test_batch > 1 else "")
            + f": estimated {_size(cost)} against {_size(budget)} usable"
            + (f" ({after_failures(factor, failures)})" if failures else ""),
            safety_margin=policy.safety_margin,
        )
    limited_by = _limited_by(curve, largest, ceiling_at(test_plan["batch_size"] if test_plan else test_batch),
                             max_batch)
    if wanted is None:
        plan = BatchPlan(largest, 1, True, int(curve(largest)), largest)
    else:
        plan = plan_batch(_capped(curve, largest), wanted, budget)
    message = f"batch {plan.batch_size} x iter_size {plan.iter_size}: estimated {_size(plan.bytes)} of {_size(budget)} usable"
    if failures:
        message += f" ({after_failures(factor, failures)})"
    return Decision(plan, test_plan, factor, budget, plan.bytes, message, largest, limited_by, policy.safety_margin)


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


def _limited_by(curve: MemoryCurve, largest: int, ceiling: int | None, max_batch: int | None) -> str:
    """Why the largest batch is not larger (see Decision.limited_by)."""
    if ceiling is not None and largest >= ceiling:
        return LIMITED_BY_MAX_BATCH if max_batch is not None and largest >= max_batch else LIMITED_BY_FAILURES
    if largest >= MAX_BATCH:
        return LIMITED_BY_MAX_BATCH
    curve(largest + 1)
    error = curve.errors.get(largest + 1)
    if isinstance(error, BlobLimitError):
        return LIMITED_BY_BLOB_LIMIT
    if error is not None:
        return LIMITED_BY_UNROLL_LIMIT
    return LIMITED_BY_MEMORY


def _failed_ceiling(failures: Sequence[Failure], test_batch: int | None) -> int | None:
    """The largest train batch still worth trying beside `test_batch`: below every batch that failed beside the
    same or a smaller test batch (None: no such failure)."""
    failed = [
        f.batch_size
        for f in failures
        if f.test_batch_size is None or test_batch is None or f.test_batch_size <= test_batch
    ]
    return min(failed) - 1 if failed else None


def _largest(curve: MemoryCurve, budget: int, ceiling: int | None) -> int:
    if ceiling is None:
        return max_batch(curve, budget)
    return max_batch(curve, budget, limit=ceiling) if ceiling >= 1 else 0


def _capped(curve: MemoryCurve, largest: int) -> MemoryCurve:
    """The curve with every batch above `largest` made infinite, so plan_batch never picks a batch that failed;
    it starts from what `curve` knows (its search then builds no batch twice, nor batch 2 for its slope)."""
    known = {batch: int(curve(batch)) for batch in curve.known() if batch <= largest and math.isfinite(curve(batch))}
    return MemoryCurve(lambda batch: curve(batch) if batch <= largest else math.inf, known)  # type: ignore[arg-type,return-value]


def _shrink_test_batch(
    curve_at: Callable[[int | None], MemoryCurve], budget: int, test_batch: int, failures: Sequence[Failure]
) -> int:
    """The largest test batch beside which train batch 1 fits (0: none), below any that failed at batch 1."""
    failed = [f.test_batch_size for f in failures if f.batch_size == 1 and f.test_batch_size is not None]
    limit = min([test_batch, *failed]) - (1 if failed else 0)
    if limit < 1:
        return 0
    test_curve = MemoryCurve(lambda tb: curve_at(tb)(1))  # type: ignore[arg-type,return-value]
    return max_batch(test_curve, budget, limit=limit)


def _size(value: float | None) -> str:
    """Bytes as every page and message writes them (sizes.format_size: "22.0 GiB", not "22480.7 MiB"); an
    estimate that is unknown or infinite is "n/a"."""
    if value is None or not math.isfinite(value):
        return "n/a"
    return format_size(int(value))
