"""The datasets a server may train on: LMDB folders and HDF5 list files found under the dataset roots, each with
what the New model form shows of it (item shape, entries, size on disk), read from the dataset itself.

A root may be large (a whole data disk) or hostile (links out of it, FIFOs, unreadable files, truncated or crafted
datasets), and the page scans it while it renders, so the walk is bounded: in depth, in directory entries looked
at, in datasets listed and in time. The time bound holds whatever a dataset holds: each read is given what is left
of it (datasets.py reads in a reader process with that deadline, an HDF5 list of 40,000 files included), and a
read cut short ends the scan with `truncated` saying so. Links are followed only where they land inside a root
(each real folder is walked once), and every file is opened through files.open_regular, which opens only regular
files inside the roots. A dataset that cannot be read is listed with its error, which names the file, rather than
left out: the user put it there and wants to know why it is refused.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..core.errors import NetError
from .dataset_reader import ReadTimedOut
from .datasets import LMDB_DATA_FILE, READ_SECONDS, DatasetInfo, hdf5_info, lmdb_info
from .files import inside, open_regular

LMDB = "lmdb"
HDF5 = "hdf5"
FORMATS = (LMDB, HDF5)
MAX_DEPTH = 4
"""Folders below a root that are walked (a root's own children are depth 1)."""
MAX_ENTRIES = 5000
"""Directory entries looked at in one scan, all roots together."""
MAX_DATASETS = 200
"""Datasets listed at most."""
MAX_SECONDS = 3.0
"""A scan stops after this long (a slow network disk), listing what it found."""
MAX_LIST_BYTES = 1024 * 1024
"""A .txt file larger than this is not taken for an HDF5 list (those name a few files)."""
HDF5_SUFFIXES = (".h5", ".hdf5")
DATA_TOP = "data"
"""The dataset of an HDF5 file that holds the items (DIGITS writes "data" and "label")."""


@dataclasses.dataclass(frozen=True)
class FoundDataset:
    """One dataset under a root, as the form offers it."""

    name: str
    """The path relative to its root: what the form's source fields take."""
    path: str
    """The absolute path (the link's own path where a link led to it)."""
    root: str
    format: str
    """"lmdb" (a folder holding data.mdb) or "hdf5" (a list file naming .h5 files)."""
    shape: tuple[int, ...] | None = None
    """One item's stored shape (channels, height, width for images)."""
    entries: int | None = None
    """Items it holds: the largest batch worth planning."""
    disk_bytes: int | None = None
    error: str | None = None
    """Why it cannot be read (naming the file); the other facts are then None."""

    def to_json(self) -> dict[str, Any]:
        document = dataclasses.asdict(self)
        document["shape"] = list(self.shape) if self.shape is not None else None
        return document


@dataclasses.dataclass(frozen=True)
class Scan:
    """The datasets found under the roots, in the order of the roots, then by name."""

    roots: tuple[str, ...]
    datasets: tuple[FoundDataset, ...]
    truncated: str | None = None
    """Why the list may be incomplete (a bound was reached); None when every folder was looked at."""

    def to_json(self) -> dict[str, Any]:
        return {
            "roots": list(self.roots),
            "datasets": [dataset.to_json() for dataset in self.datasets],
            "truncated": self.truncated,
        }


class _Budget:
    """The bounds of one scan, shared by every root."""

    def __init__(self, max_entries: int, max_datasets: int, seconds: float) -> None:
        self.max_entries, self.max_datasets, self.seconds = max_entries, max_datasets, seconds
        self.entries = max_entries
        self.datasets = max_datasets
        self.deadline = time.monotonic() + seconds
        self.reason: str | None = None

    def spend_entry(self) -> bool:
        self.entries -= 1
        if self.entries < 0:
            self.reason = f"more than {self.max_entries} files and folders in the dataset folders; only the first are listed"
        elif time.monotonic() > self.deadline:
            self.out_of_time()
        return self.reason is None

    def left(self) -> float:
        """Seconds left for reading (a read is given this much, and no more)."""
        return max(0.0, self.deadline - time.monotonic())

    def out_of_time(self) -> None:
        self.reason = f"the dataset folders took over {self.seconds:g} s to look through; only part is listed"

    def spend_dataset(self) -> bool:
        """Whether one more dataset may be listed (a dataset whose read ran out of time still is, with its error)."""
        self.datasets -= 1
        if self.datasets < 0:
            self.reason = f"more than {self.max_datasets} datasets; only the first are listed"
            return False
        return True


def scan(
    roots: Iterable[Path],
    *,
    max_depth: int = MAX_DEPTH,
    max_entries: int = MAX_ENTRIES,
    max_datasets: int = MAX_DATASETS,
    seconds: float = MAX_SECONDS,
) -> Scan:
    """Every LMDB folder and HDF5 list file under `roots` (missing roots are skipped), within the bounds."""
    roots = [Path(root) for root in roots]
    resolved = [root.resolve() for root in roots]
    budget = _Budget(max_entries, max_datasets, seconds)
    found: list[FoundDataset] = []
    visited: set[tuple[int, int]] = set()
    for shown, root in zip(roots, resolved):
        if not root.is_dir():
            continue
        for dataset in _walk(Path(shown), root, resolved, max_depth, budget, visited):
            if not budget.spend_dataset():
                break
            found.append(dataset)
            if budget.reason:
                break
        if budget.reason:
            break
    return Scan(tuple(str(root) for root in roots), tuple(found), budget.reason)


def _walk(
    shown_root: Path, root: Path, roots: list[Path], max_depth: int, budget: _Budget, visited: set[tuple[int, int]]
) -> Iterator[FoundDataset]:
    """Datasets under `root` (resolved), named relative to it; a folder holding data.mdb is an LMDB, not walked."""
    stack: list[tuple[Path, str, int]] = [(root, "", 0)]
    while stack:
        folder, prefix, depth = stack.pop()
        try:
            facts = os.stat(folder)
            if (facts.st_dev, facts.st_ino) in visited:
                continue
            visited.add((facts.st_dev, facts.st_ino))
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError:
            continue  # an unreadable folder hides nothing the server could read either
        below: list[tuple[Path, str, int]] = []
        for entry in entries:
            if not budget.spend_entry():
                return
            if entry.name.startswith("."):
                continue
            name = prefix + entry.name
            path = Path(entry.path)
            real = Path(os.path.realpath(path))
            if not inside(real, roots):
                continue  # a link out of the roots: never followed, never listed
            try:
                mode = os.stat(real).st_mode
            except OSError:
                continue
            if stat.S_ISDIR(mode):
                if os.path.lexists(real / LMDB_DATA_FILE):
                    yield _described(path, LMDB, roots, name, shown_root, budget)
                elif depth + 1 < max_depth:
                    below.append((real, name + "/", depth + 1))
            elif stat.S_ISREG(mode) and entry.name.endswith(".txt") and _names_hdf5(real, mode, roots):
                yield _described(path, HDF5, roots, name, shown_root, budget)
            if budget.reason:
                return
        stack.extend(reversed(below))


def _described(path: Path, fmt: str, roots: list[Path], name: str, root: Path, budget: _Budget) -> FoundDataset:
    """`describe` within what is left of the scan's time; a read cut short by it ends the scan."""
    try:
        return _describe(path, fmt, roots, name, root, budget.left())
    except ReadTimedOut as error:
        budget.out_of_time()
        return FoundDataset(name, str(path), str(root), fmt, error=error.message)


def _names_hdf5(path: Path, mode: int, roots: list[Path]) -> bool:
    """Whether a small text file's first line names an .h5 file: an HDF5 list, not an image list or notes."""
    try:
        if os.stat(path).st_size > MAX_LIST_BYTES or not stat.S_ISREG(mode):
            return False
        fd = open_regular(path, roots=roots)  # swapped for a FIFO or a device since the stat: not opened
    except (OSError, NetError):
        return False
    try:
        head = os.read(fd, 4096)
    except OSError:
        return False
    finally:
        os.close(fd)
    first = next((line.strip() for line in head.decode("utf-8", "replace").splitlines() if line.strip()), "")
    return first.lower().endswith(HDF5_SUFFIXES)


def describe(
    path: Path, fmt: str, roots: Iterable[Path], *, name: str | None = None, root: Path | None = None,
    seconds: float = READ_SECONDS,
) -> FoundDataset:
    """What the dataset at `path` holds, read from it within `seconds`; an unreadable one carries its error
    instead (one that took too long too)."""
    roots = [Path(r).resolve() for r in roots]
    name = name if name is not None else str(path)
    try:
        return _describe(path, fmt, roots, name, root, seconds)
    except NetError as error:
        return FoundDataset(name, str(path), str(root or ""), fmt, error=error.message)


def _describe(path: Path, fmt: str, roots: list[Path], name: str, root: Path | None, seconds: float) -> FoundDataset:
    """`describe`, raising the ReadTimedOut of a read cut short (the scan ends then)."""
    try:
        info = (
            _cached_lmdb(path, roots, name, seconds) if fmt == LMDB
            else hdf5_info(path, [DATA_TOP], "", roots, name=name, seconds=seconds)
        )
    except ReadTimedOut:
        raise
    except NetError as error:
        return FoundDataset(name, str(path), str(root or ""), fmt, error=error.message)
    spec = info.specs.get(DATA_TOP)
    return FoundDataset(
        name, str(path), str(root or ""), fmt, shape=tuple(spec.shape) if spec else None, entries=info.entries,
        disk_bytes=info.disk_bytes,
    )


_CacheKey = tuple[str, str, tuple[str, ...], int, int, int, int]
_CACHE: dict[_CacheKey, DatasetInfo | NetError] = {}
_CACHE_LOCK = threading.Lock()
MAX_CACHED = 512


def _cached_lmdb(path: Path, roots: list[Path], name: str, seconds: float) -> DatasetInfo:
    """LMDB facts by their data file's identity and change time: the page lists the same datasets at every load,
    and a write to an LMDB changes its data file's mtime. A refusal is kept too (a crafted file that ends its
    reader is not read again at every load), but not a read cut short by time."""
    try:
        facts = os.stat(path / LMDB_DATA_FILE)
        key: _CacheKey | None = (
            os.path.realpath(path / LMDB_DATA_FILE), name, tuple(map(str, roots)), facts.st_dev, facts.st_ino,
            facts.st_mtime_ns, facts.st_size,
        )
    except (OSError, ValueError):
        key = None
    if key is not None:
        with _CACHE_LOCK:
            cached = _CACHE.get(key)
        if isinstance(cached, NetError):
            raise cached
        if cached is not None:
            return cached
    result: DatasetInfo | NetError
    try:
        result = lmdb_info(path, "", roots, name=name, seconds=seconds)
    except ReadTimedOut:
        raise
    except NetError as error:
        result = error
    if key is not None:
        with _CACHE_LOCK:
            if len(_CACHE) >= MAX_CACHED:
                _CACHE.clear()
            _CACHE[key] = result
    if isinstance(result, NetError):
        raise result
    return result


def locate(value: str, fmt: str, roots: Iterable[Path]) -> Path | None:
    """The dataset a form's source names, as a job would find it: an absolute path inside a root, or a relative one
    tried against each root in turn (the first that exists, of the right kind). None when there is none."""
    value = value.strip()
    if not value or "\x00" in value:
        return None
    resolved = [Path(root).resolve() for root in roots]
    path = Path(value)
    candidates = [path] if path.is_absolute() else [root / path for root in resolved]
    for candidate in candidates:
        try:
            real = candidate.resolve()
            if not inside(real, resolved):
                continue
            if (fmt == LMDB and real.is_dir()) or (fmt == HDF5 and real.is_file()):
                return candidate
        except (OSError, RuntimeError):  # a name too long, a link loop
            continue
    return None


def source_dataset(value: str, fmt: str, roots: Iterable[Path]) -> FoundDataset | None:
    """The dataset a form's source names, described; None when it names none (yet)."""
    roots = list(roots)
    path = locate(value, fmt, roots)
    return None if path is None else describe(path, fmt, roots, name=value.strip())
