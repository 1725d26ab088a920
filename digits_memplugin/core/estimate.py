"""The estimate the CLI, the REST API and the web form return: one call from prototxt texts to a JSON document.

    {"total_bytes", "batch_size", "engine", "categories", "layers", "max_batch_size", "plan", ...}

`total_bytes` is the footprint of one training job (train net + test nets + solver) at `batch_size`.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from typing import Any

from .collector import paused_collector
from .cost import EstimateCost, Meter, estimate_cost, held_bytes, layers_in
from .errors import BatchLimitError, BlobLimitError, NetError, ShapeError
from .flavour import NVCAFFE, NVCAFFE_SAFETY_MARGIN, solver_storage
from .layers.base import ENGINE_CPU, ENGINES, INT_MAX, PHASE_TEST, PHASE_TRAIN
from .memory import DEFAULT_CUDA_CONTEXT_BYTES, SOLVER_STATE_BLOBS, MemoryOptions, MemoryReport
from .net import Net, ShapeOracle
from .planning.job_plan import JobAsk, PlanningPolicy, plan_job
from .planning.planner import MAX_BATCH, BatchPlan, MemoryCurve, auto_cap, max_buildable, passes
from .prototxt import DEFAULT_LIMITS, ParseLimits
from .training import Loader, TrainingDefinition, fill_num_classes, training_definition

MAX_CURVE_POINTS = 32
MAX_REMEMBERED_TOTALS = 512
MAX_REMEMBERED_REPORTS = 2
"""Whole reports (with their built nets) kept per definition and way of counting: the form asks again and again
about the same net at the same batch (each device's row, each keystroke that changes nothing), and a report is
what an estimate costs most; two keep memory bounded for large nets."""
MAX_KEPT_LAYERS = 5_000
"""A report is kept on its definition only when its nets hold at most this many layers (about 28 MB,
`cost.BYTES_PER_LAYER`): ResNet-50's train and test nets hold 1,100. A recurrent net unrolled over hundreds of
timesteps is rebuilt when asked again instead of being kept (two ~3 KB LSTM nets kept 730 MB; issue 23, item 4)."""
MAX_WAYS = 8
"""Ways of counting (engine, data shapes, ...) remembered per definition, the oldest forgotten first: a client
asking about one net with ever new data shapes must not grow what is kept."""
MAX_CACHED_DEFINITIONS = 32
MAX_CACHED_BYTES = 128 << 20
"""What the definition cache may keep, by its estimate of the bytes held (`cost.held_bytes`): parsed texts and
kept reports, the oldest dropped first."""
MAX_TEST_BUILDS_KEPT = 2
"""Test nets an estimator keeps built, by test batch, while it plans (each train batch reuses them)."""
MAX_RECENT_REPORTS = 2
"""Reports an estimator keeps of its own (a caller asking again for the one it just had builds nothing), however
large: with MAX_BUILD_LAYERS, what one estimate holds at once is bounded."""


@dataclasses.dataclass
class Remembered:
    """What estimators keep on a definition for one way of counting: footprints by (batch, test batch), and the
    last few reports with their nets when they are small (MAX_KEPT_LAYERS)."""

    totals: dict[tuple[int | None, int | None], int] = dataclasses.field(default_factory=dict)
    reports: dict[tuple[int | None, int | None], tuple[MemoryReport, Net, list[Net]]] = dataclasses.field(
        default_factory=dict
    )
    layers: dict[tuple[int | None, int | None], int] = dataclasses.field(default_factory=dict)
    """Layers each kept report's nets hold."""


def remembered(definition: TrainingDefinition) -> dict[Any, Remembered]:
    """The definition's remembered ways of counting, oldest first."""
    return definition.memo.setdefault("ways", {})  # type: ignore[no-any-return]


def kept_layers(definition: TrainingDefinition) -> int:
    """Layers the reports kept on `definition` hold."""
    return sum(sum(way.layers.values()) for way in remembered(definition).values())


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
    """Fraction of free memory kept back (None: the policy's for the engine, as jobs plan)."""
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

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise NetError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}", field="engine")
        for name in ("batch", "test_batch", "classes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise NetError(f"{name} must be a positive integer, got {value!r}", field=name)
        for name in ("batch", "test_batch"):
            value = getattr(self, name)
            if value is not None and value > INT_MAX:
                # A batch Caffe could never be given (its batch sizes and shapes are 32-bit): no iter_size helps.
                raise NetError(f"{name} must be at most {INT_MAX} (Caffe's INT_MAX), got {value}", field=name)
        if self.free_bytes is not None and (
            not isinstance(self.free_bytes, int) or isinstance(self.free_bytes, bool) or self.free_bytes < 0
        ):
            raise NetError(f"free_bytes must be a non-negative integer, got {self.free_bytes!r}", field="free_bytes")
        if self.safety_margin is not None and (
            not isinstance(self.safety_margin, (int, float)) or not 0.0 <= self.safety_margin < 1.0
        ):
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
        for name in ("max_batch", "train_items"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
                raise NetError(f"{name} must be a positive integer, got {value!r}", field=name)
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
        meter: Meter | None = None,
    ) -> None:
        self.definition = definition
        self.options = options
        self.data_shapes = dict(data_shapes)
        self.oracle = oracle
        self.meter = meter
        """Counts the layers this estimator sets up, and stops it past the meter's deadline (core/cost.py)."""
        self._recent: dict[tuple[int | None, int | None], tuple[MemoryReport, Net, list[Net]]] = {}
        self._tests: dict[int | None, list[Net]] = {}
        # Totals outlive this estimator: they are kept on the definition, per way of counting, so that estimating
        # the same net again (another wanted batch, another device) reuses the planner's evaluations.
        key = (options, repr(sorted(self.data_shapes.items())), id(oracle))
        ways = remembered(definition)
        way = ways.pop(key, None) or Remembered()
        ways[key] = way  # the newest
        while len(ways) > MAX_WAYS:
            ways.pop(next(iter(ways)))
        if len(way.totals) > MAX_REMEMBERED_TOTALS:
            way.totals.clear()
        self._way = way
        self._totals = way.totals

    def report(self, batch: int | None, test_batch: int | None = None) -> tuple[MemoryReport, Net, list[Net]]:
        """The report at `batch` (built nets included): one this estimator gave last, one of the last few kept on
        the definition, or a new build. Reports and nets are never changed once built, so sharing them is safe."""
        key = (batch, test_batch)
        built = self._recent.pop(key, None) or self._way.reports.get(key)
        if built is None:
            built = self._build(key)
            self._keep(key, built)
        self._recent[key] = built
        while len(self._recent) > MAX_RECENT_REPORTS:
            self._recent.pop(next(iter(self._recent)))
        self._totals[key] = built[0].total_bytes
        return built

    def total(self, batch: int | None, test_batch: int | None = None) -> int:
        """The peak at `batch`, from memory when this net was estimated at that batch before. A search's
        evaluations are not kept: only their totals are, so they never push out the report a caller asked for,
        and a search holds one build at a time."""
        key = (batch, test_batch)
        if key not in self._totals:
            self._build(key)
        return self._totals[key]

    def _keep(self, key: tuple[int | None, int | None], built: tuple[MemoryReport, Net, list[Net]]) -> None:
        """Keep a report on the definition when its nets are small; the oldest kept goes past the few kept."""
        layers = layers_in(built[1]) + sum(layers_in(net) for net in built[2])
        if layers > MAX_KEPT_LAYERS:
            return
        way = self._way
        way.reports[key], way.layers[key] = built, layers
        while len(way.reports) > MAX_REMEMBERED_REPORTS:
            oldest = next(iter(way.reports))
            del way.reports[oldest], way.layers[oldest]

    def _build(self, key: tuple[int | None, int | None]) -> tuple[MemoryReport, Net, list[Net]]:
        # The test nets depend on the test batch only: a search over train batches builds them once.
        tests = self._tests.get(key[1])
        built = self.definition.memory(
            self.options, key[0], key[1], self.data_shapes, self.oracle, tests, meter=self.meter
        )
        self._tests.pop(key[1], None)
        self._tests[key[1]] = built[2]
        while len(self._tests) > MAX_TEST_BUILDS_KEPT:
            self._tests.pop(next(iter(self._tests)))
        self._totals[key] = built[0].total_bytes
        return built

    def totals(self) -> dict[tuple[int | None, int | None], int]:
        """Every footprint known for this definition and way of counting, by (batch, test batch): what an
        estimator of the same definition in another process starts from (`learn`)."""
        return dict(self._totals)

    def learn(self, totals: Mapping[tuple[int | None, int | None], int]) -> None:
        """Footprints another estimator of this definition and way of counting computed (an estimate worker's, from
        a copy of the definition): a search finds them as its own, and builds none of those batches again."""
        for key, total in totals.items():
            if len(self._totals) >= MAX_REMEMBERED_TOTALS:
                break
            self._totals[key] = total

    def known_totals(self, test_batch: int | None = None) -> dict[int, int]:
        """The footprints computed so far at `test_batch`, by train batch."""
        return {batch: total for (batch, tb), total in self._totals.items() if tb == test_batch and batch is not None}

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
    if load is None:
        definition = DEFINITIONS.get(
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
        flavour=request.policy.flavour_for(definition.flavour),
        history_itemsize=solver_storage(definition.solver),
    )
    # NVcaffe's figures are a model no GPU has checked yet: plan with a wider margin (flavour.NVCAFFE_SAFETY_MARGIN).
    margin = request.safety_margin if request.safety_margin is not None else request.policy.safety_margin(request.engine)
    if options.flavour == NVCAFFE:
        margin = max(margin, NVCAFFE_SAFETY_MARGIN)
    estimator = Estimator(definition, options, request.data_shapes, oracle, meter)
    blob_limit = None
    try:
        report, train, tests = estimator.report(request.batch, request.test_batch)
    except BatchLimitError as error:
        if request.batch is None:
            raise  # the net as written: there is no wanted batch to reach another way
        blob_limit = _single_pass_limit(estimator, request.batch, request.test_batch, error)
        report, train, tests = estimator.report(blob_limit["batch_size"], request.test_batch)
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
        "blob_limit": blob_limit,
    }
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
        max_batch=min(caps) if caps else None, safety_margin=margin,
    )
    if batch is not None and request.free_bytes is not None:
        document.update(_device_plan(estimator, ask, request, request.free_bytes))
    if batch is not None and request.budgets:
        document["plans"] = {key: _device_plan(estimator, ask, request, free) for key, free in request.budgets.items()}
    return document


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
        # The nets' own test batch is the estimator's None: the totals already computed are found again.
        return estimator.total(batch, None if test_batch == ask.test_batch else test_batch)

    known = estimator.known_totals(None)
    decision = plan_job(footprint, ask, engine=request.engine, limit_bytes=free_bytes, policy=request.policy,
                        known=known)
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
    }


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


