"""HDF5 reads in the dataset reader process: the files an HDF5 list names, and the shapes of their datasets.

A list's lines are walked against a deadline (`_ListDeadline`): a list naming more files than its time allows stops
with a ReadTimedOut that says how far it got. Each HDF5 file is opened only as a regular file inside the roots, and
its datasets are reached one link at a time inside the file: an external link, a dataset whose values lie in
external files, a virtual dataset are refused without being followed (datasets.py's docstring says why).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..core.errors import NetError
from ..core.layers.data import DataSpec
from .dataset_reader import ReadTimedOut
from .datasets import MAX_JOB_LIST_ANSWER, MAX_JOB_LIST_LINES, MAX_LIST_BYTES, DatasetInfo, find_in_roots, no_nul
from .files import open_regular, read_regular

MAX_SOFT_LINKS = 16
"""Soft links followed to reach one HDF5 dataset (HDF5's own default limit)."""


@dataclasses.dataclass(frozen=True)
class _ListDeadline:
    """The time a walk over an HDF5 list's lines has: past `at`, a ReadTimedOut saying how far the walk got."""

    at: float
    started: float
    shown: str
    lines: int
    verb: str
    """What is done to each line: "checked" (a job's list) or "read" (an estimate's)."""
    where: Mapping[str, Any]

    def check(self, done: int) -> None:
        """Raise ReadTimedOut when the time is up, `done` lines in."""
        if time.monotonic() > self.at:
            raise ReadTimedOut(
                f"HDF5 list file {self.shown} names {self.lines} files, more than could be {self.verb} in the "
                f"{self.at - self.started:.1f} s there was time for ({done} were); not read in full", **self.where,
            )


def hdf5_list_task(
    listing: str, shown: str, roots: list[str], where: dict[str, Any], seconds: float
) -> dict[str, Any]:
    """`hdf5_list_files` in the reader: the list read (bounded), each line checked as a job's data path is
    (`find_in_roots`), a line seen before not looked up again, until `seconds` are up. The answer names each
    real file once, and the lines as runs of [file, count]."""
    started = time.monotonic()
    allowed = [Path(root) for root in roots]
    path = Path(listing)
    data = read_regular(path, MAX_LIST_BYTES, name=shown, roots=allowed, **where)
    lines = data.count(b"\n") + 1
    if lines > MAX_JOB_LIST_LINES:
        raise NetError(f"{shown} has {lines} lines; a job's HDF5 list may name at most {MAX_JOB_LIST_LINES} files",
                       **where)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise NetError(f"{shown} is not a UTF-8 list file", **where) from None
    names = [line.strip() for line in text.splitlines() if line.strip()]
    if not names:
        raise NetError(f"{shown} names no HDF5 file", **where)
    files: list[str] = []
    by_name: dict[str, int] = {}
    by_real: dict[str, int] = {}
    runs: list[list[int]] = []
    size = 0
    deadline = _ListDeadline(started + seconds, started, shown, len(names), "checked", where)
    for number, entry in enumerate(names):
        deadline.check(number)
        at = by_name.get(entry)
        if at is None:
            real = str(find_in_roots(entry, allowed, want="file", base=path.parent, **where))
            at = by_name[entry] = by_real.setdefault(real, len(files))
            if at == len(files):
                files.append(real)
                size += len(json.dumps(real)) + 2  # as the answer spells it (a letter outside ASCII: 6 bytes)
        if runs and runs[-1][0] == at:
            runs[-1][1] += 1
        else:
            runs.append([at, 1])
            size += 16
        if size > MAX_JOB_LIST_ANSWER:
            raise NetError(
                f"{shown} names more different files than a job's HDF5 list may (their names take over "
                f"{MAX_JOB_LIST_ANSWER // 1024} KiB after {number + 1} lines); merge them into fewer, larger files",
                **where,
            )
    return {"files": files, "runs": runs}


def hdf5_task(
    listing: str, shown: str, tops: list[str], layer: str, roots: list[str] | None, seconds: float
) -> dict[str, Any]:
    allowed = None if roots is None else [Path(root) for root in roots]
    return _read_hdf5(Path(listing), shown, tops, layer, allowed, time.monotonic() + seconds).to_json()


def _read_hdf5(
    listing: Path, shown: str, tops: list[str], layer: str, roots: list[Path] | None, deadline: float
) -> DatasetInfo:
    """The facts of the files `listing` names. A file named again (or spelled otherwise) is read once, and counted
    again: Caffe reads each line in turn. Stops with ReadTimedOut at `deadline`."""
    field = "hdf5_data_param.source"
    where: dict[str, Any] = {"layer": layer, "layer_type": "HDF5Data", "field": field}
    if not listing.is_file():
        raise NetError(f"HDF5 list file {shown} does not exist", **where)
    data = read_regular(listing, MAX_LIST_BYTES, name=f"HDF5 list file {shown}", roots=roots, **where)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise NetError(f"HDF5 list file {shown} is not UTF-8 text", **where) from None
    files = [line.strip() for line in text.splitlines() if line.strip()]
    if not files:
        raise NetError(f"HDF5 list file {shown} names no file", **where)
    walk = _ListDeadline(deadline, time.monotonic(), shown, len(files), "read", where)
    shapes: dict[str, tuple[int, ...]] = {}
    rows = 0
    total_rows = 0
    disk_bytes = len(data)
    by_name: dict[str, tuple[int, int, int, int]] = {}
    by_identity: dict[tuple[int, int, int, int], dict[str, tuple[int, ...]]] = {}
    for index, file in enumerate(files):
        walk.check(index)
        identity = by_name.get(file)
        if identity is None:
            no_nul(file, **where)
            fd = open_regular(listing.parent / file, name=file, roots=roots, **where)
            try:
                facts = os.fstat(fd)
                identity = by_name[file] = (facts.st_dev, facts.st_ino, facts.st_mtime_ns, facts.st_size)
                if identity not in by_identity:
                    by_identity[identity] = _hdf5_shapes(fd, file, tops, where)
                    disk_bytes += min(facts.st_size, facts.st_blocks * 512)
            finally:
                os.close(fd)
        file_shapes = by_identity[identity]
        for top, shape in file_shapes.items():
            if top in shapes and shapes[top] != shape[1:]:
                raise NetError(
                    f"dataset {top!r} has items of shape {list(shape[1:])} in {file} but {list(shapes[top])} in "
                    "an earlier file",
                    **where,
                )
            shapes[top] = shape[1:]
        file_rows = max((shape[0] for shape in file_shapes.values()), default=0)
        rows = max(rows, file_rows)
        total_rows += file_rows
    specs = {top: DataSpec(shape, rows=rows, stored_itemsize=4) for top, shape in shapes.items()}
    return DatasetInfo(specs, total_rows, disk_bytes)


def _hdf5_shapes(fd: int, file: str, tops: list[str], where: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Each top's dataset shape in the open HDF5 file `fd`, reached without leaving the file."""
    import h5py

    try:
        with h5py.File(f"/proc/self/fd/{fd}", "r") as h5:
            shapes = {}
            for top in tops:
                shape = tuple(int(d) for d in _hdf5_dataset(h5, top, file, where).shape)
                if not shape:
                    raise NetError(f"dataset {top!r} in {file} has no rows", **where)
                shapes[top] = shape
            return shapes
    except NetError:
        raise
    except OSError as error:
        raise NetError(f"cannot read HDF5 file {file}: {_h5_reason(error)}", **where) from None
    except Exception as error:  # noqa: BLE001 - h5py raises KeyError, RuntimeError, ValueError... for damaged files
        raise NetError(f"cannot read HDF5 file {file}: {_h5_reason(error)}", **where) from None


def _hdf5_dataset(h5: Any, top: str, file: str, where: Mapping[str, Any]) -> Any:
    """The dataset `top` names in `h5`, reached one link at a time: hard links, and soft links (paths inside this
    file). An external or user-defined link is refused, not followed; so are datasets whose values lie in other
    files (external storage, virtual datasets), before their shape is asked for (which opens a virtual dataset's
    sources)."""
    import h5py
    from h5py import h5d, h5l

    parts = [part for part in top.split("/") if part not in ("", ".")]
    current = h5
    hops = 0
    while parts:
        part = parts.pop(0)
        if not isinstance(current, h5py.Group):
            raise NetError(f"{file} has no dataset {top!r} ({current.name} is not a group)", **where)
        try:
            link = current.id.links.get_info(part.encode())
        except (KeyError, RuntimeError):
            raise NetError(f"{file} has no dataset {top!r}", **where) from None
        if link.type == h5l.TYPE_HARD:
            current = current.get(part)
        elif link.type == h5l.TYPE_SOFT:
            hops += 1
            if hops > MAX_SOFT_LINKS:
                raise NetError(f"{file}: {top!r} goes through more than {MAX_SOFT_LINKS} soft links; not read", **where)
            target = current.id.links.get_val(part.encode()).decode("utf-8", "replace")
            if target.startswith("/"):
                current = h5
            parts = [piece for piece in target.split("/") if piece not in ("", ".")] + parts
        else:
            kind = "an external link" if link.type == h5l.TYPE_EXTERNAL else "a user-defined link"
            raise NetError(
                f"{file}: {top!r} is reached through {kind}, to another file; the server opens no file through a "
                "link (put the data itself in the file)",
                **where,
            )
    if isinstance(current, h5py.Group):
        raise NetError(f"{file}: {top!r} is a group, not a dataset", **where)
    if not isinstance(current, h5py.Dataset):
        raise NetError(f"{file}: {top!r} is not a dataset", **where)
    plist = current.id.get_create_plist()
    if plist.get_layout() == h5d.VIRTUAL:
        raise NetError(f"{file}: {top!r} is a virtual dataset, whose values are in other files; not read", **where)
    if plist.get_external_count():
        raise NetError(f"{file}: {top!r} keeps its values in external files (external storage); not read", **where)
    return current


def _h5_reason(error: Exception) -> str:
    """HDF5's reason without the descriptor path it was opened through."""
    return re.sub(r"\s*\(?(file )?name = '/proc/self/fd/\d+'[^)]*\)?", "", str(error)) or "not an HDF5 file"
