"""The estimate the CLI, the REST API and the web form return: one call from prototxt texts to a JSON document.

    {"total_bytes", "batch_size", "engine", "categories", "layers", "max_batch_size", "plan", ...}

`total_bytes` is the footprint of one training job (train net + test nets + solver) at `batch_size`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

from .collector import paused_collector
from .errors import NetError, ShapeError
from .flavour import NVCAFFE, NVCAFFE_SAFETY_MARGIN, solver_storage
from .layers.base import ENGINE_CPU, ENGINES
from .memory import DEFAULT_CUDA_CONTEXT_BYTES, SOLVER_STATE_BLOBS, MemoryOptions, MemoryReport
from .net import Net, ShapeOracle
from .planner import MAX_BATCH, BatchPlan, MemoryCurve, max_batch, plan_batch, usable_bytes
from .prototxt import DEFAULT_LIMITS, ParseLimits
from .training import Loader, TrainingDefinition, fill_num_classes, training_definition

MAX_CURVE_POINTS = 32
MAX_REMEMBERED_TOTALS = 512
MAX_REMEMBERED_REPORTS = 2
"""Whole reports (with their built nets) kept per definition and way of counting: the form asks again and again
about the same net at the same batch (each device's row, each keystroke that changes nothing), and a report is
what an estimate costs most; two keep memory bounded for large nets."""
DEFAULT_SAFETY_MARGIN = 0.10
"""Fraction of free memory kept back by default when planning: fragmentation, allocator slack, drivers."""


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
    safety_margin: float = DEFAULT_SAFETY_MARGIN
    data_shapes: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    classes: int | None = None
    """Number of classes for DIGITS standard networks (InnerProduct layers without num_output)."""
    cuda_context_bytes: int = DEFAULT_CUDA_CONTEXT_BYTES
    budgets: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Free memory of several devices by key: a plan for each, from one estimate (the form's memory panel)."""
    curve_batches: tuple[int, ...] = ()
    """Batch sizes to report the footprint at (the panel's chart of memory against batch size)."""
    max_batch: int | None = None
    """Largest batch the planner may choose (the dataset's size, say); None: no limit but Caffe's own."""

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise NetError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}", field="engine")
        for name in ("batch", "test_batch", "classes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise NetError(f"{name} must be a positive integer, got {value!r}", field=name)
        if self.free_bytes is not None and (
            not isinstance(self.free_bytes, int) or isinstance(self.free_bytes, bool) or self.free_bytes < 0
        ):
            raise NetError(f"free_bytes must be a non-negative integer, got {self.free_bytes!r}", field="free_bytes")
        if not isinstance(self.safety_margin, (int, float)) or not 0.0 <= self.safety_margin < 1.0:
            raise NetError(f"safety_margin must be in [0, 1), got {self.safety_margin!r}", field="safety_margin")
        if not isinstance(self.cuda_context_bytes, int) or isinstance(self.cuda_context_bytes, bool) or (
            self.cuda_context_bytes < 0
        ):
            raise NetError(
                f"cuda_context_bytes must be a non-negative integer, got {self.cuda_context_bytes!r}",
                field="cuda_context_bytes",
            )
        if not isinstance(self.data_shapes, Mapping):
            raise NetError(f"data_shapes must map data tops to shapes, got {self.data_shapes!r}", field="data_shapes")
        if not isinstance(self.budgets, Mapping):
            raise NetError(f"budgets must map device keys to bytes, got {self.budgets!r}", field="budgets")
        if self.max_batch is not None and (
            not isinstance(self.max_batch, int) or isinstance(self.max_batch, bool) or self.max_batch <= 0
        ):
            raise NetError(f"max_batch must be a positive integer, got {self.max_batch!r}", field="max_batch")
        for key, free in self.budgets.items():
            if not isinstance(free, int) or isinstance(free, bool) or free < 0:
                raise NetError(f"free memory of {key!r} must be a non-negative integer, got {free!r}", field="budgets")
        if len(self.curve_batches) > MAX_CURVE_POINTS or not all(
            isinstance(b, int) and not isinstance(b, bool) and 0 < b <= MAX_BATCH for b in self.curve_batches
        ):
            raise NetError(
                f"curve_batches must be at most {MAX_CURVE_POINTS} batch sizes from 1 to {MAX_BATCH}",
                field="curve_batches",
            )


class Estimator:
    """One training definition, estimated at any batch; memoised so a planner's search costs one build per batch."""

    def __init__(
        self,
        definition: TrainingDefinition,
        options: MemoryOptions,
        data_shapes: Mapping[str, Any],
        oracle: ShapeOracle | None = None,
    ) -> None:
        self.definition = definition
        self.options = options
        self.data_shapes = dict(data_shapes)
        self.oracle = oracle
        self._reports: dict[tuple[int | None, int | None], tuple[MemoryReport, Net, list[Net]]] = {}
        self._tests: dict[int | None, list[Net]] = {}
        # Totals outlive this estimator: they are kept on the definition, per way of counting, so that estimating
        # the same net again (another wanted batch, another device) reuses the planner's evaluations.
        key = (options, repr(sorted(self.data_shapes.items())), id(oracle))
        totals = definition.memo.setdefault(key, {})
        if len(totals) > MAX_REMEMBERED_TOTALS:
            totals.clear()
        self._totals: dict[tuple[int | None, int | None], int] = totals
        self._kept: dict[tuple[int | None, int | None], tuple[MemoryReport, Net, list[Net]]] = (
            definition.memo.setdefault(("reports", key), {})
        )

    def report(self, batch: int | None, test_batch: int | None = None) -> tuple[MemoryReport, Net, list[Net]]:
        """The report at `batch` (built nets included), from this estimator's own, else from the last few kept on
        the definition. Reports and nets are never changed once built, so sharing them is safe."""
        key = (batch, test_batch)
        if key not in self._reports:
            kept = self._kept.get(key)
            if kept is None:
                kept = self._build(key)
                self._kept[key] = kept
                while len(self._kept) > MAX_REMEMBERED_REPORTS:
                    self._kept.pop(next(iter(self._kept)), None)  # the oldest
            self._reports[key] = kept
            self._totals[key] = kept[0].total_bytes
        return self._reports[key]

    def total(self, batch: int | None, test_batch: int | None = None) -> int:
        """The peak at `batch`, from memory when this net was estimated at that batch before. A search's
        evaluations are not kept on the definition: only their totals are, so they never push out the report a
        caller asked for."""
        key = (batch, test_batch)
        if key not in self._totals:
            self._reports[key] = self._build(key)
        return self._totals[key]

    def _build(self, key: tuple[int | None, int | None]) -> tuple[MemoryReport, Net, list[Net]]:
        # The test nets depend on the test batch only: a search over train batches builds them once.
        tests = self._tests.get(key[1])
        built = self.definition.memory(self.options, key[0], key[1], self.data_shapes, self.oracle, tests)
        self._tests[key[1]] = built[2]
        self._totals[key] = built[0].total_bytes
        return built

    def curve(self, test_batch: int | None = None) -> MemoryCurve:
        """Memory against the train batch, seeded with the totals already known at this test batch (the
        report's, earlier searches'), so that a search builds no batch twice."""
        known = {batch: total for (batch, tb), total in self._totals.items() if tb == test_batch and batch is not None}
        return MemoryCurve(lambda batch: self.total(batch, test_batch), known)


def net_batch(net: Net) -> int | None:
    """The batch of a net: the first dimension of its first data layer's first top."""
    for layer in net.layers:
        if layer.rule is not None and layer.rule.is_data and layer.tops:
            shape = net.blobs[layer.tops[0]].shape
            if shape:
                return shape[0]
    return None


def estimate(
    request: EstimateRequest,
    *,
    load: Loader | None = None,
    oracle: ShapeOracle | None = None,
    limits: ParseLimits = DEFAULT_LIMITS,
) -> dict[str, Any]:
    """Estimate a training job's memory and, given free memory, plan its batch. Raises NetError on bad input.

    Runs with the cyclic garbage collector paused (see `collector`): its full passes were a third of a cold
    estimate's time whenever one fell inside it."""
    with paused_collector():
        return _estimate(request, load, oracle, limits)


def _estimate(
    request: EstimateRequest, load: Loader | None, oracle: ShapeOracle | None, limits: ParseLimits
) -> dict[str, Any]:
    if load is None:
        definition = _cached_definition(
            request.net, request.solver, request.net_source, request.solver_source, limits, request.classes
        )
    else:
        definition = _definition(
            request.net, request.solver, request.net_source, request.solver_source, limits, request.classes, load
        )
    options = MemoryOptions(
        engine=request.engine,
        solver_type=_solver_type(definition),
        l1_regularization=definition.l1_regularization,
        cuda_context_bytes=request.cuda_context_bytes,
        flavour=definition.flavour,
        history_itemsize=solver_storage(definition.solver),
    )
    # NVcaffe's figures are a model no GPU has checked yet: plan with a wider margin (flavour.NVCAFFE_SAFETY_MARGIN).
    margin = max(request.safety_margin, NVCAFFE_SAFETY_MARGIN) if options.flavour == NVCAFFE else request.safety_margin
    estimator = Estimator(definition, options, request.data_shapes, oracle)
    report, train, tests = estimator.report(request.batch, request.test_batch)
    batch = net_batch(train)
    test_batch = net_batch(tests[0]) if tests else None

    document: dict[str, Any] = {
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
    }
    if request.curve_batches:
        document["curve"] = _curve(estimator, request.curve_batches, request.test_batch)
        document["linear_model"] = _linear_model(estimator, request.test_batch)
    limit = request.max_batch or MAX_BATCH
    if batch is not None and request.free_bytes is not None:
        document.update(_device_plan(estimator, definition, batch, test_batch, request.free_bytes, margin, limit))
    if batch is not None and request.budgets:
        document["plans"] = {
            key: _device_plan(estimator, definition, batch, test_batch, free, margin, limit)
            for key, free in request.budgets.items()
        }
    return document


def _device_plan(
    estimator: Estimator,
    definition: TrainingDefinition,
    batch: int,
    test_batch: int | None,
    free_bytes: int,
    safety_margin: float,
    limit: int,
) -> dict[str, Any]:
    budget = usable_bytes(free_bytes, safety_margin)
    plan, largest, test_plan = plan_job(estimator, batch, test_batch, definition, budget, limit)
    return {
        "free_bytes": free_bytes,
        "usable_bytes": budget,
        "max_batch_size": largest,
        "plan": plan.to_dict(),
        "test_plan": test_plan,
    }


def _curve(estimator: Estimator, batches: tuple[int, ...], test_batch: int | None) -> list[dict[str, Any]]:
    """The footprint at each batch; a batch Caffe cannot build (a blob over INT_MAX elements) says why."""
    points = []
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


def _definition(
    net: str | None,
    solver: str | None,
    net_source: str,
    solver_source: str,
    limits: ParseLimits,
    classes: int | None,
    load: Loader | None = None,
) -> TrainingDefinition:
    definition = training_definition(
        net, solver, net_source=net_source, solver_source=solver_source, load=load, limits=limits
    )
    if classes is not None:
        fill_num_classes(definition, classes)
    return definition


@functools.lru_cache(maxsize=32)
def _cached_definition(
    net: str | None,
    solver: str | None,
    net_source: str,
    solver_source: str,
    limits: ParseLimits,
    classes: int | None,
) -> TrainingDefinition:
    """Parsed, upgraded and prepared nets by their texts: the form re-estimates the same net at other batches and
    for other devices many times, and parsing is most of the cost of a cold estimate. Nothing mutates a cached
    definition afterwards (classes are filled in before it is cached); errors are not cached."""
    return _definition(net, solver, net_source, solver_source, limits, classes)


def plan_job(
    estimator: Estimator,
    wanted: int,
    test_batch: int | None,
    definition: TrainingDefinition,
    budget: int,
    limit: int = MAX_BATCH,
) -> tuple[BatchPlan, int, dict[str, int] | None]:
    """Plan the train batch with the test nets at their batch; when not even batch 1 fits beside them, shrink the
    test batch too (raising test_iter so a test pass still covers as many items). No batch above `limit`."""
    curve = estimator.curve(None)
    largest = max_batch(curve, budget, limit)
    if largest > 0 or test_batch is None:
        return plan_batch(curve, wanted, budget, limit), largest, None
    test_curve = MemoryCurve(lambda tb: estimator.total(1, tb))
    fitting_test = max_batch(test_curve, budget, limit=test_batch)
    if fitting_test == 0:
        return plan_batch(curve, wanted, budget, limit), 0, None
    curve = estimator.curve(fitting_test)
    test_iter = definition.test_iters[0] if definition.test_iters else 1
    test_plan = {
        "batch_size": fitting_test,
        "test_iter": math.ceil(test_iter * test_batch / fitting_test),
    }
    return plan_batch(curve, wanted, budget, limit), max_batch(curve, budget, limit), test_plan


def _solver_type(definition: TrainingDefinition) -> str:
    solver_type = definition.solver_type
    if solver_type not in SOLVER_STATE_BLOBS:
        raise NetError(
            f"unknown solver type {solver_type!r} (known: {', '.join(SOLVER_STATE_BLOBS)})",
            source=definition.train.source,
            field="type",
        )
    return solver_type
