"""Planning a job on one device: the one function the REST estimate, the New model form, the command line and the
job manager all plan with, so that the batch a page suggests is the batch the job trains.

It reads top-down. The server's policy (`PlanningPolicy`, its settings) resolves, in this one place, what a plan
depends on besides the net: the engine that trains on a kind of device, the margin of free memory kept back (the
job's own, else the policy's for the engine, never below NVcaffe's wider one for a net estimated as NVcaffe's) and
the options the memory model counts with. A job asks for a batch (a number, "auto", or the net's own). Its first
plan is core.planning.fit's on the estimate as it stands: the wanted batch, kept through iter_size when it does not
fit (or cannot be built in one pass); for "auto" the largest batch that fits within the cap of "auto"
(planner.auto_cap: a twentieth of the training set, at most 256); the test batch shrunk only when not even train
batch 1 fits beside it. A job that asked to start with its wanted batch as given ("start": "wanted") gets it for
its first attempt. Only after out-of-memory failures does the plan go through the fallback
(core.planning.fallback.decide), on the estimate the failures corrected.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from ..device_kinds import AUTO, CPU
from ..errors import BatchLimitError, NetError
from ..flavour import BVLC, FLAVOURS, NVCAFFE, NVCAFFE_SAFETY_MARGIN, solver_storage
from ..layers.base import ENGINE_CPU, ENGINE_CUDNN, ENGINES
from ..memory import DEFAULT_CUDA_CONTEXT_BYTES, SOLVER_STATE_BLOBS, MemoryOptions
from ..test_nets import TEST_NET_APART, TEST_NET_SHARED
from ..training import TrainingDefinition
from .apart import Apart, plan_test_net, with_tester
from .fallback import DEFAULT_GROWTH, DEFAULT_MAX_ATTEMPTS, Failure, Policy, decide
from .fit import DEFAULT_SAFETY_MARGIN, Decision, Footprint, fit
from .planner import BatchPlan, auto_cap, usable_bytes

START_PLAN = "plan"
START_WANTED = "wanted"
CPU_SAFETY_MARGIN = 0.03
"""On the CPU the estimate is held to what Caffe really allocates (bench/accuracy.py) and under a cap it was
within 3% of the largest batch that trains on every net of bench/fallback.py: a thinner margin suffices."""
GPU_SAFETY_MARGIN = DEFAULT_SAFETY_MARGIN
"""On GPUs the CUDA context and cuDNN's workspaces are per-machine constants the estimate only models."""


@dataclasses.dataclass(frozen=True)
class PlanningPolicy:
    """How jobs are planned on each kind of device: the engine that trains there and the memory kept back. One
    server has one policy (its settings), read by every path that plans."""

    gpu_engine: str = ENGINE_CUDNN
    cpu_safety_margin: float = CPU_SAFETY_MARGIN
    gpu_safety_margin: float = GPU_SAFETY_MARGIN
    growth: float = DEFAULT_GROWTH
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    flavour: str = BVLC
    """The flavour of the Caffe that trains: a net both schemas read is estimated as that Caffe trains it (a net
    only NVcaffe's schema reads is NVcaffe's whatever trains)."""
    apart_refused: str | None = None
    """Why this server's jobs cannot keep their test nets apart (the Caffe that trains, the backend that runs
    them), in words; None: they can (core.test_nets)."""

    def __post_init__(self) -> None:
        if self.gpu_engine not in ENGINES or self.gpu_engine == ENGINE_CPU:
            raise ValueError(f"gpu_engine must be a GPU engine, got {self.gpu_engine!r}")
        if self.flavour not in FLAVOURS:
            raise ValueError(f"flavour must be one of {', '.join(FLAVOURS)}, got {self.flavour!r}")
        for name in ("cpu_safety_margin", "gpu_safety_margin"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)!r}")

    def engine(self, device_kind: str) -> str:
        """The engine that trains on a device of this kind."""
        return ENGINE_CPU if device_kind == CPU else self.gpu_engine

    def safety_margin(self, engine: str) -> float:
        """The fraction of free memory kept back on a device trained with this engine."""
        return self.cpu_safety_margin if engine == ENGINE_CPU else self.gpu_safety_margin

    def flavour_for(self, needed: str) -> str:
        """The flavour a definition is estimated as: NVcaffe's when it needs NVcaffe's schema or NVcaffe trains it;
        else the one it needs (SSD Caffe's layers on BVLC's memory semantics are "ssd", the rest "bvlc")."""
        return NVCAFFE if NVCAFFE in (needed, self.flavour) else needed

    def margin(self, engine: str, asked: float | None = None, flavour: str = BVLC) -> float:
        """The fraction of free memory a plan keeps back: the one asked for, else the policy's for the engine; for
        a net estimated as NVcaffe's at least flavour.NVCAFFE_SAFETY_MARGIN (its figures are a model no GPU has
        checked yet)."""
        margin = asked if asked is not None else self.safety_margin(engine)
        return max(margin, NVCAFFE_SAFETY_MARGIN) if flavour == NVCAFFE else margin

    def memory_options(
        self, definition: TrainingDefinition, engine: str, cuda_context_bytes: int = DEFAULT_CUDA_CONTEXT_BYTES
    ) -> MemoryOptions:
        """How the memory model counts `definition` trained with `engine`: its solver, its L1 regularization, the
        flavour it is estimated as (`flavour_for`) and its solver's storage type. NetError on an unknown solver."""
        if definition.solver_type not in SOLVER_STATE_BLOBS:
            raise NetError(
                f"unknown solver type {definition.solver_type!r} (known: {', '.join(SOLVER_STATE_BLOBS)})",
                source=definition.train.source, field="type",
            )
        return MemoryOptions(
            engine=engine,
            solver_type=definition.solver_type,
            l1_regularization=definition.l1_regularization,
            cuda_context_bytes=cuda_context_bytes,
            flavour=self.flavour_for(definition.flavour),
            history_itemsize=solver_storage(definition.solver),
        )

    def fallback(self, engine: str, ask: JobAsk) -> Policy:
        """The fallback's policy for a job's attempts after a failure: its margin (`margin`), growth and attempts."""
        return Policy(
            safety_margin=self.margin(engine, ask.safety_margin),
            growth=ask.growth if ask.growth is not None else self.growth,
            max_attempts=ask.max_attempts if ask.max_attempts is not None else self.max_attempts,
        )


