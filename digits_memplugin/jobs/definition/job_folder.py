"""What a job's folder holds and how it is written into: the subfolders the server and the training child write
(`WRITTEN_FOLDERS`), checked before each attempt (`check_job_folder`); the outputs folder layers write into, and an
output path kept inside it by its letters, with real folders on the way (`output_path`, `make_output_folders`)."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...core.errors import NetError
from ...core.inputs import shown
from ...estimate.files import file_kind

WRITTEN_FOLDERS = ("attempts", "snapshots", "outputs", "data")
"""The job folder's subfolders the server and the training child write into."""

OUTPUTS = "outputs"
"""The job folder's subfolder layers write into (HDF5Output's files): the only place a net's own paths may write."""

MAX_OUTPUT_DEPTH = 8
"""Most names in an output path below outputs/, its file included: each folder on the way is made and checked in
the server's thread at submission and again at each attempt (a 2000-deep path held the server for seconds)."""
MAX_OUTPUT_NAME_BYTES = 255
"""Longest name of one folder or file on the way, in bytes: NAME_MAX of Linux file systems."""
MAX_OUTPUT_PATH_BYTES = 1024
"""Longest output path below outputs/, in bytes: well inside PATH_MAX with the job's folder in front of it."""

LMDB_FOLDER = "data/lmdb"
"""Under the job's folder: one folder per LMDB the job reads, made again for each attempt, whose data.mdb links
to the dataset's data file; the child's LMDB writes its lock.mdb there."""


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
    _check_output_size(target.relative_to(outputs), value, where)
    return target


def _check_output_size(relative: Path, value: str, where: Mapping[str, Any]) -> None:
    """An output path short and shallow enough to make and check at once (`MAX_OUTPUT_*`); NetError otherwise."""
    def size(text: str) -> int:
        return len(text.encode("utf-8", "surrogatepass"))

    if len(relative.parts) > MAX_OUTPUT_DEPTH:
        raise NetError(f"{shown(value)} lies {len(relative.parts)} names deep in outputs/, more than the "
                       f"{MAX_OUTPUT_DEPTH} an output path may take", **where)
    longest = max(relative.parts, key=size)
    if size(longest) > MAX_OUTPUT_NAME_BYTES:
        raise NetError(f"{shown(value)} has a name of {size(longest)} bytes ({shown(longest)}), longer than the "
                       f"{MAX_OUTPUT_NAME_BYTES} a file system takes", **where)
    if size(str(relative)) > MAX_OUTPUT_PATH_BYTES:
        raise NetError(f"{shown(value)} is {size(str(relative))} bytes long below outputs/, more than the "
                       f"{MAX_OUTPUT_PATH_BYTES} an output path may take", **where)


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
            _make_folder(current, job, where)
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


def _make_folder(path: Path, job: Path, where: Mapping[str, Any]) -> None:
    try:
        path.mkdir()
    except OSError as error:
        raise NetError(f"{path.relative_to(job)} in the job's folder cannot be made: {error.strerror or error}",
                       **where) from None
