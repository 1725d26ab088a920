"""What fits on a device: the largest train batch beside the test nets (their batch shrunk only when not even train
batch 1 fits beside them), the (batch_size, iter_size) plan that keeps the wanted batch, and why the largest is not
larger, as the `Decision` every planning path returns.

The first plan of a job is made here on the estimate as it stands (`fit`); after an out-of-memory failure the
fallback (core.planning.fallback) makes it here too, on the estimate its failures corrected and below the batches
that failed (`Bounds`). Below both lies the search over one memory curve (core.planning.planner).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import BlobLimitError
from ..sizes import format_size
from ..test_nets import TEST_NET_SHARED
from .planner import MAX_BATCH, BatchPlan, MemoryCurve, max_batch, plan_batch, usable_bytes

Footprint = Callable[[int, int | None], int]
"""Estimated bytes of a training job at (train batch, test batch); a test batch of None means the net's own."""

DEFAULT_SAFETY_MARGIN = 0.05
"""The margin of a plan made without the server's policy (core.planning.job_plan gives each engine its own: 3% on
the CPU, 5% on GPUs): a job's attempt that runs out of memory is retried, not lost, so a thin margin suffices."""
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
    test_net: str = TEST_NET_SHARED
    """Where the test nets are planned (core.test_nets): TEST_NET_SHARED beside the train net, or TEST_NET_APART."""
    test_net_note: str | None = None
    """Why that placement, when the planner chose it (core.planning.apart); None for a plan made as `shared` only."""
    tester_bytes: int | None = None
    """Under TEST_NET_APART, the tester's estimated peak (the test nets alone at their own batch)."""
    tester_device: str | None = None
    """Under TEST_NET_APART, the device the tester runs on when it is not the trainer's (None: the trainer's)."""
    by_stop_cost: bool = False
    """`auto` chose the placement on what stopping for the tester was measured to cost (core.planning.apart)."""

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
            "test_net": self.test_net,
            "test_net_note": self.test_net_note,
            "tester_bytes": self.tester_bytes,
            "tester_device": self.tester_device,
            "by_stop_cost": self.by_stop_cost,
        }


@dataclasses.dataclass(frozen=True)
class Bounds:
    """What a search on one device is held to, at each test batch: the memory curve, and the largest train batch
    worth trying; and the largest test batch worth shrinking to."""

    curve_at: Callable[[int | None], MemoryCurve]
    ceiling_at: Callable[[int | None], int | None]
    """None: no bound but the search's own."""
    test_limit: int | None
    """None: the net's own test batch."""
    max_batch: int | None = None
    """The cap asked for (see LIMITED_BY_MAX_BATCH), within which `ceiling_at` lies."""


@dataclasses.dataclass(frozen=True)
class Found:
    """The largest train batch that fits (0: none), on its curve, and the shrunk test nets it needs (or None)."""

    curve: MemoryCurve
    largest: int
    test_plan: dict[str, int] | None = None


def check_wanted(wanted: int | None) -> None:
    if wanted is not None and wanted <= 0:
        raise ValueError(f"the wanted batch must be positive, got {wanted}")


def estimate_bounds(
    footprint: Footprint, test_batch: int | None, max_batch: int | None, known: Mapping[int, int] | None
) -> Bounds:
    """The bounds of a first plan: the estimate as it stands (seeded at the net's test batch with the footprints
    already computed), capped at `max_batch`."""

    def curve_at(tb: int | None) -> MemoryCurve:
        return MemoryCurve(corrected(footprint, 1.0, tb), known if known and tb == test_batch else None)

    return Bounds(curve_at, lambda tb: max_batch, test_batch, max_batch)


def corrected(footprint: Footprint, factor: float, test_batch: int | None) -> Callable[[int], int]:
    """Memory against the train batch beside `test_batch`, the estimate raised by `factor` (1.0: as it stands)."""
    return lambda batch: math.ceil(factor * footprint(batch, test_batch))


def search(bounds: Bounds, budget: int, test_batch: int | None, test_iter: int) -> Found:
    """The largest train batch within `budget` beside the test nets; when not even batch 1 fits beside them, beside
    the largest test batch that lets it (test_iter raised so that a test pass covers as many items)."""
    curve = bounds.curve_at(test_batch)
    largest = largest_within(curve, budget, bounds.ceiling_at(test_batch))
    if largest == 0 and test_batch is not None and test_batch > 1:
        limit = test_batch if bounds.test_limit is None else bounds.test_limit
        shrunk = shrink_test_batch(bounds.curve_at, budget, limit)
        if shrunk:
            curve = bounds.curve_at(shrunk)
            largest = largest_within(curve, budget, bounds.ceiling_at(shrunk))
            if largest:
                return Found(curve, largest, shrunk_test_plan(shrunk, test_batch, test_iter))
    return Found(curve, largest)


