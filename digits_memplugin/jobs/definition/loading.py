"""A job's net and solver read into its definition (`load_definition`): parsed, their data sources put in place,
every path confined (jobs.definition.confiner), and checked down to what the job will train: a Caffe that reads
it, a solver type, a length (in iterations, or in epochs from the datasets' sizes), nets that build."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...core.epochs import EVERY_EPOCH, ONE_PASS, EpochLength, validation_iterations
from ...core.errors import NetError
from ...core.flavour import BVLC, NVCAFFE, flavour_of
from ...core.layers.base import PHASE_TEST, PHASE_TRAIN
from ...core.layers.data import DataSpec
from ...core.memory import SOLVER_STATE_BLOBS
from ...core.net import ShapeOracle, filter_layers, net_state
from ...core.proto import caffe_pb2
from ...core.schedule import LearningRate
from ...core.training import TrainingDefinition, fill_num_classes, training_definition
from ...estimate.dataset_scan import HDF5, LMDB, describe
from ...estimate.datasets import shapes_from_sources
from .confiner import Confiner
from .data_sources import SOURCE_FIELDS, DataSourceError, apply_data, data_phases
from .definition import NET_SOURCE, SOLVER_SOURCE, JobDefinition, NetFacts, countable, net_facts
from .file_fields import unique_params

NVCAFFE_REFUSAL = "this server trains with {caffe}; this net needs NVcaffe"
CHANGE_CAFFE = "MEMPLUGIN_CAFFE_ROOT, serve --caffe-root or train --caffe-root"
"""The setting that names the Caffe that trains (caffe_build.py)."""


@dataclasses.dataclass(frozen=True)
class Trainer:
    """What load_definition needs to know of the Caffe that trains: its flavour, and how to name it to people."""

    flavour: str = BVLC
    label: str = "BVLC Caffe (the bundled pycaffe)"


def load_definition(
    net_text: str,
    solver_text: str,
    *,
    folder: Path,
    roots: Sequence[Path],
    data: Mapping[str, str] | None = None,
    data_shapes: Mapping[str, Any] | None = None,
    classes: int | None = None,
    max_iter: int | None = None,
    oracle: ShapeOracle | None = None,
    trainer: Trainer | None = None,
    epochs: int | None = None,
    test_interval: int | str | None = None,
    test_iter: int | str | None = None,
    facts: Callable[[JobDefinition], NetFacts] | None = None,
) -> JobDefinition:
    """Parse, confine and check a job's definition; NetError (with the layer and field) on anything unsafe or
    unusable. `folder` is the job's folder (list files are written under it), `roots` the dataset folders,
    `data` replaces data layers' sources by layer name. `max_iter`, `epochs`, `test_interval` and `test_iter` are
    the request's (jobs.definition.request): with `epochs`, the length and the validation left unsaid are DIGITS' (core.epochs),
    from the datasets' sizes. `facts` builds the nets once (default `net_facts`, here; jobs.scheduling.planning's runs a
    costly build in an estimate worker)."""
    trainer = trainer or Trainer()
    training, solver = _training(net_text, solver_text, trainer, classes)
    resolved_roots = [root.resolve() for root in roots]
    shapes = _confined_shapes(training, folder, resolved_roots, dict(data or {}))
    for key, value in (data_shapes or {}).items():
        shapes[key] = value if isinstance(value, DataSpec) else DataSpec(tuple(value))
    length = _asked_length(
        training, solver, [*resolved_roots, (folder / "data").resolve()],
        max_iter=max_iter, epochs=epochs, test_interval=test_interval, test_iter=test_iter,
    )
    definition = JobDefinition(
        training, shapes, length.schedule, None, [], max(length.iterations, 1), roots=tuple(resolved_roots),
        train_items=length.train_items, flavour=NVCAFFE if NVCAFFE in (training.flavour, trainer.flavour) else BVLC,
        epochs=epochs, val_items=length.val_items, test_interval=length.test_interval,
    )
    # Build the nets once: a definition the estimator cannot build (bad shapes) is refused now.
    _take_facts(definition, (facts or (lambda made: net_facts(made, oracle)))(definition), length.test_iter)
    return definition


def _training(net_text: str, solver_text: str, trainer: Trainer, classes: int | None) -> tuple[TrainingDefinition, Any]:
    """The texts parsed into a training that `trainer` can train, its classes filled, and its solver (of a type
    this Caffe knows)."""
    training = training_definition(net_text, solver_text, net_source=NET_SOURCE, solver_source=SOLVER_SOURCE)
    _refuse_nvcaffe(training, trainer)
    solver = training.solver
    if solver is None:  # pragma: no cover - training_definition always has the solver when its text is given
        raise NetError("give a solver", source=SOLVER_SOURCE)
    if solver.type and solver.type not in SOLVER_STATE_BLOBS:
        raise NetError(f"unknown solver type {solver.type!r}", source=SOLVER_SOURCE, field="type")
    if classes is not None:
        fill_num_classes(training, classes)
    return training, solver


def _confined_shapes(
    training: TrainingDefinition, folder: Path, roots: list[Path], data: dict[str, str]
) -> dict[str, DataSpec]:
    """The request's `data` put in place, every layer's paths confined (`Confiner`), and the data layers' item
    shapes read from their sources; a DataSourceError where a source the request gave is at fault."""
    params = unique_params(training)
    replaced = apply_data(params, data)
    confiner = Confiner(folder, roots, replaced)
    for param in params:
        for layer in param.layer:
            confiner.layer(layer)
    _refuse_shared_readers(training)
    # The list files written above are in the job's folder; the files they list are already checked.
    try:
        return shapes_from_sources(params, folder, [*roots, (folder / "data").resolve()])
    except NetError as error:
        # Layers of both phases often share a name: the request's data is at fault only if it gave them all.
        named = [id(layer) for param in params for layer in param.layer if layer.name == error.layer]
        if named and error.field in SOURCE_FIELDS and all(key in replaced for key in named):
            raise DataSourceError(
                error.message, layer=error.layer, layer_type=error.layer_type, field=error.field
            ) from None
        raise


@dataclasses.dataclass(frozen=True)
class _AskedLength:
    """The length and validation a job asked for, checked against what its datasets' sizes allow."""

    iterations: int
    """max_iter as asked (the request's, else the solver's); positive unless the length is in epochs."""
    schedule: LearningRate
    train_items: int | None
    val_items: int | None
    test_interval: int | str | None
    test_iter: int | str | None


