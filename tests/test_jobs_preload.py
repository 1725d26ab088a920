"""jobs.child.preload: the capped-start library is built from its source once, cached by the source's hash, and never
loaded from a place someone else could have planted it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from digits_memplugin.jobs.child.preload import LIBRARY_NAME, PreloadError, ensure_library, library_path


def test_it_is_built_once_into_a_folder_named_after_its_source(tmp_path: Path) -> None:
    built = ensure_library(tmp_path)
    assert built == library_path(tmp_path) and built.name == LIBRARY_NAME and built.is_file()
    assert b"__libc_start_main" in built.read_bytes()
    stamp = built.stat().st_mtime_ns
    assert ensure_library(tmp_path) == built and built.stat().st_mtime_ns == stamp  # cached: not built again
    assert not [path for path in built.parent.iterdir() if path.name.startswith(".build-")]


def test_a_library_others_may_write_is_refused_not_loaded(tmp_path: Path) -> None:
    target = library_path(tmp_path)
    target.parent.mkdir(parents=True)
    target.write_bytes(b"planted")
    target.chmod(0o777)
    with pytest.raises(PreloadError, match="is not this user's own"):
        ensure_library(tmp_path)
    assert target.read_bytes() == b"planted"  # left as it was, and never handed to a caffe


def test_a_missing_compiler_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(PreloadError, match="no C compiler"):
        ensure_library(tmp_path / "cache")
    assert os.listdir(tmp_path / "cache" / "preload" / library_path(tmp_path).parent.name) == []
