"""The data folder's disk helpers: a job's folder removed whatever its depth, links never followed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from digits_memplugin.jobs.store.disk import folder_bytes, remove_folder


def deep_tree(root: Path, depth: int) -> Path:
    """`depth` folders one in another, a file at the bottom, made a level at a time (pathlib recurses too)."""
    folder = root / "job"
    folder.mkdir()
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        file = os.open("x.h5", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(file, b"x" * 4096)
        os.close(file)
    finally:
        os.close(fd)
    return folder


def test_a_job_folder_deeper_than_python_recurses_is_removed_in_full(tmp_path: Path) -> None:
    """shutil.rmtree (Python 3.11) recurses a level at a time: a 1,500-deep job folder died of RecursionError and
    stayed on disk, outside every storage cap, while its job was deleted."""
    folder = deep_tree(tmp_path, 1500)
    with pytest.raises(RecursionError):
        shutil.rmtree(folder, ignore_errors=True)  # the witness: what the server called before
    assert folder_bytes(folder) > 4096
    remove_folder(folder)
    assert not folder.exists() and list(tmp_path.iterdir()) == []


def test_removing_a_folder_never_follows_a_link_inside_it(tmp_path: Path) -> None:
    outside = tmp_path / "dataset"
    outside.mkdir()
    (outside / "data.mdb").write_bytes(b"keep")
    folder = tmp_path / "job" / "outputs"
    folder.mkdir(parents=True)
    (folder / "link").symlink_to(outside)
    (folder / "file_link").symlink_to(outside / "data.mdb")
    remove_folder(tmp_path / "job")
    assert not (tmp_path / "job").exists()
    assert (outside / "data.mdb").read_bytes() == b"keep"


def test_removing_what_is_not_there_or_is_a_file_is_quiet(tmp_path: Path) -> None:
    remove_folder(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    remove_folder(tmp_path / "file")
    assert list(tmp_path.iterdir()) == []
