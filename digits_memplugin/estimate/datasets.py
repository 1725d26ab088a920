"""Item shapes of the datasets a net's data layers read, from the datasets themselves (LMDB, HDF5).

Caffe learns a Data layer's shape from the first record of its LMDB and an HDF5Data layer's from its files; the
estimator needs the same shapes. This module opens what the net names, read-only, and only where the caller
allows (`allowed` roots): the web server must not read arbitrary paths a user typed into a prototxt.

An LMDB is a folder, but what LMDB opens are the files in it: `data.mdb`, and `lock.mdb` for its reader table.
Each file is checked, not only the folder: the data file must be a regular file inside the roots (a link out of
them, a FIFO, a device is refused), and it is opened through files.open_regular, which never opens anything
else; LMDB then maps that very file (/proc/self/fd) with no lock file at all, so `lock.mdb` is never opened here.
LMDB's map must not reach past the file's end (a page there is a SIGBUS): the file's size is checked against the
pages its meta page says it holds before it is mapped, and a shorter file (a truncated copy) is refused.

An HDF5 file can make the library open other files: an external link (to a file, or to a FIFO that blocks the
reader), a dataset whose values lie in external files (`external=`), a virtual dataset. Links are followed here
one at a time, only inside the file (hard and soft links); the others, and such datasets, are refused without
being followed, before the dataset's shape is asked for (the library opens a virtual dataset's sources then).

The reads run in a reader process (dataset_reader.py): what the checks cannot see (a file truncated between the
check and the read, a crafted file) ends that process, never the server, and every read has a deadline. This
module is the server's side of them (paths checked without opening anything, the reader's answer checked);
lmdb_reads.py and hdf5_reads.py are what the reader does, reader_tasks.py their names.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.errors import NetError
from ..core.inputs import shown
from ..core.layers.data import DataSpec
from ..core.proto import caffe_pb2
from .dataset_reader import ReaderCrashed, ReadTimedOut
from .dataset_reader import read as read_in_reader
from .files import file_kind, inside

LMDB_DATA_FILE = "data.mdb"
"""The data file of an LMDB folder (Caffe opens LMDBs as folders, never as single files)."""
MAX_LIST_BYTES = 64 * 1024 * 1024
"""Largest HDF5 list file read."""
READ_SECONDS = 20.0
"""How long one dataset may take to read where the caller sets no bound (a job's submission, an estimate, the
form's source); the scan of the dataset roots gives its own."""
MAX_JOB_LIST_LINES = 200_000
"""Lines of an HDF5 list a job may read (Caffe's HDF5Data loads each file whole, one after the other: the lists
DIGITS writes name a handful); the issue's list of one file named 40,000 times is taken."""
MAX_JOB_LIST_ANSWER = 768 * 1024
"""Bytes the real paths of a job's HDF5 list take, with its runs of lines, in the reader's answer (which is at
most dataset_reader.MAX_ANSWER)."""


def nul_refusal(value: str) -> str:
    """What is wrong with a path holding a NUL (pathlib raises ValueError on one: it was a 500)."""
    return f"{shown(value)!r} contains a NUL character, which no file name can hold"


def no_nul(value: str, **where: Any) -> None:
    if "\x00" in value:
        raise NetError(nul_refusal(value), **where)


def find_in_roots(
    value: str, roots: Sequence[Path], *, want: str, base: Path | None = None, **where: Any
) -> Path:
    """The real path `value` names (links resolved) inside a dataset root (`roots` resolved): an absolute path as
    it is, a relative one tried against each root in turn, or against `base` (the folder of the list file naming
    it); `want` "file" or "dir". A NetError with `where` says why not (never naming a link's target). Only stat and
    readlink are called: nothing is opened."""
    if "\x00" in value:  # pathlib raises ValueError on it (a 500), and no file name holds one
        raise NetError(nul_refusal(value), **where)
    path = Path(value)
    if not roots:
        raise NetError("no dataset folders are configured (MEMPLUGIN_DATASET_ROOTS): jobs cannot read data", **where)
    candidates = [path] if path.is_absolute() else ([base / path] if base is not None else [r / path for r in roots])
    outside = False
    for candidate in candidates:
        try:
            resolved = real_path(candidate, value, **where)
        except OSError as error:
            raise NetError(f"{shown(value)} cannot be looked up: {os.strerror(error.errno or 0)}", **where) from None
        if not any(resolved == root or resolved.is_relative_to(root) for root in roots):
            outside = True
            continue
        try:
            if (want == "file" and resolved.is_file()) or (want == "dir" and resolved.is_dir()):
                return resolved
        except OSError as error:  # a name longer than the file system takes (ENAMETOOLONG), and the like
            raise NetError(f"{shown(value)} cannot be looked up: {os.strerror(error.errno or 0)}", **where) from None
    if outside:
        raise NetError(f"{value} is outside the dataset folders this server may read", **where)
    noun = "folder" if want == "dir" else "file"
    raise NetError(f"{value} does not exist (as a {noun}) in the dataset folders", **where)


def real_path(path: Path, name: str, **where: Any) -> Path:
    """`path.resolve()`, but a loop of links (Python 3.11's resolve() raises RuntimeError on one: it was a 500)
    is a NetError naming it as `name`."""
    try:
        return path.resolve()
    except RuntimeError:
        raise NetError(f"{shown(name)} cannot be looked up: its links lead round in a loop", **where) from None


def _confined(path: Path, allowed: Iterable[Path] | None, layer: str, field: str, name: str | None = None) -> Path:
    resolved = real_path(path, name or str(path), layer=layer, field=field)
    if allowed is not None:
        roots = [Path(root).resolve() for root in allowed]
        if not any(resolved == root or resolved.is_relative_to(root) for root in roots):
            raise NetError(f"{path} is outside the dataset folders this server may read", layer=layer, field=field)
    return resolved


def lmdb_data_file(folder: Path, roots: Iterable[Path] | None, *, name: str, **where: Any) -> Path:
    """The real path of the data file of the LMDB `folder` (links resolved), checked without opening anything: a
    regular file inside `roots` (resolved). `name` is how messages show the folder (the path a user gave)."""
    shown = f"{name.rstrip('/')}/{LMDB_DATA_FILE}"
    no_nul(str(folder), **where)
    real = Path(os.path.realpath(folder / LMDB_DATA_FILE))
    if roots is not None and not inside(real, roots):
        raise NetError(f"{shown} is outside the dataset folders this server may read", **where)
    try:
        mode = os.stat(real).st_mode  # stat, not open: stat never waits on a FIFO nor acts on a device
    except FileNotFoundError:
        raise NetError(f"{shown} does not exist: {name} is not an LMDB folder", **where) from None
    except OSError as error:
        raise NetError(f"cannot read {shown}: {(error.strerror or str(error)).lower()}", **where) from None
    if not stat.S_ISREG(mode):
        raise NetError(f"{shown} is not a regular file ({file_kind(mode)}); not read", **where)
    return real


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a dataset holds: its items' specs by top, how many items, and the bytes its files take on disk."""

    specs: dict[str, DataSpec]
    entries: int
    """Records of an LMDB, rows of every file of an HDF5 list together: the most items one pass can hold."""
    disk_bytes: int

    def to_json(self) -> dict[str, Any]:
        specs = {top: {"shape": list(spec.shape), "rows": spec.rows, "itemsize": spec.stored_itemsize}
                 for top, spec in self.specs.items()}
        return {"specs": specs, "entries": self.entries, "disk_bytes": self.disk_bytes}

    @classmethod
    def from_json(cls, document: Any) -> DatasetInfo:
        """The reader's answer, checked (it read hostile files): ValueError when it is not what to_json writes."""

        def count(value: Any) -> int:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{value!r} is not a count")
            return value

        if not isinstance(document, dict) or not isinstance(document.get("specs"), dict):
            raise ValueError("not a dataset's facts")
        specs = {}
        for top, spec in document["specs"].items():
            if not isinstance(spec, dict) or not isinstance(spec.get("shape"), list) or len(spec["shape"]) > 32:
                raise ValueError(f"no shape for {top!r}")
            rows = spec.get("rows")
            specs[str(top)] = DataSpec(
                tuple(count(d) for d in spec["shape"]), rows=None if rows is None else count(rows),
                stored_itemsize=count(spec.get("itemsize")),
            )
        return cls(specs, count(document.get("entries")), count(document.get("disk_bytes")))


def lmdb_item(path: Path, layer: str, allowed: Iterable[Path] | None = None, *, name: str | None = None) -> DataSpec:
    """The first Datum of an LMDB: its stored shape, and whether it holds bytes or floats. With `allowed`, its data
    file must lie inside those folders; `name` is how messages show the folder (default: `path`)."""
    return lmdb_info(path, layer, allowed, name=name).specs["data"]


def lmdb_info(
    path: Path, layer: str, allowed: Iterable[Path] | None = None, *, name: str | None = None,
    seconds: float = READ_SECONDS,
) -> DatasetInfo:
    """`lmdb_item`, with the LMDB's record count (its stat: nothing is read past the first record) and the size its
    data file takes on disk (an LMDB's file is sparse up to its map size: its blocks, not its length). Read in a
    reader process within `seconds` (ReadTimedOut past them)."""
    name = name or str(path)
    shown = f"{name.rstrip('/')}/{LMDB_DATA_FILE}"
    where: dict[str, Any] = {"layer": layer, "layer_type": "Data", "field": "data_param.source"}
    no_nul(str(path), **where)
    arguments = {"path": os.path.abspath(path), "layer": layer, "name": name, "roots": _roots_json(allowed)}
    try:
        answer = read_in_reader("lmdb", arguments, seconds=seconds)
    except ReaderCrashed as crash:
        why = (
            "LMDB read past the end of the file (it was cut while it was read, or it is damaged)"
            if crash.ended == "SIGBUS" else "the file may be damaged"
        )
        raise _crashed(crash, f"LMDB {shown}", why, where) from None
    except ReadTimedOut as error:
        raise ReadTimedOut(f"LMDB {shown}: {error.message}", **where) from None
    return _facts(answer, f"LMDB {shown}", where)


def hdf5_items(listing: Path, tops: list[str], layer: str, allowed: Iterable[Path] | None) -> dict[str, DataSpec]:
    """Shapes of each top's dataset in the HDF5 files a list file names (relative names from the list's folder);
    rows of the largest file. Every file, the list included, is opened only if it is a regular file (inside
    `allowed`): a FIFO named there would otherwise stop the reader until someone writes to it."""
    return hdf5_info(listing, tops, layer, allowed).specs


def hdf5_info(
    listing: Path, tops: list[str], layer: str, allowed: Iterable[Path] | None, *, name: str | None = None,
    seconds: float = READ_SECONDS,
) -> DatasetInfo:
    """`hdf5_items`, with the rows of all the files together and the bytes they take on disk; `name` is how
    messages show the list (default: `listing`). Read in a reader process within `seconds`: a list naming more
    files than that allows is a ReadTimedOut saying how far it got."""
    where: dict[str, Any] = {"layer": layer, "layer_type": "HDF5Data", "field": "hdf5_data_param.source"}
    no_nul(str(listing), **where)
    name = name or str(listing)
    arguments = {"listing": os.path.abspath(listing), "shown": name, "tops": list(tops), "layer": layer,
                 "roots": _roots_json(allowed)}
    answer = _read_hdf5_list("hdf5", arguments, seconds, name, "one of its files may be damaged", where)
    return _facts(answer, f"HDF5 list file {name}", where)


def hdf5_list_files(
    listing: Path, roots: Sequence[Path], *, name: str, seconds: float = READ_SECONDS, **where: Any
) -> list[Path]:
    """The files the HDF5 list file `listing` (a regular file inside `roots`, resolved) names, one a line, each the
    real path of a regular file inside `roots` (relative names from the list's folder), in the list's order (a
    file named again is there again): what a job's HDF5Data layer is handed. Checked in a reader process within
    `seconds` (a list of 40,000 lines kept the server's one thread 3.5 s when it was checked there): a list it
    cannot check in time is a ReadTimedOut saying how far it got, one of more than MAX_JOB_LIST_LINES lines or
    naming files whose names take more than MAX_JOB_LIST_ANSWER bytes a NetError; `name` is how messages show it."""
    no_nul(str(listing), **where)
    arguments = {"listing": os.path.abspath(listing), "shown": name, "roots": _roots_json(roots), "where": dict(where)}
    answer = _read_hdf5_list("hdf5_list", arguments, seconds, name, "the list may be damaged", where)
    try:
        return _listed_files(answer)
    except ValueError as error:
        raise NetError(f"reading HDF5 list file {name}: the reader answered nonsense ({error})", **where) from None


def _listed_files(answer: Any) -> list[Path]:
    """The reader's answer to "hdf5_list", checked (it read a hostile file): ValueError when it is not one."""
    if not isinstance(answer, dict) or not isinstance(answer.get("files"), list) or not isinstance(answer.get("runs"), list):
        raise ValueError("not a list's files")
    files = answer["files"]
    if not all(isinstance(file, str) and os.path.isabs(file) and "\x00" not in file for file in files):
        raise ValueError("a file that is not an absolute path")
    paths = [Path(file) for file in files]
    listed: list[Path] = []
    for run in answer["runs"]:
        if (not isinstance(run, list) or len(run) != 2 or not all(type(n) is int for n in run)
                or not 0 <= run[0] < len(paths) or run[1] < 1 or len(listed) + run[1] > MAX_JOB_LIST_LINES):
            raise ValueError(f"{str(run)[:40]} is not a run of lines")
        listed.extend([paths[run[0]]] * run[1])
    if not listed:
        raise ValueError("no file")
    return listed


def _read_hdf5_list(task: str, arguments: dict[str, Any], seconds: float, name: str, damaged: str,
                    where: Mapping[str, Any]) -> Any:
    """A reader's answer about the HDF5 list `name`: its crash said as a damaged file (`damaged`), its timeout with
    the list's name (unless the reader's own words name it already)."""
    try:
        return read_in_reader(task, arguments, seconds=seconds)
    except ReaderCrashed as crash:
        raise _crashed(crash, f"HDF5 list file {name}", damaged, where) from None
    except ReadTimedOut as error:
        if error.field is not None:  # the reader's own words: they name the list already
            raise
        raise ReadTimedOut(f"HDF5 list file {name}: {error.message}", **where) from None


def _crashed(crash: ReaderCrashed, what: str, why: str, where: Mapping[str, Any]) -> NetError:
    if not crash.ended:  # no reader could be started
        return NetError(f"cannot read {what}: {crash.message}", **where)
    return NetError(f"reading {what} ended the reader process ({crash.ended}): {why}; not read", **where)


def _roots_json(allowed: Iterable[Path] | None) -> list[str] | None:
    return None if allowed is None else [str(Path(root).resolve()) for root in allowed]


def _facts(answer: Any, what: str, where: Mapping[str, Any]) -> DatasetInfo:
    try:
        return DatasetInfo.from_json(answer)
    except ValueError as error:
        raise NetError(f"reading {what}: the reader answered nonsense ({error})", **where) from None


def shapes_from_sources(
    nets: Iterable[Any], base_dir: Path, allowed: Iterable[Path] | None = None
) -> dict[str, DataSpec]:
    """Item shapes for every Data (LMDB) and HDF5Data layer of `nets` (NetParameters) whose source exists.

    Relative sources are taken from `base_dir`; with `allowed`, sources outside those folders are refused.
    Keys are ``layer/top`` so layers of different phases reading different datasets keep their own shapes.
    """
    shapes: dict[str, DataSpec] = {}
    allowed = list(allowed) if allowed is not None else None
    for net in nets:
        for layer in net.layer:
            found: dict[str, DataSpec] = {}
            if layer.type == "Data" and layer.data_param.source and layer.top:
                if layer.data_param.backend != caffe_pb2.DataParameter.LMDB:
                    continue
                no_nul(layer.data_param.source, layer=layer.name, layer_type=layer.type, field="data_param.source")
                path = _confined(base_dir / layer.data_param.source, allowed, layer.name, "data_param.source",
                                 layer.data_param.source)
                if path.is_dir():
                    found[layer.top[0]] = lmdb_item(path, layer.name, allowed, name=layer.data_param.source)
            elif layer.type == "HDF5Data" and layer.hdf5_data_param.source:
                no_nul(layer.hdf5_data_param.source, layer=layer.name, layer_type=layer.type,
                        field="hdf5_data_param.source")
                listing = _confined(
                    base_dir / layer.hdf5_data_param.source, allowed, layer.name, "hdf5_data_param.source",
                    layer.hdf5_data_param.source,
                )
                if listing.is_file():
                    found = hdf5_items(listing, list(layer.top), layer.name, allowed)
            # TRAIN and TEST data layers often share a name: key them by phase when their rules name one.
            phases = [caffe_pb2.Phase.Name(rule.phase) for rule in layer.include if rule.HasField("phase")]
            for top, spec in found.items():
                for prefix in [f"{phase}:" for phase in phases] or [""]:
                    shapes[f"{prefix}{layer.name}/{top}"] = spec
    return shapes


def parse_shape(text: str) -> tuple[int, ...]:
    """"3,256,256" (or "3x256x256") as a shape of positive dimensions."""
    parts = re.split(r"[,x]", text.strip())
    if not all(part.strip().isdigit() for part in parts):
        raise ValueError(f"{text!r} is not a shape: write positive dimensions like 3,256,256")
    shape = tuple(int(part) for part in parts)
    if any(d <= 0 for d in shape):
        raise ValueError(f"{text!r} is not a shape: dimensions must be positive integers")
    return shape
