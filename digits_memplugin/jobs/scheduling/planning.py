"""Where a job's nets are built and planned: in the server's thread when that is cheap, in an estimate worker when
it is not, by the same predicted cost the estimates are routed by (core.cost, estimate_pool.py).

A job's definition is built once when it is submitted (its nets as written: bad shapes are refused then) and
planned when the New model form previews it, when the scheduler places it and before each attempt. Each is pure
Python in the server's one thread. A recurrent net unrolls into tens of thousands of layers a build, and a plan
builds its train net up to 44 times (`core.cost.PLAN_BUILDS`): an 8 KB LSTM net submitted ten times froze the
server's other requests for tens of seconds, while the same net's estimate went to a worker (issue 23, items 4 and
the submissions gap). So, as for an estimate:

- the predicted cost (`core.cost.estimate_cost`: layers set up, a recurrent layer at its largest unroll, times the
  builds a plan makes) decides: within the pool's `inline_layers` and with no layer that needs pycaffe, the work is
  done here against the pool's inline deadline (`core.cost.Meter`), and goes to a worker when it passes it; above,
  it goes to a worker at once;
- a worker gets a copy of the definition (its nets and solver, without what estimators kept on it) and the
  footprints already known for it, and answers the facts or the decision with the footprints it computed, which
  are kept on the server's definition: the scheduler plans a waiting job again at every poll, and a plan whose
  batches are all known is answered here from them, building nothing;
- the pool's refusals (estimate_pool.PoolBusy, PoolTimeout, PoolCrashed) reach the caller: a submission's 503 with
  Retry-After, a queued job that waits for the next poll (jobs.scheduling.dispatcher), an attempt that waits for a worker.

Reads of a stored job that anyone allowed to read may repeat go the same way: the trained model's prototxts
(`packed`: a 4 MiB text parsed again, an unrolled deploy net built) and a large net's or solver's outline for its
clone page (`outline`, jobs/definition/outline.py).

Without a pool (the command line's `train`, tests of the manager alone) everything is done where it is asked.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...core.cost import EstimateCost, Meter, TimeUp, estimate_cost
from ...core.layers.base import PHASE_TEST, PHASE_TRAIN
from ...core.net import ShapeOracle
from ...core.planning.apart import StopCost, TesterDevice
from ...core.planning.fallback import Failure
from ...core.planning.fit import Decision
from ...core.planning.job_plan import PlanningPolicy
from ...core.training import NetDefinition
from ...estimate.pool import EstimatePool
from ..definition.definition import JobDefinition, NetFacts, net_facts
from ..definition.model_files import PackedNets, item_shapes, packed_from, packed_nets, train_mean_file
from ..definition.outline import Outline, outline
from ..store.records import Attempt
from .attempt_loop import plan_for

log = logging.getLogger(__name__)


class Planner:
    """Builds and plans job definitions, here or in `pool`'s workers (see the module); `oracle` shapes layers
    without a rule (pycaffe), here or, as the pool's `fallback`, in a worker."""

    def __init__(self, oracle: ShapeOracle | None = None, pool: EstimatePool | None = None) -> None:
        self.oracle = oracle
        self.pool = pool
        self.offloaded = 0
        """Builds and plans sent to a worker (for tests and benchmarks)."""
        self.stopped_inline = 0
        """Builds and plans stopped at the inline deadline and done again in a worker."""

    def facts(self, definition: JobDefinition) -> NetFacts:
        """`definition.net_facts`: the nets built once as written (a NetError when they cannot be)."""
        if self.pool is None:
            return net_facts(definition, self.oracle)
        if self._cheap(cost_of(definition, plans=0)):
            try:
                return net_facts(definition, self.oracle, Meter.within(self.pool.inline_seconds))
            except TimeUp:
                self.stopped_inline += 1
        self.offloaded += 1
        # Not kept: the definition is still being made (its test_iters are set after this).
        sent = shipped(definition, keep=False)
        return self.pool.run(f"{__name__}:job_facts", (*sent, self.oracle is not None))  # type: ignore[no-any-return]

    def plan(
        self, spec: Mapping[str, Any], definition: JobDefinition, *, engine: str, limit_bytes: int,
        policy: PlanningPolicy, failures: Sequence[Failure] = (), attempts_made: int = 0, placing: bool = False,
        effective_batch: int | None = None, iteration: int = 0, testers: Sequence[TesterDevice] = (),
        stop_cost: StopCost | None = None, tester_failed: bool = False,
    ) -> Decision:
        """`attempts.plan_for`, where its cost says."""
        ask: dict[str, Any] = {
            "engine": engine, "limit_bytes": limit_bytes, "policy": policy, "failures": tuple(failures),
            "attempts_made": attempts_made, "placing": placing, "effective_batch": effective_batch,
            "iteration": iteration, "testers": tuple(testers), "stop_cost": stop_cost, "tester_failed": tester_failed,
        }
        if self.pool is None:
            return plan_for(spec, definition, self.oracle, **ask)
        estimator = definition.estimator(engine, self.oracle)
        known = estimator.totals()
        # Footprints a worker computed before answer most plans again (the same batches, another limit).
        if known or self._cheap(cost_of(definition, plans=1)):
            try:
                return plan_for(spec, definition, self.oracle, meter=Meter.within(self.pool.inline_seconds), **ask)
            except TimeUp:
                self.stopped_inline += 1
        self.offloaded += 1
        decision, totals = self.pool.run(
            f"{__name__}:job_plan", (dict(spec), *shipped(definition), self.oracle is not None, estimator.totals(), ask)
        )
        estimator.learn(totals)
        return decision  # type: ignore[no-any-return]

    def packed(
        self, net_text: str, solver_text: str, spec: Mapping[str, Any], attempt: Attempt | None,
        max_iter: int | None, definition: JobDefinition | None,
    ) -> PackedNets:
        """`model_files.packed_nets` (the trained model's prototxts): here when the texts are small and the deploy
        net builds within the inline deadline, else in a worker. A download is a read anyone allowed to read may
        repeat: it must not hold the server's thread for a 4 MiB text's parse or an unrolled net's build."""
        if self.pool is None:
            return packed_nets(net_text, solver_text, spec, attempt, max_iter, definition)
        if len(net_text) + len(solver_text) <= self.pool.inline_bytes:
            try:
                return packed_nets(net_text, solver_text, spec, attempt, max_iter, definition,
                                   Meter.within(self.pool.inline_seconds))
            except TimeUp:
                self.stopped_inline += 1
        self.offloaded += 1
        return self.pool.run(  # type: ignore[no-any-return]
            f"{__name__}:job_pack", (net_text, solver_text, dict(spec), attempt, max_iter, train_mean_file(definition),
                         item_shapes(spec, definition)),
        )

    def outline(
        self, net_text: str | None, solver_text: str | None, names: list[str], max_iter: int | None
    ) -> Outline:
        """`jobs.definition.outline.outline` of a stored job's large texts, in a worker (here without a pool)."""
        if self.pool is None:
            return outline(net_text, solver_text, names, max_iter)
        self.offloaded += 1
        return self.pool.run(f"{__name__}:job_outline", (net_text, solver_text, names, max_iter))  # type: ignore[no-any-return]

    def _cheap(self, cost: EstimateCost) -> bool:
        assert self.pool is not None
        return cost.layers <= self.pool.inline_layers and not (cost.pycaffe and self.oracle is not None)


