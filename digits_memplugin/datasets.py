"""Item shapes of the datasets a net's data layers read, from the datasets themselves (LMDB, HDF5).

Caffe learns a Data layer's shape from the first record of its LMDB and an HDF5Data layer's from its files; the
estimator needs the same shapes. This module opens what the net names, read-only, and only where the caller
allows (`allowed` roots): the web server must not read arbitrary paths a user typed into a prototxt.

An LMDB is a folder, but what LMDB opens are the files in it: `data.mdb`, and `lock.mdb` for its reader table.
Each file is checked, not only the folder: the data file must be a regular file inside the roots (a link out of
them, a FIFO, a device is refused), and it is opened through files.open_regular, which never opens anything
else; LMDB then maps that very file (/proc/self/fd) with no lock file at all, so `lock.mdb` is never opened here.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from .core.errors import NetError
from .core.layers.data import DataSpec
from .core.proto import caffe_pb2
from .files import file_kind, inside, open_regular, read_regular

LMDB_DATA_FILE = "data.mdb"
"""The data file of an LMDB folder (Caffe opens LMDBs as folders, never as single files)."""
MAX_LIST_BYTES = 64 * 1024 * 1024
"""Largest HDF5 list file read."""


def _confined(path: Path, allowed: Iterable[Path] | None, layer: str, field: str) -> Path:
    resolved = path.resolve()
    if allowed is not None:
        roots = [Path(root).resolve() for root in allowed]
        if not any(resolved == root or resolved.is_relative_to(root) for root in roots):
            raise NetError(f"{path} is outside the dataset folders this server may read", layer=layer, field=field)
    return resolved


def lmdb_data_file(folder: Path, roots: Iterable[Path] | None, *, name: str, **where: Any) -> Path:
    """The real path of the data file of the LMDB `folder` (links resolved), checked without opening anything: a
    regular file inside `roots` (resolved). `name` is how messages show the folder (the path a user gave)."""
    shown = f"{name.rstrip('/')}/{LMDB_DATA_FILE}"
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


_LMDB_OPEN = threading.Lock()
"""LMDB refuses to open one environment twice in a process ("already open in this process"): two submissions
reading the same dataset at once (a threaded host app) took turns failing before this lock."""


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a dataset holds: its items' specs by top, how many items, and the bytes its files take on disk."""

    specs: dict[str, DataSpec]
    entries: int
    """Records of an LMDB, rows of every file of an HDF5 list together: the most items one pass can hold."""
    disk_bytes: int


def lmdb_item(path: Path, layer: str, allowed: Iterable[Path] | None = None, *, name: str | None = None) -> DataSpec:
    """The first Datum of an LMDB: its stored shape, and whether it holds bytes or floats. With `allowed`, its data
    file must lie inside those folders; `name` is how messages show the folder (default: `path`)."""
    return lmdb_info(path, layer, allowed, name=name).specs["data"]


def lmdb_info(path: Path, layer: str, allowed: Iterable[Path] | None = None, *, name: str | None = None) -> DatasetInfo:
    """`lmdb_item`, with the LMDB's record count (its stat: nothing is read past the first record) and the size its
    data file takes on disk (an LMDB's file is sparse up to its map size: its blocks, not its length)."""
    with _LMDB_OPEN:
        return _lmdb_info(path, layer, allowed, name or str(path))


def _lmdb_info(path: Path, layer: str, allowed: Iterable[Path] | None, name: str) -> DatasetInfo:
    import lmdb

    field = "data_param.source"
    where: dict[str, Any] = {"layer": layer, "layer_type": "Data", "field": field}
    if not path.is_dir():
        raise NetError(f"LMDB {name} does not exist (an LMDB is a folder)", **where)
    roots = None if allowed is None else [Path(root).resolve() for root in allowed]
    fd = open_regular(path / LMDB_DATA_FILE, name=f"{name.rstrip('/')}/{LMDB_DATA_FILE}", roots=roots, **where)
    try:
        # The checked file itself, as a single-file environment with no lock file (nothing else is opened).
        env = lmdb.open(f"/proc/self/fd/{fd}", subdir=False, readonly=True, lock=False, readahead=False)
    except lmdb.Error as error:
        os.close(fd)
        raise NetError(f"cannot open LMDB {name.rstrip('/')}/{LMDB_DATA_FILE}: {_lmdb_reason(error)}", **where) from None
    try:
        facts = os.fstat(fd)
        disk_bytes = min(facts.st_size, facts.st_blocks * 512)
        entries = int(env.stat()["entries"])
        with env.begin() as txn:
            cursor = txn.cursor()
            if not cursor.first():
                raise NetError(f"LMDB {name} is empty", **where)
            value = cursor.value()
    except lmdb.Error as error:
        raise NetError(f"cannot read LMDB {name.rstrip('/')}/{LMDB_DATA_FILE}: {_lmdb_reason(error)}", **where) from None
    finally:
        env.close()
        os.close(fd)
    datum = caffe_pb2.Datum()
    try:
        datum.ParseFromString(value)
    except DecodeError as error:
        raise NetError(f"the first record of {name} is not a Caffe Datum ({error})", layer=layer, field=field) from None
    if datum.encoded:
        raise NetError(
            f"{name} holds encoded (PNG/JPEG) images, whose size is only known after decoding; give the image "
            "shape explicitly",
            layer=layer,
            layer_type="Data",
            field=field,
        )
    shape = (datum.channels, datum.height, datum.width)
    itemsize = 4 if len(datum.float_data) and not datum.data else 1
    return DatasetInfo({"data": DataSpec(shape, stored_itemsize=itemsize)}, entries, disk_bytes)


