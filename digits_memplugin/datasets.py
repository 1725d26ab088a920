"""Item shapes of the datasets a net's data layers read, from the datasets themselves (LMDB, HDF5).

Caffe learns a Data layer's shape from the first record of its LMDB and an HDF5Data layer's from its files; the
estimator needs the same shapes. This module opens what the net names, read-only, and only where the caller
allows (`allowed` roots): the web server must not read arbitrary paths a user typed into a prototxt.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from .core.errors import NetError
from .core.layers.data import DataSpec
from .core.proto import caffe_pb2


def _confined(path: Path, allowed: Iterable[Path] | None, layer: str, field: str) -> Path:
    resolved = path.resolve()
    if allowed is not None:
        roots = [Path(root).resolve() for root in allowed]
        if not any(resolved == root or resolved.is_relative_to(root) for root in roots):
            raise NetError(f"{path} is outside the dataset folders this server may read", layer=layer, field=field)
    return resolved


_LMDB_OPEN = threading.Lock()
"""LMDB refuses to open one environment twice in a process ("already open in this process"): two submissions
reading the same dataset at once (a threaded host app) took turns failing before this lock."""


def lmdb_item(path: Path, layer: str) -> DataSpec:
    """The first Datum of an LMDB: its stored shape, and whether it holds bytes or floats."""
    with _LMDB_OPEN:
        return _lmdb_item(path, layer)


def _lmdb_item(path: Path, layer: str) -> DataSpec:
    import lmdb

    field = "data_param.source"
    if not path.is_dir():
        raise NetError(f"LMDB {path} does not exist", layer=layer, layer_type="Data", field=field)
    try:
        env = lmdb.open(str(path), readonly=True, lock=False, readahead=False, max_readers=4)
    except lmdb.Error as error:
        raise NetError(f"cannot open LMDB {path}: {error}", layer=layer, layer_type="Data", field=field) from None
    try:
        with env.begin() as txn:
            cursor = txn.cursor()
            if not cursor.first():
                raise NetError(f"LMDB {path} is empty", layer=layer, layer_type="Data", field=field)
            value = cursor.value()
    finally:
        env.close()
    datum = caffe_pb2.Datum()
    try:
        datum.ParseFromString(value)
    except DecodeError as error:
        raise NetError(f"the first record of {path} is not a Caffe Datum ({error})", layer=layer, field=field) from None
    if datum.encoded:
        raise NetError(
            f"{path} holds encoded (PNG/JPEG) images, whose size is only known after decoding; give the image "
            "shape explicitly",
            layer=layer,
            layer_type="Data",
            field=field,
        )
    shape = (datum.channels, datum.height, datum.width)
    itemsize = 4 if len(datum.float_data) and not datum.data else 1
    return DataSpec(shape, stored_itemsize=itemsize)


def hdf5_items(listing: Path, tops: list[str], layer: str, allowed: Iterable[Path] | None) -> dict[str, DataSpec]:
    """Shapes of each top's dataset in the HDF5 files a list file names; rows of the largest file."""
    import h5py

    field = "hdf5_data_param.source"
    if not listing.is_file():
        raise NetError(f"HDF5 list file {listing} does not exist", layer=layer, layer_type="HDF5Data", field=field)
    files = [line.strip() for line in listing.read_text().splitlines() if line.strip()]
    if not files:
        raise NetError(f"HDF5 list file {listing} names no file", layer=layer, layer_type="HDF5Data", field=field)
    shapes: dict[str, tuple[int, ...]] = {}
    rows = 0
    for name in files:
        file = _confined(Path(name), allowed, layer, field)
        try:
            with h5py.File(file, "r") as h5:
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
        except OSError as error:
            raise NetError(f"cannot read HDF5 file {file}: {error}", layer=layer, field=field) from None
    return {top: DataSpec(shape, rows=rows, stored_itemsize=4) for top, shape in shapes.items()}


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
                    found[layer.top[0]] = lmdb_item(path, layer.name)
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


def parse_shape(text: str) -> tuple[int, ...]:
    """"3,256,256" (or "3x256x256") as a shape of positive dimensions."""
    parts = re.split(r"[,x]", text.strip())
    if not all(part.strip().isdigit() for part in parts):
        raise ValueError(f"{text!r} is not a shape: write positive dimensions like 3,256,256")
    shape = tuple(int(part) for part in parts)
    if any(d <= 0 for d in shape):
        raise ValueError(f"{text!r} is not a shape: dimensions must be positive integers")
    return shape