DefinitionKey = tuple[str | None, str | None, str, str, ParseLimits, int | None]


class DefinitionCache:
    """Parsed, upgraded and prepared nets by their texts: the form re-estimates the same net at other batches and
    for other devices many times, and parsing is most of the cost of a cold estimate. Nothing mutates a cached
    definition afterwards (classes are filled in before it is cached); errors are not cached.

    It keeps at most `entries` definitions and, by its estimate of what they hold (`cost.held_bytes`: the parsed
    text and the reports estimators keep on a definition), at most `max_bytes`, the least recently used dropped
    first. What a definition holds grows after it is cached (an estimate keeps a report on it), so `settle`, which
    every estimate calls when it ends, drops again what no longer fits."""

    def __init__(self, entries: int = MAX_CACHED_DEFINITIONS, max_bytes: int = MAX_CACHED_BYTES) -> None:
        self.entries = entries
        self.max_bytes = max_bytes
        self._cached: dict[DefinitionKey, TrainingDefinition] = {}
        self._lock = threading.Lock()

    def get(
        self,
        net: str | None,
        solver: str | None,
        net_source: str,
        solver_source: str,
        limits: ParseLimits,
        classes: int | None,
    ) -> TrainingDefinition:
        key = (net, solver, net_source, solver_source, limits, classes)
        with self._lock:
            definition = self._cached.pop(key, None)
            if definition is not None:
                self._cached[key] = definition  # the most recently used
                return definition
        definition = _definition(net, solver, net_source, solver_source, limits, classes)
        with self._lock:
            self._cached[key] = definition
        self.settle()
        return definition

    def settle(self) -> None:
        """Drop the least recently used definitions until the rest fit (the newest always stays)."""
        with self._lock:
            held = {key: self._held(key, definition) for key, definition in self._cached.items()}
            total = sum(held.values())
            while len(self._cached) > 1 and (len(self._cached) > self.entries or total > self.max_bytes):
                oldest = next(iter(self._cached))
                del self._cached[oldest]
                total -= held.pop(oldest)

    @staticmethod
    def _held(key: DefinitionKey, definition: TrainingDefinition) -> int:
        return held_bytes(len(key[0] or "") + len(key[1] or ""), kept_layers(definition))

    @property
    def held(self) -> int:
        """The bytes the cached definitions hold, by the cache's estimate."""
        with self._lock:
            return sum(self._held(key, definition) for key, definition in self._cached.items())

    def __len__(self) -> int:
        with self._lock:
            return len(self._cached)

    def clear(self) -> None:
        with self._lock:
            self._cached.clear()


DEFINITIONS = DefinitionCache()
"""The process's cache of parsed definitions (each estimate worker has its own)."""


def _solver_type(definition: TrainingDefinition) -> str:
    solver_type = definition.solver_type
    if solver_type not in SOLVER_STATE_BLOBS:
        raise NetError(
            f"unknown solver type {solver_type!r} (known: {', '.join(SOLVER_STATE_BLOBS)})",
            source=definition.train.source,
            field="type",
        )
    return solver_type
