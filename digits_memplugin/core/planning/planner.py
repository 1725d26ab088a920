"""The batch planner: the largest batch that fits, and a (batch_size, iter_size) plan that keeps the effective batch.

A pure search over a memory function `bytes_at(batch) -> int` (Lightning keeps its search apart from the trainer
the same way). Memory in Caffe is affine in the batch size for almost every net, so the planner solves the
affine model from two evaluations (batch 1 and one already known, such as the report's) and then checks the
answer with exact evaluations on both sides; when the check fails (a net that is not affine) it falls back to a
bisection on exact evaluations. No guessing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

from ..errors import BatchLimitError

MAX_BATCH = 1 << 20
"""No search goes above this batch (a million items): blobs would exceed Caffe's INT_MAX elements long before."""


AUTO_MIN_EPOCH_ITERATIONS = 20
"""An "auto" batch is at most this fraction (1/20, 5%) of the training set, so that an epoch has at least 20 weight
updates. Keskar et al. (ICLR 2017, "On Large-Batch Training for Deep Learning") found that batches of 10% of the
training set already generalise worse than small ones; a batch of the whole set (what "the largest that fits" gave
for the 1438-image sample set) makes an epoch one update and 30 epochs 30 updates."""
AUTO_CEILING = 256
"""No "auto" batch above this: the largest batch of Caffe's reference models (CaffeNet's and AlexNet's 256; DIGITS'
standard networks train with 64 (LeNet), 128 (AlexNet) and 32 (GoogLeNet)), for which their learning rates were
chosen. Larger batches need the learning rate scaled with them and a warm-up (Goyal et al. 2017, "Accurate, Large
Minibatch SGD"), which a solver's fixed base_lr does not do."""


@dataclasses.dataclass(frozen=True)
class AutoCap:
    """The largest batch "auto" may choose and why: the ceiling, or the training set's size."""

    batch: int
    train_items: int | None
    """Items in the training set (None: unknown, the ceiling alone caps)."""
    reason: str
    """"ceiling" (AUTO_CEILING) or "epoch" (an epoch keeps AUTO_MIN_EPOCH_ITERATIONS iterations)."""

    @property
    def epoch_iterations(self) -> int | None:
        """Iterations of one epoch at the capped batch (None when the training set's size is unknown)."""
        return math.ceil(self.train_items / self.batch) if self.train_items else None

    def note(self) -> str:
        """Why "auto" stops there, as the New model page, the plan document and the command line say it."""
        if self.reason == "epoch" and self.train_items:
            return (f"capped at {self.batch} so that an epoch of the {self.train_items} training items has "
                    f"{self.epoch_iterations} iterations (at most 1/{AUTO_MIN_EPOCH_ITERATIONS} of the training set)")
        if self.train_items:
            return (f"capped at {self.batch}, the largest batch of Caffe's reference models (an epoch of the "
                    f"{self.train_items} training items has {self.epoch_iterations} iterations)")
        return f"capped at {self.batch}, the largest batch of Caffe's reference models"

    def to_dict(self) -> dict[str, object]:
        return {
            "batch_size": self.batch, "train_items": self.train_items, "reason": self.reason,
            "epoch_iterations": self.epoch_iterations, "note": self.note(),
        }


