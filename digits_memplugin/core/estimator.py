"""One training definition estimated at any batch (`Estimator`), memoised: a planner's search costs one build per
batch, and what it learns is kept on the definition for the next estimator of the same net (another wanted batch,
another device, another estimate of the form), within bounds. With the test nets apart (core.test_nets), the
trainer's and the tester's footprints are estimated apart too (`ApartFootprints`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .cost import Meter, layers_in
from .memory import MemoryOptions, MemoryReport
from .net import Net, ShapeOracle
from .planning.planner import MemoryCurve
from .test_nets import apart_tester_memory, apart_trainer_memory
from .training import TrainingDefinition

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
    trainer: dict[int, int] = dataclasses.field(default_factory=dict)
    """The trainer's footprints with the test nets apart, by train batch (ApartFootprints)."""
    tester: int | None = None
    """The tester's footprint with the test nets apart (ApartFootprints)."""


def remembered(definition: TrainingDefinition) -> dict[Any, Remembered]:
    """The definition's remembered ways of counting, oldest first."""
    return definition.memo.setdefault("ways", {})  # type: ignore[no-any-return]


def kept_layers(definition: TrainingDefinition) -> int:
    """Layers the reports kept on `definition` hold."""
    return sum(sum(way.layers.values()) for way in remembered(definition).values())


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


@dataclasses.dataclass
class ApartFootprints:
    """One definition's two footprints under `apart`, on the estimator's builds: the trainer's at any train batch
    and the tester's at the test nets' own batch, both kept on the definition with the estimator's totals (a waiting
    job is planned again at every poll, and builds nothing it built before). The tester on a device of another engine
    is that engine's estimator's `tester()`."""

    estimator: Estimator
    tester_options: MemoryOptions | None = None
    """How the tester's device counts, when not as the estimator does; its footprint is then not kept."""
    test_batch: int | None = None
    """The test nets' batch, when not their own (the estimate's `test_batch`); the footprints are then not kept."""
    _tests: list[Net] | None = dataclasses.field(default=None, init=False, repr=False)
    """The test nets, built once (the train batch does not change them)."""

    def trainer(self, batch: int) -> int:
        """The trainer's peak at train batch `batch`."""
        kept = self.estimator._way.trainer if self.test_batch is None else {}
        if batch not in kept:
            if len(kept) > MAX_REMEMBERED_TOTALS:
                kept.clear()
            train, _ = self._build(batch)
            kept[batch] = apart_trainer_memory(train, self.estimator.options).total_bytes
        return kept[batch]

    def tester(self) -> int:
        """The tester's peak, its test nets at their own batch (never shrunk)."""
        if self.tester_options is not None or self.test_batch is not None:
            train, tests = self._build(None)
            return apart_tester_memory(train, tests, self.tester_options or self.estimator.options).total_bytes
        way = self.estimator._way
        if way.tester is None:
            train, tests = self._build(None)
            way.tester = apart_tester_memory(train, tests, self.estimator.options).total_bytes
        return way.tester

    def _build(self, batch: int | None) -> tuple[Net, list[Net]]:
        estimator = self.estimator
        train, self._tests = estimator.definition.build(
            batch, self.test_batch, estimator.data_shapes, estimator.oracle, self._tests, meter=estimator.meter
        )
        return train, self._tests
