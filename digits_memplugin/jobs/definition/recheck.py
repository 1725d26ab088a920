"""Every path a job reads and writes, checked again just before each attempt's child starts (`confirm_data`,
`confirm_outputs`).

A job may wait in the queue for hours, so when each attempt starts every path the job reads is checked again: each
must still be the real path checked at submission (jobs.definition.confiner), with no link on it, of the same
kind. The child is handed those real paths; for an LMDB, a folder of the job's own whose data.mdb links to the
dataset's data file, because Caffe opens LMDBs read-only but still opens (creates, writes) the folder's lock.mdb,
and a prototxt cannot ask it not to: its lock table is written in the job's folder, never the dataset's. What was
confirmed says what the child may then read (`ConfirmedData.reads`), which the child's confinement
(jobs.child.confinement) holds it to while Caffe opens files all through training.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...core.errors import NetError
from ...core.proto import caffe_pb2
from ...estimate.datasets import LMDB_DATA_FILE, lmdb_data_file
from ...estimate.files import file_kind, inside, read_regular
from ..turns import Turns
from .confiner import MAX_LIST_BYTES
from .definition import JobDefinition
from .file_fields import (
    HANDLED_FIELDS,
    HDF5_LIST,
    IMAGE_LIST,
    READ_DB,
    READ_FILE,
    WRITE_DIR,
    WRITE_FILE,
    string_fields,
    unique_params,
)
from .job_folder import LMDB_FOLDER, make_output_folders, output_path

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
    for param in unique_params(definition.training):
        for layer in param.layer:
            for message, field, dotted in string_fields(layer):
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
    for param in unique_params(definition.training):
        for layer in param.layer:
            for message, field, dotted in string_fields(layer):
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
