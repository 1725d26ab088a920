"""Planning with the test nets apart (issue 28): the trainer's device holds the train net and the solver's state
alone, and the test nets run in a tester process at their own test batch (core.test_nets).

`fit_apart` plans the largest train batch (or the (batch_size, iter_size) plan of the wanted batch) on the trainer's
footprint alone, and refuses when the tester does not fit on its device: the trainer's own (the trainer stops at
each test interval, so the two never hold it at once: the same budget) or another one. `choose_test_net` is
`auto`: `apart` only where it pays in memory (a larger train batch, or fewer iter_size passes, than `shared`), and
on the same device only while stopping and resuming costs under STOP_COST_LIMIT of an interval's training, or,
once the job has trained an interval each way, where apart was measured faster, its stop included
(`StopCost.keeps_apart`).
`plan_test_net` plans a job in any of the three modes; `shared` is `fit`'s plan unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from ..test_nets import TEST_NET_APART, TEST_NET_AUTO, TEST_NET_MODES, TEST_NET_SHARED
from .fit import Decision, _size, check_wanted, fit
from .planner import BatchPlan, usable_bytes

STOP_COST_LIMIT = 0.05
"""On the trainer's device, `auto` keeps the test nets apart only while stopping and resuming (the tester's and the
trainer's set-up) costs less than this fraction of the training time of one test interval."""


@dataclasses.dataclass(frozen=True)
class ApartTester:
    """The tester's estimated peak and the device it runs on."""

    bytes: int
    """The test nets alone at their own test batch (core.test_nets.apart_tester_memory's total)."""
    limit_bytes: int | None = None
    """Memory for it on another device (a second GPU, the CPU); None: the trainer's device, whose limit it shares."""
    safety_margin: float | None = None
    """The margin kept back on that device; None: the trainer's."""
    device: str | None = None
    """That other device's key; None: the trainer's device."""

    @property
    def same_device(self) -> bool:
        return self.limit_bytes is None


@dataclasses.dataclass(frozen=True)
class TesterDevice:
    """A device other than the trainer's where a tester may run (a second GPU, the CPU), as the devices were read."""

    key: str
    engine: str
    """The engine the tester's footprint is counted with there."""
    limit_bytes: int
    """Memory for it there (free, less what our own attempts have been planned to take)."""
    safety_margin: float


@dataclasses.dataclass(frozen=True)
class StopCost:
    """What stopping the trainer for the tester costs on the same device, as measured on the job's own intervals,
    and, once the job has trained an interval each way, what its larger batch gains."""

    setup_seconds: float | None = None
    """Seconds of set-up per test interval (the trainer's resume and the tester's start); None: not measured yet."""
    interval_seconds: float | None = None
    """Seconds of training in one test interval with the test nets apart; None: not measured yet."""
    shared_interval_seconds: float | None = None
    """Seconds of training in one test interval with them shared (the smaller batch, more passes, no pause; test
    passes left out, as both placements run them); None: not measured."""

    @property
    def fraction(self) -> float | None:
        """Set-up over training time (None until both are measured)."""
        if self.setup_seconds is None or self.interval_seconds is None or self.interval_seconds <= 0:
            return None
        return self.setup_seconds / self.interval_seconds

    @property
    def apart_faster(self) -> bool | None:
        """Whether an interval apart, its stop included, took less than one shared, as measured; None until both
        placements have trained one."""
        if self.fraction is None or self.shared_interval_seconds is None:
            return None
        assert self.setup_seconds is not None and self.interval_seconds is not None
        return self.interval_seconds + self.setup_seconds < self.shared_interval_seconds

    def keeps_apart(self) -> bool | None:
        """`auto` on the trainer's device: apart while stopping costs under STOP_COST_LIMIT of an interval, or,
        past it, where an interval apart, its stop included, was measured faster than one shared (a larger batch can
        gain more than the stop costs: AlexNet at batch 1 reads its 116 MiB of fully connected weights for every
        image); None until the stop is measured."""
        fraction = self.fraction
        if fraction is None:
            return None
        return fraction < STOP_COST_LIMIT or bool(self.apart_faster)

    def words(self, what: str = "stopping and resuming") -> str:
        """What was measured, for a plan's note or an attempt's end."""
        fraction = self.fraction or 0.0
        said = (f"{what} costs {self.setup_seconds:.1f} s per test interval, {fraction:.1%} of its "
                f"{self.interval_seconds:.1f} s of training")
        if self.shared_interval_seconds is not None:
            said += f"; an interval with the test nets shared took {self.shared_interval_seconds:.1f} s"
        return said


@dataclasses.dataclass(frozen=True)
class Apart:
    """What a job's plan with its test nets apart needs besides the job's own footprint (core.planning.job_plan)."""

    trainer: Callable[[int], int]
    """The trainer's footprint at a train batch (core.test_nets.apart_trainer_memory's total)."""
    tester: ApartTester
    cost: StopCost = StopCost()
    """Stopping and resuming at each interval, as measured on the job's own first interval (same device only)."""


def fit_apart(
    trainer: Callable[[int], int],
    tester: ApartTester,
    wanted: int | None,
    limit_bytes: int,
    safety_margin: float,
    *,
    test_batch: int | None = None,
    max_batch: int | None = None,
    known: Mapping[int, int] | None = None,
) -> Decision:
    """The first plan with the test nets apart: `fit` on the trainer's footprint alone (`trainer(batch)`, no test
    net beside it, so no test batch to shrink), and the tester at its own test batch (`test_batch`, for the message)
    within its device's budget; else a stop that names what does not fit."""
    check_wanted(wanted)
    decision = fit(lambda batch, _test_batch: trainer(batch), wanted, limit_bytes, safety_margin,
                   max_batch=max_batch, known=known)
    return with_tester(decision, tester, limit_bytes, safety_margin, test_batch=test_batch)