def _asked_length(
    training: TrainingDefinition,
    solver: Any,
    items_roots: list[Path],
    *,
    max_iter: int | None,
    epochs: int | None,
    test_interval: int | str | None,
    test_iter: int | str | None,
) -> _AskedLength:
    """The request's length and validation, DIGITS' where left unsaid with `epochs` (one validation pass each
    epoch); a NetError when what is asked needs a dataset's size that cannot be read."""
    schedule = LearningRate.from_solver(solver, SOLVER_SOURCE)
    train_items = phase_items([training.train.param], items_roots, "train")
    if epochs is not None and not train_items:
        raise NetError(
            "the length in epochs needs the training set's size, which cannot be read from its data layers (an LMDB "
            "or an HDF5 list has one); give max_iter instead", field="epochs",
        )
    iterations = int(max_iter if max_iter is not None else solver.max_iter)
    if iterations <= 0 and epochs is None:
        raise NetError("max_iter must be positive", source=SOLVER_SOURCE, field="max_iter")
    if schedule.policy == "poly" and epochs is None:
        schedule = dataclasses.replace(schedule, max_iter=iterations)
    if test_interval is None and epochs is not None:
        test_interval = EVERY_EPOCH
    if training.tests and test_interval == EVERY_EPOCH and not train_items:
        raise NetError(
            "validating once per epoch needs the training set's size, which cannot be read from its data layers (an "
            "LMDB or an HDF5 list has one); give test_interval", field="test_interval",
        )
    if test_iter is None and epochs is not None:
        test_iter = ONE_PASS
    val_items = phase_items([test.param for test in training.tests], items_roots, "test") if training.tests else None
    if training.tests and test_iter == ONE_PASS and not val_items:
        raise NetError(
            "one validation pass needs the validation set's size, which cannot be read from its data layers (an LMDB "
            "or an HDF5 list has one); give test_iter", field="test_iter",
        )
    return _AskedLength(iterations, schedule, train_items, val_items, test_interval, test_iter)