def shrunk_test_plan(shrunk: int, test_batch: int, test_iter: int) -> dict[str, int]:
    """The shrunk test nets' batch and the iterations that keep a test pass over as many items."""
    return {"batch_size": shrunk, "test_iter": math.ceil(test_iter * test_batch / shrunk)}


def conclude(
    found: Found, bounds: Bounds, wanted: int | None, budget: int, *, test_batch: int | None, safety_margin: float,
    correction: float = 1.0, note: str | None = None,
) -> Decision:
    """The decision on what the search found: the plan (the largest batch for "auto", else the wanted batch kept
    through iter_size in passes no larger than the largest), or a stop when not even batch 1 fits. `note` says what
    failures changed (the fallback's)."""
    curve, largest = found.curve, found.largest
    after = f" ({note})" if note else ""
    if largest == 0:
        cost = curve(1)
        estimated = int(cost) if math.isfinite(cost) else None
        return Decision(
            None, None, correction, budget, estimated,
            "does not fit even at batch 1"
            + (" with the test batch reduced to 1" if test_batch and test_batch > 1 else "")
            + f": estimated {_size(cost)} against {_size(budget)} usable" + after,
            safety_margin=safety_margin,
        )
    ceiling = bounds.ceiling_at(found.test_plan["batch_size"] if found.test_plan else test_batch)
    limited_by = _limited_by(curve, largest, ceiling, bounds.max_batch)
    if wanted is None:
        plan = BatchPlan(largest, 1, True, int(curve(largest)), largest)
    else:
        plan = plan_batch(_capped(curve, largest), wanted, budget)
    message = f"batch {plan.batch_size} x iter_size {plan.iter_size}: estimated {_size(plan.bytes)} of {_size(budget)} usable"
    return Decision(
        plan, found.test_plan, correction, budget, plan.bytes, message + after, largest, limited_by, safety_margin
    )


def fit(
    footprint: Footprint,
    wanted: int | None,
    limit_bytes: int,
    safety_margin: float,
    *,
    test_batch: int | None = None,
    test_iter: int = 1,
    max_batch: int | None = None,
    known: Mapping[int, int] | None = None,
) -> Decision:
    """The first plan on a device with `limit_bytes` for the job, on the estimate as it stands.

    `wanted` is the effective batch to keep (None: the largest batch that fits, iter_size 1), `test_batch` and
    `test_iter` the test nets' own batch and iterations, `max_batch` the largest batch worth a pass (for "auto":
    planner.auto_cap), `known` footprints already computed at `test_batch` (the search starts from them)."""
    check_wanted(wanted)
    budget = usable_bytes(max(0, limit_bytes), safety_margin)
    bounds = estimate_bounds(footprint, test_batch, max_batch, known)
    found = search(bounds, budget, test_batch, test_iter)
    return conclude(found, bounds, wanted, budget, test_batch=test_batch, safety_margin=safety_margin)


def largest_within(curve: MemoryCurve, budget: int, ceiling: int | None) -> int:
    """The largest batch within `budget`, at most `ceiling` (0: none)."""
    if ceiling is None:
        return max_batch(curve, budget)
    return max_batch(curve, budget, limit=ceiling) if ceiling >= 1 else 0


def shrink_test_batch(curve_at: Callable[[int | None], MemoryCurve], budget: int, limit: int) -> int:
    """The largest test batch, at most `limit`, beside which train batch 1 fits (0: none)."""
    if limit < 1:
        return 0
    test_curve = MemoryCurve(lambda tb: curve_at(tb)(1))  # type: ignore[arg-type,return-value]
    return max_batch(test_curve, budget, limit=limit)


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


def _capped(curve: MemoryCurve, largest: int) -> MemoryCurve:
    """The curve with every batch above `largest` made infinite, so plan_batch never picks a batch that failed;
    it starts from what `curve` knows (its search then builds no batch twice, nor batch 2 for its slope)."""
    known = {batch: int(curve(batch)) for batch in curve.known() if batch <= largest and math.isfinite(curve(batch))}
    return MemoryCurve(lambda batch: curve(batch) if batch <= largest else math.inf, known)  # type: ignore[arg-type,return-value]


def _size(value: float | None) -> str:
    """Bytes as every page and message writes them (sizes.format_size: "22.0 GiB", not "22480.7 MiB"); an
    estimate that is unknown or infinite is "n/a"."""
    if value is None or not math.isfinite(value):
        return "n/a"
    return format_size(int(value))