def cost_of(definition: JobDefinition, *, plans: int) -> EstimateCost:
    """What building the definition's nets once (`plans` 0), or planning it on one device (1), costs at most."""
    training = definition.training
    return estimate_cost(
        training.train.prepare(PHASE_TRAIN).layers, [test.prepare(PHASE_TEST).layers for test in training.tests],
        plans=plans,
    )


def portable(definition: JobDefinition) -> JobDefinition:
    """A copy of `definition` to send to a worker: its nets, solver and data shapes, not what estimators kept on it
    (built nets, hundreds of MB for an unrolled one) nor its prepared layers. One net serving as train and test
    net (each its own NetDefinition, with its own state) is pickled once."""
    training = definition.training
    copies: dict[int, NetDefinition] = {}

    def copy(net: NetDefinition) -> NetDefinition:
        if id(net) not in copies:
            copies[id(net)] = NetDefinition(net.param, net.source, net.lines, net.state)
        return copies[id(net)]

    slim = dataclasses.replace(training, train=copy(training.train), tests=[copy(test) for test in training.tests],
                               memo={})
    return dataclasses.replace(definition, training=slim)


SHIPPED = "planning.shipped"
"""Where a definition keeps its nets as sent to a worker (TrainingDefinition.memo): serialising them costs as much as
parsing their text (this protobuf is pure Python: 0.2 s for 1 MB of messages), and a waiting job is planned again
at every poll."""


def shipped(definition: JobDefinition, *, keep: bool = True) -> tuple[bytes, JobDefinition]:
    """What a worker is sent of `definition`: its nets and solver pickled (`portable`; kept on the definition with
    `keep`, so that each plan of a job serialises them once), and the rest of it, without them."""
    memo = definition.training.memo
    sent: bytes | None = memo.get(SHIPPED)
    if sent is None:
        sent = pickle.dumps(portable(definition).training, protocol=pickle.HIGHEST_PROTOCOL)
        if keep:
            memo[SHIPPED] = sent
    return sent, dataclasses.replace(definition, training=None)  # type: ignore[arg-type]


def received(sent: bytes, rest: JobDefinition) -> JobDefinition:
    """`shipped`'s definition, in the worker: its own parent sent it."""
    return dataclasses.replace(rest, training=pickle.loads(sent))


# --- in an estimate worker ----------------------------------------------------------------------------------------


def _worker_oracle(fallback: bool) -> ShapeOracle | None:
    if not fallback:
        return None
    from ...estimate.pool import _oracle

    return _oracle()  # type: ignore[no-any-return]


def facts_in_worker(sent: bytes, rest: JobDefinition, fallback: bool) -> NetFacts:
    return net_facts(received(sent, rest), _worker_oracle(fallback))


def plan_in_worker(
    spec: dict[str, Any], sent: bytes, rest: JobDefinition, fallback: bool,
    known: Mapping[tuple[int | None, int | None], int], ask: dict[str, Any],
) -> tuple[Decision, dict[tuple[int | None, int | None], int]]:
    """The decision, and every footprint known once it is made (the server keeps them on its definition)."""
    definition = received(sent, rest)
    oracle = _worker_oracle(fallback)
    estimator = definition.estimator(ask["engine"], oracle)
    estimator.learn(known)
    decision = plan_for(spec, definition, oracle, **ask)
    return decision, estimator.totals()


WORKER_TASKS: dict[str, Callable[..., Any]] = {
    "job_facts": facts_in_worker, "job_plan": plan_in_worker, "job_pack": packed_from, "job_outline": outline,
}
"""What the estimate pool's workers run for jobs, asked for as "<this module>:<name>" (estimate.pool.task_function)."""