def hdf5_items(listing: Path, tops: list[str], layer: str, allowed: Iterable[Path] | None) -> dict[str, DataSpec]:
    """Shapes of each top's dataset in the HDF5 files a list file names (relative names from the list's folder);
    rows of the largest file. Every file, the list included, is opened only if it is a regular file (inside
    `allowed`): a FIFO named there would otherwise stop the reader until someone writes to it."""
    return hdf5_info(listing, tops, layer, allowed).specs


def hdf5_info(listing: Path, tops: list[str], layer: str, allowed: Iterable[Path] | None) -> DatasetInfo:
    """`hdf5_items`, with the rows of all the files together and the bytes they take on disk."""
    import h5py

    field = "hdf5_data_param.source"
    where: dict[str, Any] = {"layer": layer, "layer_type": "HDF5Data", "field": field}
    roots = None if allowed is None else [Path(root).resolve() for root in allowed]
    if not listing.is_file():
        raise NetError(f"HDF5 list file {listing} does not exist", **where)
    data = read_regular(listing, MAX_LIST_BYTES, name=f"HDF5 list file {listing}", roots=roots, **where)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise NetError(f"HDF5 list file {listing} is not UTF-8 text", **where) from None
    files = [line.strip() for line in text.splitlines() if line.strip()]
    if not files:
        raise NetError(f"HDF5 list file {listing} names no file", **where)
    shapes: dict[str, tuple[int, ...]] = {}
    rows = 0
    total_rows = 0
    disk_bytes = len(data)
    for file in files:
        fd = open_regular(listing.parent / file, name=file, roots=roots, **where)
        try:
            facts = os.fstat(fd)
            disk_bytes += min(facts.st_size, facts.st_blocks * 512)
            file_rows = 0
            with h5py.File(f"/proc/self/fd/{fd}", "r") as h5:
                for top in tops:
                    if top not in h5:
                        raise NetError(f"{file} has no dataset {top!r}", layer=layer, layer_type="HDF5Data", field=field)
                    shape = tuple(int(d) for d in h5[top].shape)
                    if not shape:
                        raise NetError(f"dataset {top!r} in {file} has no rows", layer=layer, field=field)
                    if top in shapes and shapes[top] != shape[1:]:
                        raise NetError(
                            f"dataset {top!r} has items of shape {list(shape[1:])} in {file} but "
                            f"{list(shapes[top])} in an earlier file",
                            layer=layer,
                            field=field,
                        )
                    shapes[top] = shape[1:]
                    rows = max(rows, shape[0])
                    file_rows = max(file_rows, shape[0])
            total_rows += file_rows
        except OSError as error:
            raise NetError(f"cannot read HDF5 file {file}: {_h5_reason(error)}", layer=layer, field=field) from None
        finally:
            os.close(fd)
    specs = {top: DataSpec(shape, rows=rows, stored_itemsize=4) for top, shape in shapes.items()}
    return DatasetInfo(specs, total_rows, disk_bytes)


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
                path = _confined(base_dir / layer.data_param.source, allowed, layer.name, "data_param.source")
                if path.is_dir():
                    found[layer.top[0]] = lmdb_item(path, layer.name, allowed, name=layer.data_param.source)
            elif layer.type == "HDF5Data" and layer.hdf5_data_param.source:
                listing = _confined(
                    base_dir / layer.hdf5_data_param.source, allowed, layer.name, "hdf5_data_param.source"
                )
                if listing.is_file():
                    found = hdf5_items(listing, list(layer.top), layer.name, allowed)
            # TRAIN and TEST data layers often share a name: key them by phase when their rules name one.
            phases = [caffe_pb2.Phase.Name(rule.phase) for rule in layer.include if rule.HasField("phase")]
            for top, spec in found.items():
                for prefix in [f"{phase}:" for phase in phases] or [""]:
                    shapes[f"{prefix}{layer.name}/{top}"] = spec
    return shapes


def _lmdb_reason(error: Exception) -> str:
    """LMDB's reason without the path it names (/proc/self/fd/N means nothing to a user)."""
    return re.sub(r"/proc/self/fd/\d+:\s*", "", str(error)) or type(error).__name__


def _h5_reason(error: OSError) -> str:
    """HDF5's reason without the descriptor path it was opened through."""
    return re.sub(r"\s*\(?(file )?name = '/proc/self/fd/\d+'[^)]*\)?", "", str(error)) or "not an HDF5 file"


def parse_shape(text: str) -> tuple[int, ...]:
    """"3,256,256" (or "3x256x256") as a shape of positive dimensions."""
    parts = re.split(r"[,x]", text.strip())
    if not all(part.strip().isdigit() for part in parts):
        raise ValueError(f"{text!r} is not a shape: write positive dimensions like 3,256,256")
    shape = tuple(int(part) for part in parts)
    if any(d <= 0 for d in shape):
        raise ValueError(f"{text!r} is not a shape: dimensions must be positive integers")
    return shape