def with_tester(
    decision: Decision, tester: ApartTester, limit_bytes: int, safety_margin: float, *, test_batch: int | None = None
) -> Decision:
    """The trainer's `decision` (planned on its footprint alone, first plan or fallback's) completed with the tester:
    its bytes, and a refusal naming what does not fit when the tester does not fit its device's budget (the trainer's
    `limit_bytes` on the same device, where the two never run at once; its own limit on another)."""
    same = tester.same_device
    margin = safety_margin if tester.safety_margin is None else tester.safety_margin
    tester_budget = usable_bytes(max(0, limit_bytes if same else tester.limit_bytes or 0), margin)
    where = "the trainer's device (the trainer stops while the tester runs)" if same else "the tester's device"
    at = f" at their own test batch {test_batch}" if test_batch else " at their own test batch"
    tester_says = f"the tester needs {_size(tester.bytes)}{at} of {_size(tester_budget)} usable on {where}"
    refusals = []
    if decision.plan is None:
        refusals.append(f"the train net alone {decision.message}")
    if tester.bytes > tester_budget:
        refusals.append(f"the test nets apart do not fit: {tester_says}")
    if refusals:
        return dataclasses.replace(
            decision, plan=None, message="; ".join(refusals), test_net=TEST_NET_APART, tester_bytes=tester.bytes,
            tester_device=tester.device,
        )
    return dataclasses.replace(
        decision, message=f"{decision.message} for the train net alone; {tester_says}",
        test_net=TEST_NET_APART, tester_bytes=tester.bytes, tester_device=tester.device,
    )


def pays(shared: BatchPlan | None, apart: BatchPlan | None) -> bool:
    """Whether `apart` trains with more items per pass or fewer iter_size passes than `shared` (or trains at all
    where `shared` cannot)."""
    if apart is None:
        return False
    if shared is None:
        return True
    return apart.iter_size < shared.iter_size or (
        apart.iter_size == shared.iter_size and apart.batch_size > shared.batch_size
    )


def _plan_words(plan: BatchPlan | None) -> str:
    return "nothing" if plan is None else f"{plan.batch_size} x iter_size {plan.iter_size}"


def choose_test_net(shared: Decision, apart: Decision, cost: StopCost, *, same_device: bool) -> Decision:
    """`auto`: the `apart` decision where it pays in memory (`pays`) and, on the trainer's device, while the
    measured set-up per test interval stays under STOP_COST_LIMIT of the interval's training (unmeasured: apart,
    to be measured on the first interval; another device stops nothing); else the `shared` one. The decision says
    which, and why, in `test_net_note` (and its message)."""
    compared = f"apart trains {_plan_words(apart.plan)}, shared {_plan_words(shared.plan)}"
    if shared.plan is None and apart.plan is None:
        return shared  # neither trains: shared's own message says why, as it did before there was a choice
    if not pays(shared.plan, apart.plan):
        why = apart.message if apart.plan is None else "no larger batch and no fewer passes"
        return _chosen(shared, TEST_NET_SHARED, f"test nets shared: apart does not pay ({compared}; {why})")
    if shared.plan is None:
        return _chosen(apart, TEST_NET_APART, f"test nets apart: shared does not fit at all ({compared})")
    if not same_device:
        return _chosen(apart, TEST_NET_APART, f"test nets apart on another device ({compared}; nothing stops)")
    keeps = cost.keeps_apart()
    if keeps is None:
        return _chosen(apart, TEST_NET_APART, (
            f"test nets apart ({compared}); the cost of stopping and resuming at each test interval is not measured "
            "yet: it will be on the first interval"
        ))
    spent = cost.words()
    if keeps and (cost.fraction or 0.0) < STOP_COST_LIMIT:
        note = f"test nets apart ({compared}; {spent}, under {STOP_COST_LIMIT:.0%})"
    elif keeps:
        note = (f"test nets apart: {spent}: apart is faster, its stop included, though it is not under "
                f"{STOP_COST_LIMIT:.0%} ({compared})")
    elif cost.apart_faster is False:
        note = f"test nets shared: {spent}: shared is faster ({compared})"
    else:
        note = f"test nets shared: {spent}, not under {STOP_COST_LIMIT:.0%} ({compared})"
    chosen = _chosen(apart if keeps else shared, TEST_NET_APART if keeps else TEST_NET_SHARED, note)
    return dataclasses.replace(chosen, by_stop_cost=True)


def _chosen(decision: Decision, test_net: str, note: str) -> Decision:
    return dataclasses.replace(decision, test_net=test_net, test_net_note=note, message=f"{decision.message}; {note}")


def plan_test_net(
    mode: str, shared: Callable[[], Decision], apart: Callable[[], Decision], cost: StopCost | None = None, *,
    same_device: bool = True,
) -> Decision:
    """The first plan of a job whose test nets are `mode` (TEST_NET_SHARED, _APART or _AUTO), from the plan of
    each placement, made only when needed: `shared` is `fit` on the job's footprint exactly as it always was,
    `apart` is `fit_apart`'s; `auto` makes both and `choose_test_net`s (`same_device`: the tester's device is the
    trainer's, where `cost` counts)."""
    if mode not in TEST_NET_MODES:
        raise ValueError(f"test_net must be one of {', '.join(TEST_NET_MODES)}, got {mode!r}")
    if mode == TEST_NET_SHARED:
        return shared()
    if mode == TEST_NET_APART:
        return apart()
    assert mode == TEST_NET_AUTO
    return choose_test_net(shared(), apart(), cost or StopCost(), same_device=same_device)
