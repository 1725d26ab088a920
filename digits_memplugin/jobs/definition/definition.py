"""A job's nets and solver made safe to run: data paths confined, outputs kept in the job's folder, and per attempt
the generated prototxts with that attempt's batch_size, iter_size and test batch.

Caffe opens whatever paths a prototxt names. A server that trains uploaded definitions must not read outside the
dataset folders it was given, nor write outside the job's folder. So every string field of every layer that
names a file is examined before anything runs (by name, so fork-only layers are covered too): known readers
(LMDB sources, HDF5 and image list files, mean files, label maps) must resolve inside a dataset root; known
writers (HDF5Output, detection outputs) must lie inside ``<job>/outputs`` by their letters (never after resolving
links: a folder the path names may not exist yet, and the attempt's LMDB links are made later), with real folders
on the way, checked again at each attempt (`confirm_outputs`); any other path-like field, and
Python layers (which import code), are refused with a clear error. List files are rewritten into the job's folder
with every entry checked. The solver's own paths (net files, snapshot_prefix) are replaced.

An LMDB source is checked down to its data file (a regular file inside a root, links resolved). A job may wait in
the queue for hours, so when each attempt starts (`write_attempt`, just before the child is started) every path
the job reads is checked again: each must still be the real path checked at submission, with no link on it, of
the same kind. The child is handed those real paths; for an LMDB, a folder of the job's own whose data.mdb links
to the dataset's data file, because Caffe opens LMDBs read-only but still opens (creates, writes) the folder's
lock.mdb, and a prototxt cannot ask it not to: its lock table is written in the job's folder, never the dataset's.
The attempt's files say what its child may then open (`AttemptFiles.reads`, `.writes`), which the child's
confinement (jobs.child.confinement) holds it to while Caffe opens files all through training.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from google.protobuf import text_format

from ...core.cost import Meter
from ...core.epochs import EVERY_EPOCH, ONE_PASS, EpochLength, iterations_per_epoch, validation_iterations
from ...core.errors import NetError
from ...core.estimator import Estimator, net_batch
from ...core.flavour import BVLC, NVCAFFE, flavour_of, solver_storage
from ...core.inputs import shown
from ...core.layers.base import PHASE_TEST, PHASE_TRAIN
from ...core.layers.data import DataSpec
from ...core.memory import SOLVER_STATE_BLOBS, MemoryOptions
from ...core.net import ShapeOracle, filter_layers, net_state
from ...core.proto import caffe_pb2
from ...core.schedule import LearningRate
from ...core.training import TrainingDefinition, fill_num_classes, training_definition
from ...estimate.dataset_scan import HDF5, LMDB, describe
from ...estimate.datasets import (
    LMDB_DATA_FILE,
    READ_SECONDS,
    find_in_roots,
    hdf5_list_files,
    lmdb_data_file,
    real_path,
    shapes_from_sources,
)
from ...estimate.files import file_kind, inside, read_regular
from ..turns import Turns

NET_SOURCE = "net.prototxt"
SOLVER_SOURCE = "solver.prototxt"
MAX_LIST_BYTES = 64 * 1024 * 1024
"""Largest list file read (an ImageData list of a million images is about 60 MB)."""

# (message name, field name) -> how the field is handled. Anything else that looks like a path is refused.
READ_FILE = "read file"
READ_DB = "read database"
HDF5_LIST = "hdf5 list"
IMAGE_LIST = "image list"
WRITE_FILE = "write file"
WRITE_DIR = "write folder"
FILE_NAME = "file name"
HANDLED_FIELDS: dict[tuple[str, str], str] = {
    ("DataParameter", "source"): READ_DB,
    ("DataParameter", "mean_file"): READ_FILE,
    ("TransformationParameter", "mean_file"): READ_FILE,
    ("HDF5DataParameter", "source"): HDF5_LIST,
    ("ImageDataParameter", "source"): IMAGE_LIST,
    ("ImageDataParameter", "mean_file"): READ_FILE,
    ("ImageDataParameter", "root_folder"): IMAGE_LIST,
    ("InfogainLossParameter", "source"): READ_FILE,
    ("AnnotatedDataParameter", "label_map_file"): READ_FILE,
    ("DetectionEvaluateParameter", "name_size_file"): READ_FILE,
    ("SaveOutputParameter", "label_map_file"): READ_FILE,
    ("SaveOutputParameter", "name_size_file"): READ_FILE,
    ("VideoDataParameter", "video_file"): READ_FILE,
    ("HDF5OutputParameter", "file_name"): WRITE_FILE,
    ("DetectionOutputParameter", "save_file"): WRITE_FILE,
    ("SaveOutputParameter", "output_directory"): WRITE_DIR,
    ("SaveOutputParameter", "output_name_prefix"): FILE_NAME,
}
PATH_LIKE = re.compile(r"file|source|folder|directory|path|prefix|module")
REFUSED_LAYERS = {
    "Python": "Python layers import and run code on the server; they are not allowed in jobs",
    "WindowData": "WindowData's window files are not supported in jobs; convert the data to LMDB or HDF5",
}
PREFETCHING_LAYERS = ("Data", "ImageData", "WindowData", "AnnotatedData")
DATA_SOURCE_FIELDS = {
    "Data": "data_param",
    "HDF5Data": "hdf5_data_param",
    "ImageData": "image_data_param",
    "AnnotatedData": "data_param",
}
SOURCE_FIELDS = frozenset(f"{param}.source" for param in DATA_SOURCE_FIELDS.values())


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


class DataSourceError(NetError):
    """A data source the request's `data` gave (not the net's own text) cannot be used: the request's `data` field
    is at fault, and the API says so rather than pointing at the net."""


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
    training = training_definition(net_text, solver_text, net_source=NET_SOURCE, solver_source=SOLVER_SOURCE)
    trainer = trainer or Trainer()
    _refuse_nvcaffe(training, trainer)
    solver = training.solver
    if solver is None:  # pragma: no cover - training_definition always has the solver when its text is given
        raise NetError("give a solver", source=SOLVER_SOURCE)
    if solver.type and solver.type not in SOLVER_STATE_BLOBS:
        raise NetError(f"unknown solver type {solver.type!r}", source=SOLVER_SOURCE, field="type")
    if classes is not None:
        fill_num_classes(training, classes)
    params = _unique_params(training)
    replaced = _apply_data_overrides(params, dict(data or {}))
    resolved_roots = [root.resolve() for root in roots]
    confiner = _Confiner(folder, resolved_roots, replaced)
    for param in params:
        for layer in param.layer:
            confiner.layer(layer)
    _refuse_shared_readers(training)
    # The list files written above are in the job's folder; the files they list are already checked.
    try:
        shapes = shapes_from_sources(params, folder, [*resolved_roots, (folder / "data").resolve()])
    except NetError as error:
        # Layers of both phases often share a name: the request's data is at fault only if it gave them all.
        named = [id(layer) for param in params for layer in param.layer if layer.name == error.layer]
        if named and error.field in SOURCE_FIELDS and all(key in replaced for key in named):
            raise DataSourceError(
                error.message, layer=error.layer, layer_type=error.layer_type, field=error.field
            ) from None
        raise
    for key, value in (data_shapes or {}).items():
        shapes[key] = value if isinstance(value, DataSpec) else DataSpec(tuple(value))
    schedule = LearningRate.from_solver(solver, SOLVER_SOURCE)
    items_roots = [*resolved_roots, (folder / "data").resolve()]
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
    definition = JobDefinition(
        training, shapes, schedule, None, [], max(iterations, 1), roots=tuple(resolved_roots),
        train_items=train_items, flavour=NVCAFFE if NVCAFFE in (training.flavour, trainer.flavour) else BVLC,
        epochs=epochs, val_items=val_items, test_interval=test_interval,
    )
    # Build the nets once: a definition the estimator cannot build (bad shapes) is refused now.
    built = (facts or (lambda made: net_facts(made, oracle)))(definition)
    definition.net_batch = built.net_batch
    definition.test_batches = list(built.test_batches)
    definition.threads = built.threads
    if isinstance(test_iter, int):
        training.test_iters = [test_iter] * len(definition.test_batches)
    elif test_iter == ONE_PASS and val_items:
        training.test_iters = [
            validation_iterations(val_items, own) if own else iters
            for own, iters in zip(definition.test_batches, training.test_iters, strict=True)
        ]
    if epochs is not None and definition.net_batch and train_items:  # at the net's own batch until planned
        definition.max_iter = epochs * iterations_per_epoch(train_items, definition.net_batch)
    return definition


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


NVCAFFE_REFUSAL = "this server trains with {caffe}; this net needs NVcaffe"
CHANGE_CAFFE = "MEMPLUGIN_CAFFE_ROOT, serve --caffe-root or train --caffe-root"
"""The setting that names the Caffe that trains (caffe_build.py)."""


@dataclasses.dataclass(frozen=True)
class Trainer:
    """What load_definition needs to know of the Caffe that trains: its flavour, and how to name it to people."""

    flavour: str = BVLC
    label: str = "BVLC Caffe (the bundled pycaffe)"


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


def _unique_params(training: TrainingDefinition) -> list[Any]:
    """Each NetParameter once: a generic net serves as the train net and the test nets (one object)."""
    seen: dict[int, Any] = {}
    for net in (training.train, *training.tests):
        seen.setdefault(id(net.param), net.param)
    return list(seen.values())


def data_phases(layer: Any) -> set[str]:
    """The phases ("train", "test") a data layer feeds, from its include rules: a phase, or DIGITS' stages (its
    solver trains with stage "train" and validates with stage "val"); a layer with neither feeds both."""
    phases = {"train" if rule.phase == caffe_pb2.TRAIN else "test" for rule in layer.include if rule.HasField("phase")}
    if phases:
        return phases
    stages = {stage for rule in layer.include for stage in rule.stage}
    return ({"train"} if "train" in stages else set()) | ({"test"} if "val" in stages else set()) or {"train", "test"}


def _apply_data_overrides(params: list[Any], data: dict[str, str]) -> set[int]:
    """Replace data sources: a key names a layer, or a phase ("train", "test": that phase's data layers, as DIGITS
    assigns its train and validation databases). A layer's own name wins over its phase. The layers whose source
    was replaced, by id() (names are not unique: LeNet's TRAIN and TEST data layers are both "mnist")."""
    phase_keys = {key.lower(): key for key in data if key.lower() in ("train", "test")}
    used: set[str] = set()
    replaced: set[int] = set()
    for param in params:
        for layer in param.layer:
            field = DATA_SOURCE_FIELDS.get(layer.type)
            key = None
            if layer.name in data:
                key = layer.name
            elif field is not None and phase_keys:
                names = data_phases(layer)
                matching = [phase_keys[name] for name in sorted(names) if name in phase_keys]
                if len(matching) > 1:
                    raise NetError(
                        f"data layer {layer.name!r} is in both phases; give its source by its name, not by phase",
                        layer=layer.name, layer_type=layer.type, field="data",
                    )
                key = matching[0] if matching else None
            if key is None:
                continue
            if field is None:
                raise NetError(
                    f"data names layer {layer.name!r}, a {layer.type} layer, which reads no data source",
                    layer=layer.name, layer_type=layer.type, field="data",
                )
            getattr(layer, field).source = data[key]
            if layer.type == "Data" and not layer.data_param.HasField("backend"):
                # Unset means LevelDB, which this Caffe is built without; DIGITS sets LMDB for its datasets too.
                layer.data_param.backend = caffe_pb2.DataParameter.LMDB
            used.add(key)
            replaced.add(id(layer))
    unused = sorted(set(data) - used)
    if unused:
        raise NetError(f"data names layers or phases the net does not have: {', '.join(unused)}", field="data")
    return replaced


def _string_fields(message: Any, path: str = "") -> Iterator[tuple[Any, Any, str]]:
    """(message, field descriptor, dotted path) of every set string field, nested messages included."""
    for field, value in message.ListFields():
        dotted = f"{path}.{field.name}" if path else field.name
        if field.type == field.TYPE_MESSAGE:
            items = value if field.label == field.LABEL_REPEATED else [value]
            for item in items:
                yield from _string_fields(item, dotted)
        elif field.type == field.TYPE_STRING and field.label != field.LABEL_REPEATED:
            yield message, field, dotted


class _Confiner:
    """Checks and rewrites one layer's paths."""

    def __init__(self, folder: Path, roots: list[Path], replaced: set[int] | None = None) -> None:
        self.folder = folder
        self.roots = roots
        self.replaced = replaced or set()
        """Layers (by id) whose source the request's `data` gave: an error about that source is a DataSourceError."""
        self._lists: dict[tuple[str, str, str], str] = {}

    def layer(self, layer: Any) -> None:
        if layer.type in REFUSED_LAYERS:
            raise NetError(REFUSED_LAYERS[layer.type], layer=layer.name, layer_type=layer.type, field="type")
        for message, field, dotted in list(_string_fields(layer)):
            if message is layer:
                continue  # the layer's own name, type, tops and bottoms
            kind = HANDLED_FIELDS.get((message.DESCRIPTOR.name, field.name))
            value = getattr(message, field.name)
            if kind is None:
                if PATH_LIKE.search(field.name) and value:
                    raise NetError(
                        f"{dotted} names a file or folder, which jobs do not support for this field",
                        layer=layer.name, layer_type=layer.type, field=dotted,
                    )
                continue
            if not value:
                continue
            try:
                self._handle(layer, message, field.name, dotted, kind, value)
            except NetError as error:
                if id(layer) in self.replaced and dotted in SOURCE_FIELDS and not isinstance(error, DataSourceError):
                    raise DataSourceError(error.message, layer=layer.name, layer_type=layer.type, field=dotted) from None
                raise

    def _handle(self, layer: Any, message: Any, name: str, dotted: str, kind: str, value: str) -> None:
        where = {"layer": layer.name, "layer_type": layer.type, "field": dotted}
        if kind == READ_FILE:
            setattr(message, name, str(self.read(value, where, want="file")))
        elif kind == READ_DB:
            folder = self.read(value, where, want="dir")
            if message.backend == caffe_pb2.DataParameter.LMDB:
                lmdb_data_file(folder, self.roots, name=value, **where)  # the file LMDB opens, not only its folder
            setattr(message, name, str(folder))
        elif kind == HDF5_LIST:
            setattr(message, name, self.hdf5_list(value, where))
        elif kind == IMAGE_LIST:
            if name == "source":
                param = message
                setattr(message, name, self.image_list(value, param.root_folder, where))
                param.root_folder = ""
        elif kind == WRITE_FILE:
            setattr(message, name, str(self.output(value, where, folder=False)))
        elif kind == WRITE_DIR:
            setattr(message, name, str(self.output(value, where, folder=True)))
        elif kind == FILE_NAME and ("/" in value or value in (".", "..")):
            raise NetError(f"{value!r} must be a plain name, not a path", **where)

    def read(self, value: str, where: Mapping[str, Any], *, want: str, base: Path | None = None) -> Path:
        """The path `value` names, resolved inside a dataset root; relative paths are tried against each root
        (or against `base`, the folder of the list file naming them)."""
        return find_in_roots(value, self.roots, want=want, base=base, **where)

    def _list_path(self, kind: str, value: str, where: Mapping[str, Any]) -> tuple[Path, bool]:
        key = (kind, str(where["layer"]), value)
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{where['layer']}_{kind}")
        path = self.folder / "data" / f"{name}_{len(self._lists)}.txt"
        if key in self._lists:
            return Path(self._lists[key]), True
        self._lists[key] = str(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        return path, False

    def _read_list(self, value: str, where: Mapping[str, Any]) -> tuple[Path, list[str]]:
        listing = self.read(value, where, want="file")
        data = read_regular(listing, MAX_LIST_BYTES, name=value, roots=self.roots, **where)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise NetError(f"{value} is not a UTF-8 list file", **where) from None
        return listing, [line.strip() for line in text.splitlines() if line.strip()]

    def hdf5_list(self, value: str, where: Mapping[str, Any]) -> str:
        """An HDF5Data source: a list of .h5 files (or one .h5 file), rewritten with each file checked."""
        path, done = self._list_path("hdf5", value, where)
        if done:
            return str(path)
        if value.endswith((".h5", ".hdf5")):
            files = [self.read(value, where, want="file")]
        else:
            # Checked in a dataset reader, with a deadline: a list of 40,000 lines held the server's thread 3.5 s.
            listing = self.read(value, where, want="file")
            files = hdf5_list_files(listing, self.roots, name=value, **where)
        path.write_text("".join(f"{file}\n" for file in files), encoding="utf-8")
        return str(path)

    def image_list(self, value: str, root_folder: str, where: Mapping[str, Any]) -> str:
        """An ImageData source: "image label" lines, rewritten with absolute paths checked against the roots."""
        path, done = self._list_path("images", value, where)
        if done:
            return str(path)
        listing, lines = self._read_list(value, where)
        folder_field = {**where, "field": str(where["field"]).rpartition(".")[0] + ".root_folder"}
        base = self.read(root_folder, folder_field, want="dir") if root_folder else listing.parent
        out = []
        # Up to a million lines, each resolved here, in the server's thread: it takes turns with the other
        # requests, and stops at the read's deadline.
        turns, deadline = Turns(), time.monotonic() + READ_SECONDS
        for number, line in enumerate(lines):
            turns.take()
            if time.monotonic() > deadline:
                raise NetError(f"{value} lists {len(lines)} images, more than could be checked in the "
                               f"{READ_SECONDS:g} s there was time for ({number} were); not read in full", **where)
            image, _, label = line.rpartition(" ")
            if not image:
                image, label = label, ""
            resolved = real_path(base / image if not Path(image).is_absolute() else Path(image), image, **where)
            if not any(resolved.is_relative_to(root) for root in self.roots):
                raise NetError(f"{value} lists {image}, which is outside the dataset folders", **where)
            out.append(f"{resolved} {label}".rstrip())
        path.write_text("".join(f"{line}\n" for line in out), encoding="utf-8")
        return str(path)

    def output(self, value: str, where: Mapping[str, Any], *, folder: bool) -> Path:
        """A path a layer writes to: lexically inside ``<job>/outputs`` (a relative path is taken from there), with
        no link on the way; its folders are made now (and checked again at each attempt: `confirm_outputs`)."""
        target = output_path(self.folder, value, where)
        make_output_folders(self.folder, target, where, folder=folder)
        return target


OUTPUTS = "outputs"
"""The job folder's subfolder layers write into (HDF5Output's files): the only place a net's own paths may write."""


def output_path(folder: Path, value: str, where: Mapping[str, Any]) -> Path:
    """`value` (a layer's output path) inside the job's outputs folder, by its letters alone: `..` is taken
    against the path, never against what a link there points to, so ``../data/lmdb/...`` is outside (it was
    checked after resolving links, when the folder it names did not exist yet). NetError when it is outside."""
    if "\0" in value:
        raise NetError(f"{shown(value)} holds a NUL byte, which no file name can", **where)
    outputs = Path(os.path.normpath(folder.resolve() / OUTPUTS))
    target = Path(os.path.normpath(value if os.path.isabs(value) else outputs / value))
    if target == outputs or not target.is_relative_to(outputs):
        raise NetError(
            f"{value} is outside the job's outputs folder; layers may only write inside outputs/ (give a name "
            "such as \"features.h5\")", **where,
        )
    return target


def make_output_folders(job: Path, target: Path, where: Mapping[str, Any], *, folder: bool) -> None:
    """The folders on the way to an output `target` (and `target` itself when the layer writes a folder), made
    where missing, one at a time from the job's folder: each must be a real folder, never a link; an output file
    that exists already must be a regular file. NetError naming the component otherwise, and nothing written."""
    job = job.resolve()
    parts = target.relative_to(job).parts
    folders = parts if folder else parts[:-1]
    current = job
    for part in folders:
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            current.mkdir()
            continue
        if not stat.S_ISDIR(mode):
            what = "a link" if stat.S_ISLNK(mode) else file_kind(mode)
            raise NetError(f"{current.relative_to(job)} in the job's folder is {what}, not a folder; not written "
                           "through", **where)
    if folder:
        return
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        what = "a link" if stat.S_ISLNK(mode) else file_kind(mode)
        raise NetError(f"{target.relative_to(job)} in the job's folder is {what}; not written through", **where)
    if os.lstat(target).st_nlink > 1:
        raise NetError(f"{target.relative_to(job)} in the job's folder has other names (a hard link); not written "
                       "through", **where)


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


# --- per attempt -------------------------------------------------------------------------------------------------

WRITTEN_FOLDERS = ("attempts", "snapshots", "outputs", "data")
"""The job folder's subfolders the server and the training child write into."""


def check_job_folder(jobs_root: Path, folder: Path) -> None:
    """Before an attempt writes anything: the job's folder and the subfolders written into are real folders inside
    the jobs root, with no symlink among them or among their files. Nothing a user sends creates a link there;
    this holds the promise that a job writes only inside its folder even when someone with access to the data
    folder planted one (the child would write its log and snapshots through it)."""
    root = jobs_root.resolve()
    if folder.is_symlink() or folder.resolve().parent != root:
        raise NetError(f"the job's folder {folder.name} is a link or lies outside the jobs folder; not written into")
    for name in WRITTEN_FOLDERS:
        sub = folder / name
        if sub.is_symlink() or (sub.exists() and not sub.is_dir()):
            raise NetError(f"{name}/ in the job's folder is a link or not a folder; not written into")
        if name == "data":
            continue  # list files the server wrote at submission; the child only reads them
        for path in sub.rglob("*") if sub.is_dir() else ():
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                raise NetError(f"{path.relative_to(folder)} in the job's folder is a link; not written through")
            if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
                # A hard link is the same file under another name, perhaps a dataset's: Caffe truncates and
                # rewrites snapshots and outputs by name, and the child's confinement allows that path.
                raise NetError(f"{path.relative_to(folder)} in the job's folder has other names (a hard link); not "
                               "written through")


LMDB_FOLDER = "data/lmdb"
"""Under the job's folder: one folder per LMDB the job reads, made again for each attempt, whose data.mdb links
to the dataset's data file; the child's LMDB writes its lock.mdb there."""
CHANGED = "changed since the job was submitted"
MAX_READ_RULES = 4096
"""Dataset paths granted one by one to the training child (jobs.child.confinement); beyond, the roots holding them."""


class _Recheck:
    """Paths checked at submission, checked again: each must still be its own real path (no link on it), of the
    same kind, inside the roots. Folders' real paths are remembered, so an image list costs an lstat per image."""

    def __init__(self, roots: Sequence[Path]) -> None:
        self.roots = roots
        self._folders: dict[str, bool] = {}
        self.reads: dict[str, None] = {}
        """What the child may read, in the order checked: each file, or the folder of each image."""

    def _real_folder(self, folder: str) -> bool:
        real = self._folders.get(folder)
        if real is None:
            real = self._folders[folder] = os.path.realpath(folder) == folder
        return real

    def path(self, value: str, where: Mapping[str, Any], *, want: str, missing_ok: bool = False) -> None:
        path = os.path.normpath(value)
        if not os.path.isabs(path) or not inside(path, self.roots):
            raise NetError(f"{value} {CHANGED}: it is not inside the dataset folders any more; not read", **where)
        if not self._real_folder(os.path.dirname(path)):
            raise NetError(f"{value} {CHANGED}: a link now stands on its path; not read", **where)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            if missing_ok:
                return
            raise NetError(f"{value} {CHANGED}: it no longer exists", **where) from None
        except OSError as error:
            raise NetError(f"{value} cannot be read: {(error.strerror or str(error)).lower()}", **where) from None
        if stat.S_ISLNK(mode):
            raise NetError(f"{value} {CHANGED}: it is now a link; not read", **where)
        if want == "dir" and not stat.S_ISDIR(mode):
            raise NetError(f"{value} {CHANGED}: it is no longer a folder ({file_kind(mode)}); not read", **where)
        if want == "file" and not stat.S_ISREG(mode):
            raise NetError(f"{value} {CHANGED}: it is no longer a regular file ({file_kind(mode)}); not read", **where)

    def grant(self, path: str | os.PathLike[str]) -> None:
        self.reads.setdefault(os.path.normpath(path))

    def granted(self) -> tuple[str, ...]:
        """The paths the child's confinement lets it read; past MAX_READ_RULES, the dataset roots holding them (one
        rule per image would pin a million inodes in the kernel)."""
        if len(self.reads) <= MAX_READ_RULES:
            return tuple(self.reads)
        return tuple(str(root) for root in self.roots if any(inside(path, [root]) for path in self.reads))


def _listed(list_file: str, folder: Path, where: Mapping[str, Any]) -> list[str]:
    """The lines of a list file the server wrote into the job's data folder at submission."""
    data_folder = (folder / "data").resolve()
    text = read_regular(list_file, MAX_LIST_BYTES, name=Path(list_file).name, roots=[data_folder], **where)
    return [line.strip() for line in text.decode("utf-8", "replace").splitlines() if line.strip()]


@dataclasses.dataclass(frozen=True)
class ConfirmedData:
    """What `confirm_data` found still as it was checked: what the child is handed and may read."""

    lmdb: dict[str, str]
    """For each LMDB source, the folder of the job's own the child is handed (see LMDB_FOLDER)."""
    reads: tuple[str, ...]
    """The dataset paths the child may read: each LMDB data file, read file and HDF5 file, each image's folder."""


def confirm_data(definition: JobDefinition, folder: Path) -> ConfirmedData:
    """Just before an attempt's child starts: every path the job reads, checked again (the data may have changed
    while the job waited, or between attempts). A NetError names the path and what changed; nothing is written
    then."""
    check = _Recheck(definition.roots)
    turns = Turns()  # a list of thousands of files is checked in the server's thread: others get their turns
    lmdbs: dict[str, Path] = {}
    for param in _unique_params(definition.training):
        for layer in param.layer:
            for message, field, dotted in _string_fields(layer):
                kind = HANDLED_FIELDS.get((message.DESCRIPTOR.name, field.name))
                value = getattr(message, field.name)
                if not value or kind not in (READ_FILE, READ_DB, HDF5_LIST, IMAGE_LIST):
                    continue
                where = {"layer": layer.name, "layer_type": layer.type, "field": dotted}
                if kind == READ_FILE:
                    check.path(value, where, want="file")
                    check.grant(value)
                elif kind == READ_DB:
                    check.path(value, where, want="dir")
                    if message.backend == caffe_pb2.DataParameter.LMDB and value not in lmdbs:
                        try:
                            lmdbs[value] = lmdb_data_file(Path(value), definition.roots, name=value, **where)
                        except NetError as error:
                            raise NetError(f"the data {CHANGED}: {error.message}", **where) from None
                        check.grant(lmdbs[value])
                elif kind == HDF5_LIST:
                    for entry in dict.fromkeys(_listed(value, folder, where)):  # a file named again is checked once
                        check.path(entry, where, want="file")
                        check.grant(entry)
                        turns.take()
                elif kind == IMAGE_LIST and field.name == "source":
                    for line in _listed(value, folder, where):
                        turns.take()
                        image, _, label = line.rpartition(" ")
                        check.path(image or label, where, want="file", missing_ok=True)  # Caffe says if one is missing
                        check.grant(os.path.dirname(os.path.normpath(image or label)))
    return ConfirmedData(_lmdb_folders(folder, lmdbs), check.granted())


def confirm_outputs(definition: JobDefinition, folder: Path) -> None:
    """Just before an attempt's child starts: every path a layer writes is still inside the job's outputs folder
    by its letters, with real folders on the way (made where missing) and no link at its end (someone with access
    to the data folder may have planted one while the job waited). NetError naming it; nothing written then."""
    for param in _unique_params(definition.training):
        for layer in param.layer:
            for message, field, dotted in _string_fields(layer):
                kind = HANDLED_FIELDS.get((message.DESCRIPTOR.name, field.name))
                value = getattr(message, field.name)
                if not value or kind not in (WRITE_FILE, WRITE_DIR):
                    continue
                where = {"layer": layer.name, "layer_type": layer.type, "field": dotted}
                make_output_folders(folder, output_path(folder, value, where), where, folder=kind == WRITE_DIR)


def _lmdb_folders(folder: Path, lmdbs: Mapping[str, Path]) -> dict[str, str]:
    """The job's own LMDB folders, made afresh: `<job>/data/lmdb/<n>-<name>/data.mdb` -> the dataset's data file."""
    base = folder / LMDB_FOLDER
    if os.path.lexists(base):
        if base.is_symlink() or not base.is_dir():
            base.unlink()  # not ours: removed, never followed
        else:
            shutil.rmtree(base)
    base.mkdir(parents=True)
    handed: dict[str, str] = {}
    for index, (source, data_file) in enumerate(lmdbs.items()):
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(source).name).strip(".") or "lmdb"
        own = base / f"{index}-{name}"
        own.mkdir()
        (own / LMDB_DATA_FILE).symlink_to(data_file)
        handed[source] = str(own.resolve())
    return handed


@dataclasses.dataclass(frozen=True)
class AttemptFiles:
    """The generated files of one attempt, relative to the job's folder."""

    solver: str
    nets: list[str]
    snapshot_prefix: str
    reads: tuple[str, ...] = ()
    """The dataset paths the child may read (`ConfirmedData.reads`)."""
    writes: tuple[str, ...] = ()
    """The folders the child may write beneath, relative to the job's folder (ATTEMPT_WRITES and its own)."""


ATTEMPT_WRITES = (OUTPUTS, "snapshots", LMDB_FOLDER)
"""What every attempt's child may write beneath, besides its own attempts/N folder (its log and records): layers'
outputs, snapshots, and the LMDB folders where Caffe's LMDB writes its lock table. Never data/ (the list files),
never the datasets."""


def set_batch(net: Any, state: Any, source: str, batch: int) -> None:
    """The batch of every data layer `state` includes: what the estimator's batch override models."""
    for _, layer in filter_layers(net, state, source, []):
        for field in ("data_param", "hdf5_data_param", "image_data_param", "memory_data_param", "window_data_param"):
            if layer.HasField(field):
                getattr(layer, field).batch_size = batch
        if layer.type == "Input":
            for shape in layer.input_param.shape:
                if len(shape.dim):
                    shape.dim[0] = batch
        if layer.type == "DummyData":
            param = layer.dummy_data_param
            for shape in param.shape:
                if len(shape.dim):
                    shape.dim[0] = batch
            for index in range(len(param.num)):
                param.num[index] = batch


def test_iters(definition: JobDefinition, test_batch: int | None) -> list[int]:
    """Each test net's test_iter at `test_batch`: raised so that a test pass still covers as many items."""
    iters = []
    for index, own in enumerate(definition.test_batches):
        base = definition.training.test_iters[index] if index < len(definition.training.test_iters) else 1
        if test_batch is None or own is None or test_batch >= own:
            iters.append(base)
        else:
            iters.append(math.ceil(base * own / test_batch))
    return iters


def snapshot_prefix(solver: Any) -> str:
    """Snapshots go to ``snapshots/<name>`` in the job's folder, named after the solver's own prefix."""
    name = Path(solver.snapshot_prefix).name if solver.snapshot_prefix else ""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", name).strip(".") or "snapshot"
    return f"snapshots/{name}"


def write_attempt(
    definition: JobDefinition,
    folder: Path,
    attempt_dir: str,
    *,
    batch_size: int,
    iter_size: int,
    test_batch: int | None,
    gpu: int | None,
    caffe_runs: bool = False,
    max_iter: int | None = None,
    test_interval: int | None = None,
) -> AttemptFiles:
    """Write the attempt's nets and solver under ``<folder>/<attempt_dir>``: the train net at `batch_size`, the test
    nets at `test_batch` (None: their own), the solver with `iter_size`, the snapshot prefix in the job's folder,
    CPU or GPU `gpu` (CUDA's number in the child). Caffe's own testing and snapshots are off (the pycaffe runner
    does both), or, with `caffe_runs` (`caffe train` trains: the binary runner), on as the job's solver has them,
    with `display: 1`, so that its log says every test, update and snapshot; `max_iter` and `test_interval` are the
    attempt's (JobDefinition.length; None: the definition's). Each message is written with its own
    schema (NVcaffe's for an NVcaffe net). The job's data and outputs are checked again first (`confirm_data`,
    `confirm_outputs`): a NetError then, and nothing is written."""
    training = definition.training
    confirm_outputs(definition, folder)
    confirmed = confirm_data(definition, folder)
    handed = confirmed.lmdb
    (folder / attempt_dir).mkdir(parents=True, exist_ok=True)
    (folder / "snapshots").mkdir(exist_ok=True)
    nets = []

    def write(net: Any, phase: str, state: Any, batch: int | None, name: str) -> str:
        copy = type(net.param)()
        copy.CopyFrom(net.param)
        for layer in copy.layer:
            if layer.HasField("data_param") and layer.data_param.source in handed:
                layer.data_param.source = handed[layer.data_param.source]
        if batch is not None:
            set_batch(copy, net_state(copy, phase, state), net.source, batch)
        relative = f"{attempt_dir}/{name}"
        (folder / relative).write_text(text_format.MessageToString(copy), encoding="utf-8")
        nets.append(relative)
        return relative

    own = definition.solver  # training_definition always has the solver of a job
    solver = type(own)()
    solver.CopyFrom(own)
    for field in ("net", "net_param", "train_net", "train_net_param", "test_net", "test_net_param", "test_state"):
        solver.ClearField(field)
    solver.train_net = write(training.train, PHASE_TRAIN, training.train.state, batch_size, "train.prototxt")
    if training.train.state is not None:
        solver.train_state.CopyFrom(training.train.state)
    solver.ClearField("test_iter")
    for index, test in enumerate(training.tests):
        solver.test_net.append(write(test, PHASE_TEST, test.state, test_batch, f"test{index}.prototxt"))
        solver.test_iter.append(test_iters(definition, test_batch)[index])
        if test.state is not None:
            solver.test_state.add().CopyFrom(test.state)
        else:
            solver.test_state.add()  # an empty state merges nothing, as if none were given
    solver.iter_size = iter_size
    solver.max_iter = max_iter if max_iter is not None else definition.max_iter
    if caffe_runs:  # as the job's solver says, and every update displayed: the log is what the records are read from
        solver.display = 1
        if training.tests and test_interval:
            solver.test_interval = test_interval
        if training.tests and not (test_interval or own.test_interval):
            solver.test_interval = 2**31 - 1  # test nets and no interval: Caffe needs one, the runner never tests
            solver.test_initialization = False
    else:
        solver.test_interval = 2**31 - 1  # never: the runner tests, so results are reported (Caffe needs > 0)
        solver.test_initialization = False
        solver.snapshot = 0  # the runner snapshots, so that each one is reported
        solver.snapshot_after_train = False
    prefix = snapshot_prefix(training.solver)
    solver.snapshot_prefix = prefix
    if gpu is None:
        solver.solver_mode = solver.CPU
        solver.ClearField("device_id")
    else:
        solver.solver_mode = solver.GPU
        solver.device_id = gpu
    relative = f"{attempt_dir}/solver.prototxt"
    (folder / relative).write_text(text_format.MessageToString(solver), encoding="utf-8")
    return AttemptFiles(relative, nets, prefix, confirmed.reads, (*ATTEMPT_WRITES, attempt_dir))