@dataclasses.dataclass(frozen=True)
class JobAsk:
    """What a job asks of its plan, as plain values (the request and the net's own figures)."""

    batch: int | str | None = None
    """The wanted batch: a number, AUTO, or None for the net's own."""
    net_batch: int | None = None
    test_batch: int | None = None
    """The test nets' own batch (None: no test net)."""
    test_iter: int = 1
    train_items: int | None = None
    """Items in the training set, when known: "auto" plans no pass over a twentieth of it (planner.auto_cap)."""
    max_batch: int | None = None
    """A cap on one pass asked for explicitly (the estimate API's max_batch)."""
    safety_margin: float | None = None
    """The job's own margin (None: the policy's for the engine)."""
    growth: float | None = None
    max_attempts: int | None = None
    start: str = START_PLAN
    effective_batch: int | None = None
    """The effective batch a started job keeps (with `iteration` > 0)."""
    iteration: int = 0
    test_net: str = TEST_NET_SHARED
    """Where the test nets are to be (core.test_nets): TEST_NET_SHARED, _APART or _AUTO; planned apart only where
    `plan_job` is given what that needs (`apart`) and the job has test nets."""

    def wanted(self) -> int | None:
        """The effective batch to reach: fixed once training has started; else as asked (None: auto)."""
        if self.effective_batch is not None and self.iteration > 0:
            return self.effective_batch
        if self.batch == AUTO:
            return None
        return int(self.batch) if self.batch is not None else self.net_batch


