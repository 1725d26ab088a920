"""What a job trains (`JobDefinition`): its nets and solver with every path checked, the dataset's item shapes, and
what the job asked of its length; how long each attempt trains at its batch, and the estimator that plans it.

The definition is read once (jobs.definition.loading: every path a layer names confined, jobs.definition.confiner)
and written again for each attempt with that attempt's batch_size, iter_size and test batch
(jobs.definition.attempt_files, after every path is checked again: jobs.definition.recheck).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ...core.cost import Meter
from ...core.epochs import EVERY_EPOCH, EpochLength
from ...core.errors import NetError
from ...core.estimator import Estimator, net_batch
from ...core.flavour import BVLC, solver_storage
from ...core.layers.data import DataSpec
from ...core.memory import MemoryOptions
from ...core.net import ShapeOracle
from ...core.schedule import LearningRate
from ...core.training import TrainingDefinition

NET_SOURCE = "net.prototxt"
SOLVER_SOURCE = "solver.prototxt"
"""The names a job's two texts go by: in errors about them, and as its files in the job's folder."""

PREFETCHING_LAYERS = ("Data", "ImageData", "WindowData", "AnnotatedData")
"""The data layers that start a prefetch thread (`net_facts` counts them)."""


@dataclasses.dataclass(frozen=True)
class TrainingLength:
    """How long an attempt trains and how often it validates (JobDefinition.length)."""

    max_iter: int
    test_interval: int
    """0 without test nets."""
    per_epoch: int | None = None
    """Iterations per epoch at the attempt's batch (None when the training set's size is unknown)."""
    epochs: int | None = None
    """The epochs asked for (None: max_iter was given)."""

    def to_dict(self) -> dict[str, int | None]:
        return dataclasses.asdict(self)


def countable(length: EpochLength) -> None:
    """A length by epochs Caffe can count, or the NetError naming `epochs` that says why not."""
    try:
        length.check_countable()
    except ValueError as error:
        raise NetError(str(error), field="epochs") from None


@dataclasses.dataclass
class JobDefinition:
    """What a job trains, with every path checked: the nets, the solver and the dataset item shapes."""

    training: TrainingDefinition
    data_shapes: dict[str, DataSpec]
    schedule: LearningRate
    net_batch: int | None
    """The TRAIN net's own batch size."""
    test_batches: list[int | None]
    """Each test net's own batch size."""
    max_iter: int
    threads: int = 0
    """Threads Caffe starts for this job: a prefetch thread per prefetching data layer, plus a reader per Data
    layer (as the estimator counts them). Each reserves a stack, which a memory cap (RLIMIT_DATA) counts."""
    roots: tuple[Path, ...] = ()
    """The dataset folders (resolved) its data was checked against; each attempt checks it again against them."""
    train_items: int | None = None
    """Items in the training net's dataset (the smallest, where several layers read): "auto" plans no batch past
    it. None when unknown (an ImageData list, a LevelDB)."""
    flavour: str = BVLC
    """The Caffe it is estimated as: NVcaffe's when it needs NVcaffe's schema or NVcaffe trains it."""
    epochs: int | None = None
    """The length in epochs (core.epochs), resolved at each attempt's effective batch; None: `max_iter` as given."""
    val_items: int | None = None
    """Items in the validation nets' dataset (the smallest), when it can be read."""
    test_interval: int | str | None = None
    """Iterations between validations: a number, core.epochs.EVERY_EPOCH, or None (the solver's)."""

    def length(self, effective_batch: int | None) -> TrainingLength:
        """max_iter and test_interval of an attempt that trains `effective_batch` items per update: by epochs as
        DIGITS computes them when the job asked so, else as given (the solver's, or the request's)."""
        by_epoch = None
        if self.train_items and effective_batch:
            by_epoch = EpochLength(self.epochs or 1, self.train_items, effective_batch)
        max_iter = self.max_iter
        if self.epochs is not None and by_epoch is not None:
            countable(by_epoch)
            max_iter = by_epoch.max_iter
        interval = int(self.solver.test_interval) if self.training.tests else 0
        if self.training.tests and isinstance(self.test_interval, int):
            interval = self.test_interval
        elif self.training.tests and self.test_interval == EVERY_EPOCH and by_epoch is not None:
            interval = min(by_epoch.per_epoch, max_iter)  # DIGITS: one epoch's iterations, max_iter past the end
        return TrainingLength(max_iter, interval, by_epoch.per_epoch if by_epoch is not None else None, self.epochs)

    def schedule_for(self, length: TrainingLength) -> LearningRate:
        """The learning rate of an attempt of that length ("poly" decays to max_iter)."""
        if self.schedule.policy == "poly":
            return dataclasses.replace(self.schedule, max_iter=length.max_iter)
        return self.schedule

    @property
    def test_batch(self) -> int | None:
        """The first test net's own batch (None without test nets): what the planner shrinks when it must."""
        return self.test_batches[0] if self.test_batches else None

    @property
    def solver(self) -> Any:
        return self.training.solver

    @property
    def test_iter(self) -> int:
        return self.training.test_iters[0] if self.training.test_iters else 1

    def memory_options(self, engine: str) -> MemoryOptions:
        return MemoryOptions(
            engine=engine,
            solver_type=self.training.solver_type,
            l1_regularization=self.training.l1_regularization,
            flavour=self.flavour,
            history_itemsize=solver_storage(self.solver),
        )

    def estimator(self, engine: str, oracle: ShapeOracle | None = None, meter: Meter | None = None) -> Estimator:
        return Estimator(self.training, self.memory_options(engine), self.data_shapes, oracle, meter)


@dataclasses.dataclass(frozen=True)
class NetFacts:
    """What building a definition's nets once, as written, tells the job (`net_facts`)."""

    net_batch: int | None
    test_batches: tuple[int | None, ...]
    threads: int
    """JobDefinition.threads."""


def net_facts(definition: JobDefinition, oracle: ShapeOracle | None = None, meter: Meter | None = None) -> NetFacts:
    """The nets built once at their own batches (a NetError when they cannot be built: bad shapes), and what that
    tells: their batches and the threads Caffe starts. `meter` may stop it (core.cost.TimeUp): a recurrent net
    unrolls into tens of thousands of layers, which jobs.scheduling.planning builds in an estimate worker instead."""
    _, train, tests = definition.estimator("cpu", oracle, meter).report(None, None)
    threads = sum(
        2 if layer.type == "Data" else 1
        for net in (train, *tests)
        for layer in net.layers
        if layer.type in PREFETCHING_LAYERS
    )
    return NetFacts(net_batch(train), tuple(net_batch(test) for test in tests), threads)
