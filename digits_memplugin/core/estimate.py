"""The estimate the CLI, the REST API and the web form return: one call from prototxt texts to a JSON document.

    {"total_bytes", "batch_size", "engine", "categories", "layers", "max_batch_size", "plan", ...}

`total_bytes` is the footprint of one training job (train net + test nets + solver) at `batch_size`. The
definition comes from the process's cache (core.definitions), its footprints from an `Estimator`
(core.estimator), and its plans from the one planning function (core.planning.job_plan), under the server's policy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .collector import paused_collector
from .cost import EstimateCost, Meter, estimate_cost
from .definitions import DEFINITIONS, parsed_definition
from .errors import BatchLimitError, BlobLimitError, NetError, ShapeError
from .estimator import ApartFootprints, Estimator, net_batch
from .fields import is_whole
from .layers.base import ENGINE_CPU, ENGINES, INT_MAX, PHASE_TEST, PHASE_TRAIN
from .memory import DEFAULT_CUDA_CONTEXT_BYTES, MemoryOptions, MemoryReport
from .net import Net, ShapeOracle
from .planning.apart import Apart, ApartTester
from .planning.job_plan import JobAsk, PlanningPolicy, plan_job
from .planning.planner import MAX_BATCH, BatchPlan, auto_cap, max_buildable, passes
from .prototxt import DEFAULT_LIMITS, ParseLimits
from .test_net_modes import TEST_NET_AUTO, TEST_NET_MODES, TEST_NET_SHARED
from .training import Loader, TrainingDefinition

MAX_CURVE_POINTS = 32


@dataclasses.dataclass(frozen=True)
class EstimateRequest:
    net: str | None = None
    solver: str | None = None
    net_source: str = "net.prototxt"
    solver_source: str = "solver.prototxt"
    batch: int | None = None
    """Batch size of the TRAIN data layers (None: the net's own)."""
    test_batch: int | None = None
    """Batch size of the TEST data layers (None: the net's own)."""
    engine: str = ENGINE_CPU
    free_bytes: int | None = None
    """Free memory of the target device; with it come max_batch_size and a plan."""
    safety_margin: float | None = None
    """Fraction of free memory kept back (None: the policy's for the engine, as jobs plan; PlanningPolicy.margin)."""
    policy: PlanningPolicy = dataclasses.field(default_factory=PlanningPolicy)
    """The server's planning policy: engines and margins per device kind (core.planning.job_plan)."""
    data_shapes: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    classes: int | None = None
    """Number of classes for DIGITS standard networks (InnerProduct layers without num_output)."""
    cuda_context_bytes: int = DEFAULT_CUDA_CONTEXT_BYTES
    budgets: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Free memory of several devices by key: a plan for each, from one estimate (the form's memory panel)."""
    curve_batches: tuple[int, ...] = ()
    """Batch sizes to report the footprint at (the panel's chart of memory against batch size)."""
    max_batch: int | None = None
    """Largest batch the planner may choose; None: no limit but Caffe's own."""
    auto: bool = False
    """Plan as a job's batch "auto" is planned: the largest batch that fits within the cap of "auto"
    (planner.auto_cap: a twentieth of `train_items`, at most 256); the document's `auto_cap` says why."""
    train_items: int | None = None
    """Items in the training set, for `auto`'s cap (None: unknown, the ceiling alone caps)."""
    test_net: str = TEST_NET_AUTO
    """Where the test nets are planned (core.test_net_modes), as a job's `test_net`: "auto" keeps them apart where
    that pays (the tester on the same device, the stop's cost not measured yet), "shared" or "apart"."""

    def __post_init__(self) -> None:
        if self.test_net not in TEST_NET_MODES:
            raise NetError(f"test_net must be one of {', '.join(TEST_NET_MODES)}, got {self.test_net!r}", field="test_net")
        if self.engine not in ENGINES:
            raise NetError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}", field="engine")
        for name in ("batch", "test_batch", "classes"):
            value = getattr(self, name)
            if value is not None and (not is_whole(value) or value <= 0):
                raise NetError(f"{name} must be a positive integer, got {value!r}", field=name)
        for name in ("batch", "test_batch"):
            value = getattr(self, name)
            if value is not None and value > INT_MAX:
                # A batch Caffe could never be given (its batch sizes and shapes are 32-bit): no iter_size helps.
                raise NetError(f"{name} must be at most {INT_MAX} (Caffe's INT_MAX), got {value}", field=name)
        if self.free_bytes is not None and (not is_whole(self.free_bytes) or self.free_bytes < 0):
            raise NetError(f"free_bytes must be a non-negative integer, got {self.free_bytes!r}", field="free_bytes")
        if self.safety_margin is not None and (
            not isinstance(self.safety_margin, (int, float)) or not 0.0 <= self.safety_margin < 1.0
        ):
            raise NetError(f"safety_margin must be in [0, 1), got {self.safety_margin!r}", field="safety_margin")
        if not is_whole(self.cuda_context_bytes) or self.cuda_context_bytes < 0:
            raise NetError(
                f"cuda_context_bytes must be a non-negative integer, got {self.cuda_context_bytes!r}",
                field="cuda_context_bytes",
            )
        if not isinstance(self.data_shapes, Mapping):
            raise NetError(f"data_shapes must map data tops to shapes, got {self.data_shapes!r}", field="data_shapes")
        if not isinstance(self.budgets, Mapping):
            raise NetError(f"budgets must map device keys to bytes, got {self.budgets!r}", field="budgets")
        for name in ("max_batch", "train_items"):
            value = getattr(self, name)
            if value is not None and (not is_whole(value) or value <= 0):
                raise NetError(f"{name} must be a positive integer, got {value!r}", field=name)
        for key, free in self.budgets.items():
            if not is_whole(free) or free < 0:
                raise NetError(f"free memory of {key!r} must be a non-negative integer, got {free!r}", field="budgets")
        if len(self.curve_batches) > MAX_CURVE_POINTS or not all(
            is_whole(b) and 0 < b <= MAX_BATCH for b in self.curve_batches
        ):
            raise NetError(
                f"curve_batches must be at most {MAX_CURVE_POINTS} batch sizes from 1 to {MAX_BATCH}",
                field="curve_batches",
            )


def estimate(
    request: EstimateRequest,
    *,
    load: Loader | None = None,
    oracle: ShapeOracle | None = None,
    limits: ParseLimits = DEFAULT_LIMITS,
    meter: Meter | None = None,
) -> dict[str, Any]:
    """Estimate a training job's memory and, given free memory, plan its batch. Raises NetError on bad input, and
    `cost.TimeUp` when `meter` has a deadline that passes.

    Runs with the cyclic garbage collector paused (see `collector`): its full passes were a third of a cold
    estimate's time whenever one fell inside it."""
    with paused_collector():
        try:
            return _estimate(request, load, oracle, limits, meter)
        finally:
            if load is None:
                DEFINITIONS.settle()


def estimate_cost_of(request: EstimateRequest, *, limits: ParseLimits = DEFAULT_LIMITS) -> EstimateCost:
    """What `estimate(request)` will cost at most (core/cost.py), from its parsed definition (cached, as the
    estimate will find it). Raises NetError as the estimate would (not always the same one: with `read_datasets`
    the estimate reads the datasets first)."""
    with paused_collector():
        definition = DEFINITIONS.get(
            request.net, request.solver, request.net_source, request.solver_source, limits, request.classes
        )
        plans = (request.free_bytes is not None) + len(request.budgets)
        return estimate_cost(
            definition.train.prepare(PHASE_TRAIN).layers, [test.prepare(PHASE_TEST).layers for test in definition.tests],
            curve_points=len(set(request.curve_batches)), plans=plans,
        )


def _estimate(
    request: EstimateRequest, load: Loader | None, oracle: ShapeOracle | None, limits: ParseLimits,
    meter: Meter | None,
) -> dict[str, Any]:
    definition = _definition_of(request, load, limits)
    # The policy resolves how to count and what to keep back, as it does for jobs.
    options = request.policy.memory_options(definition, request.engine, request.cuda_context_bytes)
    margin = request.policy.margin(request.engine, request.safety_margin, options.flavour)
    estimator = Estimator(definition, options, request.data_shapes, oracle, meter)
    report, train, tests, blob_limit = _report(estimator, request)
    batch = net_batch(train)
    test_batch = net_batch(tests[0]) if tests else None
    document = _document(report, request, options, batch, test_batch, margin, blob_limit)
    if request.curve_batches:
        document["curve"] = _curve(estimator, request.curve_batches, request.test_batch)
        document["linear_model"] = _linear_model(estimator, request.test_batch)
    # The batch to reach: the one asked for, even when Caffe cannot build it in one pass (the plan splits it).
    cap = auto_cap(request.train_items) if request.auto else None
    document["auto_cap"] = None if cap is None else cap.to_dict()
    caps = [value for value in (request.max_batch, cap.batch if cap else None) if value]
    ask = JobAsk(
        batch=request.batch if blob_limit is not None else batch, net_batch=batch,
        test_batch=test_batch, test_iter=definition.test_iters[0] if definition.test_iters else 1,
        max_batch=min(caps) if caps else None, safety_margin=margin, test_net=request.test_net,
    )
    if batch is not None and request.free_bytes is not None:
        document.update(_device_plan(estimator, ask, request, request.free_bytes))
    if batch is not None and request.budgets:
        document["plans"] = {key: _device_plan(estimator, ask, request, free) for key, free in request.budgets.items()}
    return document


def _definition_of(request: EstimateRequest, load: Loader | None, limits: ParseLimits) -> TrainingDefinition:
    """The request's definition: from the process's cache, or read through `load` (never cached)."""
    if load is None:
        return DEFINITIONS.get(
            request.net, request.solver, request.net_source, request.solver_source, limits, request.classes
        )
    return parsed_definition(
        request.net, request.solver, request.net_source, request.solver_source, limits, request.classes, load
    )


def _report(
    estimator: Estimator, request: EstimateRequest
) -> tuple[MemoryReport, Net, list[Net], dict[str, Any] | None]:
    """The report at the batch asked for; when Caffe cannot build that batch in one pass, at the batch of the
    fewest passes that reach it (with the single-pass limit that says why)."""
    try:
        report, train, tests = estimator.report(request.batch, request.test_batch)
    except BatchLimitError as error:
        if request.batch is None:
            raise  # the net as written: there is no wanted batch to reach another way
        blob_limit = _single_pass_limit(estimator, request.batch, request.test_batch, error)
        report, train, tests = estimator.report(blob_limit["batch_size"], request.test_batch)
        return report, train, tests, blob_limit
    return report, train, tests, None


def _document(
    report: MemoryReport, request: EstimateRequest, options: MemoryOptions, batch: int | None,
    test_batch: int | None, margin: float, blob_limit: dict[str, Any] | None,
) -> dict[str, Any]:
    """The document's figures at the estimated batch, its plan fields empty until a device's memory fills them."""
    return {
        "total_bytes": report.total_bytes,
        "steady_bytes": report.steady_bytes,
        "construction_bytes": report.construction_bytes,
        "batch_size": batch,
        "test_batch_size": test_batch,
        "engine": request.engine,
        "flavour": options.flavour,
        "solver_type": options.solver_type,
        "categories": dict(report.categories),
        "layers": [
            {
                "name": layer.name,
                "type": layer.type,
                "phase": layer.phase,
                "net": layer.net_index,
                "bytes": layer.bytes,
                "categories": {k: v for k, v in layer.categories.items() if v},
            }
            for layer in report.layers
        ],
        "memory_required_for_data": report.memory_required_for_data,
        "assumptions": list(report.assumptions),
        "max_batch_size": None,
        "plan": None,
        "test_plan": None,
        "free_bytes": request.free_bytes,
        "usable_bytes": None,
        "safety_margin": margin,
        "blob_limit": blob_limit,
    }


def _single_pass_limit(
    estimator: Estimator, wanted: int, test_batch: int | None, error: BatchLimitError
) -> dict[str, Any]:
    """The wanted batch makes a blob over Caffe's INT_MAX elements: the fewest passes (iter_size) whose batch Caffe
    can build, as the planner reaches a batch that does not fit in memory. Raises `error` when not even batch 1
    can be built (the limit is not the batch's doing)."""
    hint = INT_MAX * wanted // error.elements if error.elements else None
    largest = max_buildable(estimator.curve(test_batch), wanted - 1, hint)
    if largest == 0:
        raise error
    batch, iter_size = passes(wanted, largest)
    return {
        "wanted_batch_size": wanted,
        "max_batch_size": largest,
        "batch_size": batch,
        "iter_size": iter_size,
        "effective_batch": batch * iter_size,
        "layer": error.layer,
        "elements": error.elements,
        "message": (
            (
                f"Caffe cannot build batch {wanted} in one pass: layer {error.layer!r} would create a blob of "
                f"{error.elements} elements, over its limit of {INT_MAX} (INT_MAX)"
                if isinstance(error, BlobLimitError)
                else f"batch {wanted} cannot be built in one pass: layer {error.layer!r}: {error.message}"
            )
            + f"; at most batch {largest} per pass, so batch {wanted} is reached as {batch} x iter_size {iter_size}"
        ),
    }


def _device_plan(estimator: Estimator, ask: JobAsk, request: EstimateRequest, free_bytes: int) -> dict[str, Any]:
    """The job's plan on a device with `free_bytes`: the plan a job gets (core.planning.job_plan.plan_job), so the batch
    suggested here is the batch the job trains."""

    def footprint(batch: int, test_batch: int | None) -> int:
        # The test batch the estimate was asked at is the estimator's request.test_batch (None: the nets' own), so
        # that the totals already computed are found again; a shrunk one is itself.
        return estimator.total(batch, request.test_batch if test_batch == ask.test_batch else test_batch)

    known = estimator.known_totals(request.test_batch)
    decision = plan_job(footprint, ask, engine=request.engine, limit_bytes=free_bytes, policy=request.policy,
                        known=known, apart=_apart(estimator, ask, request))
    plan = decision.plan
    if plan is None:  # not even batch 1 fits: what it would take
        wanted = ask.wanted() or 1
        plan = BatchPlan(1, wanted, False, decision.estimated_bytes, wanted)
    return {
        "free_bytes": free_bytes,
        "usable_bytes": decision.budget,
        "safety_margin": decision.safety_margin,
        "max_batch_size": decision.largest,
        "max_batch_limited_by": decision.limited_by,
        "plan": plan.to_dict(),
        "test_plan": decision.test_plan,
        "test_net": decision.test_net,
        "test_net_note": decision.test_net_note,
        "tester_bytes": decision.tester_bytes,
    }


def _apart(estimator: Estimator, ask: JobAsk, request: EstimateRequest) -> Apart | None:
    """The test nets apart, as a job plans them on one device: the trainer's footprint, and the tester on the same
    device (an estimate knows one device's memory); None where they stay shared (asked so, none, or a Caffe or
    backend that cannot keep them apart: the policy says why, and the plan then says it)."""
    if ask.test_net == TEST_NET_SHARED or ask.test_batch is None or request.policy.apart_refused:
        return None
    footprints = ApartFootprints(estimator, test_batch=request.test_batch)
    return Apart(footprints.trainer, ApartTester(footprints.tester()))


def _curve(estimator: Estimator, batches: tuple[int, ...], test_batch: int | None) -> list[dict[str, Any]]:
    """The footprint at each batch; a batch Caffe cannot build (a blob over INT_MAX elements) says why."""
    points: list[dict[str, Any]] = []
    for batch in sorted(set(batches)):
        try:
            points.append({"batch": batch, "total_bytes": estimator.total(batch, test_batch), "error": None})
        except ShapeError as error:
            points.append({"batch": batch, "total_bytes": None, "error": str(error)})
    return points


def _linear_model(estimator: Estimator, test_batch: int | None) -> dict[str, int] | None:
    """total(batch) ~ fixed_bytes + bytes_per_item * batch, from batches 1 and 2 (exact for almost every net;
    the planner checks its answers against full estimates)."""
    try:
        one = estimator.total(1, test_batch)
        two = estimator.total(2, test_batch)
    except ShapeError:
        return None
    return {"fixed_bytes": 2 * one - two, "bytes_per_item": two - one}