def auto_cap(dataset_items: int | None) -> AutoCap:
    """The cap of an "auto" batch: at most 1/AUTO_MIN_EPOCH_ITERATIONS of the training set (an epoch keeps that
    many iterations; batch 1 for a set smaller than that), and never above AUTO_CEILING. The form's Auto, the
    estimate API's `train_items` and jobs with batch "auto" all take their cap from here."""
    if dataset_items and dataset_items > 0:
        by_epoch = max(1, dataset_items // AUTO_MIN_EPOCH_ITERATIONS)
        if by_epoch < AUTO_CEILING:
            return AutoCap(by_epoch, dataset_items, "epoch")
        return AutoCap(AUTO_CEILING, dataset_items, "ceiling")
    return AutoCap(AUTO_CEILING, None, "ceiling")


def auto_batch_limit(dataset_items: int | None, limit: int = MAX_BATCH) -> int:
    """The largest batch "auto" may choose (`auto_cap`), within `limit`."""
    return min(limit, auto_cap(dataset_items).batch)


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """How to train: batch_size items per forward/backward, iter_size passes per update."""

    batch_size: int
    iter_size: int
    fits: bool
    bytes: int | None
    """Estimated footprint at batch_size (None when even batch 1 cannot be built)."""
    effective_batch: int

    def to_dict(self) -> dict[str, object]:
        return {
            "batch_size": self.batch_size,
            "iter_size": self.iter_size,
            "fits": self.fits,
            "bytes": self.bytes,
            "effective_batch": self.effective_batch,
        }


class MemoryCurve:
    """Memory as a function of the batch, memoised; a batch that cannot be built (a blob over Caffe's INT_MAX
    elements, a recurrent layer unrolled past the estimator's bound) costs infinity.

    `known` seeds it with footprints already computed (the report the caller asked for), which the search uses
    as one of its two points instead of building another batch.
    """

    def __init__(self, bytes_at: Callable[[int], int], known: Mapping[int, int] | None = None) -> None:
        self._bytes_at = bytes_at
        self._cache: dict[int, float] = {batch: float(total) for batch, total in (known or {}).items()}
        self.evaluations = 0
        self.errors: dict[int, BatchLimitError] = {}
        """Why each batch that could not be built could not (its BatchLimitError)."""

    def __call__(self, batch: int) -> float:
        if batch not in self._cache:
            self.evaluations += 1
            try:
                self._cache[batch] = float(self._bytes_at(batch))
            except BatchLimitError as error:
                self._cache[batch] = math.inf
                self.errors[batch] = error
        return self._cache[batch]

    def known(self) -> list[int]:
        """The batches evaluated (or seeded) so far."""
        return list(self._cache)


def usable_bytes(free_bytes: int, safety_margin: float) -> int:
    """Free memory minus the safety margin (a fraction of it), kept for fragmentation and what the model omits."""
    if not 0.0 <= safety_margin < 1.0:
        raise ValueError(f"safety margin must be in [0, 1), got {safety_margin}")
    return int(free_bytes * (1.0 - safety_margin))


def max_batch(curve: MemoryCurve, budget: int, limit: int = MAX_BATCH) -> int:
    """The largest batch b <= limit with curve(b) <= budget; 0 when batch 1 does not fit.

    The affine model through batch 1 and a second point (the largest batch already known within `limit`, else 2)
    gives a guess, kept only when exact evaluations at it and one above agree; otherwise a bisection decides.
    """
    m1 = curve(1)
    if m1 > budget:
        return 0
    if limit < 2:
        return 1
    seen = [b for b in curve.known() if 1 < b <= limit and math.isfinite(curve(b))]
    b2 = max(seen, default=2)
    m2 = curve(b2)
    if m2 > m1 and math.isfinite(m2):
        # 1 + floor((budget - m1) / slope), with slope = (m2 - m1) / (b2 - 1), in integers: no rounding.
        guess = 1 + (int(budget) - int(m1)) * (b2 - 1) // (int(m2) - int(m1))
        guess = max(1, min(guess, limit))
        if curve(guess) <= budget and (guess == limit or curve(guess + 1) > budget):
            return guess
    return _bisect(curve, budget, limit)


def _bisect(curve: MemoryCurve, budget: int, limit: int) -> int:
    """Exponential then binary search on exact evaluations: curve(lo) fits, curve(hi) does not."""
    lo, hi = 1, 2
    while hi <= limit and curve(hi) <= budget:
        lo, hi = hi, hi * 2
    if hi > limit:
        if curve(limit) <= budget:
            return limit
        hi = limit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if curve(mid) <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def max_buildable(curve: MemoryCurve, limit: int, hint: int | None = None) -> int:
    """The largest batch b <= limit that can be built at all (no blob over INT_MAX elements...); 0 when not even
    batch 1 can be. Blob sizes are linear in the batch, so `hint` (INT_MAX over the elements per item of the blob
    that overflowed) is usually the answer; it is checked on both sides, else a bisection decides."""
    if not math.isfinite(curve(1)):
        return 0
    if limit < 2 or math.isfinite(curve(limit)):
        return max(1, limit)
    if hint is not None and 1 <= hint < limit and math.isfinite(curve(hint)) and not math.isfinite(curve(hint + 1)):
        return hint
    lo, hi = 1, limit  # curve(lo) is finite, curve(hi) is not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if math.isfinite(curve(mid)):
            lo = mid
        else:
            hi = mid
    return lo


def passes(wanted: int, largest: int) -> tuple[int, int]:
    """(batch_size, iter_size) for `wanted` items per update in passes of at most `largest`: the fewest passes, and
    the smallest batch that with them covers `wanted` (for 256 with at most 100: 86 x 3)."""
    iter_size = math.ceil(wanted / largest)
    return math.ceil(wanted / iter_size), iter_size


def plan_batch(curve: MemoryCurve, wanted: int, budget: int, limit: int = MAX_BATCH) -> BatchPlan:
    """The plan for `wanted` items per update within `budget` bytes, no pass larger than `limit` items.

    When `wanted` fits it is used as is. Otherwise iter_size grows to the fewest passes whose batch fits, and the
    batch is the smallest that still covers `wanted` (batch_size * iter_size >= wanted); Caffe divides the
    accumulated gradient by iter_size, so the learning rate and schedule stay valid unchanged.
    """
    if wanted <= 0:
        raise ValueError(f"the wanted batch must be positive, got {wanted}")
    if wanted <= limit and curve(wanted) <= budget:
        return BatchPlan(wanted, 1, True, int(curve(wanted)), wanted)
    largest = max_batch(curve, budget, limit=min(wanted, limit))
    if largest == 0:
        cost = curve(1)
        return BatchPlan(1, wanted, False, int(cost) if math.isfinite(cost) else None, wanted)
    batch, iter_size = passes(wanted, largest)
    return BatchPlan(batch, iter_size, True, int(curve(batch)), batch * iter_size)
