"""A job's net made safe to run, at submission: each layer's paths checked and rewritten (`Confiner`).

A server that trains uploaded definitions must not read outside the dataset folders it was given, nor write
outside the job's folder. Known readers (LMDB sources, HDF5 and image list files, mean files, label maps) must
resolve inside a dataset root, an LMDB source down to its data file (a regular file inside a root, links
resolved); known writers (HDF5Output, detection outputs) must lie inside ``<job>/outputs`` by their letters (never
after resolving links: a folder the path names may not exist yet, and the attempt's LMDB links are made later),
with real folders on the way, checked again at each attempt (jobs.definition.recheck). Which fields those are is
jobs.definition.file_fields. List files are rewritten into the job's folder with every entry checked.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...core.errors import NetError
from ...core.proto import caffe_pb2
from ...estimate.datasets import READ_SECONDS, find_in_roots, hdf5_list_files, lmdb_data_file, no_nul, real_path
from ...estimate.files import read_regular
from ..turns import Turns
from .data_sources import SOURCE_FIELDS, DataSourceError
from .file_fields import (
    FILE_NAME,
    HANDLED_FIELDS,
    HDF5_LIST,
    IMAGE_LIST,
    PATH_LIKE,
    READ_DB,
    READ_FILE,
    REFUSED_LAYERS,
    WRITE_DIR,
    WRITE_FILE,
    string_fields,
)
from .job_folder import make_output_folders, output_path

MAX_OUTPUTS = 64
"""Most output paths one job's layers may name (HDF5Output files and the like): each is made and checked in the
server's thread."""
MAX_LIST_BYTES = 64 * 1024 * 1024
"""Largest list file read (an ImageData list of a million images is about 60 MB)."""


class Confiner:
    """Checks and rewrites a job's layers at submission, one at a time (`layer`): what a layer reads must lie inside
    the dataset `roots`, what it writes inside the outputs of the job's `folder`."""

    def __init__(self, folder: Path, roots: list[Path], replaced: set[int] | None = None) -> None:
        self.folder = folder
        self.roots = roots
        self.replaced = replaced or set()
        """Layers (by id) whose source the request's `data` gave: an error about that source is a DataSourceError."""
        self._lists: dict[tuple[str, str, str], str] = {}
        self._outputs = 0

    def layer(self, layer: Any) -> None:
        if layer.type in REFUSED_LAYERS:
            raise NetError(REFUSED_LAYERS[layer.type], layer=layer.name, layer_type=layer.type, field="type")
        for message, field, dotted in list(string_fields(layer)):
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
            no_nul(image, **where)
            resolved = real_path(base / image if not Path(image).is_absolute() else Path(image), image, **where)
            if not any(resolved.is_relative_to(root) for root in self.roots):
                raise NetError(f"{value} lists {image}, which is outside the dataset folders", **where)
            out.append(f"{resolved} {label}".rstrip())
        path.write_text("".join(f"{line}\n" for line in out), encoding="utf-8")
        return str(path)

    def output(self, value: str, where: Mapping[str, Any], *, folder: bool) -> Path:
        """A path a layer writes to: lexically inside ``<job>/outputs`` (a relative path is taken from there), with
        no link on the way; its folders are made now (and checked again at each attempt: `confirm_outputs`)."""
        self._outputs += 1
        if self._outputs > MAX_OUTPUTS:
            raise NetError(f"the net names more than {MAX_OUTPUTS} output paths, the most a job may write", **where)
        target = output_path(self.folder, value, where)
        make_output_folders(self.folder, target, where, folder=folder)
        return target