def _take_facts(definition: JobDefinition, built: NetFacts, test_iter: int | str | None) -> None:
    """What building the nets told, kept on the definition: their batches and threads; each test net's test_iter
    (one validation pass at its own batch with ONE_PASS); the length in epochs at the net's own batch, until an
    attempt is planned."""
    training = definition.training
    definition.net_batch = built.net_batch
    definition.test_batches = list(built.test_batches)
    definition.threads = built.threads
    if isinstance(test_iter, int):
        training.test_iters = [test_iter] * len(definition.test_batches)
    elif test_iter == ONE_PASS and definition.val_items:
        training.test_iters = [
            validation_iterations(definition.val_items, own) if own else iters
            for own, iters in zip(definition.test_batches, training.test_iters, strict=True)
        ]
    if definition.epochs is not None and definition.net_batch and definition.train_items:
        length = EpochLength(definition.epochs, definition.train_items, definition.net_batch)
        countable(length)
        definition.max_iter = length.max_iter


def phase_items(params: list[Any], roots: list[Path], phase: str, base: Path | None = None) -> int | None:
    """Items of the datasets the data layers of `phase` ("train", "test") read (sources confined already; relative
    ones taken from `base`), the smallest; None when none can be read."""
    counts = []
    for param in params:
        for layer in param.layer:
            if phase not in data_phases(layer):
                continue
            if layer.type == "Data" and layer.data_param.backend == caffe_pb2.DataParameter.LMDB:
                found = describe((base or Path()) / layer.data_param.source, LMDB, roots)
            elif layer.type == "HDF5Data" and layer.hdf5_data_param.source:
                found = describe((base or Path()) / layer.hdf5_data_param.source, HDF5, roots)
            else:
                continue
            if found.entries:
                counts.append(found.entries)
    return min(counts) if counts else None


def _refuse_nvcaffe(training: TrainingDefinition, trainer: Trainer) -> None:
    """A definition only NVIDIA's Caffe fork reads (core/flavour.py) is refused here, before a job exists, unless
    NVcaffe trains: BVLC's Caffe would abort on its first NVcaffe field. It can still be estimated."""
    if training.flavour != NVCAFFE or trainer.flavour == NVCAFFE:
        return
    net_needs_it = flavour_of(training.train.param) == NVCAFFE
    raise NetError(
        f"{NVCAFFE_REFUSAL.format(caffe=trainer.label)} (its {'net' if net_needs_it else 'solver'} uses fields only "
        f"NVcaffe has): name an NVcaffe build with {CHANGE_CAFFE} (CAFFE_ROOT as DIGITS reads it) to train it; "
        "the estimate works as it is",
        source=NET_SOURCE if net_needs_it else SOLVER_SOURCE,
    )


def _refuse_shared_readers(training: TrainingDefinition) -> None:
    """This Caffe's DataReader shares one reading thread between Data layers of the same name and source, even in
    different nets, and deadlocks when the test net stops reading (the train net waits forever)."""
    seen: dict[tuple[str, str], str] = {}
    nets = [(training.train, PHASE_TRAIN, "TRAIN")] + [
        (test, PHASE_TEST, f"TEST #{index}") for index, test in enumerate(training.tests)
    ]
    for net, phase, label in nets:
        state = net_state(net.param, phase, net.state)
        for _, layer in filter_layers(net.param, state, net.source, net.lines):
            if layer.type != "Data":
                continue
            key = (layer.name, layer.data_param.source)
            if key in seen and seen[key] != label:
                raise NetError(
                    f"the {seen[key]} and {label} nets both have a Data layer named {layer.name!r} reading the same "
                    "source; this Caffe shares one reader between them and deadlocks: rename one of the layers or "
                    "give the test net its own database",
                    layer=layer.name, layer_type="Data", field="data_param.source",
                )
            seen.setdefault(key, label)