def plan_job(
    footprint: Footprint,
    ask: JobAsk,
    *,
    engine: str,
    limit_bytes: int,
    policy: PlanningPolicy | None = None,
    failures: Sequence[Failure] = (),
    attempts_made: int = 0,
    placing: bool = False,
    known: Mapping[int, int] | None = None,
    apart: Apart | None = None,
) -> Decision:
    """The plan of a job on a device trained with `engine` that has `limit_bytes` for it.

    `footprint(batch, test_batch)`: the job's estimate in bytes; `failures` and `attempts_made`: the job's
    out-of-memory attempts so far on this device; `placing`: the plan that decides where the job fits, which the
    "wanted" start does not change; `known`: footprints already computed at the net's test batch (the search
    starts from them). `apart`: the trainer's footprint and the tester's, for a job whose test nets may be apart
    (`ask.test_net`): each placement is planned the same way on its own footprint, with the failures of its own
    placement, and core.planning.apart decides between them (`plan_test_net`)."""
    refused = (policy.apart_refused if policy is not None and ask.test_net != TEST_NET_SHARED
               and ask.test_batch is not None else None)
    mode = ask.test_net if apart is not None and ask.test_batch is not None and not refused else TEST_NET_SHARED
    if mode == TEST_NET_SHARED or apart is None:
        mine = [failure for failure in failures if failure.test_net == TEST_NET_SHARED]
        decision = _plan(footprint, ask, engine, limit_bytes, policy, mine, attempts_made, placing, known)
        if not refused:
            return decision
        note = f"test nets shared: {refused}"  # asked apart or auto where they cannot be: the plan says why
        return dataclasses.replace(decision, test_net_note=note, message=f"{decision.message}; {note}")
    tester = apart.tester

    def trainer(batch: int, _test_batch: int | None) -> int:
        return apart.trainer(batch)

    def shared() -> Decision:
        mine = [translated(failure, footprint, trainer) for failure in failures]
        return _plan(footprint, ask, engine, limit_bytes, policy, mine, attempts_made, placing, known)

    def trainer_alone() -> Decision:
        mine = [translated(failure, footprint, trainer, to=TEST_NET_APART) for failure in failures]
        alone = dataclasses.replace(ask, test_batch=None, test_iter=1)  # no test net beside it to shrink
        decision = _plan(trainer, alone, engine, limit_bytes, policy, mine, attempts_made, placing, None)
        margin = (policy or PlanningPolicy()).fallback(engine, ask).safety_margin
        return with_tester(decision, tester, limit_bytes, margin, test_batch=ask.test_batch)

    return plan_test_net(mode, shared, trainer_alone, apart.cost, same_device=tester.same_device)


def translated(failure: Failure, shared: Footprint, trainer: Footprint, *, to: str = TEST_NET_SHARED) -> Failure:
    """A failure of either placement as the planning of placement `to` reads it: what it proved of its own footprint
    at its batch, scaled to the other's (an estimate that was 20% low for the job with its test nets shared is taken
    as 20% low for its trainer alone, and the other way round), and its batch among those that failed."""
    if failure.test_net == to:
        return failure
    batch, test_batch = failure.batch_size, failure.test_batch_size
    own, other = (trainer, shared) if to == TEST_NET_SHARED else (shared, trainer)
    before, after = own(batch, test_batch), other(batch, None if to == TEST_NET_APART else test_batch)
    scale = after / before if before > 0 else 1.0
    return Failure(batch, None if to == TEST_NET_APART else test_batch, math.ceil(failure.floor() * scale),
                   test_net=to)


def _plan(
    footprint: Footprint, ask: JobAsk, engine: str, limit_bytes: int, policy: PlanningPolicy | None,
    failures: Sequence[Failure], attempts_made: int, placing: bool, known: Mapping[int, int] | None,
) -> Decision:
    """One placement's plan (see `plan_job`): the first plan, or the fallback's after failures."""
    policy = policy or PlanningPolicy()
    fallback = policy.fallback(engine, ask)
    margin = fallback.safety_margin
    wanted = ask.wanted()
    auto = auto_cap(ask.train_items) if wanted is None else None
    caps = [cap for cap in (ask.max_batch, auto.batch if auto else None) if cap]
    limit = min(caps) if caps else None
    if failures or attempts_made:  # after a failure: the fallback decides, on the corrected estimate
        decision = decide(
            fallback, footprint, wanted, limit_bytes, failures, attempts_made=attempts_made,
            test_batch=ask.test_batch, test_iter=ask.test_iter, max_batch=limit, known=known,
        )
    else:
        decision = fit(
            footprint, wanted, limit_bytes, margin, test_batch=ask.test_batch, test_iter=ask.test_iter,
            max_batch=limit, known=known,
        )
    if auto is not None and decision.plan is not None and decision.plan.batch_size >= auto.batch and (
        ask.max_batch is None or auto.batch <= ask.max_batch
    ):  # memory had room for more: the cap of "auto" chose the batch, and the plan says why
        decision = dataclasses.replace(
            decision, auto_cap=auto.note(), message=f"{decision.message}; auto {auto.note()}"
        )
    if placing or decision.plan is None or attempts_made or failures or ask.start != START_WANTED or not wanted:
        return decision
    try:
        cost = footprint(wanted, None)
    except BatchLimitError:
        return decision  # Caffe cannot build it in one pass at all: the planned iter_size is the start
    plan = BatchPlan(wanted, 1, cost <= usable_bytes(limit_bytes, margin), cost, wanted)
    return dataclasses.replace(
        decision, plan=plan, message=f"the wanted batch {wanted} as given first (fallback start \"wanted\")"
    )
